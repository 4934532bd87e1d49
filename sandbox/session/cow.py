"""The copy-on-write root of a Session: the Spec's tree made writable for the
session alone, as an image's layers are in a container.

`cow_mounts` is a pure transform of a Spec's mounts, given what the host has
at their sources (`HostView`); `session_spec` reads the host and applies
it. What each mount becomes:

- a read-only `Bind` of a directory: an `Overlay` over the same source, its
  writes in a fresh tmpfs (or a kept directory's subdirectory). Unless other
  mounts lie beneath the source on the host: then it stays a read-only
  bind (recursive, as bwrap's). overlayfs clones its lower privately, and
  in the sandbox's user namespace the kernel refuses to clone a mount with
  mounts beneath it ("failed to clone lowerpath", EINVAL): copied into a
  less privileged mount namespace they are locked, and a clone without
  them would uncover what they hide. (`RoBind("/")` of `host_view` is such
  a bind on every host.)
- a read-only `Bind` of a regular file (overlayfs stacks directories only):
  a private writable copy (a `File`) of at most `MAX_FILE_COPY` bytes, made
  when the session starts; a larger file, a device, FIFO or socket, a
  `/proc/self/fd/N` source and a missing optional one stay read-only binds,
  as do a directory whose mode bits shut the caller out and a file bound
  beneath a writable host bind (its copy would be written to the host);
- a read-only `Overlay` (an image root): writable; with a kept directory, a
  writable one without an upper of its own keeps its writes there too;
- a read-only `File`: writable; a `RemountRo`: dropped, unless the mount it
  would make read-only is a writable host bind (the caller's own
  write-through stays protected as the Spec says);
- a writable `Bind` stays a bind (the caller asked to write through to the
  host), and `Tmpfs`, `Dir`, `Symlink`, `Proc`, `Dev`, `Mqueue`, `Chmod` stay.

The Spec's root is a fresh tmpfs, writable unless a `RemountRo("/")` makes it
read-only (dropped above). Its own directories and the Spec's `Tmpfs` mounts
are the session's memory, never kept in a kept directory.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..mounts import Bind, Dev, File, Mount, Mqueue, Overlay, Proc, RemountRo, Tmpfs
from ..paths import is_under
from ..plan import FD_SOURCE
from ..spec import Spec
from ..validate import StrPath, as_text, check_bool, check_path, normalize_path

# A read-only bind of a larger regular file stays read-only: its copy would be memory of the session's.
MAX_FILE_COPY = 1 << 20


@dataclass(frozen=True)
class Source:
    """What the host has at a bind's source: `kind` ("dir", "file", "other",
    "missing"), its size and mode bits, and its real path."""

    kind: str
    path: str
    size: int = 0
    mode: int = 0o644


class HostView:
    """The host facts the transform needs: a source's kind, the mounts beneath
    a directory, a file's bytes. Read once per Session start."""

    def __init__(self, mountinfo: str | None = None) -> None:
        if mountinfo is None:
            with open("/proc/self/mountinfo") as f:
                mountinfo = f.read()
        self.mounts = parse_mountinfo(mountinfo)

    def source(self, path: str) -> Source:
        """The kind of what `path` names, links followed."""
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            return Source("missing", real)
        if stat.S_ISDIR(st.st_mode):  # overlayfs opens a lower with the caller's rights, no capability
            return Source("dir" if _open_to_caller(st) else "other", real)
        if stat.S_ISREG(st.st_mode):
            return Source("file", real, st.st_size, stat.S_IMODE(st.st_mode) & 0o777)
        return Source("other", real)

    def beneath(self, path: str) -> list[str]:
        """The mount points strictly beneath `path`, in mount order."""
        return [point for point in self.mounts if point != path and is_under(point, path)]

    def read(self, path: str) -> bytes:
        """The bytes of the regular file `path` (not a FIFO's: O_NONBLOCK)."""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        try:
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(MAX_FILE_COPY + 1)
        finally:
            os.close(fd)


def _open_to_caller(st: os.stat_result) -> bool:
    """Whether the caller may list and enter a directory by its mode bits
    alone: in the sandbox's user namespace no capability overrides them for
    a file of an unmapped owner, so an overlay of a directory the bits shut
    fails to mount where a bind of it works (and shows it shut)."""
    if st.st_uid == os.geteuid() and st.st_gid == os.getegid():  # mapped: the namespace's capabilities cover it
        return True
    if st.st_uid == os.geteuid():
        return st.st_mode & 0o500 == 0o500
    if st.st_gid == os.getegid() or st.st_gid in os.getgroups():
        return st.st_mode & 0o050 == 0o050
    return st.st_mode & 0o005 == 0o005


def parse_mountinfo(text: str) -> list[str]:
    """The mount point of each line of a /proc/self/mountinfo, in order (its
    octal escapes, as of a space, undone)."""
    fields = (line.split(" ") for line in text.splitlines())
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), f[4]) for f in fields if len(f) > 4]


def upper_name(dest: str, taken: set[str]) -> str:
    """The kept directory's subdirectory for the overlay at `dest`: its path
    quoted into one name ("%2Fusr"), numbered if taken ("%2Fusr.2")."""
    base = urllib.parse.quote(dest, safe="")
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}.{k}"
    taken.add(name)
    return name


