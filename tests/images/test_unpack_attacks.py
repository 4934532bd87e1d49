"""Hostile layers: each tries to write outside its directory, and must fail
with UnsafeLayerError (or be confined), leaving nothing outside and nothing
published. Every attack runs through ImageStore.load end to end, with a
canary directory beside the store that nothing may touch."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from sandbox.images import ImageStore, UnsafeLayerError

from .image_helpers import DIRTYPE, LNKTYPE, SYMTYPE, TestImage, layer, member, write_layout


def snapshot(path: Path) -> dict[str, tuple[int, int, bytes | str]]:
    """Every entry below path: (mode, size, content or link target)."""
    out: dict[str, tuple[int, int, bytes | str]] = {}
    for p in [path, *path.rglob("*")]:
        st = p.lstat()
        content: bytes | str = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else b""
        out[str(p.relative_to(path))] = (st.st_mode, st.st_size, content)
    return out


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, ImageStore]:
    """tmp_path/outside (a canary tree: a file, a directory) and a store at tmp_path/store."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "victim").write_text("untouched\n")
    return outside, ImageStore(tmp_path / "store")


def load_layers(tmp_path: Path, store: ImageStore, *tars: bytes) -> None:
    layout = tmp_path / f"layout{len(os.listdir(tmp_path))}"
    write_layout(str(layout), [(TestImage(list(tars)), None)])
    store.load(layout)


def assert_refused(tmp_path: Path, world: tuple[Path, ImageStore], tar: bytes, match: str) -> None:
    outside, store = world
    before = snapshot(tmp_path / "outside")
    with pytest.raises(UnsafeLayerError, match=match):
        load_layers(tmp_path, store, tar)
    assert snapshot(outside) == before
    for sub in ("refs", "layers", "tmp"):
        assert os.listdir(Path(store.path) / sub) == [], f"{sub}/ kept something of the refused layer"


