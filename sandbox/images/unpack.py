"""Unpacking one layer tarball into its own, fresh directory, without ever writing outside it.

A layer is untrusted input. Every member's path is resolved from the layer's
root one component at a time with openat(O_NOFOLLOW|O_DIRECTORY): a `..`
component is refused, an absolute path is taken relative to the root, and a
parent that is a symlink (which only this layer can have made, the
directory being fresh) or a file is refused, so no write ever goes through a
link. Hardlink targets are resolved the same way, inside the root, and
linked with linkat() without following. Regular files are written with
holes for runs of zeros and their declared sizes count against a limit, so
a huge sparse file costs neither disk nor time beyond the limit.

What the kernel would not let an unprivileged user have, and what an image
must not carry onto the host, is dropped for every caller: device nodes,
setuid/setgid bits, xattrs outside the `user.` namespace. As root, owners
are kept. Whiteouts (`.wh.NAME`) and opaque markers (`.wh..wh..opq`) are not
written into the tree: they are returned, to be recorded beside it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tarfile
import time
from dataclasses import dataclass, field
from typing import IO

from . import treewalk
from .errors import ImageFormatError, UnsafeLayerError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_CHUNK = 1 << 20
_BLOCK = 1 << 16
_ZEROS = bytes(_BLOCK)
_KEPT_FDS = 128
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
HEADER = 512  # what each member costs against max_bytes besides its data: its tar header (an inode on disk)


@dataclass(frozen=True)
class Bounds:
    """What one layer may hold: `max_bytes` of declared file sizes plus HEADER per member (so 20,000 empty
    files are 10 MB, not nothing), `max_members` tar members (each an inode), and paths at most `max_depth`
    components deep."""

    max_bytes: int
    max_members: int
    max_depth: int


@dataclass
class Unpacked:
    """What a layer left beside its tree: paths (relative, `/`-separated) it
    deletes from the layers below, directories it makes opaque, and what was
    dropped (device nodes, setuid bits) with the member's path."""

    whiteouts: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    size: int = 0


@dataclass
class _Dir:
    parts: tuple[str, ...]
    member: tarfile.TarInfo


