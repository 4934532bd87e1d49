"""sandbox.Session on the real kernel: commands in one living sandbox, what a
timeout or kill ends (and what it leaves), exit statuses, and that every
command is confined exactly as a fresh sandbox of the same Spec."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from conftest import make_base_spec, new_marker, sleep_cmd, sleepers, wait_until  # tests/, on sys.path (rootdir)
from users_world import sh

import sandbox
from sandbox import Limits

pytestmark = pytest.mark.integration

SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hello from " + sys.argv[2].encode())
    c.close()
"""
CLIENT = """
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
print(c.recv(100).decode())
"""


@pytest.fixture
def session(require_native: None) -> Iterator[sandbox.Session]:
    with sandbox.Session(make_base_spec()) as s:
        yield s


def test_exec_reports_like_run(session: sandbox.Session) -> None:
    done = sh(session, "echo out; echo err >&2; exit 3")
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
    assert sh(session, "kill -TERM $$").returncode == -signal.SIGTERM
    assert session.exec(["cat"], input=b"fed", capture_output=True).stdout == b"fed"
    assert sh(session, "pwd", cwd="/usr").stdout == "/usr\n"
    assert sh(session, "echo $A:$PATH", env={"A": "1", "PATH": "/usr/bin"}).stdout == "1:/usr/bin\n"
    with pytest.raises(subprocess.CalledProcessError):
        session.exec(["false"], check=True)


def test_files_and_processes_persist(session: sandbox.Session) -> None:
    assert sh(session, "echo kept > /tmp/f; echo $$ > /tmp/pid").returncode == 0
    assert sh(session, "cat /tmp/f").stdout == "kept\n"
    first = sh(session, "readlink /proc/self/ns/mnt /proc/self/ns/pid /proc/self/ns/net /proc/self/ns/ipc").stdout
    second = sh(session, "readlink /proc/self/ns/mnt /proc/self/ns/pid /proc/self/ns/net /proc/self/ns/ipc").stdout
    assert first == second
    assert first.split()[2] != os.readlink("/proc/self/ns/net")


def test_a_server_started_by_one_call_answers_the_next(session: sandbox.Session) -> None:
    server = session.start(["python3", "-c", SERVER, "8765", "one"], stdout=subprocess.PIPE)
    assert server.stdout is not None and server.stdout.readline() == b"listening\n"
    for _ in range(2):
        done = session.exec(["python3", "-c", CLIENT, "8765"], capture_output=True, text=True, timeout=30)
        assert done.stdout == "hello from one\n", done.stderr
    server.kill()
    assert server.wait(10) == -signal.SIGKILL
    server.stdout.close()
    assert session.exec(["python3", "-c", CLIENT, "8765"], capture_output=True, timeout=30).returncode != 0


def test_a_background_server_outlives_its_call(session: sandbox.Session) -> None:
    """As with `docker exec`: a call that ends normally leaves what it started running."""
    done = sh(session, "python3 -c '" + SERVER.replace("'", '"') + "' 8766 bg >/dev/null 2>&1 & echo started")
    assert done.stdout == "started\n"
    client = ["python3", "-c", CLIENT, "8766"]
    assert wait_until(lambda: session.exec(client, capture_output=True, timeout=30).returncode == 0, 10)
    assert session.exec(client, capture_output=True, text=True, timeout=30).stdout == "hello from bg\n"


def test_a_timeout_ends_that_calls_whole_tree_only(session: sandbox.Session) -> None:
    kept, doomed = new_marker(), new_marker()
    assert sh(session, f"{sleep_cmd(kept)} >/dev/null 2>&1 & echo ok").stdout == "ok\n"
    script = f"{sleep_cmd(doomed)} & setsid {sleep_cmd(doomed)} & (setsid sh -c '{sleep_cmd(doomed)} &'); wait"
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        session.exec(["sh", "-c", script], timeout=1, stdout=subprocess.DEVNULL)
    assert time.monotonic() - began < 10
    assert wait_until(lambda: not sleepers(doomed), 5), "the timed-out call's tree survived"
    assert len(sleepers(kept)) == 1, "a process of another call was killed"


def test_kill_ends_the_started_tree(session: sandbox.Session) -> None:
    marker = new_marker()
    proc = session.start(["sh", "-c", f"setsid {sleep_cmd(marker)} & {sleep_cmd(marker)} & echo up; wait"],
                         stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    assert wait_until(lambda: len(sleepers(marker)) == 2, 5)
    assert proc.pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]
    proc.terminate()  # SIGTERM reaches the command (sh) only
    assert proc.wait(10) == -signal.SIGTERM
    proc.stdout.close()
    assert wait_until(lambda: len(sleepers(marker)) == 2, 1), "SIGTERM went past the command"
    again = session.start(["sh", "-c", f"setsid {sleep_cmd(marker)} & exec {sleep_cmd(marker)}"])
    assert wait_until(lambda: len(sleepers(marker)) == 4, 5)
    again.kill()
    assert again.wait(10) == -signal.SIGKILL
    assert wait_until(lambda: len(sleepers(marker)) == 2, 5), "kill() left the tree's setsid'd process"


def test_missing_and_non_executable_commands(session: sandbox.Session) -> None:
    missing = session.exec(["no-such-command"], capture_output=True, text=True)
    assert missing.returncode == 127 and "no-such-command" in missing.stderr
    assert session.exec(["/tmp/nothing/here"], capture_output=True).returncode == 127
    session.write_file("/tmp/script", b"#!/bin/sh\necho hi\n", mode=0o644)
    with pytest.raises(sandbox.ExecPermissionError):
        session.exec(["/tmp/script"])
    with pytest.raises(sandbox.SetupError) as info:
        session.exec(["true"], cwd="/no/such/dir")
    assert info.value.step == "cwd"
    assert sh(session, "echo still serving").stdout == "still serving\n"


