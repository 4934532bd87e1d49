"""Attack: a sandbox that can write the image store plants links the store then follows on the host.

The store (~/.cache/sandbox/images by default) is the caller's, but a
sandbox given a writable bind of it, or of ~/.cache or of the home (a shared
pip cache, an agent's workspace), writes there as the caller. The store
worked by path: gc() listed and removed the entries of `tmp/`, `locks/` and
`blobs/sha256/` wherever a link in their place pointed (a host directory
emptied; as root, any), the lock file was created through a dangling link
(a host file created), a `merged/<digest>` link was handed out as the
image's root (a host tree bound into the next sandbox), and a layer's tree
that is a link was read for the image's /etc/passwd; a FIFO among the
names hung list(), get() and gc(). The store now opens
its own directories beneath its root with openat2 (no link on the way) and
works through their fds: each planted link is an ImageError naming it, and
the host is untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from images.image_helpers import TestImage, layer, member, write_layout

from sandbox import Bind
from sandbox.images import Image, ImageError, ImageStore, roots

from .attack import make_base_spec, require, run_sh

pytestmark = pytest.mark.integration
BACKEND = "native"


class World:
    """A store with one image, and a host directory (`victim`) the sandbox cannot see."""

    def __init__(self, tmp_path: Path) -> None:
        tmp_path.chmod(0o755)
        self.victim = tmp_path / "victim"
        self.victim.mkdir()
        for name in ("a", "b"):
            (self.victim / name).write_text(f"host file {name}\n")
        self.store = ImageStore(tmp_path / "store")
        layout = tmp_path / "layout"
        write_layout(str(layout), [(TestImage([layer(member("etc/hostname", data=b"image\n"))]), "example.org/s:1")])
        self.image: Image = self.store.load(layout)

    def plant(self, script: str) -> None:
        """Run `script` in a sandbox with the store bound writable at /store."""
        require(BACKEND)
        done = run_sh(BACKEND, script, make_base_spec(Bind(self.store.path, "/store")))
        assert done.returncode == 0, done.stderr

    def victim_state(self) -> list[tuple[str, str]]:
        return sorted((p.name, p.read_text()) for p in self.victim.iterdir())


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.mark.parametrize("sub", ["tmp", "locks", "blobs/sha256"])
def test_gc_does_not_remove_through_a_planted_link(sub: str, world: World) -> None:
    before = world.victim_state()
    world.plant(f"mv /store/{sub} /store/{sub.replace('/', '-')}.moved && ln -s {world.victim} /store/{sub}")
    with pytest.raises(ImageError, match=f"{sub}.*symbolic link"):
        world.store.gc()
    assert world.victim_state() == before


def test_lock_not_created_through_a_planted_link(world: World) -> None:
    world.plant(f"rm /store/lock && ln -s {world.victim}/created /store/lock")
    with pytest.raises(ImageError, match="lock.*symbolic link"):
        world.store.gc()
    assert not (world.victim / "created").exists()


def test_merged_root_not_a_planted_link(world: World) -> None:
    """merged/<digest> a link to a host directory: handed out, it would be the next sandbox's root."""
    world.plant(f"ln -s {world.victim} /store/merged/{world.image.digest[7:]}")
    with pytest.raises(ImageError, match="symbolic link"):
        world.store.merged(world.image)
    assert world.victim_state() == [("a", "host file a\n"), ("b", "host file b\n")]


def test_layer_tree_not_a_planted_link(world: World) -> None:
    """layers/<diff_id>/root a link to a host directory: as an overlay lower layer or merged, it would
    show the host directory (merged: hardlinks to its files) in the sandbox."""
    layer_dir = Path(world.image.layers[0].path).parent.name
    world.plant(f"mv /store/layers/{layer_dir}/root /store/old-root && ln -s {world.victim} "
                f"/store/layers/{layer_dir}/root")
    with pytest.raises(ImageError, match="symbolic link"):
        world.store.get("example.org/s:1")
    with pytest.raises(ImageError, match="symbolic link"):
        world.store.merged(world.image)
    with pytest.raises(ImageError, match="symbolic link"):  # the image's user, looked up in its /etc/passwd
        roots.read_file(world.image.layers[0], "a")
    merged = Path(world.store.path, "merged")
    assert all(not os.path.exists(merged / name / "a") for name in os.listdir(merged))


def test_ref_naming_a_path_is_refused(world: World) -> None:
    """A ref file's content is a digest: one that names a path (`sha256:../..`) is refused, not opened."""
    world.plant("printf 'sha256:../../../../../../etc/passwd' > '/store/refs/example.org%2Fevil%3A1'")
    with pytest.raises(ImageError, match="not a digest"):
        world.store.get("example.org/evil:1")


# Lists the store at argv[1] in its own process (the test kills it if it hangs).
LIST = """
import sys
from sandbox.images import ImageStore
try:
    ImageStore(sys.argv[1]).list()
except Exception as exc:
    print(type(exc).__name__, exc)
else:
    print("listed")
"""


def test_fifo_planted_as_a_name_does_not_hang(world: World) -> None:
    """A FIFO among the names: list(), get() and gc() read every name; opening it blocked forever."""
    world.plant("mkfifo '/store/refs/example.org%2Ffifo%3A1'")
    try:
        done = subprocess.run([sys.executable, "-c", LIST, world.store.path], capture_output=True, text=True,
                              timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("ImageStore.list() blocked on a FIFO among the store's names")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ImageError ") and "FIFO" in done.stdout, done.stdout
