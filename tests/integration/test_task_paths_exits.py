"""The launcher's exit status for a command it cannot run; pathlib.Path wherever a path is taken (issue 24)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from task_helpers import PY, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

from sandbox import task
from sandbox.task import Bind, Layout, Sandbox

pytestmark = pytest.mark.integration


def _launch(backend: str, spec: dict[str, object], *cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "sandbox.task", "--backend", backend, json.dumps(spec), "--", *cmd],
                          capture_output=True, text=True, timeout=60)


def test_a_missing_command_exits_127_and_one_not_executable_126(backend: str, tmp_path: Path) -> None:
    r = _launch(backend, {}, "/nonexistent/cmd")
    assert r.returncode == 127 and "ExecNotFoundError" in r.stderr and "/nonexistent/cmd" in r.stderr
    r = _launch(backend, {}, "no-such-command-anywhere")
    assert r.returncode == 127, r.stderr
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o644)
    r = _launch(backend, {"read": [str(tmp_path)]}, str(script))
    assert r.returncode == 126 and "ran" not in r.stdout, r.stderr
    # a start that fails otherwise is still 125
    r = _launch(backend, {"probes": ["/usr"]}, "true")
    assert r.returncode == 125, r.stderr


def test_paths_may_be_pathlib_paths_everywhere(backend: str, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "in.txt").write_text("data")
    sb = Sandbox(read=[tmp_path / "work"], write=(tmp_path,), binds=[Bind(work, Path("/w"), writable=True)],
                 layout=Layout(work, Path("/w")), chdir=work, records=tmp_path / "records",
                 probes=[Path("/root/.ssh")])
    assert sb == Sandbox(read=[str(work)], write=[str(tmp_path)], binds=[Bind(str(work), "/w", True)],
                         layout=Layout(str(work), "/w"), chdir=str(work), records=str(tmp_path / "records"),
                         probes=["/root/.ssh"])
    assert task.translate(sb, ["cat", work / "in.txt"]) == ["cat", "/w/in.txt"]
    assert task.relative(sb, work / "in.txt") == "in.txt" and task.outside(sb, Path("in.txt")) == str(work / "in.txt")
    r = task.run(["cat", work / "in.txt"], sb, backend=backend, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "data"), r.stderr
    assert Path(r.record_path).parent == tmp_path / "records"
    task.sanitized_copy(work, tmp_path / "copy")
    assert (tmp_path / "copy" / "in.txt").read_text() == "data"
