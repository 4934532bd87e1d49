"""An image's layers made into a sandbox's root: overlay-ready layers, and
merged trees where overlayfs cannot be mounted.

- **Overlay-ready**: unpacking records a layer's whiteouts and opaque
  directories beside its tree (layer.json). overlayfs, mounted with
  `userxattr` in the sandbox's user namespace, reads them from the tree
  itself: a whiteout is a 0:0 character device (which an unprivileged user
  may make since Linux 5.8), an opaque directory carries
  `user.overlay.opaque=y`. `make_overlay_ready` writes them once per layer,
  under that layer's lock, and then the marker file `overlay` beside the
  tree (a store written before this keeps working: its layers get theirs on
  first use).
- **Merged**: one tree per image, `merged/<hex>/` in the store, the layers
  applied bottom first with their deletions: every file a hardlink to the
  layer's (no data copied), directories made afresh; built in tmp/ and
  published by rename(2), so a merged tree is complete or absent. It also
  holds the mount points a read-only root needs (`MOUNT_POINTS`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Iterable, Iterator

from . import fsutil, treewalk
from .errors import ImageError
from .model import Image, Layer

OVERLAY_MARK = "overlay"  # layers/<hex>/overlay: the tree has its whiteout devices and opaque xattrs
OPAQUE_XATTR = "user.overlay.opaque"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What a read-only root needs to mount on, made in a merged tree where the image lacks them.
MOUNT_POINTS = ("proc", "dev")


def store_path(image: Image) -> str | None:
    """The store an image's layers are in (each is <store>/layers/<hex>/root), None for no layers."""
    return os.path.dirname(os.path.dirname(os.path.dirname(image.layers[0].path))) if image.layers else None


def scratch_dirs(image: Image) -> tuple[str, ...]:
    """Where a read-only root of `image` gets a fresh tmpfs: /tmp, /run,
    /var/tmp, the image's home ($HOME, else /root) and working directory."""
    home = dict(image.config.env).get("HOME", "/root")
    dirs = ("/tmp", "/run", "/var/tmp", home, image.config.working_dir or "/")
    return tuple(dict.fromkeys(d for d in dirs if d.startswith("/") and _split(d)))


