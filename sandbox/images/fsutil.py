"""File-system helpers of the store: its own paths, atomic writes, durable renames, locks.

Everything the store publishes appears by rename(2) of a finished, synced
temporary (a file, or a whole layer directory), so a reader sees it complete
or not at all, whatever happened to the writer. The store's directories
are opened beneath its root with no link on the way (`own_dir`), and the
helpers here work relative to those fds (`*_at`), never by a path a
planted link could redirect.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator

from . import beneath, treewalk
from .errors import ImageError, StoreFullError

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


def fresh(prefix: str) -> str:
    """A fresh name for a temporary of the store's tmp/."""
    return f"{prefix}.{os.getpid()}.{secrets.token_hex(6)}"


def refused(where: str, name: str, exc: OSError) -> ImageError:
    """The ImageError for a store path that could not be opened beneath the store's root."""
    if exc.errno == errno.ELOOP:
        problem = ("is a symbolic link, or lies below one: the store never follows a link in its own "
                   "directories (something other than the store wrote there: remove it)")
    elif isinstance(exc, beneath.NotRegularError):
        problem = f"is {exc.strerror} (something other than the store wrote there: remove it)"
    elif exc.errno == errno.ENOTDIR:
        problem = "is not a directory (something other than the store wrote there: remove it)"
    else:
        problem = exc.strerror or str(exc)
    return ImageError(f"image store at {where}: {name} {problem}")


def own_dir(root: int, name: str, where: str) -> int:
    """The store's directory `name` (relative to its root `root`), opened beneath it with no link on
    the way (beneath.py); ImageError naming it otherwise."""
    try:
        return beneath.open_beneath(root, name, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise refused(where, name, exc) from None


def read_own(dirfd: int, name: str, limit: int, where: str) -> bytes:
    """A small regular file of the store's, read beneath `dirfd` (FileNotFoundError if it is not there)."""
    try:
        fd = beneath.open_regular(dirfd, name)  # a FIFO is not waited on, a device not opened
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise refused(where, name, exc) from None
    try:
        st = os.fstat(fd)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(min(limit, st.st_size + 1))  # (a buffer of `limit` bytes costs more than the read)
    finally:
        os.close(fd)


def write_atomic_at(dirfd: int, name: str, data: bytes, tmpfd: int) -> None:
    """Write `data` to a temporary in `tmpfd`, fsync it, rename it over `name` of `dirfd`, fsync that."""
    tmp = fresh("file")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=tmpfd)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=tmpfd)
        raise
    os.close(fd)
    os.rename(tmp, name, src_dir_fd=tmpfd, dst_dir_fd=dirfd)
    os.fsync(dirfd)


def publish_dir_at(tmpfd: int, tmp: str, dirfd: int, name: str) -> bool:
    """rename(2) the finished directory `tmp` of `tmpfd` to `name` of `dirfd`; False when another
    process published the same content first (then `tmp` is removed)."""
    try:
        os.rename(tmp, name, src_dir_fd=tmpfd, dst_dir_fd=dirfd)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        treewalk.remove_entry(tmpfd, tmp)
        return False
    os.fsync(dirfd)
    return True


class StoreLock:
    """flock(2) on a lock file of the store (`name`, relative to the store's
    root `root`), opened beneath the root, never through a link: shared
    while a pull or load adds to the store, exclusive while garbage
    collection removes from it, so gc never removes what a concurrent pull
    is about to name."""

    def __init__(self, root: str, name: str) -> None:
        self.root = root
        self.name = name

    @contextlib.contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        """Hold the lock (blocking) for the duration of the block."""
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = beneath.open_beneath(root, self.name, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            raise refused(self.root, self.name, exc) from None
        finally:
            os.close(root)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ImageError(f"image store at {self.root}: {self.name} is not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock
