"""A Template serving an image root warm (sandbox.warm_overlay): its root
holds the layers once, each sandbox mounts its own overlay over them with a
fresh writable layer and pivots into it. Real sandboxes, root and
unprivileged: what one tenant writes, the next never sees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import sandbox
from sandbox import presets
from sandbox.errors import SpecError
from sandbox.images import Image, ImageStore
from sandbox.spec import Bind, Overlay, RoBind

from .image_helpers import DIRTYPE, TestImage, layer, member, runnable_layer, write_layout

pytestmark = pytest.mark.skipif(not presets.overlay_works(), reason="no overlayfs in a user namespace here")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """This host's programs, then a layer that deletes a file and replaces another."""
    base = runnable_layer((member("etc/", DIRTYPE, mode=0o755), member("etc/image-file", data=b"base\n"),
                           member("data/", DIRTYPE, mode=0o755), member("data/keep", data=b"keep\n"),
                           member("data/gone", data=b"gone\n"), member("work/", DIRTYPE, mode=0o755)))
    top = layer(member("data/.wh.gone"), member("etc/image-file", data=b"top\n"))
    root = tmp_path_factory.mktemp("image")
    write_layout(str(root / "layout"), [(TestImage([base, top], env=["PATH=/usr/bin"], working_dir="/work"),
                                         "run")])
    return ImageStore(root / "store").load(root / "layout")


def store_of(image: Image) -> ImageStore:
    return ImageStore(Path(image.layers[0].path).parents[2])


def sh(t: sandbox.Template, script: str) -> sandbox.CompletedProcess:
    return t.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)


def test_each_tenant_gets_its_own_writable_layer(image: Image) -> None:
    """Request N writes everywhere it may (the image's files, new files in
    its directories, the root); request N+1 sees none of it, and the layers
    on the host are untouched."""
    write = ("echo mine > /etc/image-file && echo new > /data/new && rm /data/keep && mkdir /planted && "
             "echo root > /planted/f && echo t > /tmp/t && echo s > /dev/shm/s && cat /etc/image-file && ls /data")
    look = ("cat /etc/image-file; ls /data; ls -A /tmp /dev/shm; test -e /planted && echo planted || echo none;"
            " touch /dev/planted 2>/dev/null || echo dev-read-only")
    with sandbox.Template(presets.image(image, root="overlay", store=store_of(image))) as t:
        for _ in range(3):
            first = sh(t, write)
            assert (first.returncode, first.stdout) == (0, "mine\nnew\n"), first.stderr
            second = sh(t, look)
            assert (second.returncode, second.stdout) == (0, "top\nkeep\n/dev/shm:\n\n/tmp:\nnone\ndev-read-only\n"), \
                second.stderr
    for lay in image.layers:  # nothing reached a layer's tree
        assert not os.path.exists(os.path.join(lay.path, "data", "new"))
        assert not os.path.exists(os.path.join(lay.path, "planted"))
    assert open(os.path.join(image.layers[0].path, "data", "keep")).read() == "keep\n"


def test_two_sandboxes_at_once_do_not_share_their_layer(image: Image) -> None:
    """Running side by side (two standbys taken at once): each writes the
    same path, each reads back its own."""
    with sandbox.Template(presets.image(image, root="overlay", store=store_of(image))) as t:
        procs = [t.spawn(["sh", "-c", f"echo {k} > /etc/image-file; sleep 0.3; cat /etc/image-file"],
                         stdout=sandbox.PIPE) for k in range(2)]
        outs = [p.communicate(timeout=60)[0] for p in procs]
    assert outs == [b"0\n", b"1\n"]


