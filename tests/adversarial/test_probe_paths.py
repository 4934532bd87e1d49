"""Attack: a probe path that reaches the secret through /proc passes the isolation check.

`probe_paths` must be proven absent as the sandbox's own processes would look
them up. Under bwrap the check runs from outside, while bwrap waits after
setup; resolved as the caller's process, /proc/self/root/... named the
caller's root (or nothing), so "/proc/self/root/data/key" passed while
/data/key was visible inside.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import IsolationError, RoBind

from .attack import BACKENDS, make_base_spec, require, run

pytestmark = pytest.mark.integration

THROUGH_PROC = ["/proc/self/root/data/key", "/proc/thread-self/root/data/key", "/proc/1/root/data/key",
                "/proc/self/cwd/data/key", "/proc/self/root/proc/1/root/data/key"]


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    key = tmp_path / "key"
    key.write_text("secret\n")
    key.chmod(0o644)
    tmp_path.chmod(0o755)
    return tmp_path


@pytest.mark.parametrize("probe", THROUGH_PROC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_probe_through_proc_finds_a_visible_secret(backend: str, probe: str, secret: Path) -> None:
    require(backend)
    spec = make_base_spec(RoBind(str(secret), "/data"), probe_paths=[probe], cwd="/")
    with pytest.raises(IsolationError) as info:
        run(["true"], spec, backend, timeout=30)
    assert info.value.path == probe
    assert "is visible inside the sandbox" in str(info.value)


@pytest.mark.parametrize("probe", THROUGH_PROC)
@pytest.mark.parametrize("backend", BACKENDS)
def test_probe_through_proc_passes_when_the_secret_is_absent(backend: str, probe: str, secret: Path) -> None:
    require(backend)
    spec = make_base_spec(RoBind(str(secret), "/other"), probe_paths=[probe], cwd="/")
    done = run(["true"], spec, backend, timeout=30)
    assert done.returncode == 0
    assert done.isolation["probe_paths_absent"] == [probe]
