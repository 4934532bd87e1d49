"""The copy-on-write root of a Session: the Spec's tree made writable for the
session alone, as an image's layers are in a container.

`cow_mounts` is a pure transform of a Spec's mounts, given what the host has
at their sources (`HostView`); `session_root` reads the host and applies
it. What each mount becomes:

- a read-only `Bind` of a directory: an `Overlay` over the same source, its
  writes in a fresh tmpfs (or a kept directory's subdirectory), if its
  filesystem can be a lower (`LOWER_TYPES`). Unless other mounts lie
  beneath the source on the host: overlayfs clones its lower privately,
  and in the sandbox's user namespace the kernel refuses to clone a mount
  with mounts beneath it ("failed to clone lowerpath", EINVAL): copied into
  a less privileged mount namespace they are locked, and a clone without
  them would uncover what they hide. Such a bind (`host_view`'s
  `RoBind("/")`, on every host) stays a read-only bind, and each directory
  in it is overlaid on top of it as above, recursively where mounts lie
  beneath that one too (a mount of another filesystem type, /proc, /sys,
  stays read-only): its files at the top, and the mount points themselves,
  stay read-only;
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

overlayfs shows the top directory of an overlay as its upper one, made by
the session: owned by the session's user, whoever owns the lower's.

The Spec's root is a fresh tmpfs, writable unless a `RemountRo("/")` makes it
read-only (dropped above). Its own directories and the Spec's `Tmpfs` mounts
are the session's memory, never kept in a kept directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..mounts import Bind, Dev, File, Mount, Mqueue, Overlay, Proc, RemountRo, Tmpfs
from ..paths import is_under
from ..plan import FD_SOURCE
from ..spec import Spec
from ..validate import StrPath, as_text, check_bool, check_path, normalize_path
from .cow_host import MAX_FILE_COPY, HostView, Source
from .cow_upper import prepare_upper, upper_name

# Filesystems overlayfs takes as a lower layer; a directory on any other stays a read-only bind.
LOWER_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "tmpfs", "overlay", "squashfs", "erofs",
                         "zfs"})
# At most this many overlays are made for the directories of binds with mounts beneath them.
MAX_SPLIT = 64


class _Transform:
    """One pass over a Spec's mounts; `uppers` collects the kept subdirectories."""

    def __init__(self, host: HostView, upper: str | None) -> None:
        self.host = host
        self.upper = upper
        self.uppers: list[str] = []
        self.taken: set[str] = set()
        self.budget = MAX_SPLIT
        self.later: tuple[str, ...] = ()  # where the Spec's later operations mount: an overlay there is hidden

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
        if not self.lower(src):
            return [original]
        if self.host.beneath(src.path):
            return [original, *self.split(src.path, dest)]
        return [self.overlay(dest, [src.path])]

    def lower(self, src: Source) -> bool:
        """Whether overlayfs can stack `src` as a lower (mounts beneath it aside)."""
        return src.kind == "dir" and self.host.fstype(src.path) in LOWER_TYPES

    def split(self, path: str, dest: str) -> list[Mount]:
        """Overlays of the directories in `path`, a source with mounts beneath it, bound at `dest`."""
        out: list[Mount] = []
        for name in self.host.subdirs(path):
            child, inner = os.path.join(path, name), os.path.join(dest, name)
            if not self.lower(self.host.source(child)) or any(is_under(inner, p) for p in self.later):
                continue
            if self.host.beneath(child):
                out += self.split(child, inner)
            elif self.budget > 0:
                self.budget -= 1
                out.append(self.overlay(inner, [child]))
        return out

    def mount(self, m: Mount, before: list[Mount]) -> list[Mount]:
        if isinstance(m, Bind) and m.readonly and not FD_SOURCE.fullmatch(m.src):
            return self.source(self.host.source(m.src), m.dest_path(), m, before)
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
        if isinstance(m, MOUNTING) and is_under(dest, m.dest_path()):
            return isinstance(m, Bind) and not m.readonly
    return False


def cow_mounts(mounts: Iterable[Mount], host: HostView,
               upper: str | None = None) -> tuple[tuple[Mount, ...], list[str]]:
    """The mounts of the session's copy-on-write tree, and the names of the
    subdirectories of `upper` (a kept directory) they keep their writes in."""
    t = _Transform(host, upper)
    mounts = tuple(mounts)
    out: list[Mount] = []
    for i, m in enumerate(mounts):
        t.later = tuple(n.dest_path() for n in mounts[i + 1:] if isinstance(n, MOUNTING))
        out += t.mount(m, out)
    return tuple(out), t.uppers


@dataclass
class SessionRoot:
    """The Spec a Session runs, and the lock on its kept upper directory
    (an fd, flock'ed: `cow_upper.prepare_upper`) while the session lives."""

    spec: Spec
    lock: int = -1

    def release(self) -> None:
        """Let another session use the kept directory. Idempotent."""
        if self.lock >= 0:
            os.close(self.lock)
            self.lock = -1


def session_root(spec: Spec, writable_root: object = True, upper: StrPath | None = None,
                 host: Callable[[], HostView] = HostView) -> SessionRoot:
    """The Spec a Session runs: `spec` itself with `writable_root=False`,
    else its copy-on-write form (`cow_mounts`), its writes in a fresh tmpfs
    per overlay or, with `upper`, in subdirectories of that host directory
    (made if missing, checked and locked by `prepare_upper`), kept after the
    session. Raises SpecError (an argument, or a plant in `upper`),
    SessionError (`upper` in use by another session)."""
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
        return SessionRoot(spec)
    mounts, names = cow_mounts(spec.mounts, host(), kept)
    changed = spec.replace(mounts=mounts)
    return SessionRoot(changed, prepare_upper(kept, names) if kept is not None else -1)
