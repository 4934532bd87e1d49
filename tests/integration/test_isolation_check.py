"""The probe_paths isolation check: secrets proven absent before the command runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import usable_backend

import sandbox
from sandbox import RoBind

pytestmark = pytest.mark.integration


@pytest.fixture(params=["native", "bwrap"])
def backend(request: pytest.FixtureRequest) -> str:
    return usable_backend(request.param)


def test_absent_probe_paths_let_the_command_run(base_spec, tmp_path: Path, backend: str) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret")
    spec = base_spec(probe_paths=["/etc/shadow", "/root", str(secret), "/home"])
    done = sandbox.run(["true"], spec, backend=backend, timeout=60)
    assert done.returncode == 0
    assert done.isolation["probe_paths_absent"] == list(spec.probe_paths)


def test_a_visible_probe_path_fails_the_start_and_the_command_never_runs(base_spec, tmp_path: Path,
                                                                        backend: str) -> None:
    secret_dir = tmp_path / "keys"
    secret_dir.mkdir()
    (secret_dir / "id_rsa").write_text("PRIVATE")
    out = tmp_path / "out"
    out.mkdir()
    marker = out / "ran"
    spec = base_spec(RoBind(str(secret_dir)), sandbox.Bind(str(out)), probe_paths=[str(secret_dir / "id_rsa")])
    with pytest.raises(sandbox.IsolationError) as info:
        sandbox.run(["sh", "-c", f"touch {marker}"], spec, backend=backend, timeout=60)
    assert info.value.path == str(secret_dir / "id_rsa")
    assert "visible" in str(info.value)
    assert not marker.exists()


def test_probe_paths_are_validated() -> None:
    with pytest.raises(sandbox.SpecError) as info:
        sandbox.Spec(probe_paths=["relative/path"])
    assert info.value.field == "probe_paths[0]"
