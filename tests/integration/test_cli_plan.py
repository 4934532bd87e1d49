"""The installed `sandbox` command running a plan its CLI server compiled (client/cliplan.c, fastpath.py).

What is checked: which command lines the client runs itself and which need
a worker, and the server's notes say why; that a plan's run is the Python
CLI's (the same status, output and messages as a direct run, --args read as
it reads them, a client with a terminal served in its own session); and the
plan is attacked: a forged, damaged or oversized answer from something that
passes the client's check of the server is never run, a request from inside
a sandbox gets no plan, and an --args pipe that is still open for writing
does not stall the server.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import (  # noqa: F401
    FAKE_SERVER_ACCEPT,
    RAW_REQUEST,
    SYSTEM,
    TIMEOUT,
    UNIT_TESTS,
    Installation,
    clean_env,
    cli_install,
    cli_served,
)
from leakcheck import descendants, kill_trees

from sandbox._core import cliwire as wire

pytestmark = pytest.mark.integration
# (cli_install and cli_served are the fixtures `install` and `served`)


def _args_pipe(options: list[str]) -> int:
    """The read end of a pipe holding `options` as --args reads them (the write end closed)."""
    r, w = os.pipe()
    os.write(w, b"".join(o.encode() + b"\0" for o in options))
    os.close(w)
    return r


# ---------------------------------------------------------------- the decision, and its notes

class TestWhichPath:
    def test_pure_options_run_the_plan_and_others_need_a_worker(self, served):
        assert served.run("run", *SYSTEM, "true").returncode == 0
        assert served.run("run", *SYSTEM, "--sync-fd", "1", "true").returncode == 0
        notes = served.notes()
        assert notes[0].endswith(": runs the plan itself")
        assert notes[1].endswith(": needs a worker: --sync-fd is not carried by a plan"), notes
        assert notes[2].endswith(": handed off")  # the worker's own note

    def test_a_worker_after_a_plan_with_a_reaper(self, served):
        """The server opened sandbox-init for the plan's reaper; a worker forked after that (the
        spare that replaces the first worker) closes every fd but its client's, and opens its own
        (it once ran with the server's number, closed: "Can't set up the sandbox (exec init)")."""
        for extra in ([], ["--sync-fd", "2"], [], ["--sync-fd", "2"]):
            result = served.run("run", *SYSTEM, "--unshare-pid", *extra, "sh", "-c", "echo $$")
            assert (result.returncode, result.stdout) == (0, "2\n"), result.stderr
        assert (served.plans(), served.workers()) == (2, 2)

    def test_an_args_pipe_is_taken_as_the_python_cli_takes_it(self, served):
        r = _args_pipe(SYSTEM)
        try:
            result = served.run("--args", str(r), "sh", "-c", "echo ran", name="bwrap", pass_fds=(r,))
            assert os.read(r, 1) == b""  # read to its end, by the server once it sent the plan
        finally:
            os.close(r)
        assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
        assert served.plans() == 1

    def test_an_option_in_an_args_file_that_needs_a_worker(self, served):
        """The server read the file without taking it: the worker reads it whole again."""
        r = _args_pipe([*SYSTEM, "--json-status-fd", "2"])
        try:
            result = served.run("--args", str(r), "sh", "-c", "exit 4", name="bwrap", pass_fds=(r,))
            assert os.read(r, 1) == b""  # taken, as the Python CLI takes it
        finally:
            os.close(r)
        assert result.returncode == 4 and '"exit-code": 4' in result.stderr, result.stderr
        assert served.workers() == 1 and "--json-status-fd in its --args" in served.notes()[0]

    def test_an_args_pipe_still_open_for_writing_does_not_stall_the_server(self, served):
        """The Python CLI would wait for the writer: so does a worker, and the server serves others."""
        r, w = os.pipe()
        waiting = subprocess.Popen([str(served.client), "run", "--args", str(r), "cat", "/etc/hostname"],
                                   env=clean_env(), cwd="/", pass_fds=(r,), stdout=subprocess.PIPE, text=True)
        os.close(r)
        try:
            deadline = time.monotonic() + TIMEOUT
            while not served.notes():
                assert time.monotonic() < deadline and waiting.poll() is None
                time.sleep(0.02)
            other = served.run("run", *SYSTEM, "sh", "-c", "echo meanwhile")
            assert (other.returncode, other.stdout) == (0, "meanwhile\n")
            os.write(w, b"".join(o.encode() + b"\0" for o in ["--ro-bind", "/", "/"]))
            os.close(w)
            w = -1
            out, _ = waiting.communicate(timeout=TIMEOUT)
        finally:
            if w >= 0:
                os.close(w)
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait()
        assert waiting.returncode == 0 and out == Path("/etc/hostname").read_text()
        assert "may still be written to" in served.notes()[0]
        assert (served.plans(), served.workers()) == (1, 1)

    def test_an_args_file_is_read_from_its_offset_and_left_at_its_end(self, served, tmp_path):
        args = tmp_path / "args"
        args.write_bytes(b"skipped\0" + b"".join(o.encode() + b"\0" for o in SYSTEM))
        fd = os.open(args, os.O_RDONLY)
        try:
            os.lseek(fd, len(b"skipped\0"), os.SEEK_SET)
            result = served.run("--args", str(fd), "sh", "-c", "echo read", name="bwrap", pass_fds=(fd,))
            assert os.lseek(fd, 0, os.SEEK_CUR) == args.stat().st_size
        finally:
            os.close(fd)
        assert (result.returncode, result.stdout) == (0, "read\n"), result.stderr
        assert served.plans() == 1


# ---------------------------------------------------------------- the same as the Python CLI

CASES = {
    "status": ["run", *SYSTEM, "sh", "-c", "echo out; echo err >&2; exit 3"],
    "signal": ["run", *SYSTEM, "sh", "-c", "kill -TERM $$"],
    "not found": ["run", *SYSTEM, "/nonexistent"],
    "not executable": ["run", *SYSTEM, "/usr"],
    # ELOOP: musl words it "Symbolic link loop"; a client built with musl still says glibc's words
    "symlink loop": ["run", *SYSTEM, "--tmpfs", "/tmp", "--symlink", "b", "/tmp/a", "--symlink", "a", "/tmp/b",
                     "/tmp/a"],
    "setup": ["run", *SYSTEM, "--ro-bind", "/nonexistent", "/x", "true"],
    "warning and verbose": ["run", *SYSTEM, "--chdir", "/", "--chdir", "/usr", "--verbose", "pwd"],
    "environment": ["run", *SYSTEM, "--clearenv", "--setenv", "A", "1", "--unsetenv", "PWD", "env"],
    "bwrap not found": ["bwrap", *SYSTEM, "/nonexistent"],
    "bwrap setup": ["bwrap", *SYSTEM, "--ro-bind", "/nonexistent", "/x", "true"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_plan_runs_as_the_python_cli_would(served, case):
    args = CASES[case]
    name = "bwrap" if args[0] == "bwrap" else "sandbox"
    args = args[1:] if name == "bwrap" else args
    direct = served.run(*args, name=name, env=clean_env(SANDBOX_CLI_SERVER="0"))
    planned = served.run(*args, name=name)
    assert (planned.returncode, planned.stdout, planned.stderr) == (direct.returncode, direct.stdout, direct.stderr)
    assert served.plans() == 1


# What a command sees of its sandbox, without what differs between two runs (pids, namespace ids).
PROBE = ("id; grep -E '^(Cap|NoNewPrivs|Seccomp:)' /proc/self/status; ulimit -n -u -f -t; umask; hostname; pwd; "
         "env | grep -v -e '^_=' -e '^SANDBOX_CLI_SERVER=' | sort; ls -ln / | awk '{print $1, $3, $4, $9, $10, $11}'; "
         "cut -d' ' -f5,6 /proc/self/mountinfo | sort; ls /proc | grep -v '^[0-9]' | sort | tr '\\n' ' '")
OPTIONS = {
    "flatpak-like": ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv", "--tmpfs", "/tmp"],
    "ids and hostname": ["--unshare-user", "--unshare-uts", "--uid", "5", "--gid", "6", "--hostname", "box"],
    "capabilities": ["--unshare-user", "--cap-add", "CAP_NET_RAW", "--cap-drop", "CAP_CHOWN"],
    "filesystem": ["--size", "65536", "--perms", "0750", "--tmpfs", "/tmp", "--dir", "/tmp/d", "--chmod", "0700",
                   "/tmp/d", "--symlink", "d", "/tmp/l", "--remount-ro", "/tmp", "--chdir", "/tmp/d"],
    "environment": ["--setenv", "A", "1", "--unsetenv", "HOME", "--chdir", "/usr"],
    "limits": ["--limit-nofile", "77", "--limit-file", "3", "--limit-cpu", "30"],
    "pid 1 and seccomp": ["--unshare-pid", "--as-pid-1", "--seccomp-default"],
    "strict proc": ["--unshare-pid", "--proc-covers", "strict", "--close-fds", "--disable-userns", "--unshare-user"],
}


@pytest.mark.parametrize("options", list(OPTIONS))
def test_a_plan_gives_what_the_python_cli_gives(served, options):
    """Every option of the pure set keeps its meaning in a plan: what the command sees is what it
    sees run by the Python CLI directly (ids, capabilities, limits, environment, mounts, /proc)."""
    args = ["run", *SYSTEM, *OPTIONS[options], "sh", "-c", PROBE]
    direct = served.run(*args, env=clean_env(SANDBOX_CLI_SERVER="0", HOME="/root"))
    planned = served.run(*args, env=clean_env(HOME="/root"))
    assert direct.returncode == 0, direct.stderr
    assert (planned.returncode, planned.stdout, planned.stderr) == (direct.returncode, direct.stdout, direct.stderr)
    assert served.plans() == 1


def test_a_client_with_a_terminal_runs_the_plan_in_its_session(served):
    """A worker's sandbox would not be in the client's session (such a client runs directly);
    the plan's is the client's own child: it has the client's terminal, as bwrap's would."""
    import fcntl
    import termios

    controller, terminal = os.openpty()

    def take_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        for extra in ([], ["--sync-fd", "1"]):
            result = subprocess.run([str(served.client), "run", *SYSTEM, *extra, "sh", "-c",
                                     'read -r pid comm state ppid pgrp session tty rest < /proc/self/stat; '
                                     'test "$tty" != 0 && echo in-session'],
                                    stdin=terminal, capture_output=True, preexec_fn=take_terminal, env=clean_env(),
                                    cwd="/", text=True, timeout=TIMEOUT)
            assert (result.returncode, result.stdout) == (0, "in-session\n"), result.stderr
    finally:
        os.close(controller)
        os.close(terminal)
    assert served.plans() == 1  # the second needed a worker: it ran directly instead
    assert "controlling terminal" in served.ran_directly()[0]


# ---------------------------------------------------------------- attacks

def _plan(tmp_path: Path, marker: Path, extra: tuple[str, ...] = ()) -> bytes:
    """A real plan's blob (the command touches `marker`, under `tmp_path` bound inside)."""
    from sandbox.bwrap.parse import parse_bwrap_args
    from sandbox.launcher import launcher_argv

    spec, command, _ = parse_bwrap_args([*SYSTEM, *extra, "--bind", str(tmp_path), str(tmp_path), "touch",
                                         str(marker)], environ={"PATH": "/usr/bin"}, cwd="/")
    argv = launcher_argv(spec, command, "/")
    assert argv[1] == "--plan", "sandbox-launch is not installed"
    return base64.b64decode(argv[2])


def _with_opts(blob: bytes, bits: int) -> bytes:
    from sandbox._core.binding import ffi

    at = ffi.offsetof("struct sbx_header", "opts")
    opts = int.from_bytes(blob[at:at + 4], "little") | bits
    return blob[:at] + opts.to_bytes(4, "little") + blob[at + 4:]


FAKE_SERVER = FAKE_SERVER_ACCEPT + """
nfds = int(sys.argv[3])
if len(answer) > 200000:
    c.setsockopt(socket.SOL_SOCKET, 32, len(answer) * 2)  # SO_SNDBUFFORCE: only root may
extra = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [0] * nfds))] if nfds else []
c.sendmsg([answer], extra)
c.recv(1)
"""


class TestForgedAnswers:
    """Something that passes the client's check of the server (it is as confined as the
    client) answers with a plan: whatever is wrong with it, nothing of it runs."""

    def _answer_with(self, install: Installation, tmp_path: Path, answer: bytes,
                     nfds: int = 0) -> subprocess.CompletedProcess[str]:
        os.makedirs(os.path.dirname(install.socket), mode=0o700, exist_ok=True)
        (tmp_path / "answer").write_bytes(answer)
        fake = subprocess.Popen([sys.executable, "-c", FAKE_SERVER, install.socket, str(tmp_path / "answer"),
                                 str(nfds)], stdout=subprocess.PIPE, text=True, env=clean_env(), cwd="/")
        try:
            assert fake.stdout is not None
            assert fake.stdout.readline() == "ready\n"
            return install.run("run", *SYSTEM, "true", env=clean_env(SANDBOX_CLI_SERVER="1"))
        finally:
            fake.kill()
            fake.wait()

    def test_a_sound_plan_runs(self, install, tmp_path):
        """The control: the same fake, with a plan that holds up, is obeyed (so the others test
        the checks, not the fake)."""
        marker = tmp_path / "ran"
        result = self._answer_with(install, tmp_path, wire.plan_answer(
            _plan(tmp_path, marker), [b"touch", os.fsencode(marker)], [b"PATH=/usr/bin"], [], die_with_parent=False))
        assert result.returncode == 0, result.stderr
        assert marker.exists()

    @pytest.mark.parametrize("damage", ["blob", "truncated", "unlisted fd", "stdio fd", "sync fds", "exec fd",
                                        "strings", "reaper without its fd", "two fds", "oversized"])
    def test_a_damaged_plan_is_not_run(self, install, tmp_path, damage):
        marker = tmp_path / "ran"
        blob, argv, env = _plan(tmp_path, marker), [b"touch", os.fsencode(marker)], [b"PATH=/usr/bin"]
        pass_fds: list[int] = []
        nfds = 0
        if damage == "blob":
            blob = blob[:32] + b"\xff" * (len(blob) - 32)
        elif damage == "unlisted fd":
            pass_fds = [77]
        elif damage == "stdio fd":
            pass_fds = [1]
        elif damage == "sync fds":
            from sandbox._core.binding import lib

            blob = _with_opts(blob, lib.SBX_OPT_SYNC)
        elif damage == "exec fd":
            from sandbox._core.binding import lib

            blob = _with_opts(blob, lib.SBX_OPT_EXEC_FD)
        elif damage == "reaper without its fd":
            blob = _plan(tmp_path, marker, ("--unshare-pid",))
        elif damage == "two fds":
            nfds = 2
        answer = wire.plan_answer(blob, argv, env, pass_fds, die_with_parent=False)
        if damage == "truncated":
            answer = answer[:-1]
        elif damage == "strings":
            answer = answer.replace(os.fsencode(marker) + b"\0", os.fsencode(marker) + b"x")
        elif damage == "oversized":
            if os.getuid() != 0:
                pytest.skip("a message beyond the socket's buffer needs root's SO_SNDBUFFORCE")
            answer += b"\0" * (wire.MAX_ANSWER + 4096 - len(answer))
        result = self._answer_with(install, tmp_path, answer, nfds)
        assert result.returncode == 125, result.stderr
        assert "sandbox CLI server" in result.stderr and not marker.exists()


def test_a_request_from_inside_a_sandbox_gets_no_plan(served):
    """A process in a sandbox that sees the socket (a bind of /) and speaks the wire itself (no
    client's check of the server) gets FALLBACK: the server compiles nothing for it."""
    result = subprocess.run(
        [str(served.root / "sandbox-py"), "run", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--",
         sys.executable, "-c", RAW_REQUEST, served.socket, served.identity()],
        env=clean_env(PYTHONPATH=UNIT_TESTS), capture_output=True, timeout=TIMEOUT, cwd="/")
    assert result.returncode == 0, result.stderr
    assert wire.parse_frame(result.stdout) == (wire.FALLBACK, 0)
    assert served.served() == 0 and "confined otherwise" in served.ran_directly()[0]


SLOW_SERVER = FAKE_SERVER_ACCEPT + """
print('request', flush=True)
print(wire.parse_frame(c.recv(64))[1], flush=True)  # the client's SIGNAL frame, relayed
c.send(answer)
c.recv(1)
"""


def test_a_signal_that_came_while_the_server_answered_reaches_the_sandbox(install, tmp_path):
    """A SIGTERM to the client after it sent its request and before the plan came: the client
    relayed it (a worker would have got it); with a plan it runs itself, it holds it and passes
    it to the sandbox once that exists, as the Python CLI's forwarder does. Here the server
    answers only once the signal's frame came: the command, a long sleep, ends of it."""
    blob = _plan(tmp_path, tmp_path / "unused")
    answer = wire.plan_answer(blob, [b"sleep", b"60"], [b"PATH=/usr/bin"], [], die_with_parent=False)
    os.makedirs(os.path.dirname(install.socket), mode=0o700, exist_ok=True)
    (tmp_path / "answer").write_bytes(answer)
    fake = subprocess.Popen([sys.executable, "-c", SLOW_SERVER, install.socket, str(tmp_path / "answer")],
                            stdout=subprocess.PIPE, text=True, env=clean_env(), cwd="/")
    client = None
    try:
        assert fake.stdout is not None
        assert fake.stdout.readline() == "ready\n"
        client = subprocess.Popen([str(install.client), "run", *SYSTEM, "sleep", "60"],
                                  env=clean_env(SANDBOX_CLI_SERVER="1"), cwd="/", stderr=subprocess.PIPE, text=True)
        assert fake.stdout.readline() == "request\n"
        client.send_signal(signal.SIGTERM)
        assert fake.stdout.readline() == f"{int(signal.SIGTERM)}\n"
        started = time.monotonic()
        _, err = client.communicate(timeout=TIMEOUT)
        assert client.returncode == 128 + signal.SIGTERM, err  # the sandbox's command ended of it
        assert time.monotonic() - started < 30  # not the sleep's 60 s
    finally:
        if client is not None:
            kill_trees({client.pid, *descendants(client.pid)})
        fake.kill()
        fake.wait()
