"""The session command line: `sandbox session start|list|stop` and `sandbox exec`, through the
installed `sandbox` command, in the caller's per-user directory, as root and unprivileged.

A session outlives each command line: a server one `exec` starts answers the next on
127.0.0.1; each `exec` exits with its command's status; signals to `exec` reach the command,
and its death kills the command's tree; `stop` leaves no process and no socket."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_base_spec, new_marker, sleep_cmd, sleepers, wait_until  # tests/, on sys.path
from session_cli import SANDBOX, Started, cli, gone, listed, session_dir, spec_file, started

pytestmark = pytest.mark.integration

SERVER = ("python3 -c \"import http.server as h; h.HTTPServer(('127.0.0.1', 8765), h.SimpleHTTPRequestHandler)"
          ".serve_forever()\" > /dev/null 2>&1 &")
FETCH = ("import time, urllib.request\n"
         "for _ in range(200):\n"
         "    try:\n"
         "        print(urllib.request.urlopen('http://127.0.0.1:8765/').status); break\n"
         "    except OSError:\n"
         "        time.sleep(0.05)\n")


@pytest.fixture
def session(require_native: None, tmp_path: Path) -> Iterator[Started]:
    with started(spec_file(tmp_path), "--name", f"t{new_marker()[2:]}") as s:
        yield s


def test_a_server_one_exec_starts_answers_the_next(session: Started) -> None:
    assert session.exec("sh", "-c", SERVER).returncode == 0
    done = session.exec("python3", "-c", FETCH)
    assert (done.returncode, done.stdout) == (0, "200\n"), done.stderr
    assert session.exec("sh", "-c", "echo kept > /tmp/file").returncode == 0
    assert session.exec("cat", "/tmp/file").stdout == "kept\n"


def test_exit_status_passes_through(session: Started, tmp_path: Path) -> None:
    done = session.exec("sh", "-c", "echo out; echo err >&2; exit 7")
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")
    assert session.exec("sh", "-c", "kill -TERM $$").returncode == 128 + signal.SIGTERM
    missing = session.exec("no-such-command")
    assert missing.returncode == 127 and "no-such-command" in missing.stderr
    assert session.exec("sh", "-c", "printf '#!/bin/sh\\n' > /tmp/x; chmod 644 /tmp/x").returncode == 0
    assert session.exec("/tmp/x").returncode == 126
    bad_cwd = session.exec("true", options=("--cwd", "/no/such/dir"))
    assert bad_cwd.returncode == 125 and "/no/such/dir" in bad_cwd.stderr


def test_stdin_is_the_callers(session: Started) -> None:
    done = session.exec("tr", "a-z", "A-Z", input="piped\n")
    assert (done.returncode, done.stdout) == (0, "PIPED\n")


def test_closed_stdio_is_dev_null(session: Started) -> None:
    done = session.exec("sh", "-c", "cat; echo done", stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout) == (0, "done\n")
    closed = subprocess.run(f"exec 0<&- 2>&-; {SANDBOX} exec {session.ident} -- sh -c 'cat; echo done; echo e >&2'",
                            shell=True, capture_output=True, text=True, timeout=60)
    assert (closed.returncode, closed.stdout, closed.stderr) == (0, "done\n", "")
    # each closed one is /dev/null, never one of the client's own fds (its socket to the holder)
    for fd in (0, 1, 2):
        to = 2 if fd == 1 else 1  # where the answer goes: a stream left open
        inner = f"x=$(readlink /proc/$$/fd/{fd}); echo $x >&{to}"  # $$: this sh, not an exec of readlink
        seen = subprocess.run(["sh", "-c", f"exec {fd}>&-; exec {SANDBOX} exec {session.ident} -- sh -c '{inner}'"],
                              capture_output=True, text=True, timeout=60)
        answer = seen.stderr if to == 2 else seen.stdout
        assert seen.returncode == 0 and answer.strip() == "/dev/null", (fd, seen)


def test_cwd_and_env(session: Started) -> None:
    done = session.exec("sh", "-c", "pwd; echo $ONE $TWO; echo $PATH",
                        options=("--cwd", "/tmp", "--env", "ONE=1", "--env=TWO=2 3"))
    assert done.stdout == "/tmp\n1 2 3\n/usr/bin:/bin\n", done.stderr
    assert session.exec("sh", "-c", "echo ${ONE-unset}").stdout == "unset\n"


def test_user_is_passed_through(session: Started) -> None:
    done = session.exec("id", "-u", options=("--user", "0"))
    assert (done.returncode, done.stdout) == (0, "0\n"), done.stderr
    unknown = session.exec("id", "-u", options=("--user", "no-such-user"))
    assert unknown.returncode == 125 and "no-such-user" in unknown.stderr


def test_signals_to_exec_reach_the_command(session: Started) -> None:
    script = "trap 'echo got $SIG; exit 5' $SIG; echo ready; while :; do sleep 0.05; done"
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        name = signal.Signals(sig).name[3:]
        with subprocess.Popen([SANDBOX, "exec", session.ident, "--", "sh", "-c", script.replace("$SIG", name)],
                              stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            proc.send_signal(sig)
            assert proc.wait(30) == 5
            assert proc.stdout.read() == f"got {name}\n"


def test_a_terminal_stays_a_terminal(session: Started) -> None:
    """`sandbox exec` on a terminal hands the command the terminal itself (an interactive shell)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdio are the pty's other side; it only execs
        try:
            os.execv(SANDBOX, [SANDBOX, "exec", session.ident, "--", "sh", "-c",
                               "test -t 0 && test -t 1 && test -t 2 && echo all-three-a-tty; read x; echo got-$x"])
        finally:
            os._exit(127)
    out = b""

    def read_until(words: bytes) -> bytes:
        data = b""
        while words not in data:
            assert select.select([fd], [], [], 30)[0], data
            data += os.read(fd, 1024)
        return data

    try:
        out += read_until(b"all-three-a-tty")
        os.write(fd, b"typed\n")
        out += read_until(b"got-typed")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, out


def test_the_death_of_exec_kills_the_commands_tree(session: Started) -> None:
    marker = new_marker()
    with subprocess.Popen([SANDBOX, "exec", session.ident, "--", "sh", "-c",
                           f"setsid {sleep_cmd(marker)} & {sleep_cmd(marker)}"]) as proc:
        assert wait_until(lambda: len(sleepers(marker)) == 2, 20)
        proc.kill()
    assert wait_until(lambda: not sleepers(marker), 10)
    assert session.exec("true").returncode == 0


def test_list_and_stop_leave_no_process_or_socket(require_native: None, tmp_path: Path) -> None:
    done = cli("session", "start", "--spec", str(spec_file(tmp_path)))
    assert done.returncode == 0, done.stderr
    ident = done.stdout.strip()
    pids = listed(ident)
    assert pids is not None
    holder, pid1 = pids
    marker = new_marker()
    assert cli("exec", ident, "--", "sh", "-c", f"{sleep_cmd(marker)} > /dev/null 2>&1 &").returncode == 0
    assert wait_until(lambda: len(sleepers(marker)) == 1, 10)
    sock = Path(session_dir()) / f"session-{ident}.sock"
    assert sock.exists() and oct(sock.stat().st_mode & 0o777) == "0o600"
    assert oct(Path(session_dir()).stat().st_mode & 0o777) == "0o700"
    stop = cli("session", "stop", ident)
    assert stop.returncode == 0, stop.stderr
    assert gone(holder) and gone(pid1) and not sleepers(marker)
    assert not sock.exists() and listed(ident) is None
    again = cli("exec", ident, "--", "true")
    assert again.returncode == 125 and f"no session {ident!r}" in again.stderr
    nowhere = {**os.environ, "SANDBOX_SESSION_DIR": str(tmp_path / "never-made")}
    for args in (("exec", ident, "--", "true"), ("session", "stop", ident)):
        done = cli(*args, env=nowhere)
        assert done.returncode == 125 and f"no session {ident!r}" in done.stderr, done.stderr
    assert cli("session", "list", env=nowhere).stdout.split() == ["ID", "PID", "SESSION", "AGE"]


