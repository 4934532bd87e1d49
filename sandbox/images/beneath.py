"""Opening a regular file beneath a directory fd, never through a link, never blocking.

What `ImageStore.load` reads from a layout or a `docker save` directory is
named by that directory's own JSON (index.json, manifest.json): the names,
the links and the file types are whoever wrote the directory's, perhaps a
sandbox that built the image. So a member is opened with openat2(2)
relative to the directory's fd with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS:
the kernel refuses a path that leaves the directory (an absolute one, `..`
above it) or passes through any symbolic link, checked during the lookup
itself, so no rename race can redirect it. The member is first opened
O_PATH (which opens nothing: a FIFO's or a device's open is not run) and
checked to be a regular file, then opened O_RDONLY | O_NONBLOCK and checked
again to be the same inode: a FIFO swapped in between is seen, never waited
on. On a kernel without openat2 (before 5.6, or a seccomp filter answering
ENOSYS) the path is walked one component at a time with
O_NOFOLLOW | O_DIRECTORY, `..` refused, to the same effect.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from typing import Any

SYS_OPENAT2 = 437  # the same number on every architecture (asm-generic)
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class NotRegularError(OSError):
    """The member is there, beneath the directory, but is not a regular file (the message says what it is)."""

    def __init__(self, name: str, problem: str) -> None:
        super().__init__(errno.EINVAL, problem, name)

    def __reduce__(self) -> tuple[Any, ...]:
        # OSError's own reduce passes (errno, strerror, filename), which this constructor does not take
        return type(self), (self.filename, self.strerror), self.__dict__ or None


def _openat2(dirfd: int, name: str, flags: int, mode: int) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
    fd = _libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dirfd), os.fsencode(name), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), name)
    return int(fd)


def _walk_open(dirfd: int, name: str, flags: int, mode: int) -> int:
    """openat2's resolution, by hand: each directory opened O_NOFOLLOW, `..` and absolute names refused."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or not parts:
        raise OSError(errno.EXDEV, "leaves the directory", name)
    fd = os.dup(dirfd)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except NotADirectoryError:  # O_DIRECTORY|O_NOFOLLOW on a link: ENOTDIR, openat2's ELOOP
                if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name) from None
                raise
            os.close(fd)
            fd = nxt
        last = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        if stat.S_ISLNK(os.fstat(last).st_mode):  # O_PATH|O_NOFOLLOW opens the link itself
            os.close(last)
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
        return last
    except OSError as exc:
        exc.filename = name
        raise
    finally:
        os.close(fd)


def open_beneath(dirfd: int, name: str, flags: int, mode: int = 0) -> int:
    """An fd of `name` below the directory `dirfd`, resolved as the module says (`mode` for O_CREAT).
    OSError as openat2's: ELOOP for a link on the way, EXDEV for a path leaving the directory, ENOENT..."""
    try:
        return _openat2(dirfd, name, flags, mode)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EPERM):  # EPERM: a seccomp filter's answer, not openat2's
            raise
    return _walk_open(dirfd, name, flags, mode)


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, word in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISLNK, "symbolic link")):
        if test(mode):
            return word
    return "special file"


def open_regular(dirfd: int, name: str) -> int:
    """A read-only, blocking fd of the regular file `name` below `dirfd`; NotRegularError for anything
    else (a FIFO is never waited on, a device never opened), OSError as open_beneath's."""
    probe = open_beneath(dirfd, name, os.O_PATH)
    try:
        first = os.fstat(probe)
    finally:
        os.close(probe)
    if not stat.S_ISREG(first.st_mode):
        raise NotRegularError(name, f"a {kind_of(first.st_mode)}, not a regular file")
    fd = open_beneath(dirfd, name, os.O_RDONLY | os.O_NONBLOCK)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (first.st_dev, first.st_ino):
        os.close(fd)
        raise NotRegularError(name, "replaced while it was being opened: not the regular file it was")
    os.set_blocking(fd, True)
    return fd