def test_dotdot_path(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    depth = "../" * 12
    assert_refused(tmp_path, world, layer(member(f"{depth}{tmp_path}/outside/victim", data=b"owned\n")), r"`\.\.`")
    assert_refused(tmp_path, world, layer(member("a/../../../../outside/new", data=b"x")), r"`\.\.`")


def test_absolute_path_stays_inside(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    outside, store = world
    victim = outside / "victim"
    load_layers(tmp_path, store, layer(member(str(victim), data=b"owned\n"), member("/etc/abs", data=b"x")))
    assert victim.read_text() == "untouched\n"
    [img] = store.list()
    root = Path(img.layers[0].path)
    assert (root / str(victim).lstrip("/")).read_text() == "owned\n"  # taken relative to the layer's root
    assert (root / "etc/abs").read_bytes() == b"x"


def test_file_through_a_symlink_it_made(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    outside, _ = world
    tar = layer(member("escape", SYMTYPE, linkname=str(outside)), member("escape/victim", data=b"owned\n"))
    assert_refused(tmp_path, world, tar, "symlink or a file")
    relative = layer(member("up", SYMTYPE, linkname="../../../../../../../../../" + str(outside)),
                     member("up/dir/new", data=b"x"))
    assert_refused(tmp_path, world, relative, "symlink or a file")


def test_directory_replaced_by_a_symlink_then_written_through(tmp_path: Path,
                                                              world: tuple[Path, ImageStore]) -> None:
    """A directory the unpacker has walked (and keeps an fd of), replaced by a symlink: the next
    member under that name must see the symlink, not the directory that was there."""
    outside, _ = world
    tar = layer(member("d/", DIRTYPE, mode=0o755), member("d/f", data=b"in d"),
                member("d", SYMTYPE, linkname=str(outside)), member("d/victim", data=b"owned\n"))
    assert_refused(tmp_path, world, tar, "symlink or a file")


def test_path_through_a_fifo_does_not_block(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    """A FIFO as a parent: refused at lookup (O_DIRECTORY), never opened (which would block)."""
    tar = layer(member("p", tarfile.FIFOTYPE), member("p/x", data=b"x"))
    assert_refused(tmp_path, world, tar, "symlink or a file")


def test_directory_through_a_symlink(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    outside, _ = world
    tar = layer(member("link", SYMTYPE, linkname=str(outside)), member("link/dir/sub", DIRTYPE, mode=0o777))
    assert_refused(tmp_path, world, tar, "symlink or a file")


def test_symlink_replaced_by_a_file_is_not_followed(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    """A symlink, then a regular file of the same name: the link is replaced, not written through."""
    outside, store = world
    load_layers(tmp_path, store, layer(member("f", SYMTYPE, linkname=str(outside / "victim")),
                                       member("f", data=b"owned\n")))
    assert (outside / "victim").read_text() == "untouched\n"
    [img] = store.list()
    assert Path(img.layers[0].path, "f").read_text() == "owned\n"


def test_hardlink_to_outside(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    outside, _ = world
    tar = layer(member("h", LNKTYPE, linkname=str(outside / "victim")))  # taken inside: not there
    assert_refused(tmp_path, world, tar, "not in this layer")
    tar = layer(member("h", LNKTYPE, linkname="../../outside/victim"))
    assert_refused(tmp_path, world, tar, r"`\.\.`")


def test_hardlink_through_a_symlink(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    outside, _ = world
    tar = layer(member("out", SYMTYPE, linkname=str(outside)), member("h", LNKTYPE, linkname="out/victim"))
    assert_refused(tmp_path, world, tar, "symlink or a file")


def test_hardlink_to_a_symlink_then_write(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    """A hardlink of a symlink is the symlink itself; a file then written there replaces it."""
    outside, store = world
    load_layers(tmp_path, store, layer(member("s", SYMTYPE, linkname=str(outside / "victim")),
                                       member("h", LNKTYPE, linkname="s"),
                                       member("h", data=b"owned\n")))
    assert (outside / "victim").read_text() == "untouched\n"
    [img] = store.list()
    assert Path(img.layers[0].path, "h").read_text() == "owned\n"
    assert os.readlink(Path(img.layers[0].path, "s")) == str(outside / "victim")


def test_hardlink_then_overwrite_does_not_write_through(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    _, store = world
    load_layers(tmp_path, store, layer(member("a", data=b"original\n"), member("b", LNKTYPE, linkname="a"),
                                       member("b", data=b"replaced\n")))
    [img] = store.list()
    root = Path(img.layers[0].path)
    assert (root / "a").read_text() == "original\n"
    assert (root / "b").read_text() == "replaced\n"


def test_whiteout_of_dotdot(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    assert_refused(tmp_path, world, layer(member("dir/.wh..."), member("x", data=b"")), "whiteout of '..'")
    assert_refused(tmp_path, world, layer(member(".wh.")), "whiteout of ''")


def test_whiteout_through_a_symlink(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    outside, _ = world
    tar = layer(member("l", SYMTYPE, linkname=str(outside)), member("l/.wh.victim"))
    assert_refused(tmp_path, world, tar, "symlink or a file")


def test_huge_sparse_file(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    """A GNU sparse member declaring 1 TiB: over the layer limit, refused before any byte of it is written."""
    tar = _gnu_sparse(1 << 40)
    _, store = world
    store.max_layer_bytes = 1 << 30
    assert_refused(tmp_path, world, tar, "more than the limit")


def test_zeros_become_holes(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    """A 64 MiB sparse file (and a file of zeros) takes almost no disk."""
    _, store = world
    load_layers(tmp_path, store, _gnu_sparse(64 << 20, data=b"end"), layer(member("zeros", data=bytes(8 << 20))))
    [img] = store.list()
    sparse = Path(img.layers[0].path, "huge")
    assert sparse.stat().st_size == (64 << 20) + 3
    assert sparse.stat().st_blocks * 512 < (1 << 20)
    with open(sparse, "rb") as f:
        f.seek(64 << 20)
        assert f.read() == b"end"
    zeros = Path(img.layers[1].path, "zeros")
    assert zeros.stat().st_size == 8 << 20 and zeros.stat().st_blocks * 512 < (1 << 20)


def test_device_node_and_setuid_are_dropped(tmp_path: Path, world: tuple[Path, ImageStore]) -> None:
    _, store = world
    load_layers(tmp_path, store, layer(member("dev/mem", tarfile.CHRTYPE, devmajor=1, devminor=1),
                                       member("dev/sda", tarfile.BLKTYPE, devmajor=8, devminor=0),
                                       member("suid", data=b"#!/bin/sh\n", mode=0o4755),
                                       member("sgid-dir", DIRTYPE, mode=0o2775)))
    [img] = store.list()
    root = Path(img.layers[0].path)
    assert not (root / "dev/mem").exists() and not (root / "dev/sda").exists()
    assert (root / "suid").stat().st_mode & 0o7777 == 0o755
    assert (root / "sgid-dir").stat().st_mode & 0o7777 == 0o775


def _gnu_sparse(size: int, data: bytes = b"") -> bytes:
    """A GNU-format tar with one old-style sparse member `huge` of `size` bytes (plus `data` at the end)."""
    # built by hand: tarfile reads sparse members but cannot write them
    def field(value: int, width: int) -> bytes:
        return f"{value:0{width - 1}o}".encode() + b"\0" if value < 8 ** (width - 1) else \
            b"\x80" + value.to_bytes(width - 1, "big")

    total = size + len(data)
    header = bytearray(512)
    header[0:4] = b"huge"
    header[100:108] = field(0o644, 8)
    header[108:116] = field(0, 8)
    header[116:124] = field(0, 8)
    header[124:136] = field(len(data), 12)  # bytes stored
    header[136:148] = field(1_700_000_000, 12)
    header[156:157] = b"S"
    header[257:265] = b"ustar  \0"
    # the sparse map (offset, numbytes) at 386; the real size at 483
    header[386:398] = field(size, 12)
    header[398:410] = field(len(data), 12)
    header[483:495] = field(total, 12)
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}".encode() + b"\0 "
    body = data + bytes(-len(data) % 512)
    return bytes(header) + body + bytes(1024)
