"""The per-user directory's checks: the directory itself, and the files made in it.

The CLI server's own files (the lock, the notes, the socket) and a session
holder's (its socket and log: sandbox/session/clisock.py) are opened
beneath an fd of their directory, checked once as ours and 0700, and
never through a link: a process that can write in that directory (a
sandbox given a bind of it) could otherwise plant a link there and have
the server create, truncate or append to the file it names, as the
server's user (root's: any file).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat


def own_dir(path: str) -> bool:
    """Whether `path` is a directory (not a link) of ours, mode 0700."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return _ours(st, 0o700)


def _ours(st: os.stat_result, mode: int) -> bool:
    return st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == mode


def open_own_dir(path: str) -> int:
    """An fd of the directory `path`, not a link: OSError unless it is ours with mode 0700 (checked
    on the fd: what is checked is what is used)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        raise OSError(exc.errno, f"{path} is not a directory of ours with mode 0700 (a link?)") from None
    if not _ours(os.fstat(fd), 0o700):
        os.close(fd)
        raise OSError(errno.EPERM, f"{path} is not a directory of ours with mode 0700")
    return fd


def open_own(directory: int, name: str, flags: int) -> int:
    """The file `name` in the directory of fd `directory`, never through a link: created (O_EXCL),
    else the one there if it is a regular file of ours with one link (not a link planted to
    another file of ours). OSError otherwise (ELOOP: a symbolic link)."""
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a FIFO planted there never blocks the open
    with contextlib.suppress(FileExistsError):
        return os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=directory)
    try:
        fd = os.open(name, flags, dir_fd=directory)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise OSError(exc.errno, f"{name} is a symbolic link, not a file of ours") from None
    st = os.fstat(fd)
    if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_nlink == 1):
        os.close(fd)
        raise OSError(errno.EPERM, f"{name} is not a regular file of ours with one link")
    return fd


def fresh_file(directory: int, name: str, flags: int) -> int:
    """The file `name` in the directory of fd `directory` made afresh (mode 0600): whatever had the
    name is unlinked first (a link goes, never what it names), and the new file created O_EXCL."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=directory)
    return os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=directory)
