"""The bwrap backend's own mechanics: synchronous errors whatever stderr is,
exit statuses, killing, fd and argv hygiene, timings.

What a sandbox looks like from inside is the conformance suite's job
(tests/conformance); this module checks how the backend drives bwrap.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import make_base_spec, sleep_cmd

import sandbox

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _require_bwrap() -> None:
    if not sandbox.probe().bwrap:
        pytest.skip(f"bwrap missing: {sandbox.probe().bwrap_reason}")


def bwrap_run(argv: list[str], spec: sandbox.Spec | None = None, **kwargs: object) -> sandbox.CompletedProcess:
    return sandbox.run(argv, spec or make_base_spec(), backend="bwrap", timeout=60, **kwargs)  # type: ignore[arg-type]


STDERR_KINDS: dict[str, Callable[[Path], object]] = {
    "pipe": lambda tmp: sandbox.PIPE,
    "devnull": lambda tmp: sandbox.DEVNULL,
    "file": lambda tmp: open(tmp / "stderr.txt", "ab"),  # noqa: SIM115 - closed by the test
    "inherited": lambda tmp: None,
}


@pytest.mark.parametrize("kind", sorted(STDERR_KINDS))
class TestErrorsAreSynchronous:
    """spawn() raises the typed error before returning, whatever the command's stderr is."""

    def stderr(self, kind: str, tmp_path: Path) -> object:
        value = STDERR_KINDS[kind](tmp_path)
        self.opened = value if hasattr(value, "close") else None
        return value

    def teardown_method(self) -> None:
        if getattr(self, "opened", None) is not None:
            self.opened.close()  # type: ignore[union-attr]

    def test_missing_command(self, kind: str, tmp_path: Path) -> None:
        with pytest.raises(sandbox.ExecNotFoundError) as info:
            sandbox.spawn(["no-such-command-xyz"], make_base_spec(), backend="bwrap",
                          stderr=self.stderr(kind, tmp_path))
        assert info.value.errno == 2 and info.value.backend == "bwrap"

    def test_not_executable(self, kind: str, tmp_path: Path) -> None:
        with pytest.raises(sandbox.ExecPermissionError):
            sandbox.spawn(["/usr"], make_base_spec(), backend="bwrap", stderr=self.stderr(kind, tmp_path))

    def test_not_executable_in_path(self, kind: str, tmp_path: Path) -> None:
        spec = make_base_spec(sandbox.File("/opt/bin/tool", b"#!/bin/sh\n", perms=0o644),
                              env={"PATH": "/opt/bin:/usr/bin"})
        with pytest.raises(sandbox.ExecPermissionError):
            sandbox.spawn(["tool"], spec, backend="bwrap", stderr=self.stderr(kind, tmp_path))

    def test_setup_failure(self, kind: str, tmp_path: Path) -> None:
        spec = make_base_spec(sandbox.Bind("/nonexistent-source-xyz", "/x"))
        with pytest.raises(sandbox.SetupError) as info:
            sandbox.spawn(["true"], spec, backend="bwrap", stderr=self.stderr(kind, tmp_path))
        err = info.value
        assert (err.step, err.path, err.errno, err.backend) == ("source", "/nonexistent-source-xyz", 2, "bwrap")
        assert str(err) == "Can't find source path /nonexistent-source-xyz: No such file or directory"

    def test_strict_cwd(self, kind: str, tmp_path: Path) -> None:
        with pytest.raises(sandbox.SetupError) as info:
            sandbox.spawn(["true"], make_base_spec(cwd="/nonexistent"), backend="bwrap",
                          stderr=self.stderr(kind, tmp_path))
        assert (info.value.step, info.value.path) == ("cwd", "/nonexistent")


def test_a_piped_stderr_holds_only_the_commands_output() -> None:
    """bwrap's own message is taken out of a captured stderr pipe when it becomes the exception."""
    result = bwrap_run(["sh", "-c", "echo out; echo err >&2"], capture_output=True)
    assert (result.stdout, result.stderr) == (b"out\n", b"err\n")