class _Unpacker:
    def __init__(self, root_fd: int, layer: str, bounds: Bounds) -> None:
        self.root_fd = root_fd
        self.layer = layer
        self.bounds = bounds
        self.members = 0
        self.as_root = os.geteuid() == 0
        self.out = Unpacked()
        self.dirs: dict[tuple[str, ...], _Dir] = {}
        self.fds: dict[tuple[str, ...], int] = {}  # directories walked, by path (see open_dir)

    def refuse(self, member: str, problem: str) -> UnsafeLayerError:
        return UnsafeLayerError(self.layer, member, problem)

    def parts(self, name: str) -> tuple[str, ...]:
        """A member's path as components below the root; `..` is refused."""
        parts = tuple(p for p in name.split("/") if p not in ("", "."))  # a leading `/` is the root
        if ".." in parts:
            raise self.refuse(name, "a `..` component would leave the layer's directory")
        if len(parts) > self.bounds.max_depth:
            raise self.refuse(name[:200] + "...", f"{len(parts)} components deep, more than the limit of "
                              f"{self.bounds.max_depth} (max_layer_depth)")
        return parts

    def open_dir(self, parts: tuple[str, ...], member: str, create: bool) -> int:
        """A new fd of the directory `parts` (creating missing ones), never through a symlink.

        The fds of directories already walked are kept (tar lists a
        directory's entries together): a walk starts from the longest kept
        prefix. They are all dropped whenever a directory is removed, so a
        kept fd always is the directory now at that path."""
        start = len(parts)
        while start and parts[:start] not in self.fds:
            start -= 1
        fd = self.fds[parts[:start]] if start else self.root_fd
        for i in range(start, len(parts)):
            part = parts[i]
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o700, dir_fd=fd)
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                self.dirs[parts[: i + 1]] = _Dir(parts[: i + 1], _implicit_dir("/".join(parts[: i + 1])))
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = "/".join(parts[: i + 1])
                    raise self.refuse(member, f"{where!r} is a symlink or a file, not a directory: "
                                      "nothing is written through it") from None
                raise
            self.keep(parts[: i + 1], nfd)
            fd = nfd
        return os.dup(fd)

    def keep(self, parts: tuple[str, ...], fd: int) -> None:
        if len(self.fds) >= _KEPT_FDS:
            self.drop_fds()
        self.fds[parts] = fd

    def drop_fds(self) -> None:
        """Close every kept directory fd."""
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def clear(self, dfd: int, parts: tuple[str, ...], keep_dir: bool = False) -> None:
        """Remove what is at `parts` (a later member replaces an earlier one)."""
        name = parts[-1]
        try:
            st = os.lstat(name, dir_fd=dfd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
            self.drop_fds()  # one of them may be this directory or below it
            treewalk.remove_entry(dfd, name)  # fd-based, never follows a symlink, any depth
            n = len(parts)
            for gone in [d for d in self.dirs if d[:n] == parts]:
                del self.dirs[gone]
        else:
            os.unlink(name, dir_fd=dfd)

    def add(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        self.admit(m)
        parts = self.parts(m.name)
        if not parts:
            return  # the root itself: its mode is the store's
        base = parts[-1]
        if base.startswith(WHITEOUT):
            self.whiteout(m, parts)
            return
        if m.isdir():
            dfd = self.open_dir(parts[:-1], m.name, create=True)
            try:
                self.clear(dfd, parts, keep_dir=True)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(base, 0o700, dir_fd=dfd)
            finally:
                os.close(dfd)
            self.dirs[parts] = _Dir(parts, m)
            return
        if m.ischr() or m.isblk():
            self.out.dropped.append(f"{m.name}: device node")
            return
        self.count(m)
        dfd = self.open_dir(parts[:-1], m.name, create=True)
        try:
            self.clear(dfd, parts)
            if m.isreg():
                self.file(tf, m, dfd, base)
            elif m.issym():
                os.symlink(m.linkname, base, dir_fd=dfd)  # never followed by the store
            elif m.islnk():
                self.hardlink(m, dfd, base)
                return
            elif m.isfifo():
                os.mkfifo(base, self.mode(m), dir_fd=dfd)
            else:
                self.out.dropped.append(f"{m.name}: tar type {m.type!r}")
                return
            self.finish(dfd, base, m)
        finally:
            os.close(dfd)

    def admit(self, m: tarfile.TarInfo) -> None:
        """Count one more member (whatever it is: a directory, a whiteout and a dropped device are inodes
        or headers too) against max_members, and its header against max_bytes."""
        self.members += 1
        if self.members > self.bounds.max_members:
            raise self.refuse(m.name, f"the layer has more than the limit of {self.bounds.max_members} members "
                              "(max_layer_members)")
        self.check_bytes(m)

    def count(self, m: tarfile.TarInfo) -> None:
        self.out.size += max(0, m.size)
        self.check_bytes(m)

    def check_bytes(self, m: tarfile.TarInfo) -> None:
        if self.out.size + HEADER * self.members > self.bounds.max_bytes:
            raise self.refuse(m.name, f"the layer's files and members add up to more than the limit of "
                              f"{self.bounds.max_bytes} bytes (max_layer_bytes: each member counts {HEADER} "
                              "bytes besides its data)")

    def whiteout(self, m: tarfile.TarInfo, parts: tuple[str, ...]) -> None:
        base = parts[-1]
        dfd = self.open_dir(parts[:-1], m.name, create=True)  # so an opaque directory exists in this layer
        os.close(dfd)
        if base == OPAQUE:
            self.out.opaque.append("/".join(parts[:-1]))
        elif base.startswith(WHITEOUT + WHITEOUT):
            pass  # aufs bookkeeping (.wh..wh.plnk, ...), not a deletion
        else:
            target = base[len(WHITEOUT):]
            if target in ("", ".", ".."):
                raise self.refuse(m.name, f"a whiteout of {target!r} names no entry of its directory")
            self.out.whiteouts.append("/".join((*parts[:-1], target)))

    def mode(self, m: tarfile.TarInfo) -> int:
        mode = m.mode & 0o7777
        if mode & (stat.S_ISUID | stat.S_ISGID):
            self.out.dropped.append(f"{m.name}: setuid/setgid bits")
        return mode & ~(stat.S_ISUID | stat.S_ISGID)

    def file(self, tf: tarfile.TarFile, m: tarfile.TarInfo, dfd: int, base: str) -> None:
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            src = tf.extractfile(m)
            if src is not None:
                _copy_sparse(src, fd)
            os.ftruncate(fd, m.size)  # the holes at the end, if any
            self.xattrs(fd, m)
        finally:
            os.close(fd)

    def hardlink(self, m: tarfile.TarInfo, dfd: int, base: str) -> None:
        tparts = self.parts(m.linkname)
        if not tparts:
            raise self.refuse(m.name, "a hardlink to the layer's root")
        try:
            tfd = self.open_dir(tparts[:-1], m.name, create=False)
        except FileNotFoundError:
            raise self.refuse(m.name, f"hardlink target {m.linkname!r} is not in this layer") from None
        try:
            os.link(tparts[-1], base, src_dir_fd=tfd, dst_dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise self.refuse(m.name, f"hardlink target {m.linkname!r} is not in this layer") from None
        except PermissionError:
            raise self.refuse(m.name, f"hardlink target {m.linkname!r} is a directory") from None
        finally:
            os.close(tfd)

    def finish(self, dfd: int, base: str, m: tarfile.TarInfo) -> None:
        """Owner (as root), mode and times of what was just made."""
        if self.as_root:
            os.chown(base, m.uid, m.gid, dir_fd=dfd, follow_symlinks=False)
        if not m.issym():
            os.chmod(base, self.mode(m), dir_fd=dfd)
        with contextlib.suppress(OSError):
            os.utime(base, (m.mtime, m.mtime), dir_fd=dfd, follow_symlinks=False)

    def xattrs(self, fd: int, m: tarfile.TarInfo) -> None:
        for key, value in m.pax_headers.items():
            if not key.startswith("SCHILY.xattr."):
                continue
            name = key[len("SCHILY.xattr."):]
            # user.overlay.* is overlayfs's own bookkeeping under `userxattr`
            # (whiteouts, opaque directories, redirects): only the store writes it
            if not name.startswith("user.") or name.startswith("user.overlay."):
                self.out.dropped.append(f"{m.name}: xattr {name}")
                continue
            with contextlib.suppress(OSError):  # a file system without user xattrs
                os.setxattr(fd, name, value.encode("utf-8", "surrogateescape"))

    def finish_dirs(self) -> None:
        """Directories get their modes last (a read-only one had files to receive), deepest first."""
        for parts in sorted(self.dirs, key=len, reverse=True):
            m = self.dirs[parts].member
            fd = self.open_dir(parts, m.name, create=False)
            try:
                if self.as_root:
                    os.fchown(fd, m.uid, m.gid)
                self.xattrs(fd, m)
                os.fchmod(fd, self.mode(m))
                with contextlib.suppress(OSError):
                    os.utime(fd, (m.mtime, m.mtime))
            finally:
                os.close(fd)


def _implicit_dir(name: str) -> tarfile.TarInfo:
    """A parent the layer does not list: 0755, root's (as tar and Docker make them)."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.mtime = int(time.time())
    return info


def _copy_sparse(src: IO[bytes], fd: int) -> None:
    """Copy, seeking over 64 KiB blocks of zeros instead of writing them."""
    while chunk := src.read(_CHUNK):
        view = memoryview(chunk)
        for at in range(0, len(view), _BLOCK):
            block = view[at:at + _BLOCK]
            if len(block) == _BLOCK and block == _ZEROS:
                os.lseek(fd, _BLOCK, os.SEEK_CUR)
            else:
                while block:
                    block = block[os.write(fd, block):]


def unpack(stream: IO[bytes], dest: int, layer: str, bounds: Bounds) -> Unpacked:
    """Unpack the uncompressed tar `stream` into the empty directory of fd `dest` (left open).

    `layer` names the layer in errors. Raises UnsafeLayerError for a member
    that would leave `dest` or a layer over its `bounds`; tarfile.TarError for
    a corrupt archive. `dest` is left partial on error: the caller removes it.
    """
    root_fd = os.dup(dest)
    u = _Unpacker(root_fd, layer, bounds)
    try:
        with tarfile.open(fileobj=stream, mode="r|", errorlevel=2) as tf:
            for member in tf:
                try:
                    u.add(tf, member)
                except OSError as exc:
                    _typed(exc, layer, member.name)
        try:
            u.finish_dirs()
        except OSError as exc:
            _typed(exc, layer, "(directory modes)")
        return u.out
    finally:
        u.drop_fds()
        os.close(root_fd)


def _typed(exc: OSError, layer: str, member: str) -> None:
    """Re-raise a member's OSError as ImageFormatError (a name too long, too many links, ...), except
    a full disk and a failing download, which the store reports as such."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or isinstance(exc, (ConnectionError, TimeoutError)):
        raise exc
    raise ImageFormatError(f"layer {layer}", f"member {member!r}: {exc.strerror or exc}") from None
