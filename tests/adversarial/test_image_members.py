"""Attack: an image directory a sandbox wrote makes ImageStore.load read a host file, or hang.

A sandbox that builds an image into a writable bind (an OCI layout, or a
`docker save` unpacked into a directory) chooses the names, links and file
types there; the caller then loads it. Each case plants from inside a real
sandbox: a FIFO where a blob (or index.json, or the archive) belongs, which
hung the load forever; a link from config.json, manifest.json, a layer or a
blob to a host file the sandbox cannot see, which the load followed (the
host file became the image's config, or a layer, readable in the image).
The load now reads each member beneath the directory with openat2
(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), regular files only, opened without
blocking: each case is an ImageFormatError naming the member, at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from images.image_helpers import TestImage, layer, member, sha256, write_layout

from sandbox import Bind
from sandbox.images import ImageFormatError, ImageStore

from .attack import make_base_spec, require, run_sh

pytestmark = pytest.mark.integration
BACKEND = "native"

# Loads argv[2] into a store at argv[1], in its own process (the test kills it if it hangs).
LOAD = """
import sys
from sandbox.images import ImageStore
try:
    ImageStore(sys.argv[1]).load(sys.argv[2])
except Exception as exc:
    print(type(exc).__name__, exc)
else:
    print("loaded")
"""


def _image() -> TestImage:
    return TestImage([layer(member("etc/hostname", data=b"image\n"))], compression="tar")


def _plant(box: Path, script: str) -> None:
    """Run `script` in a sandbox whose only writable place is `box`, at /box."""
    require(BACKEND)
    done = run_sh(BACKEND, script, make_base_spec(Bind(str(box), "/box")))
    assert done.returncode == 0, done.stderr


def _box(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    box = tmp_path / "box"
    box.mkdir()
    return box


def _load_in_child(store: Path, path: Path) -> str:
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", LOAD, str(store), str(path)], capture_output=True, text=True,
                              timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ImageStore.load({str(path)!r}) blocked on the planted FIFO")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 20
    return done.stdout.strip()


@pytest.mark.parametrize("where", ["blob", "index.json", "archive"])
def test_planted_fifo_fails_at_once(where: str, tmp_path: Path) -> None:
    box = _box(tmp_path)
    write_layout(str(box / "layout"), [(_image(), "example.org/fifo:1")])
    blob = "blobs/sha256/" + sha256(_image().layers[0])[7:]
    target = {"blob": f"layout/{blob}", "index.json": "layout/index.json", "archive": "image.tar"}[where]
    _plant(box, f"rm -f /box/{target} && mkfifo /box/{target}")
    loaded = box / ("image.tar" if where == "archive" else "layout")
    out = _load_in_child(tmp_path / "store", loaded)
    assert out.startswith("ImageFormatError "), out
    assert "FIFO" in out and (where == "archive" or repr(target.split("/", 1)[1]) in out), out
    assert os.listdir(tmp_path / "store" / "refs") == []


class Host:
    """A host directory the sandbox cannot see, with files the attack wants the loader to take."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "host"
        self.dir.mkdir(mode=0o700)

    def put(self, name: str, data: bytes) -> str:
        path = self.dir / name
        path.write_bytes(data)
        return str(path)


def _docker_dir(box: Path, image: TestImage, config: bytes) -> Path:
    """A `docker save` unpacked into a directory: manifest.json, config.json, <id>/layer.tar."""
    save = box / "save"
    (save / "l0").mkdir(parents=True)
    (save / "l0" / "layer.tar").write_bytes(image.layers[0])
    (save / "config.json").write_bytes(config)
    (save / "manifest.json").write_text(json.dumps([{"Config": "config.json", "RepoTags": ["example.org/save:1"],
                                                     "Layers": ["l0/layer.tar"]}]))
    return save


def _config(image: TestImage, env: list[str]) -> bytes:
    doc = json.loads(image.config())
    doc["config"]["Env"] = env
    return json.dumps(doc).encode()


@pytest.mark.parametrize("member_name", ["config.json", "manifest.json", "l0/layer.tar"])
def test_docker_save_directory_links_to_a_host_file(member_name: str, tmp_path: Path) -> None:
    box, host = _box(tmp_path), Host(tmp_path)
    image = _image()
    save = _docker_dir(box, image, _config(image, ["FROM=the-image"]))
    # What the link names on the host: a config carrying the host's secret, a manifest.json naming
    # it, a tar of host files; each would be what the loader takes, had it followed the link.
    secret_config = host.put("config.json", _config(image, ["SECRET=host-only"]))
    if member_name == "manifest.json":
        target = host.put("manifest.json", json.dumps([{"Config": "config.json", "Layers": ["l0/layer.tar"],
                                                        "RepoTags": ["example.org/save:1"]}]).encode())
    elif member_name == "config.json":
        target = secret_config
    else:
        secret_tar = layer(member("etc/hostname", data=b"host-only\n"))
        target = host.put("layer.tar", secret_tar)
        config = json.loads(image.config())
        config["rootfs"]["diff_ids"] = [sha256(secret_tar)]
        (save / "config.json").write_bytes(json.dumps(config).encode())
    _plant(box, f"ln -sf {target} /box/save/{member_name}")
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageFormatError, match="symbolic link") as caught:
        store.load(save)
    assert repr(member_name) in str(caught.value)
    assert store.list() == [] and os.listdir(Path(store.path) / "layers") == []


@pytest.mark.parametrize("member_name", ["index.json", "blob"])
def test_oci_layout_links_to_a_host_file(member_name: str, tmp_path: Path) -> None:
    """A layout's blob (or its index.json) a link to a host file with the content the sandbox expects:
    following it would make the load an oracle of host files, and copy them into the store."""
    box, host = _box(tmp_path), Host(tmp_path)
    image = _image()
    write_layout(str(box / "layout"), [(image, "example.org/link:1")])
    blob = "blobs/sha256/" + sha256(image.layers[0])[7:]
    name = "index.json" if member_name == "index.json" else blob
    target = host.put("file", (box / "layout" / name).read_bytes())
    _plant(box, f"ln -sf {target} /box/layout/{name}")
    store = ImageStore(tmp_path / "store")
    with pytest.raises(ImageFormatError, match="symbolic link") as caught:
        store.load(box / "layout")
    assert repr(name) in str(caught.value)
    assert store.list() == []


def test_layout_itself_may_be_a_link(tmp_path: Path) -> None:
    """The path the caller names is the caller's choice: a link to a layout is followed (only what lies
    beneath it is checked), and a plain layout loads as before."""
    box = _box(tmp_path)
    image = _image()
    write_layout(str(box / "layout"), [(image, "example.org/plain:1")])
    (tmp_path / "named").symlink_to(box / "layout")
    img = ImageStore(tmp_path / "store").load(tmp_path / "named")
    assert img.names == ("example.org/plain:1",)
    assert Path(img.layers[0].path, "etc/hostname").read_bytes() == b"image\n"
    assert hashlib.sha256(image.layers[0]).hexdigest() == img.layers[0].digest[7:]
