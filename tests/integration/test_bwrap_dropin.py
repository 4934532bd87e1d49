"""`python -m sandbox run` as a drop-in for bwrap 0.8.0: the behaviours
bubblewrap's own test suite (tests/test-run.sh and friends) checks, restated
here in our words, on both backends (the CLI's `--backend`), as root and as
the unprivileged user. tools/run-bwrap-suite.sh runs the upstream suite
itself when a copy is at hand. Where real bwrap is installed, some cases
also check that it does the same, so a case states bwrap's behaviour and
not our guess of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

TIMEOUT = 60
BWRAP = shutil.which("bwrap")
BACKENDS = ("native", "bwrap")
PYTHON_M_SANDBOX = [sys.executable, "-P", "-m", "sandbox", "run"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    import sandbox

    found = sandbox.probe()
    ok, reason = (found.native, found.native_reason) if request.param == "native" else (found.bwrap, found.bwrap_reason)
    if not ok:
        pytest.skip(f"{request.param} backend unavailable: {reason}")
    return str(request.param)


def ours(backend: str, *args: str, **kw) -> subprocess.CompletedProcess[str]:
    """`python -m sandbox run --backend BACKEND ARGS`, captured."""
    kw.setdefault("cwd", "/")
    return subprocess.run([*PYTHON_M_SANDBOX, "--backend", backend, *args], capture_output=True, text=True,
                          timeout=TIMEOUT, **kw)


def real(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    """The real bwrap with ARGS, captured (the case is skipped without it)."""
    if BWRAP is None:
        pytest.skip("bwrap is not installed")
    kw.setdefault("cwd", "/")
    return subprocess.run([BWRAP, *args], capture_output=True, text=True, timeout=TIMEOUT, **kw)


@pytest.fixture
def host_tmp_file() -> Iterator[Path]:
    """A file with known content directly in the host's /tmp."""
    fd, name = tempfile.mkstemp(dir="/tmp", prefix="dropin-")
    os.write(fd, b"hello from the host\n")
    os.close(fd)
    os.chmod(name, 0o644)
    yield Path(name)
    os.unlink(name)


# ---------------------------------------------------------------- 1: no scaffolding inside

class TestNoScaffolding:
    """Whatever is bound, the sandbox never shows the directories and
    filesystems its own setup used (the new root is built on a tmpfs on a
    host directory such as /tmp; binding / must still show the host's /tmp)."""

    @pytest.mark.parametrize("bind", ["--bind", "--ro-bind", "--dev-bind"])
    def test_binding_the_root_shows_the_hosts_tmp(self, backend, host_tmp_file, bind):
        result = ours(backend, bind, "/", "/", "cat", str(host_tmp_file))
        assert (result.returncode, result.stdout) == (0, "hello from the host\n"), result.stderr

    def test_binding_tmp_elsewhere_shows_the_hosts_tmp(self, backend, host_tmp_file):
        result = ours(backend, "--bind", "/", "/", "--bind", "/tmp", "/mnt", "cat", f"/mnt/{host_tmp_file.name}")
        assert (result.returncode, result.stdout) == (0, "hello from the host\n"), result.stderr

    def test_binding_over_tmp_shows_what_was_bound(self, backend):
        with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
            Path(d, "input").write_text("bound\n")
            os.chmod(d, 0o755)
            result = ours(backend, "--bind", "/", "/", "--bind", d, "/tmp", "sh", "-c",
                          "cat /tmp/input; ls -A /tmp")
        assert (result.returncode, result.stdout) == (0, "bound\ninput\n"), result.stderr

    @pytest.mark.parametrize("name", ["oldroot", "newroot"])
    def test_no_pivot_directories(self, backend, name):
        result = ours(backend, "--bind", "/", "/", "--tmpfs", "/tmp", "test", "-e", f"/tmp/{name}")
        assert result.returncode == 1, result.stderr
