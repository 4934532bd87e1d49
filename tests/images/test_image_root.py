"""An image as a sandbox's root (sandbox.presets.image), for real: an image
built here from this host's programs, loaded into a fresh store, run in
sandboxes with its layers stacked by overlayfs in the sandbox's user
namespace, and with the merged-tree fallback. Root and unprivileged."""

from __future__ import annotations

import dataclasses
import errno
import os
from pathlib import Path

import pytest

import sandbox
from sandbox import presets
from sandbox.errors import SpecError, UnavailableError
from sandbox.images import Image, ImageStore
from sandbox.spec import Overlay

from .image_helpers import DIRTYPE, SYMTYPE, TestImage, layer, member, runnable_layer, write_layout

# Where overlayfs cannot be mounted in a user namespace, the merged-tree cases still run.
needs_overlay = pytest.mark.skipif(not presets.overlay_works(), reason="no overlayfs in a user namespace here")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory, canary: Path) -> Image:
    """Two layers: this host's programs with data files, then a layer that
    deletes a file, makes a directory opaque, replaces a file, and plants
    links at the host's canary (absolute, and climbing with '..')."""
    base = runnable_layer((
        member("etc/", DIRTYPE, mode=0o755), member("etc/image-file", data=b"base\n"),
        member("data/", DIRTYPE, mode=0o755), member("data/keep", data=b"keep\n"),
        member("data/gone", data=b"gone\n"), member("data/dir/", DIRTYPE, mode=0o755),
        member("data/dir/x", data=b"x\n"), member("work/", DIRTYPE, mode=0o755)))
    top = layer(member("data/.wh.gone"), member("data/dir/.wh..wh..opq"), member("data/dir/y", data=b"y\n"),
                member("etc/image-file", data=b"top\n"),
                member("abs-link", SYMTYPE, linkname=str(canary)),
                member("up-link", SYMTYPE, linkname="../../../../../../../.." + str(canary)),
                member("data/xattr", data=b"z\n", pax_headers={"SCHILY.xattr.user.overlay.redirect": "/etc",
                                                              "SCHILY.xattr.user.overlay.opaque": "y"}))
    root = tmp_path_factory.mktemp("image")
    write_layout(str(root / "layout"), [(TestImage([base, top], env=["PATH=/usr/bin", "GREETING=hi"],
                                                   working_dir="/work"), "run")])
    return ImageStore(root / "store").load(root / "layout")


def store_of(image: Image) -> ImageStore:
    """The store `image` was loaded into (its layers are store/layers/<hex>/root)."""
    return ImageStore(Path(image.layers[0].path).parents[2])


def run(spec: sandbox.Spec, script: str) -> sandbox.CompletedProcess[str]:
    return sandbox.run(["sh", "-c", script], spec, capture_output=True, text=True, timeout=60)


@pytest.fixture(params=["overlay", "merged"])
def root(request: pytest.FixtureRequest) -> str:
    if request.param == "overlay" and not presets.overlay_works():
        pytest.skip("no overlayfs in a user namespace here")
    return str(request.param)


def test_the_sandbox_sees_the_images_files_not_the_hosts(image: Image, root: str) -> None:
    spec = presets.image(image, root=root, store=store_of(image))
    r = run(spec, "cat /etc/image-file; ls /data; ls /data/dir; echo $GREETING; pwd; id -u; ls /;"
                  "test -e /etc/os-release && echo HOST-ETC; test -e /usr/bin/python3 && echo HOST-USR;"
                  "test -e /home && echo HOST-HOME; true")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[:5] == ["top", "dir", "keep", "xattr", "y"]  # gone deleted, x hidden by the opaque dir
    assert lines[5:8] == ["hi", "/work", "1000"]
    assert "HOST" not in r.stdout
    listed = set(lines[8:]) - {""}
    expected = {"abs-link", "bin", "data", "dev", "etc", "lib", "lib64", "proc", "tmp", "up-link", "usr", "work"}
    assert listed == expected | ({"root", "run", "var"} if root == "merged" else set())  # its scratch mounts


def test_links_in_the_image_lead_into_the_image_not_the_host(image: Image, root: str, canary: Path) -> None:
    store = store_of(image)
    r = run(presets.image(image, root=root, store=store), f"cat /abs-link /up-link {canary} 2>&1; true")
    assert "host secret" not in r.stdout
    assert r.stdout.count("No such file") == 3


@needs_overlay
def test_overlay_xattrs_of_a_layer_are_dropped(image: Image) -> None:
    path = os.path.join(image.layers[1].path, "data", "xattr")
    assert not [n for n in os.listxattr(path) if n.startswith("user.overlay.")]
    r = run(presets.image(image, root="overlay", store=ImageStore(Path(path).parents[4])), "cat /data/xattr")
    assert r.stdout == "z\n"


