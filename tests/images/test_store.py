"""ImageStore.load, get, list, remove and gc, on images the tests build from this host's files."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from sandbox.errors import SandboxError
from sandbox.images import (
    DigestMismatchError,
    Image,
    ImageFormatError,
    ImageNotFoundError,
    ImageStore,
    InvalidReferenceError,
    UnsupportedMediaTypeError,
    UnsupportedPlatformError,
)

from .image_helpers import (
    JSON_ARC,
    JSON_DIR,
    LAYER_ZSTD,
    TestImage,
    docker_save,
    layer,
    member,
    sha256,
    tar_directory,
    write_layout,
)


def check_host_image(img: Image, image: TestImage) -> None:
    """What the two-layer host image must look like once stored."""
    assert len(img.layers) == 3
    assert [layer.digest for layer in img.layers] == [sha256(t) for t in image.layers]
    base, extra, top = (Path(layer.path) for layer in img.layers)
    host = Path(JSON_DIR)
    for f in host.glob("*.py"):
        assert (base / JSON_ARC / f.name).read_bytes() == f.read_bytes()
    assert (extra / "usr/bin/env").read_bytes() == Path("/usr/bin/env").read_bytes()
    assert os.access(extra / "usr/bin/env", os.X_OK)
    assert (top / "etc/os-release").read_text() == "ID=test-image\n"
    # whiteouts are recorded beside the tree, never written into it
    assert set(img.layers[2].whiteouts) == {f"{JSON_ARC}/tool.py", "opt/old"}
    assert img.layers[2].opaque == (JSON_ARC,)
    assert not list(top.rglob(".wh.*"))
    assert (top / JSON_ARC / "__init__.py").read_text() == "# replaced\n"
    assert img.config.env == (("PATH", "/usr/bin"), ("GREETING", "hello=world"))
    assert img.config.working_dir == "/work"
    assert img.config.argv == ("/entry", "python3", "-c", "pass")
    assert img.config.user == "1000:1000"


def test_load_oci_layout(store: ImageStore, host_image: TestImage, tmp_path: Path) -> None:
    [digest] = write_layout(str(tmp_path / "layout"), [(host_image, "example.org/host/json:1")])
    img = store.load(tmp_path / "layout")
    assert img.digest == digest
    assert img.names == ("example.org/host/json:1",)
    check_host_image(img, host_image)
    assert store.get("example.org/host/json:1") == img
    assert store.get(digest) == img
    assert store.get(f"example.org/host/json@{digest}").digest == digest


def test_load_oci_archive_and_docker_save(store: ImageStore, host_image: TestImage, tmp_path: Path) -> None:
    write_layout(str(tmp_path / "layout"), [(host_image, "v1")])
    tar_directory(str(tmp_path / "layout"), str(tmp_path / "oci.tar"))
    img = store.load(tmp_path / "oci.tar", "example.org/archived:v1")
    assert img.names == ("example.org/archived:v1",)
    check_host_image(img, host_image)
    docker_save(str(tmp_path / "saved.tar"), host_image, "saved/image:2")
    saved = store.load(tmp_path / "saved.tar")
    assert saved.names == ("docker.io/saved/image:2",)
    check_host_image(saved, host_image)
    # the same layers, unpacked once: both images name the same directories
    assert [layer.path for layer in saved.layers] == [layer.path for layer in img.layers]
    assert len(os.listdir(Path(store.path) / "layers")) == 3


def test_list_remove_gc(store: ImageStore, host_image: TestImage, tmp_path: Path) -> None:
    other = TestImage([layer(member("only-here", data=b"x"))])
    write_layout(str(tmp_path / "a"), [(host_image, "example.org/a:1")])
    write_layout(str(tmp_path / "b"), [(other, None)])  # no name: found by its digest
    a = store.load(tmp_path / "a")
    b = store.load(tmp_path / "b")
    assert b.names == ()
    assert {i.digest for i in store.list()} == {a.digest, b.digest}
    assert store.gc().layers == ()  # everything is referenced
    store.remove("example.org/a:1")
    with pytest.raises(ImageNotFoundError, match="example.org/a:1"):
        store.get("example.org/a:1")
    assert [i.digest for i in store.list()] == [b.digest]
    done = store.gc()
    assert set(done.layers) == {layer.digest for layer in a.layers}
    assert a.digest in done.blobs and a.config_digest in done.blobs
    assert all(not os.path.exists(layer.path) for layer in a.layers)
    assert all(os.path.exists(layer.path) for layer in b.layers)
    assert store.get(b.digest) == b
    store.remove(b.digest)
    assert store.list() == []
    assert len(store.gc().layers) == 1
    assert os.listdir(Path(store.path) / "layers") == []


def test_gc_removes_what_an_interrupted_pull_left(store: ImageStore) -> None:
    leftover = Path(store.path) / "tmp" / "layer.12345.abcdef"
    (leftover / "root" / "ro").mkdir(parents=True)
    (leftover / "root" / "ro" / "f").write_text("x")
    (leftover / "root" / "ro").chmod(0o555)
    assert store.gc().temporaries == 1
    assert os.listdir(Path(store.path) / "tmp") == []


def test_default_path_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_IMAGES", str(tmp_path / "env-store"))
    assert ImageStore().path == str(tmp_path / "env-store")
    assert (tmp_path / "env-store").stat().st_mode & 0o777 == 0o700
    monkeypatch.delenv("SANDBOX_IMAGES")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert ImageStore().path == str(tmp_path / "cache" / "sandbox" / "images")


# ---------------------------------------------------------------- bad input: typed errors, nothing kept

def _nothing_kept(store: ImageStore) -> None:
    root = Path(store.path)
    assert os.listdir(root / "refs") == []
    assert os.listdir(root / "layers") == []
    assert os.listdir(root / "tmp") == []


def test_unknown_ref(store: ImageStore, host_image: TestImage, tmp_path: Path) -> None:
    with pytest.raises(ImageNotFoundError, match="nope/nothing"):
        store.get("nope/nothing:1")
    with pytest.raises(ImageNotFoundError):
        store.get("sha256:" + "0" * 64)
    with pytest.raises(ImageNotFoundError):
        store.remove("nope/nothing:1")
    write_layout(str(tmp_path / "layout"), [(host_image, "v1"), (TestImage([layer(member("a"))]), "v3")])
    with pytest.raises(ImageNotFoundError, match="v2"):
        store.load(tmp_path / "layout", "v2")
    with pytest.raises(ImageNotFoundError, match="no such file"):
        store.load(tmp_path / "missing")
    with pytest.raises(InvalidReferenceError, match="UPPER"):
        store.get("UPPER/case")
    _nothing_kept(store)


def test_digest_mismatch_of_a_layer(store: ImageStore, tmp_path: Path) -> None:
    image = TestImage([layer(member("a", data=b"good"))], compression="tar")
    [digest] = write_layout(str(tmp_path / "layout"), [(image, "example.org/x:1")])
    blob = tmp_path / "layout/blobs/sha256" / sha256(image.layers[0])[7:]
    blob.write_bytes(layer(member("a", data=b"evil")))  # same size, other content
    with pytest.raises(DigestMismatchError) as info:
        store.load(tmp_path / "layout")
    assert info.value.expected == sha256(image.layers[0])
    assert isinstance(info.value, SandboxError)
    _nothing_kept(store)


def test_digest_mismatch_of_diff_id(store: ImageStore, tmp_path: Path) -> None:
    """The compressed blob matches its digest but not the config's diff_id."""
    image = TestImage([layer(member("a", data=b"one"))])
    write_layout(str(tmp_path / "layout"), [(image, "example.org/x:1")])
    config = json.loads(image.config())
    config["rootfs"]["diff_ids"] = [sha256(b"something else")]
    manifest, _ = image.blobs()
    doc = json.loads(manifest)
    raw = json.dumps(config).encode()
    (tmp_path / "layout/blobs/sha256" / sha256(raw)[7:]).write_bytes(raw)
    doc["config"].update(digest=sha256(raw), size=len(raw))
    raw_manifest = json.dumps(doc).encode()
    (tmp_path / "layout/blobs/sha256" / sha256(raw_manifest)[7:]).write_bytes(raw_manifest)
    index = json.loads((tmp_path / "layout/index.json").read_text())
    index["manifests"][0].update(digest=sha256(raw_manifest), size=len(raw_manifest))
    (tmp_path / "layout/index.json").write_text(json.dumps(index))
    with pytest.raises(DigestMismatchError, match="diff_id"):
        store.load(tmp_path / "layout")
    _nothing_kept(store)


