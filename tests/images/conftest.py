"""Fixtures of the image store's tests: a fresh store, images built from this
host's files, a host file no image may reach, and a real registry (Debian's docker-registry) on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.images import ImageStore

from .image_helpers import DIRTYPE, JSON_ARC, JSON_DIR, TestImage, layer, layer_from_dir, member
from .registry_server import REGISTRY_BIN, start_registry


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A host file no image should reach."""
    path = tmp_path_factory.mktemp("canary") / "secret"
    path.write_text("host secret\n")
    return path


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "store")


@pytest.fixture(scope="session")
def host_image() -> TestImage:
    """Three layers: host files (the standard library's json package), more host files (/etc/os-release,
    /usr/bin/env, a directory /opt/old), then a layer that deletes a file and a directory, makes
    a directory opaque and replaces files."""
    base = layer_from_dir(JSON_DIR, JSON_ARC)
    extra = layer(member("etc", DIRTYPE, mode=0o755),
                  member("etc/os-release", data=open("/etc/os-release", "rb").read()),
                  member("usr/bin/", DIRTYPE, mode=0o755),
                  member("usr/bin/env", data=open("/usr/bin/env", "rb").read(), mode=0o755),
                  member("opt/", DIRTYPE, mode=0o755),
                  member("opt/old/", DIRTYPE, mode=0o755),
                  member("opt/old/a", data=b"a\n"))
    top = layer(member(f"{JSON_ARC}/.wh.tool.py"),
                member("opt/.wh.old"),
                member("etc/os-release", data=b"ID=test-image\n"),
                member(f"{JSON_ARC}/.wh..wh..opq"),
                member(f"{JSON_ARC}/__init__.py", data=b"# replaced\n"))
    return TestImage([base + b"", extra, top], env=["PATH=/usr/bin", "GREETING=hello=world"],
                     working_dir="/work", cmd=["python3", "-c", "pass"])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A docker-registry on 127.0.0.1, plain HTTP, storage in a temp dir; "127.0.0.1:PORT"."""
    binary = shutil.which(REGISTRY_BIN) or (f"/usr/bin/{REGISTRY_BIN}" if os.path.exists(
        f"/usr/bin/{REGISTRY_BIN}") else None)
    if binary is None:
        pytest.skip("docker-registry is not installed (Debian: apt-get install docker-registry; CI installs it)")
    with start_registry(binary, tmp_path_factory.mktemp("registry")) as addr:
        yield addr
