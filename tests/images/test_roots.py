"""The store's side of image roots (sandbox/images/roots.py): layers made
overlay-ready once, merged trees, and their garbage collection. Root and
unprivileged; nothing is mounted here (test_image_root.py runs sandboxes)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandbox.images import ImageError, ImageStore

from .image_helpers import DIRTYPE, JSON_ARC, SYMTYPE, TestImage, layer, member, write_layout


def test_overlay_ready_writes_whiteouts_and_opaque_markers_once(store: ImageStore, host_image: TestImage,
                                                                tmp_path: Path) -> None:
    write_layout(str(tmp_path / "l"), [(host_image, "h")])
    img = store.load(tmp_path / "l")
    assert not any(lay.overlay for lay in img.layers)
    ready = store.overlay_ready(img)
    assert all(lay.overlay for lay in ready.layers)
    top = Path(ready.layers[2].path)
    for gone in (f"{JSON_ARC}/tool.py", "opt/old"):
        st = os.lstat(top / gone)
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(0, 0), gone
    assert os.getxattr(top / JSON_ARC, "user.overlay.opaque") == b"y"
    assert (top / JSON_ARC / "__init__.py").read_text() == "# replaced\n"  # the layer's own file stays
    assert all(lay.overlay for lay in store.get(img.digest).layers)  # recorded in the store
    again = store.overlay_ready(store.get(img.digest))  # once: nothing to do, nothing fails
    assert again.layers == ready.layers
    assert not os.listdir(Path(store.path) / "tmp")


def test_a_layer_whose_whiteout_lies_below_its_own_link_is_refused(store: ImageStore, tmp_path: Path) -> None:
    odd = TestImage([layer(member("a/", DIRTYPE, mode=0o755), member("a/.wh.b"), member("a", SYMTYPE,
                                                                                       linkname="/etc"))])
    write_layout(str(tmp_path / "l"), [(odd, "odd")])
    img = store.load(tmp_path / "l")
    with pytest.raises(ImageError, match="below a link"):
        store.overlay_ready(img)
    assert not os.path.exists("/etc/b")


def test_a_merged_tree_applies_deletions_with_hardlinks(store: ImageStore, host_image: TestImage,
                                                        tmp_path: Path) -> None:
    write_layout(str(tmp_path / "l"), [(host_image, "h")])
    img = store.overlay_ready(store.load(tmp_path / "l"))  # its whiteout devices are not copied
    merged = Path(store.merged(img))
    assert merged == Path(store.path) / "merged" / img.digest[7:]
    assert sorted(os.listdir(merged / JSON_ARC)) == ["__init__.py"]  # opaque: only the top layer's file
    assert (merged / "etc/os-release").read_text() == "ID=test-image\n"
    assert not (merged / "opt/old").exists() and (merged / "opt").is_dir()
    top = Path(img.layers[2].path)
    assert os.stat(merged / "etc/os-release").st_ino == os.stat(top / "etc/os-release").st_ino
    assert (merged / "usr/bin/env").stat().st_ino == (Path(img.layers[1].path) / "usr/bin/env").stat().st_ino
    for scratch in ("proc", "dev", "tmp", "run", "var/tmp", "root", "work"):
        assert (merged / scratch).is_dir(), scratch
    assert store.merged(img) == str(merged)  # made once
    assert not os.listdir(Path(store.path) / "tmp")


def test_gc_removes_the_merged_tree_of_a_removed_image(store: ImageStore, host_image: TestImage,
                                                       tmp_path: Path) -> None:
    write_layout(str(tmp_path / "l"), [(host_image, "h")])
    img = store.load(tmp_path / "l")
    merged = store.merged(img)
    store.gc()
    assert os.path.isdir(merged)
    store.remove(img.digest)
    result = store.gc()
    assert not os.path.exists(merged) and len(result.layers) == 3
    assert not os.listdir(Path(store.path) / "tmp")


def test_concurrent_callers_make_a_layer_overlay_ready_once(store: ImageStore, host_image: TestImage,
                                                           tmp_path: Path) -> None:
    """Four processes at once: each finds every layer ready, none fails on
    another's markers (the layer's lock), the markers are there once."""
    import subprocess
    import sys

    write_layout(str(tmp_path / "l"), [(host_image, "h")])
    img = store.load(tmp_path / "l")
    code = ("import sys; from sandbox.images import ImageStore; s = ImageStore(sys.argv[1]); "
            "img = s.overlay_ready(s.get(sys.argv[2])); s.merged(img); print(all(l.overlay for l in img.layers))")
    procs = [subprocess.Popen([sys.executable, "-c", code, store.path, img.digest], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [(p.returncode, out) for p, (out, _) in zip(procs, outs, strict=True)] == [(0, "True\n")] * 4, outs
    top = Path(img.layers[2].path)
    assert stat.S_ISCHR(os.lstat(top / "opt/old").st_mode)
    assert os.listdir(Path(store.path) / "merged") == [img.digest[7:]]
    assert not os.listdir(Path(store.path) / "tmp")


def test_read_only_directories_of_a_layer_still_get_their_markers(store: ImageStore, tmp_path: Path) -> None:
    """A layer may make a directory read-only (0555) after deleting in it or
    making it opaque: the markers go in anyway, and the mode stays."""
    ro = TestImage([layer(member("d/", DIRTYPE, mode=0o755), member("d/keep", data=b"k\n"),
                          member("o/", DIRTYPE, mode=0o755))])
    top = layer(member("d/", DIRTYPE, mode=0o555), member("d/.wh.gone"),
                member("o/", DIRTYPE, mode=0o555), member("o/.wh..wh..opq"))
    write_layout(str(tmp_path / "l"), [(TestImage([*ro.layers, top]), "ro")])
    img = store.overlay_ready(store.load(tmp_path / "l"))
    layer_root = Path(img.layers[1].path)
    assert stat.S_ISCHR(os.lstat(layer_root / "d" / "gone").st_mode)
    assert os.getxattr(layer_root / "o", "user.overlay.opaque") == b"y"
    assert stat.S_IMODE(os.lstat(layer_root / "d").st_mode) == stat.S_IMODE(os.lstat(layer_root / "o").st_mode) == 0o555