def test_the_session_ends_with_its_pid_1(require_native: None, tmp_path: Path) -> None:
    with started(spec_file(tmp_path)) as s:
        os.kill(s.pid1, signal.SIGKILL)
        assert gone(s.holder)
        assert not (Path(session_dir()) / f"session-{s.ident}.sock").exists()


def test_sigterm_to_the_holder_ends_the_session(require_native: None, tmp_path: Path) -> None:
    with started(spec_file(tmp_path)) as s:
        marker = new_marker()
        assert s.exec("sh", "-c", f"{sleep_cmd(marker)} > /dev/null 2>&1 &").returncode == 0
        os.kill(s.holder, signal.SIGTERM)
        assert gone(s.holder) and gone(s.pid1) and wait_until(lambda: not sleepers(marker), 10)
        assert not (Path(session_dir()) / f"session-{s.ident}.sock").exists()


def test_an_idle_session_ends(require_native: None, tmp_path: Path) -> None:
    with started(spec_file(tmp_path), "--idle-timeout", "1") as s:
        assert s.exec("sh", "-c", "sleep 2; echo still").stdout == "still\n"  # a command running: not idle
        assert gone(s.holder, 10) and gone(s.pid1)
        assert listed(s.ident) is None


def test_a_bad_spec_is_reported_by_start(require_native: None, tmp_path: Path) -> None:
    cases = {
        '{"mounts": "x"}': "mounts",
        '{"bogus": 1}': "bogus",
        '{"namespaces": {"pid": false}}': "pid",  # refused by the Session itself (in the holder)
    }
    for text, field in cases.items():
        path = tmp_path / "bad.json"
        path.write_text(text)
        done = cli("session", "start", "--spec", str(path))
        assert done.returncode == 125 and field in done.stderr and done.stdout == "", (text, done)
    done = cli("session", "start", "--spec", str(tmp_path / "missing.json"))
    assert done.returncode == 125 and "missing.json" in done.stderr
    assert cli("session", "start").returncode == 125


def test_a_name_is_one_session(require_native: None, tmp_path: Path) -> None:
    name = f"n{new_marker()[2:]}"
    with started(spec_file(tmp_path), "--name", name) as s:
        assert s.ident == name
        twice = cli("session", "start", "--spec", str(spec_file(tmp_path)), "--name", name)
        assert twice.returncode == 125 and "is running" in twice.stderr
        assert s.exec("true").returncode == 0


def test_spec_text_like_run(require_native: None) -> None:
    done = cli("session", "start", "--spec", make_base_spec().to_json())
    assert done.returncode == 0, done.stderr
    ident = done.stdout.strip()
    try:
        assert cli("exec", ident, "echo", "inline").stdout == "inline\n"
    finally:
        assert cli("session", "stop", ident).returncode == 0


def test_exec_startup_cost(session: Started) -> None:
    """Not a benchmark: the figure is printed (pytest -s) so a regression shows."""
    t = time.monotonic()
    for _ in range(5):
        assert session.exec("true").returncode == 0
    print(f"sandbox exec ID true: {(time.monotonic() - t) / 5 * 1000:.0f} ms")


def test_help_and_bad_command_lines() -> None:
    for args in (("session", "--help"), ("exec", "--help")):
        done = cli(*args)
        assert done.returncode == 0 and "sandbox session start --spec FILE" in done.stdout
    assert "session start --spec FILE" in cli("--help").stdout
    cases: tuple[tuple[tuple[str, ...], str], ...] = (
        (("session",), "usage"), (("session", "frobnicate"), "unknown command"),
        (("session", "stop"), "usage"), (("session", "list", "x"), "no arguments"),
        (("session", "start", "--spec"), "needs a value"), (("exec",), "usage"),
        (("exec", "x/y", "true"), "bad session id"),
        (("session", "start", "--spec", "{}", "--idle-timeout", "-1"), "positive number"),
        (("session", "start", "--spec", "{}", "--name", "-bad"), "bad session id"))
    for bad, words in cases:
        done = cli(*bad)
        assert done.returncode == 125 and words in done.stderr, (bad, done)
