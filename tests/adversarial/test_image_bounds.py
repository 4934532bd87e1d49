"""Attack: a layer that is cheap in bytes but costly in inodes or depth.

`max_layer_bytes` counted only the declared sizes of a layer's files:
20,000 empty files passed a 1 MiB limit (each an inode, and an entry every
later walk of the store visits). And every walk of the store's trees was
recursive: a layer 1,100 directories deep made `merged()` raise
RecursionError, and so did every later `gc()`, on what the failed build
left in tmp/. Now each member counts (a 512-byte header against
`max_layer_bytes`, and `max_layer_members`), paths are bounded by
`max_layer_depth`, each refusal an UnsafeLayerError naming the member and
the limit; and the walks are iterative, so a deep tree from a store that
allowed it is merged and collected.
"""

from __future__ import annotations

import os
import resource
import tarfile
from pathlib import Path

import pytest
from images.image_helpers import DIRTYPE, TestImage, layer, member, write_layout

from sandbox.images import ImageError, ImageStore, UnsafeLayerError

DEEP = 1100  # deeper than Python's default recursion limit (1,000)


def _load(tmp_path: Path, store: ImageStore, tar: bytes, name: str = "example.org/bounds:1") -> None:
    layout = tmp_path / f"layout{len(os.listdir(tmp_path))}"
    write_layout(str(layout), [(TestImage([tar], compression="tar"), name)])
    store.load(layout)


def _nothing_kept(store: ImageStore) -> None:
    for sub in ("refs", "layers", "tmp"):
        assert os.listdir(Path(store.path) / sub) == [], f"{sub}/ kept something of the refused layer"


def test_empty_files_count_against_the_byte_limit(tmp_path: Path) -> None:
    tar = layer(*(member(f"f{i}") for i in range(20_000)))
    store = ImageStore(tmp_path / "store", max_layer_bytes=1 << 20)
    with pytest.raises(UnsafeLayerError, match=f"more than the limit of {1 << 20} bytes") as caught:
        _load(tmp_path, store, tar)
    assert caught.value.member.startswith("f")
    _nothing_kept(store)


def test_member_limit(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store", max_layer_members=100)
    with pytest.raises(UnsafeLayerError, match="more than the limit of 100 members") as caught:
        _load(tmp_path, store, layer(*(member(f"d{i}/", DIRTYPE, mode=0o755) for i in range(101))))
    assert caught.value.member == "d100"
    _nothing_kept(store)
    _load(tmp_path, store, layer(*(member(f"f{i}") for i in range(100))))  # at the limit: loads


def _deep_members(depth: int) -> list[tuple[tarfile.TarInfo, bytes]]:
    return [*(member("d/" * (i + 1), DIRTYPE, mode=0o755) for i in range(depth)),
            member("d/" * depth + "leaf", data=b"bottom\n")]


def _deep(depth: int) -> bytes:
    return layer(*_deep_members(depth))


def test_depth_limit(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    with pytest.raises(UnsafeLayerError, match=r"257 components deep, more than the limit of 256") as caught:
        _load(tmp_path, store, _deep(DEEP))
    assert caught.value.member.startswith("d/d/")
    _nothing_kept(store)


def test_deep_tree_merged_and_collected(tmp_path: Path) -> None:
    """A store that allows the depth: the layer unpacks, merged() builds its tree, a member (of the
    same layer, of a later one) replacing the deep directory removes it, and gc() removes all of it:
    no RecursionError, and far fewer fds than the tree has levels."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # room for what is open now (other tests' pools and templates) and the unpacker's 128 kept
    # directory fds, far fewer than the tree's 1,100 levels
    open_now = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(open_now + 200, hard), hard))
    try:
        store = ImageStore(tmp_path / "store", max_layer_depth=DEEP + 1)
        deep = _deep(DEEP)
        layout = tmp_path / "layout"
        replaced = layer(*_deep_members(DEEP), member("d", data=b"now a file\n"))  # unpacking removes the tree
        write_layout(str(layout), [(TestImage([deep, replaced], compression="tar"), "example.org/deep:1")])
        img = store.load(layout)
        assert Path(img.layers[0].path, *(["d"] * DEEP), "leaf").read_bytes() == b"bottom\n"
        merged = store.merged(img)
        assert Path(merged, "d").read_bytes() == b"now a file\n"
        only_lower = store.load(_lower_only(tmp_path, deep))
        tree = Path(store.merged(only_lower), *(["d"] * DEEP), "leaf")
        assert tree.read_bytes() == b"bottom\n"
        for ref in ("example.org/deep:1", "example.org/lower:1"):
            store.remove(ref)
        done = store.gc()
        assert len(done.layers) == 2
        assert os.listdir(Path(store.path) / "merged") == [] and os.listdir(Path(store.path) / "tmp") == []
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _lower_only(tmp_path: Path, deep: bytes) -> Path:
    layout = tmp_path / "lower"
    write_layout(str(layout), [(TestImage([deep], compression="tar"), "example.org/lower:1")])
    return layout


def test_gc_removes_a_deep_leftover(tmp_path: Path) -> None:
    """What a killed build left in tmp/, 1,100 deep, some directories read-only: gc() removes it."""
    store = ImageStore(tmp_path / "store")
    fd = os.open(Path(store.path, "tmp"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(DEEP):  # (pathlib's and os's makedirs recurse too)
            name = "merged.1.dead" if i == 0 else "d"
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            if i % 100 == 50:
                os.chmod(fd, 0o500)  # a read-only directory on the way
            os.close(fd)
            fd = nxt
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    done = store.gc()
    assert done.temporaries == 1 and os.listdir(Path(store.path) / "tmp") == []


def test_bad_bounds_are_refused(tmp_path: Path) -> None:
    for kwargs in ({"max_layer_members": 0}, {"max_layer_depth": True}, {"max_layer_bytes": -1}):
        with pytest.raises(ImageError, match=next(iter(kwargs))):
            ImageStore(tmp_path / "store", **kwargs)  # type: ignore[arg-type]