@needs_overlay
def test_writes_go_to_a_layer_of_the_sandbox_and_vanish_with_it(image: Image) -> None:
    store = store_of(image)
    spec = presets.image(image, root="overlay", store=store)
    r = run(spec, "echo new > /data/new && echo changed > /data/keep && rm /etc/image-file && mkdir /opt && "
                  "touch /opt/f && cat /data/new /data/keep")
    assert (r.returncode, r.stdout) == (0, "new\nchanged\n"), r.stderr
    r = run(spec, "ls /data; cat /data/keep /etc/image-file; test -e /opt || echo no-opt")
    assert r.stdout == "dir\nkeep\nxattr\nkeep\ntop\nno-opt\n"
    for lay in image.layers:  # the layers themselves are untouched
        assert not os.path.exists(os.path.join(lay.path, "data", "new"))
    assert open(os.path.join(image.layers[0].path, "data", "keep")).read() == "keep\n"


@needs_overlay
def test_a_kept_writable_layer_keeps_the_writes(image: Image, tmp_path: Path) -> None:
    store = store_of(image)
    spec = presets.image(image, writable=tmp_path, store=store)
    assert run(spec, "echo kept > /data/new && rm /data/keep").returncode == 0
    assert (tmp_path / "upper" / "data" / "new").read_text() == "kept\n"
    r = run(spec, "cat /data/new; ls /data")
    assert r.stdout == "kept\ndir\nnew\nxattr\n"


def test_a_read_only_root_refuses_writes_but_tmp(image: Image, root: str) -> None:
    store = store_of(image)
    spec = presets.image(image, root=root, writable=False, store=store)
    r = run(spec, "touch /data/new 2>&1; touch /tmp/ok && echo tmp-ok")
    assert "Read-only file system" in r.stdout and "tmp-ok" in r.stdout


def test_binds_go_on_top(image: Image, tmp_path: Path) -> None:
    (tmp_path / "in").write_text("bound\n")
    spec = presets.image(image, sandbox.RoBind(tmp_path, "/work/in"))  # its store is found from the Image
    assert run(spec, "cat /work/in/in").stdout == "bound\n"


def test_bad_choices_are_named(image: Image, tmp_path: Path) -> None:
    store = store_of(image)
    with pytest.raises(SpecError, match="root"):
        presets.image(image, root="chroot", store=store)
    with pytest.raises(SpecError, match="writable"):
        presets.image(image, root="merged", writable=tmp_path, store=store)
    with pytest.raises(sandbox.images.ImageNotFoundError):
        presets.image("no/such:image", store=store)
    with pytest.raises(SpecError, match="writable"):
        presets.image(image, writable=5, store=store)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="size"):
        presets.image(image, root="merged", size=1 << 20, store=store)
    with pytest.raises(SpecError, match="img"):
        presets.image(object(), store=store)  # type: ignore[arg-type]


def test_the_images_user_is_read_from_its_own_passwd_never_through_a_link(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "store")
    own = layer(member("etc/", DIRTYPE, mode=0o755), member("etc/passwd", data=b"app:x:1234:5678::/:/bin/sh\n"))
    linked = layer(member("etc/", DIRTYPE, mode=0o755), member("etc/passwd", SYMTYPE, linkname="/etc/passwd"))
    write_layout(str(tmp_path / "own"), [(TestImage([own]), "own")])
    write_layout(str(tmp_path / "linked"), [(TestImage([own, linked]), "linked")])
    img = store.load(tmp_path / "own")
    named = dataclasses.replace(img, config=dataclasses.replace(img.config, user="app"))
    spec = presets.image(named, store=store, root="merged")
    assert (spec.uid, spec.gid) == (1234, 5678)
    assert presets.image(named, store=store, root="merged", uid=7).gid is None  # a given id wins, whole
    top = store.load(tmp_path / "linked")
    as_root = dataclasses.replace(top, config=dataclasses.replace(top.config, user="root"))
    with pytest.raises(SpecError, match="names no user"):  # the host's /etc/passwd is not read
        presets.image(as_root, store=store, root="merged")


def test_the_bwrap_backend_refuses_an_overlay_by_capability(image: Image) -> None:
    spec = presets.minimal_system(Overlay("/mnt", [image.layers[0].path]))
    with pytest.raises(UnavailableError, match="no --overlay"):
        sandbox.run(["true"], spec, backend="bwrap")


def test_a_template_runs_the_merged_root_per_sandbox(image: Image) -> None:
    store = store_of(image)
    with sandbox.Template(presets.image(image, root="merged", store=store)) as t:
        first = t.run(["sh", "-c", "cat /etc/image-file; echo x > /tmp/f; ls /data"], capture_output=True, text=True)
        second = t.run(["sh", "-c", "ls /tmp; touch /data/no 2>&1"], capture_output=True, text=True)
    assert first.stdout == "top\ndir\nkeep\nxattr\n"
    assert "f" not in second.stdout.split("\n") and "Read-only" in second.stdout


