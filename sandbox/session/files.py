"""A Session's files without a command: read_file and write_file.

Every path is resolved by openat2(2) with RESOLVE_IN_ROOT on an fd of the
session's root, taken from its pid 1 (/proc/PID/root) when it started: `..`
and every symlink, absolute or relative, are resolved as if that root were
/ (a planted link cannot lead out), and magic links (/proc/*/fd/*) are not
followed. The file is first opened O_PATH, which opens nothing of a device
or FIFO, and is only reopened for reading or writing (through the caller's
/proc/self/fd, the same inode, no second lookup) once fstat says it is a
regular file. A file created here belongs to the session's user.
"""

from __future__ import annotations

import errno as E
import os
import posixpath
import stat
from collections.abc import Callable

from .._core.binding import ffi, lib
from ..errors import SpecError

RESOLVE_NO_MAGICLINKS = 0x02  # linux/openat2.h
RESOLVE_IN_ROOT = 0x10
RESOLVE = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
MAX_RETRIES = 1000
KINDS = {stat.S_IFIFO: "FIFO", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
         stat.S_IFSOCK: "socket", stat.S_IFLNK: "symlink"}


class Root:
    """The session's root, as its pid 1 (host pid `pid`) sees it."""

    def __init__(self, pid: int) -> None:
        self.fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.uid, self.gid = _ids(pid)
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = "/"
        self.cwd = cwd if cwd.startswith("/") else "/"

    def close(self) -> None:
        """Close the root's fd (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _path(self, path: str | os.PathLike[str]) -> str:
        text = os.fspath(path)
        if not isinstance(text, str) or not text or "\0" in text:
            raise SpecError("path", path, "must be a non-empty path without NUL bytes")
        return text if text.startswith("/") else posixpath.join(self.cwd, text)

    def _open(self, path: str, flags: int, mode: int = 0) -> int:
        encoded = os.fsencode(path)
        for _ in range(MAX_RETRIES):
            fd = int(lib.sbx_openat2(self.fd, encoded, flags | os.O_CLOEXEC, mode, RESOLVE))
            if fd >= 0:
                return fd
            err = ffi.errno
            if err != E.EAGAIN:  # EAGAIN: a rename or mount anywhere raced a ".." step; openat2(2) says retry
                break
        raise OSError(err, f"{os.strerror(err)} (in the session)", path)

    def _regular(self, fd: int, path: str) -> None:
        """Raise unless `fd` is a regular file."""
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(E.EISDIR, "Is a directory (in the session)", path)
        if not stat.S_ISREG(mode):
            kind = KINDS.get(stat.S_IFMT(mode), "special file")
            raise OSError(E.EINVAL, f"a {kind}, not a regular file: refused (in the session)", path)

    def read_file(self, path: str | os.PathLike[str], max_bytes: int | None = None) -> bytes:
        """The contents of `path` in the session (at most `max_bytes`: EFBIG beyond)."""
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
            raise SpecError("max_bytes", max_bytes, "must be a number of bytes (0 or more) or None")
        where = self._path(path)
        fd = self._open(where, os.O_PATH)
        try:
            self._regular(fd, where)
            rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        finally:
            os.close(fd)
        try:
            return _read_all(rfd, where, max_bytes)
        finally:
            os.close(rfd)

    def write_file(self, path: str | os.PathLike[str], data: bytes | str, mode: int = 0o644,
                   parents: bool = False) -> None:
        """Write `data` to `path` in the session: an existing regular file is
        truncated (its mode kept); a new one is made with `mode`, owned by the
        session's user, its directories too when `parents`."""
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SpecError("data", data, "must be bytes or str")
        if isinstance(mode, bool) or not isinstance(mode, int) or not 0 <= mode <= 0o7777:
            raise SpecError("mode", mode, "must be a permission mode such as 0o644")
        where = self._path(path)
        for _ in range(8):  # a file planted between the lookup and O_EXCL: look again
            wfd = self._open_for_write(where, mode, parents)
            if wfd >= 0:
                break
        else:
            raise OSError(E.EAGAIN, "the file kept changing while it was written (in the session)", where)
        try:
            _write_all(wfd, memoryview(data))
        finally:
            os.close(wfd)

    def _open_for_write(self, where: str, mode: int, parents: bool) -> int:
        try:
            fd = self._open(where, os.O_PATH)
        except FileNotFoundError:
            return self._create(where, mode, parents)
        try:
            self._regular(fd, where)
            return _ro_checked(lambda: os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC |
                                               os.O_NOCTTY), where)
        finally:
            os.close(fd)

    def _create(self, where: str, mode: int, parents: bool) -> int:
        """A new file (-1 if something appeared there meanwhile)."""
        parent, name = posixpath.split(where.rstrip("/") or "/")
        if not name or name in (".", "..") or where.endswith("/"):
            raise IsADirectoryError(E.EISDIR, "Is a directory (in the session)", where)
        dfd = self._directory(parent, parents)
        try:
            fd = _ro_checked(lambda: os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC |
                                             os.O_NOCTTY | os.O_NOFOLLOW, mode, dir_fd=dfd), where)
        except FileExistsError:
            if stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                raise FileNotFoundError(E.ENOENT, "a symlink to nothing (in the session): not followed",
                                        where) from None
            return -1
        finally:
            os.close(dfd)
        self._own(fd)
        os.fchmod(fd, mode)  # whatever the caller's umask
        return fd

    def _directory(self, path: str, parents: bool) -> int:
        """An O_PATH fd of the directory `path`, made (with its parents) if `parents`."""
        try:
            return self._open(path, os.O_PATH | os.O_DIRECTORY)
        except FileNotFoundError:
            if not parents or path == "/":
                raise
        up, name = posixpath.split(path.rstrip("/"))
        dfd = self._directory(up or "/", parents)
        try:
            _ro_checked(lambda: os.mkdir(name, 0o755, dir_fd=dfd), path)
            if (self.uid, self.gid) != (os.geteuid(), os.getegid()):
                os.chown(name, self.uid, self.gid, dir_fd=dfd, follow_symlinks=False)
        except FileExistsError:
            pass
        finally:
            os.close(dfd)
        return self._open(path, os.O_PATH | os.O_DIRECTORY)

    def _own(self, fd: int) -> None:
        if (self.uid, self.gid) != (os.geteuid(), os.getegid()):
            os.fchown(fd, self.uid, self.gid)