class _Transform:
    """One pass over a Spec's mounts; `uppers` collects the kept subdirectories."""

    def __init__(self, host: HostView, upper: str | None) -> None:
        self.host = host
        self.upper = upper
        self.uppers: list[str] = []
        self.taken: set[str] = set()

    def overlay(self, dest: str, lowers: Iterable[str], size: int | None = None) -> Overlay:
        if self.upper is None:
            return Overlay(dest, lowers, size=size)
        name = upper_name(dest, self.taken)
        self.uppers.append(name)
        return Overlay(dest, lowers, upper=os.path.join(self.upper, name))

    def source(self, src: Source, dest: str, original: Mount, before: list[Mount]) -> list[Mount]:
        if src.kind == "file" and src.size <= MAX_FILE_COPY and not _host_write_through(dest, before):
            try:
                data = self.host.read(src.path)
            except OSError:  # unreadable to the caller: the bind shows it as unreadable too
                return [original]
            if len(data) <= MAX_FILE_COPY:
                return [File(dest, data, perms=src.mode)]
        if src.kind != "dir" or self.host.beneath(src.path):
            return [original]
        return [self.overlay(dest, [src.path])]

    def mount(self, m: Mount, before: list[Mount]) -> list[Mount]:
        if isinstance(m, Bind) and m.readonly and not FD_SOURCE.fullmatch(m.src):
            return self.source(self.host.source(m.src), m.target(), m, before)
        if isinstance(m, Overlay) and (not m.writable or (m.upper is None and self.upper is not None)):
            return [self.overlay(m.dest, m.lowers, m.size if self.upper is None else None)]
        if isinstance(m, File) and m.readonly:
            return [replace(m, readonly=False)]
        if isinstance(m, RemountRo) and not _host_write_through(m.dest, before):
            return []
        return [m]


# The operations that mount a filesystem (a File and a Dir write into the one they are made in).
MOUNTING = (Bind, Tmpfs, Overlay, Proc, Dev, Mqueue)


def _host_write_through(dest: str, before: list[Mount]) -> bool:
    """Whether the mount that holds `dest` (the last one made at it or above
    it) is a writable host bind: a copy made there would be written to the
    host, and a RemountRo there protects the host."""
    for m in reversed(before):
        if isinstance(m, MOUNTING) and is_under(dest, m.target()):
            return isinstance(m, Bind) and not m.readonly
    return False


def cow_mounts(mounts: Iterable[Mount], host: HostView,
               upper: str | None = None) -> tuple[tuple[Mount, ...], list[str]]:
    """The mounts of the session's copy-on-write tree, and the names of the
    subdirectories of `upper` (a kept directory) they keep their writes in."""
    t = _Transform(host, upper)
    out: list[Mount] = []
    for m in mounts:
        out += t.mount(m, out)
    return tuple(out), t.uppers


def prepare_upper(upper: str, names: Iterable[str]) -> None:
    """Make the kept directory `upper` (if missing) and its subdirectories
    `names`, refusing what could redirect the session's writes: `upper`
    owned by another user or writable by others, a subdirectory that is a
    symlink or not a directory. overlayfs (csrc/mounts.c) then opens each
    subdirectory by path; only its owner could swap it meanwhile."""
    os.makedirs(upper, mode=0o700, exist_ok=True)
    top = os.open(upper, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check_dir(top, upper)
        for name in names:
            try:
                os.mkdir(name, 0o700, dir_fd=top)
            except FileExistsError:
                pass
            _check_sub(top, upper, name)
    finally:
        os.close(top)


def _check_dir(fd: int, path: str) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise SpecError("upper", path, f"is owned by uid {st.st_uid}, not by the caller (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise SpecError("upper", path, f"is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                        "they could swap what the session writes into")


def _check_sub(top: int, upper: str, name: str) -> None:
    path = os.path.join(upper, name)
    try:
        fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SpecError("upper", path, "is a symlink or not a directory: the session's writes of this "
                            "mount go there; remove it") from None
        raise
    try:
        _check_dir(fd, path)
    finally:
        os.close(fd)


def session_spec(spec: Spec, writable_root: object = True, upper: StrPath | None = None,
                 host: Callable[[], HostView] = HostView) -> Spec:
    """The Spec a Session runs: `spec` itself with `writable_root=False`,
    else its copy-on-write form (`cow_mounts`), its writes in a fresh tmpfs
    per overlay or, with `upper`, in subdirectories of that host directory
    (made if missing, checked by `prepare_upper`), kept after the session."""
    if not isinstance(spec, Spec):
        raise SpecError("spec", spec, "must be a sandbox.Spec")
    check_bool("writable_root", writable_root)
    kept = None
    if upper is not None:
        text = as_text(upper)
        kept = normalize_path(check_path("upper", os.path.abspath(text) if isinstance(text, str) else text))
        if not writable_root:
            raise SpecError("upper", upper, "keeps the writes of a writable root: it needs writable_root=True")
    if not writable_root:
        return spec
    mounts, names = cow_mounts(spec.mounts, host(), kept)
    if kept is not None:
        prepare_upper(kept, names)
    return spec.replace(mounts=mounts)
