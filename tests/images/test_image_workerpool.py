"""A WorkerPool in an image (sandbox.images.python): its zygote is the
image's own Python, checked compatible (the caller's major.minor, and it
loads this package's C core with this package and cloudpickle bound
read-only), or refused naming why. The images are built here from this
host's Python: its executable and libraries, and a layer of its standard
library. Real sandboxes, root and unprivileged."""

from __future__ import annotations

import glob
import os
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

import sandbox
from sandbox import presets
from sandbox.errors import UnavailableError
from sandbox.images import Image, ImageStore
from sandbox.images.python import python_name, required_glibc
from sandbox.spec import Overlay
from sandbox.workerpool.interpreter import PACKAGE_ROOT

from .image_helpers import DIRTYPE, TestImage, _libraries, file_members, layer, member, runnable_layer, write_layout

pytestmark = pytest.mark.skipif(not presets.overlay_works(), reason="no overlayfs in a user namespace here")

STDLIB = sysconfig.get_path("stdlib")  # /usr/lib/python3.11
SKIP = ("test", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data", "config-")


def _origin(module: str) -> str:
    """The file a compiled module is loaded from."""
    import importlib.util

    found = importlib.util.find_spec(module)
    assert found is not None and found.origin is not None
    return found.origin


def _native() -> str:
    return _origin("sandbox._native")


def python_layer(without: str = "") -> bytes:
    """This host's python3.X (its real file, at usr/bin/python3.X), the
    libraries it, its extension modules, cffi's backend and this package's C
    core load (at their real paths), `without` one of them."""
    python = os.path.realpath(f"/usr/bin/{python_name()}")
    objects = [python, _native(), _origin("_cffi_backend"), *glob.glob(os.path.join(STDLIB, "lib-dynload", "*.so"))]
    libs = {os.path.realpath(lib): lib for obj in objects for lib in _libraries(obj)}
    files = {f"usr/bin/{python_name()}": python}
    for real, name in libs.items():
        if without and without in (os.path.basename(name), os.path.basename(real)):
            continue
        files[real.lstrip("/")] = real  # the file, and its name as the loader looks it up (via the lib link)
        files[("usr" + name if not name.startswith("/usr/") else name).lstrip("/")] = real
    return layer(*file_members(files))


def stdlib_layer() -> bytes:
    """The standard library, without its tests, GUI, build files and bytecode."""
    import io

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
            rel = os.path.relpath("/" + info.name, STDLIB)
            if rel.split("/")[0].startswith(SKIP) or "__pycache__" in info.name or info.isdev():
                return None
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            return info
        tf.add(STDLIB, arcname=STDLIB.lstrip("/"), filter=keep)
    return buf.getvalue()


def make_image(root: Path, layers: list[bytes]) -> Image:
    write_layout(str(root / "layout"), [(TestImage(layers, env=["PATH=/usr/bin:/bin"]), "py")])
    return ImageStore(root / "store").load(root / "layout")


@pytest.fixture(scope="module")
def stdlib() -> bytes:
    return stdlib_layer()


@pytest.fixture(scope="module")
def py_image(tmp_path_factory: pytest.TempPathFactory, stdlib: bytes) -> Image:
    base = runnable_layer((member("etc/", DIRTYPE, mode=0o755), member("etc/image-file", data=b"from the image\n")))
    return make_image(tmp_path_factory.mktemp("py"), [base, python_layer(), stdlib])


def spec_of(img: Image) -> sandbox.Spec:
    return presets.image(img, store=ImageStore(Path(img.layers[0].path).parents[2]))


def read_image_file() -> tuple[str, str, str]:
    import sys as s

    with open("/etc/image-file") as f:
        return f.read(), s.executable, open("/proc/self/exe", "rb").read(4).hex()


def write_then_look(path: str) -> bool:
    seen = os.path.exists(path)
    with open(path, "w") as f:
        f.write("x")
    return seen


def test_tasks_run_in_the_images_python(py_image: Image) -> None:
    with sandbox.WorkerPool(spec_of(py_image), 2) as pool:
        text, executable, magic = pool.submit(read_image_file).result(timeout=60)
        assert (text, executable, magic) == ("from the image\n", f"/usr/bin/{python_name()}", "7f454c46")
        # a task's /tmp is its own: the next one does not see what the last one wrote
        assert [pool.submit(write_then_look, "/tmp/mark").result(timeout=60) for _ in range(3)] == [False] * 3


def test_the_zygote_sees_only_the_image_and_the_bound_package(py_image: Image) -> None:
    """Neither the caller's executable (its venv's) nor the host's standard
    library is bound: the stdlib's tests, left out of the image, are absent."""
    with sandbox.WorkerPool(spec_of(py_image), 1) as pool:
        caller = pool.submit(os.path.exists, sys.executable).result(timeout=60)
        tests = pool.submit(os.path.exists, os.path.join(STDLIB, "test")).result(timeout=60)
        bound = pool.submit(os.path.isdir, os.path.join(PACKAGE_ROOT, "sandbox")).result(timeout=60)
        ls = pool.submit(os.listdir, "/").result(timeout=60)
    assert os.path.exists(os.path.join(STDLIB, "test"))
    assert (caller, tests, bound) == (sys.executable.startswith(PACKAGE_ROOT), False, True)
    assert "home" not in ls and "etc" in ls


def test_an_image_without_python_is_refused_naming_it(tmp_path: Path) -> None:
    img = make_image(tmp_path, [runnable_layer()])
    with pytest.raises(UnavailableError, match=rf"no {python_name()} on its PATH .*the caller's 3\.\d+"):
        sandbox.WorkerPool(spec_of(img), 1)


def test_an_image_with_another_python_says_which(tmp_path: Path) -> None:
    """Its python3 answers 3.9 (a script standing in for an older
    interpreter: what the check reads is its answer)."""
    fake = member("usr/bin/python3", data=b"#!/bin/sh\necho 3.9\n", mode=0o755)
    img = make_image(tmp_path, [runnable_layer((fake,))])
    with pytest.raises(UnavailableError, match=r"its python3 is 3\.9"):
        sandbox.WorkerPool(spec_of(img), 1)


def test_a_python_that_cannot_load_the_c_core_is_refused_naming_why(tmp_path: Path, stdlib: bytes) -> None:
    """Without libpthread.so.0, which cffi's backend links, the image's
    Python starts but cannot load this package's C core."""
    img = make_image(tmp_path, [runnable_layer(), python_layer(without="libpthread.so.0"), stdlib])
    with pytest.raises(UnavailableError, match=r"cannot load this package's C core .*libpthread"):
        sandbox.WorkerPool(spec_of(img), 1)


def test_the_c_cores_glibc_need_is_read_from_its_symbol_versions() -> None:
    need = required_glibc(_native())
    major, minor = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0.0").split()[1].split(".")[:2]
    assert (2, 2) <= need <= (int(major), int(minor))



def write_over(path: str) -> tuple[str, str]:
    """What `path` holds, then what writing to it did."""
    with open(path) as f:
        seen = f.read()
    try:
        with open(path, "w") as f:
            f.write("task\n")
    except OSError as exc:
        return seen, exc.strerror or ""
    return seen, "written"


def test_no_task_writes_where_the_next_task_would_see_it(py_image: Image, tmp_path: Path) -> None:
    """The zygote's overlays (the image's root, and any other Overlay of the
    Spec) are one mount shared by its tasks: read-only in them, as the root
    of a WorkerPool always is. (Before, a task wrote into an Overlay at
    /mnt/o and the next read it.)"""
    (tmp_path / "lower").mkdir()
    (tmp_path / "lower" / "f").write_text("lower\n")
    spec = spec_of(py_image)
    spec = spec.replace(mounts=(*spec.mounts, Overlay("/mnt/o", [str(tmp_path / "lower")])))
    with sandbox.WorkerPool(spec, 1) as pool:
        results = [pool.submit(write_over, path).result(timeout=60)
                   for path in ("/mnt/o/f", "/mnt/o/f", "/etc/image-file", "/etc/image-file")]
    assert results == [("lower\n", "Read-only file system")] * 2 + [("from the image\n", "Read-only file system")] * 2
    assert (tmp_path / "lower" / "f").read_text() == "lower\n"


def test_a_merged_root_with_no_room_for_the_package_is_refused_naming_it(py_image: Image) -> None:
    """A merged root is read-only: the package's directory has no mount
    point there (unless it lies below one of its scratch tmpfs)."""
    if PACKAGE_ROOT.startswith(("/tmp/", "/run/", "/var/tmp/", "/root/")):
        pytest.skip(f"this package lies below a merged root's scratch directory: {PACKAGE_ROOT}")
    spec = presets.image(py_image, root="merged", store=ImageStore(Path(py_image.layers[0].path).parents[2]))
    with pytest.raises(UnavailableError, match=r"cannot bind this package and cloudpickle into it"):
        sandbox.WorkerPool(spec, 1)
