"""File-system helpers of the store: atomic writes, durable renames, locks, removal.

Everything the store publishes appears by rename(2) of a finished, synced
temporary (a file, or a whole layer directory), so a reader sees it complete
or not at all, whatever happened to the writer.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
from collections.abc import Iterator

from . import treewalk
from .errors import StoreFullError

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def full_disk_is_typed(where: str) -> Iterator[None]:
    """Turn ENOSPC, EDQUOT and EFBIG (RLIMIT_FSIZE) into StoreFullError."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _FULL and not isinstance(exc, StoreFullError):
            raise StoreFullError(exc.errno, where, os.strerror(exc.errno)) from exc
        raise


def syncfs(fd: int) -> None:
    """syncfs(2): flush the file system holding fd (one call for a whole layer's files)."""
    if _libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def fsync_dir(path: str) -> None:
    """Make a rename or an unlink in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_name(directory: str, prefix: str) -> str:
    """A fresh name in `directory` (the store's tmp/)."""
    return os.path.join(directory, f"{prefix}.{os.getpid()}.{secrets.token_hex(6)}")


def write_atomic(path: str, data: bytes, tmp_dir: str) -> None:
    """Write `data` to a temporary, fsync it, rename it over `path`, fsync the directory."""
    tmp = temp_name(tmp_dir, "file")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path))


def publish_dir(tmp: str, final: str) -> bool:
    """rename(2) a finished directory into place; False when another process
    published the same content first (then `tmp` is removed)."""
    try:
        os.rename(tmp, final)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        remove_tree(tmp)
        return False
    fsync_dir(os.path.dirname(final))
    return True


def remove_tree(path: str) -> None:
    """Remove a tree the store made, even where a layer made directories
    read-only (each is made writable first), at any depth (treewalk.py);
    never follows a symlink."""
    parent = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        treewalk.remove_entry(parent, os.path.basename(path))
    finally:
        os.close(parent)


class StoreLock:
    """flock(2) on the store's lock file: shared while a pull or load adds to
    the store, exclusive while garbage collection removes from it, so gc never
    removes what a concurrent pull is about to name."""

    def __init__(self, path: str) -> None:
        self.path = path

    @contextlib.contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        """Hold the lock (blocking) for the duration of the block."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock
