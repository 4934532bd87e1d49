"""The `native` mode of sandbox.compat.avatar end to end, run exactly as the harness runs a sandbox:

    spec = sandbox.prepare(argv, cwd)
    subprocess.run(spec.argv, cwd=cwd, env=spec.env, preexec_fn=spec.preexec_fn, timeout=...)

The whole module is skipped while the native launcher is unavailable. No traffic
leaves the machine: the network checks only read /proc/net/dev.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_avatar_exec import RIGGED_CHECK, TIMEOUT
from test_avatar_exec import harness_run as exec_harness_run

from sandbox.compat.avatar import (
    NativeSandbox,
    RLimits,
    Sandbox,
    SandboxUnavailable,
    make_sandbox,
)

pytestmark = pytest.mark.integration



def native(**kwargs: object) -> NativeSandbox:
    """A NativeSandbox, or skip the test with the launcher's reason."""
    try:
        return NativeSandbox(**kwargs)  # type: ignore[arg-type]
    except SandboxUnavailable as exc:
        pytest.skip(f"native sandbox unavailable: {exc}")


def harness_run(
    sandbox: Sandbox, argv: list[str], cwd: Path, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Run `argv` exactly as the harness does (test_avatar_exec's); a native launch has no preexec_fn."""
    return exec_harness_run(sandbox, argv, cwd, timeout, preexec=False)


def interfaces(net_dev: str) -> set[str]:
    """Interface names listed in a /proc/net/dev text."""
    return {line.split(":", 1)[0].strip() for line in net_dev.splitlines()[2:] if ":" in line}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace: the harness's cwd."""
    path = tmp_path / "workspace"
    path.mkdir()
    return path


# ---------------------------------------------------------------- the filesystem

def test_made_by_make_sandbox(ws: Path) -> None:
    native()  # skip if unavailable
    proc = harness_run(make_sandbox("native"), ["/bin/sh", "-c", "pwd"], ws)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(ws)


def test_write_under_cwd_lands_on_host(ws: Path) -> None:
    proc = harness_run(native(), ["/bin/sh", "-c", "echo hello > made-inside && mkdir sub && echo x > sub/f"], ws)
    assert proc.returncode == 0, proc.stderr
    assert (ws / "made-inside").read_text() == "hello\n"
    assert (ws / "sub" / "f").read_text() == "x\n"


def test_cwd_sees_host_files(ws: Path) -> None:
    (ws / "input").write_text("from host\n")
    proc = harness_run(native(), ["cat", "input"], ws)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "from host\n"


@pytest.mark.parametrize("where", ["/usr", "/etc", "/var", "/"])
def test_writes_outside_cwd_fail(ws: Path, where: str) -> None:
    target = Path(where) / f"avatar-test-{uuid.uuid4().hex}"
    try:
        proc = harness_run(native(), ["/bin/sh", "-c", f"echo x > {target}"], ws)
        assert proc.returncode != 0
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


def test_home_is_read_only(ws: Path) -> None:
    home = Path.home()
    if str(ws).startswith(str(home) + "/"):
        pytest.skip("the workspace lies under HOME")
    name = f"avatar-test-{uuid.uuid4().hex}"
    try:
        proc = harness_run(native(), ["/bin/sh", "-c", f'echo x > "$HOME/{name}"'], ws)
        assert proc.returncode != 0
        assert not (home / name).exists()
    finally:
        (home / name).unlink(missing_ok=True)


def test_tmp_is_fresh_and_private(ws: Path) -> None:
    name = f"avatar-test-{uuid.uuid4().hex}"
    host_tmp_entry = Path("/tmp") / f"avatar-host-{uuid.uuid4().hex}"
    host_tmp_entry.write_text("host")
    try:
        script = f"echo x > /tmp/{name} && cat /tmp/{name} && test ! -e {host_tmp_entry}"
        proc = harness_run(native(), ["/bin/sh", "-c", script], ws)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "x\n"
        assert not (Path("/tmp") / name).exists()
    finally:
        (Path("/tmp") / name).unlink(missing_ok=True)
        host_tmp_entry.unlink()


def test_dev_and_proc_are_usable(ws: Path) -> None:
    script = "echo gone > /dev/null && head -c 4 /dev/zero | wc -c && test -r /proc/self/status && echo $$"
    proc = harness_run(native(), ["/bin/sh", "-c", script], ws)
    assert proc.returncode == 0, proc.stderr
    count, pid = proc.stdout.split()
    assert count == "4"
    assert int(pid) < 10  # a fresh pid namespace


# ---------------------------------------------------------------- the network

def test_only_loopback_without_network(ws: Path) -> None:
    proc = harness_run(native(), ["cat", "/proc/net/dev"], ws)
    assert proc.returncode == 0, proc.stderr
    assert interfaces(proc.stdout) == {"lo"}


def test_host_interfaces_with_network(ws: Path) -> None:
    host = interfaces(Path("/proc/net/dev").read_text())
    proc = harness_run(native(allow_network=True), ["cat", "/proc/net/dev"], ws)
    assert proc.returncode == 0, proc.stderr
    assert interfaces(proc.stdout) == host


# ---------------------------------------------------------------- environment and limits

def test_rigged_env_is_stripped(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox = native()
    monkeypatch.setenv("RIGGED", "1")
    assert harness_run(sandbox, RIGGED_CHECK, ws).returncode == 1


def test_command_sees_the_hermetic_env(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox = native()
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("PYTHONPATH", "/evil")
    monkeypatch.setenv("LC_TIME", "C")
    proc = harness_run(sandbox, ["/usr/bin/env"], ws)
    assert proc.returncode == 0, proc.stderr
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    assert "SECRET_TOKEN" not in env
    assert "PYTHONPATH" not in env
    assert env["LC_TIME"] == "C"
    assert env["PATH"] == os.environ["PATH"]


def test_fsize_limit_holds(ws: Path) -> None:
    # Byte-precise: needs the byte-precise file-size field of Limits (see the TODO in avatar._native_limits).
    sandbox = native(rlimits=RLimits(cpu_seconds=1000, fsize_bytes=4096))
    proc = harness_run(sandbox, ["/bin/sh", "-c", "head -c 1048576 /dev/zero > big"], ws)
    assert proc.returncode != 0
    assert (ws / "big").stat().st_size <= 4096


def test_cpu_limit_holds(ws: Path) -> None:
    sandbox = native(rlimits=RLimits(cpu_seconds=1))
    start = time.monotonic()
    proc = harness_run(sandbox, ["/bin/sh", "-c", "while :; do :; done"], ws, timeout=30)
    assert proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
    assert time.monotonic() - start < 20


# ---------------------------------------------------------------- the exit-code contract

@pytest.mark.parametrize("code", [0, 1, 2, 3, 42, 124, 128, 255])
def test_exit_code_passes_through(ws: Path, code: int) -> None:
    assert harness_run(native(), ["/bin/sh", "-c", f"exit {code}"], ws).returncode == code


@pytest.mark.parametrize("argv", [["avatar-no-such-command-7f3a"], ["/nonexistent/avatar/cmd"], ["./missing"]])
def test_missing_command_is_127(ws: Path, argv: list[str]) -> None:
    assert harness_run(native(), argv, ws).returncode == 127


def test_non_executable_is_126(ws: Path) -> None:
    script = ws / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    assert harness_run(native(), [str(script)], ws).returncode == 126
    assert harness_run(native(), ["./script.sh"], ws).returncode == 126


def test_directory_is_126(ws: Path) -> None:
    (ws / "adir").mkdir()
    assert harness_run(native(), [str(ws / "adir")], ws).returncode == 126


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGUSR1, signal.SIGSEGV])
def test_signal_death_is_minus_n(ws: Path, sig: signal.Signals) -> None:
    proc = harness_run(native(), ["/bin/sh", "-c", f"kill -{sig.name.removeprefix('SIG')} $$; sleep 5"], ws)
    assert proc.returncode == -sig


def test_missing_cwd_harness_style_fails_on_the_host(tmp_path: Path) -> None:
    # The harness passes cwd= to subprocess.run too, so a cwd missing on the host
    # fails there (FileNotFoundError), before the launcher runs: as in every mode.
    missing = tmp_path / "does-not-exist"
    sandbox = native()
    spec = sandbox.prepare(["true"], missing)  # pure: no check, no error
    with pytest.raises(FileNotFoundError):
        subprocess.run(spec.argv, cwd=missing, env=spec.env, preexec_fn=spec.preexec_fn, timeout=TIMEOUT,
                       check=False)


def test_missing_cwd_is_a_setup_failure_125(tmp_path: Path) -> None:
    # Run from elsewhere (or after the workspace vanished): the launcher cannot
    # bind the cwd, reports a setup failure, and never runs the command.
    missing = tmp_path / "does-not-exist"
    spec = native().prepare(["/bin/sh", "-c", "echo ran > /dev/stderr"], missing)
    proc = subprocess.run(spec.argv, cwd=tmp_path, env=spec.env, preexec_fn=spec.preexec_fn, timeout=TIMEOUT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 125
    assert any(line.startswith("sandbox: ") for line in proc.stderr.splitlines()), proc.stderr
    assert "ran" not in proc.stderr
    assert not missing.exists()


def test_workspace_removed_after_prepare_is_125(tmp_path: Path) -> None:
    ws = tmp_path / "gone"
    ws.mkdir()
    spec = native().prepare(["true"], ws)
    ws.rmdir()
    proc = subprocess.run(spec.argv, cwd=tmp_path, env=spec.env, timeout=TIMEOUT, capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 125
    assert "sandbox: " in proc.stderr


# ---------------------------------------------------------------- timeouts and threads

def marked_processes(marker: str) -> list[int]:
    """Pids whose command line is `sleep 1000 <marker>`."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                parts = f.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if marker.encode() in parts and b"1000" in parts and any(p.endswith(b"sleep") for p in parts):
            found.append(int(entry.name))
    return found


def test_timeout_leaves_no_grandchildren(ws: Path) -> None:
    sandbox = native()
    # GNU sleep adds its arguments: the marker is a unique extra fraction of a second.
    marker = f"0.{secrets.randbelow(10**9):09d}1"
    script = (f"(sleep 1000 {marker} &); sleep 1000 {marker} & sleep 1000 {marker} & "
              f"echo started > started; wait")
    seen = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal seen
        while not stop.is_set():
            seen = max(seen, len(marked_processes(marker)))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            harness_run(sandbox, ["/bin/sh", "-c", script], ws, timeout=3)
    finally:
        stop.set()
        watcher.join()
    assert (ws / "started").exists()
    assert seen == 3, "the sleeps never ran, so the test proves nothing"
    deadline = time.monotonic() + 10
    while marked_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = marked_processes(marker)
    for pid in left:  # do not leave them behind even when the test fails
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert left == []


def test_nothing_is_left_when_the_launcher_returns(ws: Path) -> None:
    # The launcher exits with the status the sandbox's reaper reports once it has killed and reaped every
    # other process (a stopped one and a new session's included), not after its own exit.
    marker = f"0.{secrets.randbelow(10**9):09d}1"
    script = (f"sleep 1000 {marker} & setsid sleep 1000 {marker} & sleep 1000 {marker} & p=$!; "
              'until [ "$(cat /proc/$p/comm)" = sleep ]; do :; done; kill -STOP $p; '
              "until [ $(cat /proc/[0-9]*/comm | grep -c '^sleep$') = 3 ]; do :; done; exit 9")
    result = harness_run(native(), ["/bin/sh", "-c", script], ws)
    left = marked_processes(marker)
    for pid in left:  # do not leave them behind even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert (result.returncode, left) == (9, [])


def test_32_threads_prepare_and_run_concurrently(tmp_path: Path) -> None:
    sandbox = native(rlimits=RLimits())
    n = 32
    barrier = threading.Barrier(n)

    def one(i: int) -> tuple[int, str, str, str]:
        ws = tmp_path / f"ws{i}"
        ws.mkdir()
        barrier.wait(timeout=TIMEOUT)
        proc = harness_run(sandbox, ["/bin/sh", "-c", 'echo "$0" > out && cat out && pwd', str(i)], ws)
        return proc.returncode, proc.stdout, proc.stderr, (ws / "out").read_text() if (ws / "out").exists() else ""

    with ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(one, range(n)))
    for i, (code, out, err, written) in enumerate(results):
        assert code == 0, err
        assert out == f"{i}\n{tmp_path / f'ws{i}'}\n"
        assert written == f"{i}\n"


def test_prepare_from_threads_gives_equal_specs(ws: Path) -> None:
    sandbox = native()
    with ThreadPoolExecutor(max_workers=32) as pool:
        specs = list(pool.map(lambda _: sandbox.prepare(["true"], ws), range(64)))
    assert all(spec == specs[0] for spec in specs)
    assert not list(ws.iterdir())