@needs_overlay
def test_nothing_of_the_host_is_mounted_but_what_the_spec_declares(image: Image) -> None:
    spec = presets.image(image, store=store_of(image))
    r = run(spec, "cat /proc/self/mountinfo")
    points = {line.split()[4] for line in r.stdout.splitlines()}
    devices = {f"/dev/{n}" for n in ("null", "zero", "full", "random", "urandom", "tty", "pts", "shm")}
    proc_covers = {p for p in points if p.startswith("/proc/")}
    assert points - proc_covers == {"/", "/proc", "/dev", "/tmp"} | (devices & points)
    assert {"/", "/proc", "/dev", "/tmp"} <= points
    root = next(line for line in r.stdout.splitlines() if line.split()[4] == "/")
    assert " - overlay " in root and "nosuid" in root.split()[5]


@needs_overlay
def test_a_missing_layer_or_a_bad_kept_directory_is_a_setup_error_naming_it(image: Image, tmp_path: Path) -> None:
    lowers = [lay.path for lay in image.layers]
    spec = presets.image(image, store=store_of(image))
    missing = spec.replace(mounts=(Overlay("/", [*lowers, str(tmp_path / "nope")]), *spec.mounts[1:]))
    with pytest.raises(sandbox.SetupError) as err:
        run(missing, "true")
    assert err.value.step == "overlay" and err.value.errno == errno.ENOENT
    (tmp_path / "file").write_text("")
    with pytest.raises(sandbox.SetupError) as err:
        run(presets.image(image, writable=tmp_path / "file", store=store_of(image)), "true")
    assert err.value.step == "overlay" and err.value.errno == errno.ENOTDIR


def test_a_hostile_image_cannot_reach_the_host_through_proc_or_links(image: Image, root: str, canary: Path,
                                                                    tmp_path: Path) -> None:
    """The image's own root is all there is: /proc/1/root, the cwd's '..',
    and the paths of its layers on the host lead nowhere outside."""
    store = store_of(image)
    layer_file = os.path.join(image.layers[0].path, "etc", "image-file")
    script = (f"cat /proc/1/root{canary} ../../../..{canary} {layer_file} 2>&1; "
              "readlink /proc/1/root; ls /proc/1/root/; echo pwn > /proc/1/root/data/keep 2>&1; true")
    r = run(presets.image(image, root=root, store=store), script)
    assert "host secret" not in r.stdout and "base" not in r.stdout.split("\n")[:3]
    assert open(os.path.join(image.layers[0].path, "data", "keep")).read() == "keep\n"


def test_the_cli_runs_a_command_in_an_image(image: Image, tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "SANDBOX_IMAGES": store_of(image).path}
    cmd = [sys.executable, "-P", "-m", "sandbox", "run", "--image", image.digest, "--tmpfs", "/data/dir",
           "--", "sh", "-c", "cat /etc/image-file; ls /data/dir; pwd"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, "top\n/work\n"), r.stderr
    cmd[6] = "no/such:image"
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode != 0 and "--image no/such:image" in r.stderr and "no image" in r.stderr


@needs_overlay
def test_two_overlays_each_resolve_their_layers_below_the_new_roots_directory(image: Image,
                                                                             tmp_path: Path) -> None:
    """The store and a kept upper below /tmp, where the new root is built: a
    second overlay's layers must not be looked up after the first one's
    tmpfs covered that directory."""
    assert str(tmp_path).startswith("/tmp/") and image.layers[0].path.startswith("/tmp/")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "e").write_text("extra\n")
    spec = presets.image(image, Overlay("/mnt/ro", [str(tmp_path / "extra")], writable=False),
                         Overlay("/mnt/kept", [str(tmp_path / "extra")], upper=tmp_path / "keep"),
                         store=store_of(image))
    r = run(spec, "cat /etc/image-file /mnt/ro/e /mnt/kept/e && echo k > /mnt/kept/new")
    assert (r.returncode, r.stdout) == (0, "top\nextra\nextra\n"), r.stderr
    assert (tmp_path / "keep" / "upper" / "new").read_text() == "k\n"


def test_the_merged_root_runs_under_bwrap_too(image: Image) -> None:
    if not sandbox.backends.availability("bwrap")[0]:
        pytest.skip("bwrap is not available here")
    spec = presets.image(image, root="merged", store=store_of(image))
    r = sandbox.run(["sh", "-c", "cat /etc/image-file; ls /data"], spec, capture_output=True, text=True,
                    backend="bwrap", timeout=60)
    assert (r.returncode, r.stdout, r.backend) == (0, "top\ndir\nkeep\nxattr\n", "bwrap"), r.stderr


@needs_overlay
def test_a_layer_path_longer_than_an_fsconfig_string_mounts(image: Image, tmp_path: Path) -> None:
    """fsconfig copies at most 255 bytes of a string value: layers go as fds."""
    deep = tmp_path / ("d" * 200) / ("e" * 200)
    deep.mkdir(parents=True)
    (deep / "f").write_text("deep\n")
    assert len(str(deep)) > 400
    spec = presets.image(image, Overlay("/mnt/deep", [str(deep)]), store=store_of(image))
    assert run(spec, "cat /mnt/deep/f").stdout == "deep\n"