def test_unsupported_media_type(store: ImageStore, tmp_path: Path) -> None:
    image = TestImage([layer(member("a"))], layer_media="application/vnd.example.wasm.v1")
    write_layout(str(tmp_path / "layout"), [(image, "example.org/x:1")])
    with pytest.raises(UnsupportedMediaTypeError, match="vnd.example.wasm") as info:
        store.load(tmp_path / "layout")
    assert info.value.media_type == "application/vnd.example.wasm.v1"
    _nothing_kept(store)


def test_unsupported_platform(store: ImageStore, tmp_path: Path) -> None:
    image = TestImage([layer(member("a"))], architecture="arm64")
    write_layout(str(tmp_path / "layout"), [(image, "example.org/x:1")])
    with pytest.raises(UnsupportedPlatformError, match="linux/arm64") as info:
        store.load(tmp_path / "layout")
    assert info.value.wanted == "linux/amd64"
    _nothing_kept(store)


def test_not_an_image(store: ImageStore, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImageFormatError, match="neither index.json"):
        store.load(tmp_path / "empty")
    (tmp_path / "junk").write_bytes(b"junk" * 100)
    with pytest.raises(ImageFormatError, match="tarball"):
        store.load(tmp_path / "junk")
    layout = tmp_path / "bad-json"
    write_layout(str(layout), [(TestImage([layer(member("a"))]), None)])
    (layout / "index.json").write_text("{not json")
    with pytest.raises(ImageFormatError, match="not JSON"):
        store.load(layout)
    _nothing_kept(store)


