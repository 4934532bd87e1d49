"""The launcher `python -m sandbox.task SPEC -- CMD...`: exit status, stdio, signals, death; both backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import sleepers, wait_until
from task_helpers import PY, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

pytestmark = pytest.mark.integration


def launcher(backend: str, spec: dict | str, *cmd: str) -> list[str]:
    text = spec if isinstance(spec, str) else json.dumps(spec)
    return [PY, "-m", "sandbox.task", "--backend", backend, text, "--", *cmd]


def test_exit_status_and_stdio_pass_through(backend: str, tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"write": [str(tmp_path)]}))
    r = subprocess.run(launcher(backend, f"@{spec_file}", "sh", "-c", 'read x; echo "got $x"; echo err >&2; exit 42'),
                       input="line\n", capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (42, "got line\n", "err\n")
    r = subprocess.run(launcher(backend, {}, "sh", "-c", "kill -KILL $$"), capture_output=True, timeout=60)
    assert r.returncode == 128 + signal.SIGKILL


def test_bad_spec_is_refused_by_name() -> None:
    r = subprocess.run([PY, "-m", "sandbox.task", '{"writeable": []}', "--", "true"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "writeable" in r.stderr


def test_unbuffered_output_arrives_before_the_end(backend: str) -> None:
    with subprocess.Popen(launcher(backend, {}, "sh", "-c", "echo first; sleep 30"), stdout=subprocess.PIPE,
                          start_new_session=True) as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == b"first\n"
        finally:
            p.terminate()
            p.wait(30)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded(backend: str, sig: int) -> None:
    script = f'trap "echo caught; exit 9" {signal.Signals(sig).name[3:]}; echo ready; while :; do sleep 0.05; done'
    with subprocess.Popen(launcher(backend, {}, "sh", "-c", script), stdout=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        p.send_signal(sig)
        assert p.wait(30) == 9
        assert p.stdout.read() == "caught\n"


def test_nothing_is_left_alive_when_the_launcher_is_killed(backend: str, no_leftovers: str) -> None:
    with subprocess.Popen(launcher(backend, {}, "sh", "-c", f"echo up; sleep 1000 {no_leftovers}"),
                          stdout=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None and p.stdout.readline() == "up\n"
        assert wait_until(lambda: bool(sleepers(no_leftovers)), timeout=10)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
    assert wait_until(lambda: not sleepers(no_leftovers), timeout=10)