def test_the_root_is_the_overlay_and_nothing_of_the_template_shows(image: Image, canary: Path) -> None:
    """The sandbox's mounts are its overlay root, /proc, /dev and /tmp: the
    template's hidden layer mounts went with its old root (pivot_root and a
    lazy unmount), and nothing reaches the host."""
    with sandbox.Template(presets.image(image, root="overlay", store=store_of(image))) as t:
        r = sh(t, "cat /proc/self/mountinfo")
        probe = sh(t, f"ls -a /; cat /proc/1/root{canary} ../../../..{canary} 2>&1; ls /.sandbox-warm 2>&1;"
                      f" cat {image.layers[0].path}/etc/image-file 2>&1; true")
    points = {line.split()[4] for line in r.stdout.splitlines()}
    assert points - {p for p in points if p.startswith(("/proc/", "/dev/"))} == {"/", "/proc", "/dev", "/tmp"}
    root = next(line for line in r.stdout.splitlines() if line.split()[4] == "/")
    assert " - overlay " in root and "nosuid" in root.split()[5]
    listing, _, rest = probe.stdout.partition("work\n")
    assert set(listing.split()) == {".", "..", "bin", "data", "dev", "etc", "lib", "lib64", "proc", "tmp", "usr"}
    assert "host secret" not in rest and "base" not in rest and "top" not in rest
    errors = rest.splitlines()  # pid 1 (the sandbox's reaper) may refuse /proc/1/root outright
    assert len(errors) == 4 and all(e.endswith(("No such file or directory", "Permission denied")) for e in errors)


def test_binds_on_top_come_from_the_templates_copy(image: Image, tmp_path: Path) -> None:
    """A read-only and a writable bind over the image, and a per-call bind."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "f").write_text("ro\n")
    (tmp_path / "rw").mkdir()
    (tmp_path / "call").mkdir()
    (tmp_path / "call" / "c").write_text("call\n")
    spec = presets.image(image, RoBind(tmp_path / "ro", "/data/ro"), Bind(tmp_path / "rw", "/out"),
                         root="overlay", store=store_of(image))
    with sandbox.Template(spec) as t:
        r = sh(t, "cat /data/ro/f; echo w > /out/w; touch /data/ro/x 2>/dev/null || echo ro-refused; ls /data")
        call = t.run(["cat", "/in/c"], binds=[RoBind(tmp_path / "call", "/in")], capture_output=True, text=True)
    assert (r.returncode, r.stdout) == (0, "ro\nro-refused\nkeep\nro\n"), r.stderr
    assert (tmp_path / "rw" / "w").read_text() == "w\n"
    assert (call.returncode, call.stdout) == (0, "call\n"), call.stderr


def test_a_read_only_image_root_refuses_writes(image: Image) -> None:
    with sandbox.Template(presets.image(image, root="overlay", writable=False, store=store_of(image))) as t:
        r = sh(t, "touch /etc/x 2>&1; echo ok > /tmp/t && cat /tmp/t")
    assert "Read-only" in r.stdout and r.stdout.endswith("ok\n")


def test_a_kept_writable_layer_and_recycling_are_refused_with_the_reason(image: Image, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="shared by its sandboxes"):
        sandbox.Template(presets.image(image, writable=tmp_path / "keep", store=store_of(image)))
    with pytest.raises(sandbox.UnavailableError, match="Overlay"):
        sandbox.Template(presets.image(image, root="overlay", store=store_of(image)), recycle=True)


def test_an_overlay_below_the_root_is_served_warm_too(tmp_path: Path) -> None:
    """An Overlay at a directory of a minimal_system root, not only at /."""
    (tmp_path / "lower").mkdir()
    (tmp_path / "lower" / "f").write_text("lower\n")
    spec = presets.minimal_system(Overlay("/mnt/o", [str(tmp_path / "lower")]))
    with sandbox.Template(spec) as t:
        first = sh(t, "cat /mnt/o/f; echo w > /mnt/o/f; cat /mnt/o/f")
        second = sh(t, "cat /mnt/o/f")
    assert (first.stdout, second.stdout) == ("lower\nw\n", "lower\n"), (first.stderr, second.stderr)
    assert (tmp_path / "lower" / "f").read_text() == "lower\n"


def test_requests_are_served_by_standbys_built_ahead(image: Image) -> None:
    """A standby mounts its overlay before any request (with its server's
    credentials: sandbox.warm_overlay.OVERLAY_MOUNTER_CAPS): a request it
    serves has no mount step of its own in its timings, as one the server
    clones cold has."""
    import time

    with sandbox.Template(presets.image(image, root="overlay", store=store_of(image))) as t:
        served = []
        for _ in range(3):
            time.sleep(0.3)  # its standby is ready by now
            p = t.spawn(["sh", "-c", "echo x > /etc/image-file"])
            assert p.wait(timeout=60) == 0
            served.append("mounts" in p.timings)
    assert served == [False, False, False]