def test_exit_status_and_signals() -> None:
    assert bwrap_run(["sh", "-c", "exit 42"]).returncode == 42
    assert bwrap_run(["sh", "-c", "kill -KILL $$"]).returncode == -9


def test_kill_ends_every_process(no_leftovers: str, procs: Any) -> None:
    proc = sandbox.spawn(["sh", "-c", f"{sleep_cmd(no_leftovers)} & {sleep_cmd(no_leftovers)}"],
                         make_base_spec(), backend="bwrap")
    assert procs.wait_until(lambda: len(procs.with_marker(no_leftovers)) >= 2)
    proc.kill()
    assert proc.wait(timeout=10) == -signal.SIGKILL


def test_terminate_ends_the_sandbox(no_leftovers: str, procs: Any) -> None:
    proc = sandbox.spawn(["sh", "-c", sleep_cmd(no_leftovers)], make_base_spec(), backend="bwrap")
    assert procs.wait_until(lambda: bool(procs.with_marker(no_leftovers)))
    proc.terminate()
    assert proc.wait(timeout=10) == -signal.SIGTERM  # bwrap's monitor dies of it; PDEATHSIG kills the rest


def test_background_processes_die_with_the_command(no_leftovers: str) -> None:
    result = bwrap_run(["sh", "-c", f"{sleep_cmd(no_leftovers)} > /dev/null 2>&1 & exit 5"])
    assert result.returncode == 5


def test_environment_is_not_on_bwraps_command_line(no_leftovers: str) -> None:
    secret = "s3cr3t-value-" + no_leftovers
    spec = make_base_spec(env={"PATH": "/usr/bin:/bin", "TOKEN": secret})
    with sandbox.spawn(["sh", "-c", sleep_cmd(no_leftovers)], spec, backend="bwrap") as proc:
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert secret.encode() not in cmdline
        assert b"--args" in cmdline
        proc.kill()


def test_returns_once_the_command_runs() -> None:
    with sandbox.spawn(["sh", "-c", "read x; echo got $x"], make_base_spec(), backend="bwrap",
                       stdin=sandbox.PIPE, stdout=sandbox.PIPE) as proc:
        assert set(proc.timings) >= {"spawned", "child", "ready", "exec"}
        assert proc.timings["spawned"] <= proc.timings["child"] <= proc.timings["ready"] <= proc.timings["exec"]
        out, _ = proc.communicate(b"hello\n", timeout=30)
    assert out == b"got hello\n" and proc.returncode == 0


def test_no_fd_of_the_caller_leaks_into_bwrap() -> None:
    r, w = os.pipe()
    os.set_inheritable(r, True)
    try:
        result = bwrap_run(["sh", "-c", "ls /proc/self/fd"], capture_output=True)
    finally:
        os.close(r)
        os.close(w)
    assert sorted(int(x) for x in result.stdout.split()) == [0, 1, 2, 3]  # 3: ls's own directory fd


def test_rlimits_without_seccomp_get_an_allow_all_filter() -> None:
    spec = make_base_spec(limits=sandbox.Limits(nofile=50), seccomp=None)
    out = bwrap_run(["sh", "-c", "ulimit -n; grep Seccomp: /proc/self/status"], spec, capture_output=True)
    lines = out.stdout.decode().split("\n")
    assert lines[0] == "50" and lines[1].split() == ["Seccomp:", "2"]


def test_rlimits_do_not_bind_the_setup() -> None:
    """A file limit below a File's size: bwrap writes the file during setup, before the limit applies."""
    spec = make_base_spec(sandbox.File("/big", b"x" * 10000), limits=sandbox.Limits(file_bytes=100))
    out = bwrap_run(["sh", "-c", "wc -c < /big; ulimit -f"], spec, capture_output=True)
    assert out.stdout.split() == [b"10000", b"0"]  # ulimit -f counts 512-byte blocks


def test_spawning_does_not_leave_zombies_or_popen_state() -> None:
    before = set(subprocess._active)  # type: ignore[attr-defined]
    for _ in range(5):
        assert bwrap_run(["true"]).returncode == 0
    assert set(subprocess._active) == before  # type: ignore[attr-defined]