def test_corrupt_gzip_layer(store: ImageStore, tmp_path: Path) -> None:
    """A blob that hashes right (the manifest names the corrupt bytes) but is no gzip stream."""
    image = TestImage([layer(member("a", data=b"x" * 5000))])
    manifest, blobs = image.blobs()
    write_layout(str(tmp_path / "layout"), [(image, None)])
    bad = b"\x1f\x8b" + b"\x00" * 100
    doc = json.loads(manifest)
    doc["layers"][0].update(digest=sha256(bad), size=len(bad))
    (tmp_path / "layout/blobs/sha256" / sha256(bad)[7:]).write_bytes(bad)
    raw = json.dumps(doc).encode()
    (tmp_path / "layout/blobs/sha256" / sha256(raw)[7:]).write_bytes(raw)
    index = json.loads((tmp_path / "layout/index.json").read_text())
    index["manifests"][0].update(digest=sha256(raw), size=len(raw))
    (tmp_path / "layout/index.json").write_text(json.dumps(index))
    with pytest.raises(ImageFormatError, match="not a valid layer"):
        store.load(tmp_path / "layout")
    _nothing_kept(store)


def _zstd_layout(tmp_path: Path, tar: bytes) -> Path:
    """A layout whose one layer is `tar` compressed with the zstd program."""
    import shutil
    import subprocess

    if shutil.which("zstd") is None:
        pytest.skip("the zstd program is not installed: no zstd blob to make (Debian: apt-get install zstd)")
    blob = subprocess.run(["zstd", "-q", "-c"], input=tar, stdout=subprocess.PIPE, check=True).stdout
    image = TestImage([tar], compression="tar", layer_media=LAYER_ZSTD)
    manifest, _ = image.blobs()
    layout = tmp_path / "layout"
    write_layout(str(layout), [(image, None)])
    doc = json.loads(manifest)
    doc["layers"][0].update(digest=sha256(blob), size=len(blob))
    (layout / "blobs/sha256" / sha256(blob)[7:]).write_bytes(blob)
    raw = json.dumps(doc).encode()
    (layout / "blobs/sha256" / sha256(raw)[7:]).write_bytes(raw)
    index = json.loads((layout / "index.json").read_text())
    index["manifests"][0].update(digest=sha256(raw), size=len(raw))
    (layout / "index.json").write_text(json.dumps(index))
    return layout


def test_zstd_without_a_module_is_a_clear_error(store: ImageStore, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    layout = _zstd_layout(tmp_path, layer(member("a", data=b"z")))
    for name in ("zstandard", "compression.zstd"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails, as where neither is installed
    with pytest.raises(UnsupportedMediaTypeError, match="zstandard"):
        store.load(layout)
    _nothing_kept(store)


@pytest.mark.skipif(not any(importlib.util.find_spec(m) for m in ("zstandard",)) and sys.version_info < (3, 14),
                    reason="no zstd module (pip install 'sandbox[zstd]')")
def test_zstd_layer(store: ImageStore, tmp_path: Path) -> None:
    layout = _zstd_layout(tmp_path, layer(member("z/file", data=b"zstd layer\n" * 1000)))
    img = store.load(layout)
    assert Path(img.layers[0].path, "z/file").read_bytes() == b"zstd layer\n" * 1000


def test_a_bare_tag_that_chooses_one_of_two_images_names_it(store: ImageStore, host_image: TestImage,
                                                            tmp_path: Path) -> None:
    """A layout of two images tagged `v1` and `v3` (as skopeo writes them): load(layout, "v3") chooses the
    second, and the store can find it again by that name; the other image is not loaded."""
    other = TestImage([layer(member("a"))])
    write_layout(str(tmp_path / "layout"), [(host_image, "v1"), (other, "v3")])
    img = store.load(tmp_path / "layout", "v3")
    assert img.names == ("docker.io/library/v3:latest",)
    assert store.get("v3").digest == img.digest
    assert [i.digest for i in store.list()] == [img.digest]
