"""Fixtures of the image store's tests: a fresh store, images built from this
host's files, and a real registry (Debian's docker-registry) on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from image_helpers import DIRTYPE, TestImage, layer, layer_from_dir, member

from sandbox.images import ImageStore

REGISTRY_BIN = "docker-registry"


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "store")


@pytest.fixture(scope="session")
def host_image() -> TestImage:
    """Two layers: host files (/usr/lib/python3.11/json, /etc/os-release, /usr/bin/env), then a
    layer that deletes a file and a directory, makes one opaque and replaces a file."""
    base = layer_from_dir("/usr/lib/python3.11/json", "usr/lib/python3.11/json")
    extra = layer(member("etc", DIRTYPE, mode=0o755),
                  member("etc/os-release", data=open("/etc/os-release", "rb").read()),
                  member("usr/bin/", DIRTYPE, mode=0o755),
                  member("usr/bin/env", data=open("/usr/bin/env", "rb").read(), mode=0o755),
                  member("opt/", DIRTYPE, mode=0o755),
                  member("opt/old/", DIRTYPE, mode=0o755),
                  member("opt/old/a", data=b"a\n"))
    top = layer(member("usr/lib/python3.11/json/.wh.tool.py"),
                member("opt/.wh.old"),
                member("etc/os-release", data=b"ID=test-image\n"),
                member("usr/lib/python3.11/json/.wh..wh..opq"),
                member("usr/lib/python3.11/json/__init__.py", data=b"# replaced\n"))
    return TestImage([base + b"", extra, top], env=["PATH=/usr/bin", "GREETING=hello=world"],
                     working_dir="/work", cmd=["python3", "-c", "pass"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A docker-registry on 127.0.0.1, plain HTTP, storage in a temp dir; "127.0.0.1:PORT"."""
    binary = shutil.which(REGISTRY_BIN) or (f"/usr/bin/{REGISTRY_BIN}" if os.path.exists(
        f"/usr/bin/{REGISTRY_BIN}") else None)
    if binary is None:
        pytest.skip("docker-registry is not installed (Debian: apt-get install docker-registry; CI installs it)")
    with start_registry(binary, tmp_path_factory.mktemp("registry")) as addr:
        yield addr


class start_registry:  # noqa: N801 - used as a context manager, like open()
    """Run docker-registry with `extra` YAML (auth) until the block ends."""

    def __init__(self, binary: str, work: Path, extra: str = "") -> None:
        self.port = _free_port()
        self.work = work
        config = work / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {work / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n" + extra)
        self.argv = [binary, "serve", str(config)]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        log = open(self.work / "registry.log", "wb")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError("docker-registry did not start: "
                                       + (self.work / "registry.log").read_text()[-2000:]) from None
                time.sleep(0.05)
        return f"127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False