CONFINEMENT = ("grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp|Seccomp_filters)'"
               " /proc/self/status; cat /proc/self/limits; umask; "
               "unshare -U true 2>/dev/null; echo unshare=$?; cat /proc/self/attr/current 2>/dev/null; echo")


@pytest.mark.parametrize("extra", [{}, {"landlock": True, "limits": Limits(nofile=300, nproc=500)}],
                         ids=["defaults", "landlock-rlimits"])
def test_every_command_is_confined_as_a_fresh_sandbox(require_native: None, extra: dict[str, object]) -> None:
    spec = make_base_spec(**extra)  # type: ignore[arg-type]
    fresh = sandbox.run(["sh", "-c", CONFINEMENT], spec, capture_output=True, text=True, timeout=60)
    with sandbox.Session(spec) as s:
        first = sh(s, CONFINEMENT)
        sh(s, "sleep 0.01 &")  # a command started later is no different
        later = sh(s, CONFINEMENT)
    assert fresh.returncode == 0, fresh.stderr
    assert first.stdout == fresh.stdout == later.stdout
    assert "Seccomp:\t2" in fresh.stdout and "NoNewPrivs:\t1" in fresh.stdout


def test_landlock_applies_to_every_command(require_native: None, tmp_path: object) -> None:
    spec = make_base_spec(landlock=True)
    script = "mkdir /proc/x 2>&1; echo data > /tmp/ok && cat /tmp/ok"
    fresh = sandbox.run(["sh", "-c", script], spec, capture_output=True, text=True, timeout=60)
    with sandbox.Session(spec) as s:
        inside = sh(s, script)
    assert (inside.returncode, inside.stdout) == (fresh.returncode, fresh.stdout)


def test_close_ends_everything(require_native: None) -> None:
    marker = new_marker()
    s = sandbox.Session(make_base_spec())
    s.start(["sh", "-c", f"{sleep_cmd(marker)} & setsid {sleep_cmd(marker)}"])
    assert wait_until(lambda: len(sleepers(marker)) == 2, 5)
    pid = s.pid
    s.close()
    assert not sleepers(marker)
    assert not os.path.exists(f"/proc/{pid}/status") or wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 5)
    with pytest.raises(sandbox.SessionError):
        s.exec(["true"])
    with pytest.raises(sandbox.SessionError):
        s.read_file("/tmp/x")
    s.close()  # idempotent


def test_pid_1_killed_from_outside_gives_a_typed_error(require_native: None) -> None:
    marker = new_marker()
    with sandbox.Session(make_base_spec()) as s:
        s.start(["sh", "-c", sleep_cmd(marker)])
        running = s.start(["sleep", "1000"])
        os.kill(s.pid, signal.SIGKILL)
        assert running.wait(10) == -signal.SIGKILL
        assert wait_until(lambda: not sleepers(marker), 5)
        for _ in range(3):
            with pytest.raises(sandbox.SessionError, match="ended"):
                s.exec(["true"])


def test_a_session_needs_a_pid_namespace_of_its_own(require_native: None) -> None:
    with pytest.raises(sandbox.UnavailableError, match="a Session cannot run the command as pid 1.*as_pid_1=True"):
        sandbox.Session(make_base_spec(as_pid_1=True))
    with pytest.raises(sandbox.UnavailableError, match="as pid 1 of its sandbox: no pid namespace"):
        sandbox.Session(make_base_spec(namespaces=sandbox.Namespaces(pid=False)))
    with pytest.raises(sandbox.SpecError, match="spec"):
        sandbox.Session("not a spec")  # type: ignore[arg-type]


def test_a_command_killing_everything_it_can_leaves_the_session_serving(session: sandbox.Session) -> None:
    """kill -9 -1 from a command reaches every process of its uid in the session but pid 1: the
    call processes, its own among them, and the standby that takes the next request."""
    marker = new_marker()
    session.start(["sh", "-c", sleep_cmd(marker)])
    assert wait_until(lambda: len(sleepers(marker)) == 1, 5)
    session.exec(["sh", "-c", "kill -9 -1; sleep 0.1"], timeout=30)
    assert wait_until(lambda: not sleepers(marker), 5)
    for _ in range(3):
        assert sh(session, "echo serving").stdout == "serving\n"


@pytest.mark.parametrize("mode", ["tail", "head", "kill", "raise"])
def test_exec_caps_its_output(mode: str) -> None:
    """10 MiB printed under a 64 KiB cap: what was kept and what was dropped, by each on_overflow; "kill"
    and "raise" end the command's tree, and the session serves the next call."""
    from sandbox.output import OutputLimitError

    cap = 64 << 10
    script = "import sys; sys.stdout.write('a' + 'x' * (10 << 20) + 'z'); sys.stdout.flush()"
    with sandbox.Session(make_base_spec()) as session:
        try:
            done = session.exec(["python3", "-c", script], capture_output=True, timeout=60, max_output=cap,
                                on_overflow=mode)
        except OutputLimitError as exc:
            assert mode == "raise" and exc.killed_by == "output"
            assert exc.stdout is not None and len(exc.stdout) == cap and exc.stdout.startswith(b"a")
        else:
            assert mode != "raise"
            assert done.stdout is not None and len(done.stdout) == cap
            if mode == "tail":
                assert done.returncode == 0 and done.stdout.endswith(b"xz")
                assert done.stdout_dropped == (10 << 20) + 2 - cap
            else:
                assert done.stdout.startswith(b"ax")
                assert (done.killed_by == "output") == (mode == "kill")
        assert session.exec(["true"]).returncode == 0