@contextlib.contextmanager
def _layer_tree(layer: Layer) -> Iterator[int]:
    """An fd of a layer's tree (<store>/layers/<hex>/root), opened beneath its store's root with no
    link on the way, as the store opens it (fsutil.own_dir): ImageError if something planted one."""
    layer_dir = os.path.dirname(layer.path)
    store = os.path.dirname(os.path.dirname(layer_dir))
    root = os.open(store, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = fsutil.own_dir(root, f"layers/{os.path.basename(layer_dir)}/root", store)
    finally:
        os.close(root)
    try:
        yield fd
    finally:
        os.close(fd)


def read_file(layer: Layer, path: str, limit: int = 1 << 20) -> bytes | None:
    """The file `path` of one layer's tree, read without following any link
    (an image's /etc/passwd may be a link to the host's): None if it is not
    a regular file of that layer."""
    parts = _split(path)
    with _layer_tree(layer) as top:
        try:
            with _walk_fd(top, parts[:-1]) as fd:
                f = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return None
    try:
        return os.read(f, limit) if stat.S_ISREG(os.fstat(f).st_mode) else None
    finally:
        os.close(f)


def _split(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


@contextlib.contextmanager
def _writable(fd: int) -> Iterator[None]:
    """Directory `fd` writable by its owner for the block (a layer may have made it read-only)."""
    mode = os.fstat(fd).st_mode
    if mode & stat.S_IWUSR or os.geteuid() == 0:
        yield
        return
    os.fchmod(fd, stat.S_IMODE(mode) | stat.S_IWUSR)
    try:
        yield
    finally:
        os.fchmod(fd, stat.S_IMODE(mode))


def make_overlay_ready(layer_fd: int, name: str, whiteouts: Iterable[str], opaque: Iterable[str],
                       tmp_fd: int) -> None:
    """Write a layer's whiteout devices and opaque xattrs into its tree, make
    them durable, then mark the layer (the caller holds the layer's lock).
    `layer_fd` is the layer's directory (layers/<hex>, `name` in errors),
    `tmp_fd` the store's tmp/."""
    root = os.open("root", DIR_FLAGS, dir_fd=layer_fd)
    try:
        _write_markers(root, whiteouts, opaque)
        fsutil.syncfs(root)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise ImageError(f"layer {name}: a whiteout or opaque directory lies below "
                         f"a link the layer itself makes ({exc.filename or exc}): it cannot be an overlayfs "
                         "layer; use root='merged'") from None
    finally:
        os.close(root)
    fsutil.write_atomic_at(layer_fd, OVERLAY_MARK, b"1\n", tmp_fd)


def _write_markers(root: int, whiteouts: Iterable[str], opaque: Iterable[str]) -> None:
    for path in whiteouts:
        parts = _split(path)
        with _walk_fd(root, parts[:-1], create=True) as fd, _writable(fd):
            try:
                os.mknod(parts[-1], stat.S_IFCHR | 0o600, os.makedev(0, 0), dir_fd=fd)
            except FileExistsError:
                pass  # the layer puts something there itself: that wins, as in the tar
    for path in opaque:  # a user.* xattr wants write permission on the directory, as an entry would
        with _walk_fd(root, _split(path), create=True) as fd, _writable(fd):
            os.setxattr(fd, OPAQUE_XATTR, b"y")


def _overlay(src_top: int, dst_top: int, dirs: list[tuple[str, os.stat_result]]) -> None:
    """Apply the tree at `src_top` onto the merged tree at `dst_top`: files hardlinked,
    directories merged; each directory's final mode and owner noted in `dirs`. Iterative
    (treewalk.Cursor): any depth, two fds held."""
    src, dst = treewalk.Cursor(src_top), treewalk.Cursor(dst_top)
    pending = [os.listdir(src.fd)]
    try:
        while pending:
            if not pending[-1]:
                pending.pop()
                if pending:
                    src.ascend()
                    dst.ascend()
                continue
            name = pending[-1].pop()
            st = os.lstat(name, dir_fd=src.fd)
            if stat.S_ISDIR(st.st_mode):
                _make_dir(dst.fd, name)
                dirs.append((_join(src.path, name), st))
                src.descend(name)
                dst.descend(name)
                pending.append(os.listdir(src.fd))
            elif stat.S_ISCHR(st.st_mode):
                pass  # a whiteout device of make_overlay_ready (unpacking drops the image's devices)
            else:
                treewalk.remove_entry(dst.fd, name)
                os.link(name, name, src_dir_fd=src.fd, dst_dir_fd=dst.fd, follow_symlinks=False)
    finally:
        src.close()
        dst.close()


def _make_dir(fd: int, name: str) -> None:
    """A directory `name` in `fd`, replacing what a lower layer had there if it is not one."""
    try:
        if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
            return
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass
    os.mkdir(name, 0o700, dir_fd=fd)


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


def build_merged(image: Image, layer_fds: list[int], tmp_fd: int, merged_fd: int, name: str) -> None:
    """The merged tree of `image` (its layers' trees open as `layer_fds`, bottom first) at `name` of
    `merged_fd`, built in `tmp_fd` (the store's tmp/) and renamed there (a concurrent builder's
    identical tree may win: then it is used)."""
    tmp = fsutil.fresh("merged")
    os.mkdir(tmp, 0o700, dir_fd=tmp_fd)
    try:
        dirs: list[tuple[str, os.stat_result]] = []
        with _walk_fd(tmp_fd, (tmp,)) as dst:
            for layer, src in zip(image.layers, layer_fds, strict=True):
                _apply_layer(layer, src, dst, dirs)
            for path in (*MOUNT_POINTS, *scratch_dirs(image)):
                with contextlib.suppress(OSError), _walk_fd(dst, _split(path), create=True):
                    pass  # a path through a link of the image's gets none: mounting there fails, named
            _finish_dirs(dst, dirs)
            fsutil.syncfs(dst)
    except BaseException:
        treewalk.remove_entry(tmp_fd, tmp)
        raise
    fsutil.publish_dir_at(tmp_fd, tmp, merged_fd, name)


def _apply_layer(layer: Layer, src: int, dst: int, dirs: list[tuple[str, os.stat_result]]) -> None:
    for path in layer.opaque:  # the lower layers' contents of an opaque directory go first
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), _walk_fd(dst, _split(path)) as fd:
            treewalk.clear(fd)
    for path in layer.whiteouts:
        parts = _split(path)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), _walk_fd(dst, parts[:-1]) as fd:
            treewalk.remove_entry(fd, parts[-1])
    dirs.append(("", os.fstat(src)))
    _overlay(src, dst, dirs)


@contextlib.contextmanager
def _walk_fd(top: int, parts: Iterable[str], create: bool = False) -> Iterator[int]:
    """An fd of directory `parts` below the directory fd `top`, as _walk (`create`: made where missing)."""
    fd = os.dup(top)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            nxt = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _finish_dirs(top: int, dirs: list[tuple[str, os.stat_result]]) -> None:
    """Each directory gets the mode (and, for root, the owner) of the top-most
    layer that has it (the last noted wins: layers go bottom first), deepest
    first: set as the walk leaves it, once its own entries are done."""
    final = dict(dirs)
    as_root = os.geteuid() == 0

    def apply(fd: int, path: str) -> None:
        st = final.get(path)
        if st is None:
            return  # a directory the store made (a mount point), not a layer's
        if as_root:
            os.fchown(fd, st.st_uid, st.st_gid)
        os.fchmod(fd, stat.S_IMODE(st.st_mode))

    cur = treewalk.Cursor(top)
    pending = [treewalk.subdirs(cur.fd)]
    try:
        while pending:
            if not pending[-1]:
                pending.pop()
                if pending:
                    cur.ascend(functools.partial(apply, path=cur.path))
                continue
            cur.descend(pending[-1].pop())
            pending.append(treewalk.subdirs(cur.fd))
        apply(cur.fd, "")
    finally:
        cur.close()
