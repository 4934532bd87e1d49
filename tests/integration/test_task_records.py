"""Isolation check, records, enforcement and enabled=False, on both backends, root and unprivileged."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from task_helpers import PY, task_backend, trun  # noqa: F401  (task_backend: the fixture `backend`)

from sandbox import IsolationError, task
from sandbox.task import Bind, Sandbox
from sandbox.task.records import RECORD_KEYS

pytestmark = pytest.mark.integration
KEY = "sk-test-0123456789abcdefXYZ"


def records_in(d: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]


def test_a_present_probe_fails_the_start_before_the_command_runs(backend: str, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / ".netrc").write_text("machine x password y")
    marker = tmp_path / "out" / "ran"
    marker.parent.mkdir()
    sb = Sandbox(read=(str(tmp_path / "ws"),), write=(str(marker.parent),), probes=(str(tmp_path / "ws" / ".netrc"),),
                 records=str(tmp_path / "rec"))
    with pytest.raises(IsolationError, match=r"\.netrc"):
        task.run(["touch", str(marker)], sb, backend=backend)
    assert not marker.exists()
    (rec,) = records_in(tmp_path / "rec")
    assert rec["exit_status"] is None and rec["check"][-1]["ok"] is False and ".netrc" in rec["check"][-1]["name"]
    # absent: the start goes on, and the record says it was checked
    ok = task.run(["true"], sb.replace(probes=(str(tmp_path / "ws" / "missing"),)), backend=backend)
    assert ok.returncode == 0
    assert {"name": f"probe {tmp_path}/ws/missing", "ok": True, "result": "absent"} in ok.record["check"]


def test_one_record_per_start_with_values_scrubbed(backend: str, tmp_path: Path) -> None:
    environ = {"OPENAI_API_KEY": KEY, "MWM_KEY": KEY, "SHORT_TOKEN": "short", "PATH": os.environ["PATH"]}
    (tmp_path / "ws").mkdir()
    sb = Sandbox(binds=(Bind(str(tmp_path / "ws"), "/w", writable=True),), env_allow=("MWM_*",),
                 env={"MODEL": "m"}, records=str(tmp_path / "rec"), role="judge", chdir=str(tmp_path / "ws"),
                 limits=task.Limits(cpu_s=30))
    r = task.run(["sh", "-c", "exit 3", KEY, "short", str(tmp_path / "ws" / "f")], sb, backend=backend,
                 environ=environ)
    assert r.returncode == 3
    (rec,) = records_in(tmp_path / "rec")
    assert set(rec) == set(RECORD_KEYS)
    text = json.dumps(rec)
    assert KEY not in text
    assert rec["command"] == ["sh", "-c", "exit 3", rec["command"][3], "short", "/w/f"]
    assert rec["command"][3] in ("<OPENAI_API_KEY>", "<MWM_KEY>")
    assert rec["chdir"] == "/w" and rec["exit_status"] == 3 and rec["confined"] is True
    assert rec["backend"] == backend and rec["role"] == "judge" and rec["limits"] == {"cpu_s": 30}
    assert {"source": str(tmp_path / "ws"), "target": "/w", "writable": True} in rec["binds"]
    assert set(rec["env_names"]) == {"MWM_KEY", "MODEL", "PATH", "SANDBOX_TASK_BROKER"}
    assert any(c["name"] == "network" and c["ok"] for c in rec["check"])


def _launcher(spec: dict, *cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "sandbox.task", json.dumps(spec), "--", *cmd], capture_output=True, text=True,
                          env=env, timeout=60)


def no_confinement_env() -> dict[str, str]:
    """An environment in which neither backend can run (native disabled, bwrap missing)."""
    return {**os.environ, "SANDBOX_DISABLE_NATIVE": "1", "SANDBOX_BWRAP": "/nonexistent/bwrap"}


def test_required_refuses_without_confinement(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    r = _launcher({"records": str(tmp_path / "rec")}, "touch", str(marker), env=no_confinement_env())
    assert r.returncode == 125 and "UnavailableError" in r.stderr and "required" in r.stderr
    assert not marker.exists() and not (tmp_path / "rec").exists()


def test_best_effort_runs_unconfined_and_records_why(tmp_path: Path) -> None:
    env = {**no_confinement_env(), "MWM_X": "1", "OTHER": "2"}
    spec = {"enforce": "best_effort", "records": str(tmp_path / "rec"), "env_allow": ["MWM_*"]}
    r = _launcher(spec, "sh", "-c", f"echo $MWM_X$OTHER; test -d {tmp_path}", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"
    (rec,) = records_in(tmp_path / "rec")
    assert rec["confined"] is False and "no sandbox backend" in rec["reason"] and rec["backend"] is None


def test_enabled_false_confines_nothing_and_holds_nothing_back(tmp_path: Path) -> None:
    sb = Sandbox(enabled=False, records=str(tmp_path / "rec"))
    r = task.run(["sh", "-c", f"echo $ONLY_HERE; ls {tmp_path}"], sb, capture_output=True, text=True,
                 environ={**os.environ, "ONLY_HERE": "visible"})
    assert r.stdout.split()[0] == "visible"
    (rec,) = records_in(tmp_path / "rec")
    assert rec["confined"] is False and rec["reason"] == "enabled=False"


def test_a_sandbox_inside_a_task_sandbox_needs_its_broker(backend: str) -> None:
    """Nested sandboxes: the default seccomp policy still denies new user namespaces inside, so
    sandbox.run works there only through the broker (docs/task.md, test_task_nested.py)."""
    code = ("import os, sandbox\n"
            "print('broker', sandbox.run(['true'], sandbox.presets.minimal_system()).returncode)\n"
            "del os.environ['SANDBOX_TASK_BROKER']\n"
            "for be in ('native', 'bwrap'):\n"
            "    try:\n"
            "        sandbox.run(['true'], sandbox.presets.minimal_system(), backend=be)\n"
            "        print(be, 'started')\n"
            "    except sandbox.UnavailableError:\n"
            "        print(be, 'refused')\n")
    r = task.run([PY, "-c", code], Sandbox(), backend=backend, capture_output=True, text=True, timeout=60)
    assert r.stdout.split("\n")[:3] == ["broker 0", "native refused", "bwrap refused"], r.stderr