def _ids(pid: int) -> tuple[int, int]:
    """The effective uid and gid of a process, as the caller numbers them."""
    uid = gid = -1
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):
                uid = int(line.split()[2])
            elif line.startswith(b"Gid:"):
                gid = int(line.split()[2])
    return uid, gid


def _ro_checked(op: Callable[[], int | None], path: str) -> int:
    """Run `op`; a read-only filesystem is a PermissionError, as a command sees it."""
    try:
        result = op()
    except OSError as exc:
        if exc.errno == E.EROFS:
            raise PermissionError(E.EROFS, "Read-only file system (in the session)", path) from None
        raise
    return int(result) if result is not None else 0


def _read_all(fd: int, path: str, max_bytes: int | None) -> bytes:
    size = os.fstat(fd).st_size
    want = size + 1 if max_bytes is None else min(size, max_bytes) + 1
    chunks = []
    total = 0
    while True:
        block = os.read(fd, max(want, 65536) if max_bytes is None else max(1, min(want, max_bytes + 1 - total)))
        if not block:
            break
        chunks.append(block)
        total += len(block)
        if max_bytes is not None and total > max_bytes:
            raise OSError(E.EFBIG, f"larger than max_bytes={max_bytes} (in the session)", path)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        n = os.write(fd, view)
        view = view[n:]
