"""What a Session's copy-on-write root needs to know of the host (sandbox.session.cow):
what a bind's source is, which mounts lie beneath it and of which
filesystem, the directories in it, a small file's bytes. Read when a
Session starts; no decision is made here."""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass

from ..paths import is_under

# A regular file larger than this is not read (its copy would be memory of the session's).
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
        return [point for point, _ in self.mounts if point != path and is_under(point, path)]

    def fstype(self, path: str) -> str:
        """The type of the filesystem `path` (a real path) lies in: of the
        last mount on the deepest mount point at or above it."""
        best, kind = "", ""
        for point, fstype in self.mounts:
            if is_under(path, point) and len(point) >= len(best):
                best, kind = point, fstype
        return kind

    def subdirs(self, path: str) -> list[str]:
        """The names of the directories in `path` (not links to one), sorted;
        none if it cannot be listed."""
        try:
            with os.scandir(path) as it:
                return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        except OSError:
            return []

    def read(self, path: str) -> bytes:
        """The bytes of the regular file `path`, at most MAX_FILE_COPY + 1 of
        them; OSError(EINVAL) if it is no longer one (opened O_PATH first: a
        FIFO or a device swapped in since `source` is never opened)."""
        where = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(where).st_mode):
                raise OSError(errno.EINVAL, "no longer a regular file", path)
            fd = os.open(f"/proc/self/fd/{where}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        finally:
            os.close(where)
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


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of each line of a /proc/self/mountinfo,
    in order (the point's octal escapes, as of a space, undone)."""
    out = []
    for line in text.splitlines():
        fields = line.split(" ")
        if "-" in fields[6:]:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out.append((point, fields[fields.index("-", 6) + 1]))
    return out
