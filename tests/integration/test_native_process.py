"""The process side of native sandboxes: stdio, exit codes, signals, timeouts,
the parent's death, sessions, file descriptors, and many spawns at once."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import pids_with_marker, proc_stat, wait_until  # tests/, on sys.path (rootdir)
from leakcheck import children

import sandbox
from sandbox import DEVNULL, PIPE, STDOUT, Namespaces, Spec

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_native")]

RunSh = Callable[..., sandbox.CompletedProcess]
BaseSpec = Callable[..., Spec]

PYTHON = "/usr/bin/python3"
needs_python = pytest.mark.skipif(not os.access(PYTHON, os.X_OK), reason=f"{PYTHON} is needed inside the sandbox")


def spawn_sh(script: str, spec: Spec, **kwargs: object) -> sandbox.SandboxProcess:
    """Start `sh -c script` in a native sandbox."""
    return sandbox.spawn(["sh", "-c", script], spec, backend="native", **kwargs)  # type: ignore[arg-type]


def read_line(stream: io.BufferedReader | None, timeout: float = 10.0) -> bytes:
    """One line from a pipe, failing the test if none arrives within `timeout` seconds."""
    assert stream is not None
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert box, f"no line within {timeout} s"
    return box[0]


# ---------------------------------------------------------------- stdio


def test_input_and_captured_output(base_spec: BaseSpec) -> None:
    r = sandbox.run(["cat"], base_spec(), input=b"bytes in\n", capture_output=True, backend="native", timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, b"bytes in\n", b"")
    r = sandbox.run(["cat"], base_spec(), input="text in", capture_output=True, text=True, backend="native",
                    timeout=60)
    assert r.stdout == "text in"
    assert r.backend == "native"


def test_large_input_and_output_do_not_deadlock(base_spec: BaseSpec) -> None:
    data = os.urandom(4 << 20)
    r = sandbox.run(["sh", "-c", "head -c 1000000 /dev/zero >&2; cat"], base_spec(), input=data,
                    capture_output=True, backend="native", timeout=60)
    assert r.returncode == 0
    assert r.stdout == data
    assert r.stderr == bytes(1000000)


def test_stdout_and_stderr_are_separate_pipes(run_sh: RunSh) -> None:
    r = run_sh("echo out; echo err >&2; exit 4")
    assert (r.returncode, r.stdout, r.stderr) == (4, "out\n", "err\n")


def test_stderr_to_stdout(base_spec: BaseSpec) -> None:
    r = sandbox.run(["sh", "-c", "echo one; echo two >&2; echo three"], base_spec(), stdout=PIPE, stderr=STDOUT,
                    backend="native", timeout=60)
    assert r.stdout == b"one\ntwo\nthree\n"
    assert r.stderr is None


def test_inherited_stdio_reaches_the_callers_fds(base_spec: BaseSpec, capfd: pytest.CaptureFixture[str]) -> None:
    r = sandbox.run(["sh", "-c", "echo to-stdout; echo to-stderr >&2"], base_spec(), backend="native", timeout=60)
    assert r.returncode == 0 and r.stdout is None
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("to-stdout\n", "to-stderr\n")


def test_stderr_to_inherited_stdout(base_spec: BaseSpec, capfd: pytest.CaptureFixture[str]) -> None:
    sandbox.run(["sh", "-c", "echo a; echo b >&2"], base_spec(), stderr=STDOUT, backend="native", timeout=60)
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("a\nb\n", "")


def test_devnull(base_spec: BaseSpec) -> None:
    r = sandbox.run(["sh", "-c", "cat; echo hidden; test -c /proc/self/fd/1 && echo stdout-is-a-char-device >&2"],
                    base_spec(), stdin=DEVNULL, stdout=DEVNULL, stderr=PIPE, backend="native", timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, None, b"stdout-is-a-char-device\n")


def test_file_objects_and_raw_fds(base_spec: BaseSpec, tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"from a file\n")
    with open(tmp_path / "in", "rb") as fin, open(tmp_path / "out", "wb") as fout:
        err_fd = os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            r = sandbox.run(["sh", "-c", "cat; echo e >&2"], base_spec(), stdin=fin, stdout=fout, stderr=err_fd,
                            backend="native", timeout=60)
        finally:
            os.close(err_fd)
    assert r.returncode == 0
    assert (tmp_path / "out").read_bytes() == b"from a file\n"
    assert (tmp_path / "err").read_bytes() == b"e\n"


def test_spawn_with_pipes_and_communicate(base_spec: BaseSpec) -> None:
    with spawn_sh("read line; echo got:$line; echo done >&2", base_spec(), stdin=PIPE, stdout=PIPE,
                  stderr=PIPE) as proc:
        out, err = proc.communicate(b"hello\n", timeout=30)
    assert (proc.returncode, out, err) == (0, b"got:hello\n", b"done\n")


def test_writing_stdin_by_hand(base_spec: BaseSpec) -> None:
    with spawn_sh("tr a-z A-Z", base_spec(), stdin=PIPE, stdout=PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"shout\n")
        proc.stdin.close()
        assert proc.stdout.read() == b"SHOUT\n"
    assert proc.returncode == 0


def test_check_and_text(run_sh: RunSh) -> None:
    with pytest.raises(subprocess.CalledProcessError) as info:
        run_sh("echo nope; exit 9", check=True)
    assert info.value.returncode == 9
    assert run_sh("printf 'héllo'").stdout == "héllo"


# ---------------------------------------------------------------- exit codes and signals


@pytest.mark.parametrize("as_pid_1", [False, True], ids=["reaper", "as-pid-1"])
@pytest.mark.parametrize("code", [0, 1, 3, 126, 127, 255])
def test_exit_codes_pass_through(run_sh: RunSh, base_spec: BaseSpec, code: int, as_pid_1: bool) -> None:
    assert run_sh(f"exit {code}", base_spec(as_pid_1=as_pid_1)).returncode == code


def test_exit_codes_without_a_pid_namespace(run_sh: RunSh, base_spec: BaseSpec) -> None:
    spec = base_spec(namespaces=Namespaces(pid=False))
    assert [run_sh(f"exit {c}", spec).returncode for c in (0, 3, 255)] == [0, 3, 255]
    assert run_sh("kill -9 $$", spec).returncode == -signal.SIGKILL


@pytest.mark.parametrize(("sig", "name"), [(signal.SIGKILL, "KILL"), (signal.SIGTERM, "TERM"),
                                           (signal.SIGSEGV, "SEGV"), (signal.SIGUSR1, "USR1")])
def test_death_by_signal_is_a_negative_returncode(run_sh: RunSh, sig: int, name: str) -> None:
    assert run_sh(f"kill -{name} $$").returncode == -sig


def test_send_signal_reaches_the_command(base_spec: BaseSpec) -> None:
    script = "trap 'echo got-term; exit 7' TERM; trap 'echo got-usr1' USR1; echo ready; " \
             "while :; do sleep 0.05; done"
    with spawn_sh(script, base_spec(), stdout=PIPE) as proc:
        assert read_line(proc.stdout) == b"ready\n"
        proc.send_signal(signal.SIGUSR1)
        assert read_line(proc.stdout) == b"got-usr1\n"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert out == b"got-term\n"
    assert proc.returncode == 7


@pytest.mark.parametrize("as_pid_1", [False, True], ids=["reaper", "as-pid-1"])
def test_terminate_and_kill(base_spec: BaseSpec, as_pid_1: bool, no_leftovers: str) -> None:
    spec = base_spec(as_pid_1=as_pid_1)
    # As pid 1 the shell ignores SIGTERM unless it handles it (the kernel's rule for init).
    script = ("trap 'exit 143' TERM; " if as_pid_1 else "") + f"echo ready; sleep 1000 {no_leftovers} & wait"
    with spawn_sh(script, spec, stdout=PIPE) as proc:
        assert read_line(proc.stdout) == b"ready\n"
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.05)
        proc.terminate()
        code = proc.wait(timeout=30)
    assert code == (143 if as_pid_1 else -signal.SIGTERM)
    with spawn_sh(f"sleep 1000 {no_leftovers} & sleep 1000 {no_leftovers}", spec) as proc:
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
    assert proc.poll() == -signal.SIGKILL
    proc.kill()  # a finished sandbox: nothing happens


@pytest.mark.parametrize("as_pid_1", [False, True], ids=["reaper", "as-pid-1"])
def test_signals_start_at_their_defaults(base_spec: BaseSpec, as_pid_1: bool) -> None:
    # Python ignores SIGPIPE and SIGXFSZ and the spawning thread blocks every
    # signal around clone: none of that may reach the command.
    r = sandbox.run(["cat", "/proc/self/status"], base_spec(as_pid_1=as_pid_1), capture_output=True,
                    backend="native", timeout=60)
    fields = dict(line.split(":\t", 1) for line in r.stdout.decode().splitlines() if ":\t" in line)
    assert (fields["SigBlk"], fields["SigIgn"], fields["SigCgt"]) == ("0" * 16,) * 3


def test_orphans_are_reaped(run_sh: RunSh) -> None:
    out = run_sh("(true &); (sleep 0.1 &); sleep 0.5; cat /proc/[0-9]*/stat").stdout
    states = {line.split(") ")[0] + ")": line.split(") ")[1].split()[0] for line in out.splitlines()}
    assert "Z" not in states.values(), states
    assert len(states) == 2  # sandbox-init and sh (sh expands the glob before cat starts)


def test_the_sandbox_ends_with_its_command(run_sh: RunSh, no_leftovers: str) -> None:
    # A background grandchild holding stdout open does not keep the sandbox
    # (or run()) alive: pid 1 leaves, the kernel kills the rest.
    start = time.monotonic()
    r = run_sh(f"sleep 1000 {no_leftovers} & setsid sleep 1000 {no_leftovers} & echo done", timeout=30)
    assert (r.returncode, r.stdout) == (0, "done\n")
    assert time.monotonic() - start < 10


# A process whose exit takes a while (256 MB to free), so that a status sent before every process had
# been reaped is caught while its pid 1 still has children.
SLOW_TO_DIE = (f"{PYTHON} -c 'import time; b = b\"x\" * (256 << 20); open(\"/tmp/ready\", \"w\").close(); "
               "time.sleep(1000)' & ")


@needs_python
@pytest.mark.parametrize("executor", ["native", "template"])
def test_nothing_but_the_exiting_pid_1_is_left_when_wait_returns(base_spec: BaseSpec, executor: str,
                                                                   no_leftovers: str) -> None:
    # wait() ends with the status sandbox-init (or a Template's resident pid 1) reports, before its own exit:
    # by then it must have killed and reaped every other process: a stopped one, a new session's, a slow one.
    script = (SLOW_TO_DIE + f"sleep 1000 {no_leftovers} & setsid sleep 1000 {no_leftovers} & "
              f"sleep 1000 {no_leftovers} & kill -STOP $!; while [ ! -e /tmp/ready ]; do sleep 0.01; done; exit 7")
    spec = base_spec()
    with contextlib.ExitStack() as stack:
        if executor == "template":
            proc = stack.enter_context(sandbox.Template(spec)).spawn(["sh", "-c", script])
        else:
            proc = sandbox.spawn(["sh", "-c", script], spec, backend="native")
        assert proc.wait(timeout=60) == 7
        # pid 1 itself may still be exiting, and sandbox-init's cmdline holds the command's, marker and all
        others = [pid for pid in pids_with_marker(no_leftovers) if pid != proc.pid]
        assert children(proc.pid) == [] and others == []
        if executor == "native":
            assert wait_until(lambda: proc_stat(proc.pid) is None)  # pid 1 is reaped in the background


@pytest.mark.parametrize("executor", ["native", "template", "recycled"])
def test_waits_and_polls_from_several_threads_agree(base_spec: BaseSpec, executor: str,
                                                    fd_count: Callable[[], int], no_leftovers: str) -> None:
    # A wait that wakes tells the handle its fds were readable, so the handle reads the status without
    # checking again: with several threads waiting and polling at once, each gets the one returncode,
    # none blocks on a status another took, and no fd is left open.
    spec = base_spec()
    with contextlib.ExitStack() as stack:
        if executor == "native":
            def start(script: str) -> sandbox.SandboxProcess:
                return spawn_sh(script, spec)
        else:
            template = stack.enter_context(sandbox.Template(spec, recycle=executor == "recycled"))

            def start(script: str) -> sandbox.SandboxProcess:
                return template.spawn(["sh", "-c", script])
        start("exit 0").wait(timeout=30)  # warm up: the backend's own fds are open from here on
        before = fd_count()
        for code in (0, 3, 5):
            proc = start(f"sleep 0.2; exit {code} # {no_leftovers}")
            assert _waiters_and_a_poller(proc, 4) == [code] * 5 and proc.returncode == code
            assert proc.wait(timeout=0) == code and proc.poll() == code
        assert fd_count() == before


class _Alarm(Exception):
    pass


@pytest.mark.parametrize("executor", ["native", "template", "recycled"])
def test_a_signal_during_a_wait_runs_its_handler(base_spec: BaseSpec, executor: str, no_leftovers: str) -> None:
    # A signal that interrupts the wait's poll runs its Python handler at once (which may raise, as Ctrl-C
    # does); a handler that returns lets the wait go on to its timeout, and no copy of the fd it waited on
    # is left open.
    spec = base_spec()
    calls: list[int] = []

    def handler(signum: int, frame: object) -> None:
        calls.append(signum)
        if len(calls) == 1:
            raise _Alarm

    old = signal.signal(signal.SIGALRM, handler)
    with contextlib.ExitStack() as stack:
        stack.callback(signal.signal, signal.SIGALRM, old)
        stack.callback(signal.setitimer, signal.ITIMER_REAL, 0)
        if executor == "native":
            proc = spawn_sh(f"sleep 1000 # {no_leftovers}", spec)
        else:
            template = stack.enter_context(sandbox.Template(spec, recycle=executor == "recycled"))
            proc = template.spawn(["sh", "-c", f"sleep 1000 # {no_leftovers}"])
        status = os.readlink(f"/proc/self/fd/{proc._handle.ended_fd}")  # type: ignore[attr-defined]
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        start = time.monotonic()
        with pytest.raises(_Alarm):
            proc.wait(timeout=30)
        assert time.monotonic() - start < 10 and proc.returncode is None
        signal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)  # a handler that returns: the wait goes on
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.6)
        signal.setitimer(signal.ITIMER_REAL, 0)
        assert len(calls) >= 3 and _open_as(status) == 1
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL


def _open_as(target: str) -> int:
    """How many of this process's fds are `target` (a readlink of /proc/self/fd)."""
    fds = os.listdir("/proc/self/fd")
    return sum(1 for fd in fds if _readlink(f"/proc/self/fd/{fd}") == target)


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _waiters_and_a_poller(proc: sandbox.SandboxProcess, waiters: int) -> list[int | None]:
    """What `waiters` threads calling proc.wait() and one polling it every 10 ms got (None: nothing in 30 s)."""
    results: list[int | None] = []

    def poller() -> None:
        deadline = time.monotonic() + 30
        while (rc := proc.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        results.append(rc)

    threads = [threading.Thread(target=lambda: results.append(proc.wait(timeout=30))) for _ in range(waiters)]
    threads.append(threading.Thread(target=poller))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


# ---------------------------------------------------------------- timeouts


@pytest.mark.parametrize("as_pid_1", [False, True], ids=["reaper", "as-pid-1"])
def test_timeout_kills_everything(run_sh: RunSh, base_spec: BaseSpec, procs: type, no_leftovers: str,
                                  as_pid_1: bool) -> None:
    m = no_leftovers
    script = (f"sleep 1000 {m} & (sleep 1000 {m} &); setsid sleep 1000 {m} & sh -c 'sleep 1000 {m} & wait' & "
              f"echo started; sleep 1000 {m}")
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        run_sh(script, base_spec(as_pid_1=as_pid_1), timeout=1)
    assert 0.9 < time.monotonic() - start < 10
    assert info.value.timeout == 1
    assert procs.wait_until(lambda: not procs.with_marker(m), timeout=5)


@pytest.mark.xfail(strict=True, reason="without a pid namespace kill() only reaches the command: its children "
                   "survive a run() timeout (api.run's docstring promises every process is killed)")
def test_timeout_kills_everything_without_a_pid_namespace(run_sh: RunSh, base_spec: BaseSpec, procs: type) -> None:
    m = procs.new_marker()
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            run_sh(f"sleep 1000 {m} & sleep 1000 {m}", base_spec(namespaces=Namespaces(pid=False)), timeout=1)
        assert procs.wait_until(lambda: not procs.with_marker(m), timeout=2)
    finally:
        for pid in procs.with_marker(m):
            os.kill(pid, signal.SIGKILL)


def test_communicate_timeout_leaves_the_sandbox_running(base_spec: BaseSpec, no_leftovers: str) -> None:
    with spawn_sh(f"echo partial; sleep 1000 {no_leftovers}", base_spec(), stdout=PIPE) as proc:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.communicate(timeout=0.3)
        assert proc.poll() is None
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_communicate_after_a_timeout_keeps_what_was_read(base_spec: BaseSpec) -> None:
    # as subprocess.Popen.communicate: the second call returns everything, the first call's part too
    script = "echo early >&2; echo first; sleep 2; echo second; echo late >&2"
    with spawn_sh(script, base_spec(), stdout=PIPE, stderr=PIPE) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"first\n"  # "early" is in its pipe already; 2 s to go
        with pytest.raises(subprocess.TimeoutExpired) as info:
            proc.communicate(timeout=0.5)
        assert info.value.stderr == b"early\n"
        out, err = proc.communicate(timeout=30)
    assert (out, err, proc.returncode) == (b"second\n", b"early\nlate\n", 0)


# ---------------------------------------------------------------- the parent's death

HELPER = r"""
import sys
import sandbox
spec = sandbox.Spec.from_json(sys.argv[1])
proc = sandbox.spawn(["sh", "-c", sys.argv[2]], spec, backend="native")
print(proc.pid, flush=True)
sys.stdin.read()
"""


def start_helper(spec: Spec, script: str) -> tuple[subprocess.Popen[bytes], int]:
    """A Python process that spawns `script` in a sandbox and then waits on its stdin; returns it and the
    sandbox's host pid."""
    helper = subprocess.Popen([sys.executable, "-c", HELPER, spec.to_json(), script], stdin=PIPE, stdout=PIPE,
                              stderr=PIPE)
    line = read_line(helper.stdout, timeout=30)  # type: ignore[arg-type]
    assert line.strip().isdigit(), (line, helper.stderr.read() if helper.poll() is not None else b"")
    return helper, int(line)


def test_the_parents_death_kills_the_sandbox(base_spec: BaseSpec, procs: type, no_leftovers: str) -> None:
    m = no_leftovers
    helper, pid = start_helper(base_spec(), f"sleep 1000 {m} & setsid sleep 1000 {m} & sleep 1000 {m}")
    try:
        assert procs.wait_until(lambda: len(procs.sleepers(m)) == 3, timeout=10)
        assert procs.stat(pid) is not None
    finally:
        helper.kill()
        helper.wait()
        for f in (helper.stdin, helper.stdout, helper.stderr):
            f.close()  # type: ignore[union-attr]
    assert procs.wait_until(lambda: not procs.with_marker(m), timeout=5)


def test_die_with_parent_false_survives_the_parent(base_spec: BaseSpec, procs: type, no_leftovers: str) -> None:
    m = no_leftovers
    helper, pid = start_helper(base_spec(die_with_parent=False), f"sleep 1000 {m}")
    try:
        assert procs.wait_until(lambda: len(procs.sleepers(m)) == 1, timeout=10)
    finally:
        helper.kill()
        helper.wait()
        for f in (helper.stdin, helper.stdout, helper.stderr):
            f.close()  # type: ignore[union-attr]
    try:
        # polls for the whole window: the sandbox must still be there at the end
        assert not procs.wait_until(lambda: not procs.sleepers(m), timeout=0.5)
    finally:
        os.kill(pid, signal.SIGKILL)  # the sandbox's pid 1: the kernel ends the rest
    assert procs.wait_until(lambda: not procs.with_marker(m), timeout=5)


def test_a_sandbox_outlives_the_thread_that_spawned_it(base_spec: BaseSpec, no_leftovers: str) -> None:
    box: list[sandbox.SandboxProcess] = []
    worker = threading.Thread(target=lambda: box.append(spawn_sh(f"sleep 1000 {no_leftovers}", base_spec())))
    worker.start()
    worker.join()
    proc = box[0]
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------- sessions and terminals


def stat_of_shell(run_sh: RunSh, spec: Spec) -> tuple[int, int, int, int]:
    """(pid, pgrp, session, tty_nr) of the sandboxed shell itself, from /proc/$$/stat."""
    out = run_sh("echo $$; cat /proc/$$/stat", spec).stdout
    pid, stat = out.split("\n", 1)
    fields = stat[stat.rindex(")") + 2:].split()
    return int(pid), int(fields[2]), int(fields[3]), int(fields[4])


def test_new_session_without_a_pid_namespace(run_sh: RunSh, base_spec: BaseSpec) -> None:
    pid, pgrp, sid, tty = stat_of_shell(run_sh, base_spec(namespaces=Namespaces(pid=False)))
    assert sid == pid == pgrp
    assert tty == 0
    pid, pgrp, sid, tty = stat_of_shell(run_sh, base_spec(namespaces=Namespaces(pid=False), new_session=False))
    assert sid == os.getsid(0)
    assert sid != pid


def test_new_session_with_a_pid_namespace(run_sh: RunSh, base_spec: BaseSpec) -> None:
    pid, pgrp, sid, tty = stat_of_shell(run_sh, base_spec())
    assert sid != 0  # 0 would mean a session outside the namespace: the caller's
    assert tty == 0
    # without new_session the caller's session (not visible inside) is kept
    pid, pgrp, sid, tty = stat_of_shell(run_sh, base_spec(new_session=False))
    assert sid == 0


def test_the_reaper_leads_the_new_session_like_bwrap(run_sh: RunSh, base_spec: BaseSpec) -> None:
    # bwrap calls setsid() before forking its pid-1 init: the command runs in
    # init's session and process group (the conformance suite compares them).
    pid, pgrp, sid, _ = stat_of_shell(run_sh, base_spec())
    assert (pid, pgrp, sid) == (2, 1, 1)


GROUP_SIGNAL = """
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
os.kill(0, signal.SIGRTMIN)  # real-time signals queue: a second copy is not merged into the first
n = 0
while signal.sigtimedwait([signal.SIGRTMIN], 0.3) is not None:
    n += 1
print(n)
"""


@needs_python
def test_a_signal_to_the_own_process_group_arrives_once(base_spec: BaseSpec) -> None:
    r = sandbox.run([PYTHON, "-c", GROUP_SIGNAL], base_spec(), capture_output=True, backend="native", timeout=60)
    assert r.stdout == b"1\n"


TTY_HELPER = r"""
import os, sys
import sandbox
os.open(sys.argv[1], os.O_RDWR)  # a session leader without a terminal: this pty becomes ours
os.close(os.open("/dev/tty", os.O_RDWR))  # we do have a controlling terminal now
spec = sandbox.Spec.from_json(sys.argv[2])
code = "import errno, os\ntry:\n    os.open('/dev/tty', os.O_RDWR); print('open')\nexcept OSError as e:\n" \
       "    print(errno.errorcode[e.errno])"
r = sandbox.run([sys.argv[3], "-c", code], spec, capture_output=True, backend="native", timeout=60)
print(r.stdout.decode().strip() or r.stderr.decode())
"""


@needs_python
@pytest.mark.parametrize(("new_session", "expected"), [(True, "ENXIO"), (False, "open")])
def test_new_session_detaches_the_controlling_terminal(base_spec: BaseSpec, new_session: bool,
                                                       expected: str) -> None:
    master, slave = pty.openpty()
    try:
        name = os.ttyname(slave)
        spec = base_spec(new_session=new_session)
        r = subprocess.run([sys.executable, "-c", TTY_HELPER, name, spec.to_json(), PYTHON], start_new_session=True,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == expected


# ---------------------------------------------------------------- file descriptors


def fds_of_shell(run_sh: RunSh, spec: Spec, **kwargs: object) -> list[int]:
    """The fd numbers open in the sandboxed shell itself."""
    out = run_sh("ls /proc/$$/fd", spec, **kwargs).stdout  # ls is forked: these are the shell's fds
    return sorted(int(x) for x in out.split())


@pytest.mark.parametrize("as_pid_1", [False, True], ids=["reaper", "as-pid-1"])
def test_only_stdio_is_open_inside(run_sh: RunSh, base_spec: BaseSpec, tmp_path: Path, as_pid_1: bool) -> None:
    leak = os.open(tmp_path / "leak", os.O_RDWR | os.O_CREAT, 0o600)
    os.set_inheritable(leak, True)  # even an inheritable fd stays outside
    r, w = os.pipe()
    try:
        assert fds_of_shell(run_sh, base_spec(as_pid_1=as_pid_1)) == [0, 1, 2]
    finally:
        for fd in (leak, r, w):
            os.close(fd)


def test_pass_fds_are_open_at_the_same_number(run_sh: RunSh, base_spec: BaseSpec) -> None:
    r, w = os.pipe()
    other_r, other_w = os.pipe()
    os.set_inheritable(other_w, True)
    try:
        passed = w
        script = f"ls /proc/$$/fd; echo through > /proc/$$/fd/{w}; readlink /proc/$$/fd/{w}"
        res = run_sh(script, base_spec(), pass_fds=[w])
        os.close(w)
        w = -1
        assert res.returncode == 0, res.stderr
        *listed, link = res.stdout.split()
        assert link == f"pipe:[{os.fstat(r).st_ino}]"
        assert sorted(int(x) for x in listed) == [0, 1, 2, passed]
        assert os.read(r, 100) == b"through\n"
        assert os.read(r, 100) == b""  # the sandbox held the only other copy, and it is gone
    finally:
        for fd in (r, w, other_r, other_w):
            if fd >= 0:
                os.close(fd)


def test_pass_fds_is_validated(base_spec: BaseSpec) -> None:
    r, w = os.pipe()
    os.close(w)
    try:
        with pytest.raises(sandbox.SpecError) as info:
            sandbox.run(["true"], base_spec(), pass_fds=[w], backend="native")
        assert (info.value.field, info.value.value) == ("pass_fds", w)
    finally:
        os.close(r)


def test_no_fds_leak_across_many_runs(base_spec: BaseSpec, fd_count: Callable[[], int]) -> None:
    spec = base_spec()
    sandbox.run(["true"], spec, backend="native")  # warm up: the backend keeps one fd of sandbox-init
    before = fd_count()
    for _ in range(20):
        sandbox.run(["sh", "-c", "echo x; echo y >&2"], spec, capture_output=True, input=b"in", backend="native")
        with spawn_sh("exit 0", spec, stdin=PIPE, stdout=PIPE, stderr=PIPE) as proc:
            proc.communicate()
    assert fd_count() == before


# ---------------------------------------------------------------- many at once


def test_16_threads_by_50_spawns(base_spec: BaseSpec, fd_count: Callable[[], int], no_leftovers: str) -> None:
    spec = base_spec()
    sandbox.run(["true"], spec, backend="native")
    before = fd_count()

    def worker(t: int) -> list[str]:
        bad = []
        for i in range(50):
            tag = f"{t}-{i}"
            if i % 2:
                r = sandbox.run(["sh", "-c", 'echo "$0"', tag], spec, capture_output=True, backend="native",
                                timeout=120)
                if (r.returncode, r.stdout) != (0, f"{tag}\n".encode()):
                    bad.append(f"{tag}: {r.returncode} {r.stdout!r} {r.stderr!r}")
            else:
                r = sandbox.run(["sh", "-c", f"exit {i % 7}"], spec, backend="native", timeout=120)
                if r.returncode != i % 7:
                    bad.append(f"{tag}: exit {r.returncode}")
        return bad

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(worker, range(16)))
    assert [b for bad in results for b in bad] == []
    assert fd_count() == before


def test_spawns_do_not_see_each_others_pipes(base_spec: BaseSpec) -> None:
    # Pipes made for one sandbox must not be inherited by a sandbox started at the same time.
    spec = base_spec()
    results: list[list[int]] = []

    def worker() -> None:
        for _ in range(20):
            with spawn_sh("ls /proc/$$/fd", spec, stdin=PIPE, stdout=PIPE, stderr=PIPE) as proc:
                out, _ = proc.communicate(timeout=60)
            results.append(sorted(int(x) for x in out.split()))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 160
    assert all(r == [0, 1, 2] for r in results), [r for r in results if r != [0, 1, 2]][:5]


LONG_ARGV = r"""
import sys
import sandbox
spec = sandbox.Spec.from_json(sys.argv[1])
n = int(sys.argv[2])
r = sandbox.run(["sh", "-c", 'echo $#', "sh"] + ["a"] * n, spec, capture_output=True, backend="native", timeout=60)
print(r.returncode, r.stdout.decode().strip())
"""


@pytest.mark.parametrize("as_pid_1", [
    pytest.param(False, id="reaper"),
    pytest.param(True, id="as-pid-1"),
])
def test_a_long_argv(base_spec: BaseSpec, as_pid_1: bool) -> None:
    # 50000 arguments are ~100 KB of strings, far below ARG_MAX. Run from a
    # helper process: an overflowing child shares its caller's memory.
    n = 50000
    r = subprocess.run([sys.executable, "-c", LONG_ARGV, base_spec(as_pid_1=as_pid_1).to_json(), str(n)],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().split() == ["0", str(n)]


REAPED_ACROSS_FORK = r"""
import os, signal, sys, time
import sandbox
spec = sandbox.Spec.from_json(sys.argv[1])

def run_and_check_reaped():
    p = sandbox.spawn(["true"], spec, backend="native")
    assert p.wait(timeout=60) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the background reaper takes the exiting pid 1
        try:
            if os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                time.sleep(0.01)
                continue
        except ChildProcessError:
            return
        time.sleep(0.01)  # a zombie, not yet reaped
    raise SystemExit(f"pid 1 {p.pid} was never reaped")

run_and_check_reaped()  # the parent's reaper thread runs now, and its pool's refill thread checks the lease
child = os.fork()
if child == 0:
    signal.alarm(60)  # a hang ends the child with SIGALRM
    try:
        run_and_check_reaped()  # the child has no thread: it must start its own
    except BaseException as exc:
        print(exc, flush=True)
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(child, 0)
run_and_check_reaped()
print(os.waitstatus_to_exitcode(status))
"""


def run_forking_script(script: str, spec: Spec, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """`python -c script SPEC` in a process group of its own, all of which is killed if it times out:
    a forked child that hangs (what these scripts look for) must not outlive the test."""
    proc = subprocess.Popen([sys.executable, "-c", script, spec.to_json()], stdout=PIPE, stderr=PIPE, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # before the leader is reaped: the group is still its own
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_forked_child_spawns_and_reaps_like_its_parent(base_spec: BaseSpec, tmp_path: Path) -> None:
    # The child has only the thread that forked: the parent's reaper and pool threads are gone, and the pool's
    # thread may have held the pool's locks at the fork (the child used to hang on them in its first spawn).
    r = run_forking_script(REAPED_ACROSS_FORK, base_spec(), tmp_path)
    assert (r.returncode, r.stdout.decode().split()) == (0, ["0"]), r.stderr.decode()


LOCKS_HELD_AT_FORK = r"""
import os, signal, sys, threading
import sandbox
import sandbox.backends as backends
import sandbox.backends.native as native
import sandbox.launcher as launcher
import sandbox.netpool as netpool
import sandbox.plan_cache as plan_cache
import sandbox.probe as probe
spec = sandbox.Spec.from_json(sys.argv[1])
sandbox.run(["true"], spec, backend="native")
launcher.native_ok()
locks = [probe._lock, backends._lock, launcher._native_lock, plan_cache._lock, netpool._default_lock,
         native._init_fd_lock]
held, done = threading.Event(), threading.Event()

def hold():  # another thread in the middle of a probe, a plan, a spawn, when the caller forks
    for lock in locks:
        lock.acquire()
    held.set()
    done.wait()
    for lock in locks:
        lock.release()

thread = threading.Thread(target=hold)
thread.start()
held.wait()
child = os.fork()
if child == 0:
    signal.alarm(30)  # a hang ends the child with SIGALRM
    sandbox.probe()
    launcher.native_ok()
    os._exit(sandbox.run(["true"], spec, backend="native").returncode)
done.set()
thread.join()
_, status = os.waitpid(child, 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_does_not_wait_for_locks_its_parents_threads_held(base_spec: BaseSpec,
                                                                          tmp_path: Path) -> None:
    r = run_forking_script(LOCKS_HELD_AT_FORK, base_spec(), tmp_path)
    assert (r.returncode, r.stdout.decode().split()) == (0, ["0"]), r.stderr.decode()


def test_timings_are_reported(run_sh: RunSh) -> None:
    r = run_sh("true")
    assert r.timings and all(v >= 0 for v in r.timings.values())
    assert json.dumps(r.timings)

