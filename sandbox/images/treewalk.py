"""Walking the store's trees at any depth: no recursion, one directory fd per tree.

A layer's tree is the image's: it may be thousands of directories deep.
A recursive walk (shutil.rmtree, os.walk before Python 3.12, a function
calling itself) raises RecursionError near 1,000 levels, and a walk that
keeps an fd per level runs out of fds (RLIMIT_NOFILE is often 1,024). So a
`Cursor` holds the fd of the one directory it is in and, for each level
above, only the (st_dev, st_ino) it saw on the way down: it goes back up by
opening `..` and checking that identity, so a directory renamed while it was
walked is an ImageError, never a walk of somewhere else. Every lookup is
relative to the fd with O_NOFOLLOW: a link in the tree is an entry, never a
way out of it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable

from .errors import ImageError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class Cursor:
    """A position in a tree: the fd of the current directory, the identities of those above it."""

    def __init__(self, top: int) -> None:
        self.fd = os.dup(top)
        self.trail = [_ident(os.fstat(self.fd))]
        self.names: list[str] = []  # the components from the top to here

    @property
    def path(self) -> str:
        """Where the cursor is, relative to the top ("" at the top)."""
        return "/".join(self.names)

    def descend(self, name: str, own: bool = False) -> None:
        """Into the subdirectory `name` (never through a link). `own`: a directory the store may make
        readable first (one it is removing: a layer may have made it 0)."""
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        except PermissionError:
            if not own:
                raise
            # EACCES, not ELOOP or ENOTDIR, from an O_NOFOLLOW|O_DIRECTORY open: a directory, ours
            os.chmod(name, 0o700, dir_fd=self.fd)
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        self.trail.append(_ident(os.fstat(fd)))
        self.names.append(name)
        os.close(self.fd)
        self.fd = fd

    def ascend(self, on_leave: Callable[[int], None] | None = None) -> str:
        """Back to the parent; `on_leave(fd)` is called on the directory left, once `..` is open (so
        it may take the directory's own search permission away). The name of the directory left."""
        parent = os.open("..", DIR_FLAGS, dir_fd=self.fd)
        try:
            if _ident(os.fstat(parent)) != self.trail[-2]:
                raise ImageError(f"{self.path}: moved while the image store walked it; nothing more was done "
                                 "below its old place")
            if on_leave is not None:
                on_leave(self.fd)
        except BaseException:
            os.close(parent)
            raise
        os.close(self.fd)
        self.fd = parent
        self.trail.pop()
        return self.names.pop()

    def close(self) -> None:
        """Close the fd held."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def subdirs(fd: int) -> list[str]:
    """The names of the directories in directory `fd` (not of links to some)."""
    with os.scandir(fd) as entries:
        return [e.name for e in entries if e.is_dir(follow_symlinks=False)]


def _is_dir(fd: int, name: str) -> bool | None:
    try:
        return stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode)
    except FileNotFoundError:
        return None


def clear(top: int) -> None:
    """Remove everything in the directory `top` (which stays open, and empty), whatever its depth;
    directories a layer made read-only are made writable on the way."""
    cur = Cursor(top)
    pending = [os.listdir(cur.fd)]
    try:
        while pending:
            if not pending[-1]:
                pending.pop()
                if pending:
                    os.rmdir(cur.ascend(), dir_fd=cur.fd)
                continue
            name = pending[-1].pop()
            kind = _is_dir(cur.fd, name)
            if kind:
                cur.descend(name, own=True)
                with contextlib.suppress(OSError):
                    os.fchmod(cur.fd, 0o700)  # to remove its entries
                pending.append(os.listdir(cur.fd))
            elif kind is not None:
                os.unlink(name, dir_fd=cur.fd)
    finally:
        cur.close()


def remove_entry(dirfd: int, name: str) -> None:
    """Remove the entry `name` of directory `dirfd`: a whole tree if it is a directory (never
    following a link), nothing if it is not there."""
    kind = _is_dir(dirfd, name)
    if kind is None:
        return
    if not kind:
        os.unlink(name, dir_fd=dirfd)
        return
    cur = Cursor(dirfd)
    try:
        cur.descend(name, own=True)
        with contextlib.suppress(OSError):
            os.fchmod(cur.fd, 0o700)
        clear(cur.fd)
    finally:
        cur.close()
    os.rmdir(name, dir_fd=dirfd)
