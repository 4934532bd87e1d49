"""The installed `sandbox` command (csrc/client/cliclient.c) and the CLI server (sandbox.cliserver).

Each test gets an installation of its own: a copy of the client executable
and of the `sandbox-py` script beside it in a temporary directory, so its
socket (named after that directory) is its own, and a server started for
it (`sandbox-py serve`, stopped afterwards). The server's notes (`--log`)
say, per client, whether it ran the plan itself, needed a worker (and
why), or ran directly (and why).

What is checked: a served command line behaves as the Python CLI run
directly, whether the client runs the plan itself or a worker runs it
(status, output, fds at their numbers, --args, --info-fd,
--json-status-fd, signals, --die-with-parent, the client's death); and the
handoff is attacked: a client under a seccomp filter, under no_new_privs,
inside a sandbox, of another user, and a process posing as the server, all
end up run directly (or refused), never served by the less-confined server.
tests/integration/test_cli_plan.py attacks what is new with plans.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import (  # noqa: F401
    RAW_REQUEST,
    SYSTEM,
    TIMEOUT,
    UNIT_TESTS,
    Installation,
    clean_env,
    cli_install,
    cli_served,
    servers_of,
)
from leakcheck import descendants, kill_trees

import sandbox

pytestmark = pytest.mark.integration
# (cli_install and cli_served are the fixtures `install` and `served`)

SHOW_STATE = "ulimit -Sn; ulimit -Hn; umask; grep SigIgn /proc/self/status | cut -f2 >&2"


# ---------------------------------------------------------------- the same as the Python CLI

class TestHandedOff:
    def test_status_and_output(self, served):
        result = served.run("run", *SYSTEM, "sh", "-c", "echo out; echo err >&2; exit 7")
        assert (result.returncode, result.stdout, result.stderr) == (7, "out\n", "err\n")
        assert served.plans() == 1

    def test_a_failure_speaks_as_the_python_cli(self, served):
        result = served.run("run", *SYSTEM, "/nonexistent")
        assert result.returncode == 127 and result.stderr.startswith("sandbox: execvp /nonexistent")
        bad = served.run("run", "--no-such-option", "true")
        assert bad.returncode == 125 and bad.stderr.startswith("sandbox: ")
        assert (served.plans(), served.workers()) == (1, 1)  # the Python CLI says what is wrong

    def test_named_bwrap(self, served):
        result = served.run("--no-such-option", "true", name="bwrap")
        assert result.returncode == 1 and result.stderr.startswith("bwrap: ")
        assert served.run("--version", name="bwrap").stdout == "bubblewrap 0.8.0\n"
        assert served.served() == 1  # --version is answered by the client itself

    def test_version_is_the_packages(self, served):
        for args in (["--version"], ["-V"], ["run", "--version"]):
            assert served.run(*args).stdout == f"sandbox {sandbox.__version__}\n"

    def test_cwd_env_and_fds_at_their_numbers(self, served, tmp_path):
        import fcntl

        r, w = os.pipe()
        high = fcntl.fcntl(w, fcntl.F_DUPFD, 77)  # a number of its own, as the command will see it
        os.close(w)
        try:
            env = clean_env(PROBE="value")
            result = served.run("run", *SYSTEM, "--bind", str(tmp_path), str(tmp_path), "--chdir", str(tmp_path),
                                "sh", "-c", f'pwd; echo "$PROBE"; echo to-{high} > /proc/self/fd/{high}',
                                env=env, pass_fds=(high,))
        finally:
            os.close(high)
        with os.fdopen(r) as f:
            assert f.read() == f"to-{high}\n"
        assert result.stdout == f"{tmp_path}\nvalue\n" and result.returncode == 0
        assert served.plans() == 1

    def test_a_repeated_command_line_sees_its_own_environment_and_cwd(self, served, tmp_path):
        # each spare makes the previous command line ready (cliserver/rehearse.py): only the very same
        # words, environment and cwd may reuse what it made
        outs = []
        for value, cwd in (("one", "/"), ("one", "/"), ("two", "/"), ("two", str(tmp_path)), ("two", str(tmp_path))):
            result = served.run("run", *SYSTEM, "--bind", str(tmp_path), str(tmp_path), "sh", "-c",
                                'echo "$PROBE $PWD"; pwd', env=clean_env(PROBE=value), cwd=cwd)
            outs.append(result.stdout)
        assert outs == [f"{v} {d}\n{d}\n" for v, d in (("one", "/"), ("one", "/"), ("two", "/"), ("two", tmp_path),
                                                      ("two", tmp_path))]
        assert served.plans() == 5

    def test_a_repeated_args_file_with_other_content_is_read_again(self, served, tmp_path):
        for name in ("a", "b", "b", "a"):
            (tmp_path / name).mkdir(exist_ok=True)
            (tmp_path / name / "which").write_text(name)
        seen = []
        for name in ("a", "a", "b", "a"):
            r, w = os.pipe()
            os.write(w, b"\0".join(a.encode() for a in [*SYSTEM, "--ro-bind", str(tmp_path / name), "/mnt"]))
            os.close(w)
            try:
                result = served.run("--args", str(r), "cat", "/mnt/which", name="bwrap", pass_fds=(r,))
            finally:
                os.close(r)
            seen.append(result.stdout)
        assert seen == ["a", "a", "b", "a"]
        assert served.plans() == 4

    def test_limits_umask_and_ignored_signals_are_the_clients(self, served):
        import resource

        def narrow() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (77, 99))
            os.umask(0o027)
            signal.signal(signal.SIGUSR2, signal.SIG_IGN)

        direct = served.run("run", *SYSTEM, "sh", "-c", SHOW_STATE, preexec_fn=narrow,
                            env=clean_env(SANDBOX_CLI_SERVER="0"))
        handed = served.run("run", *SYSTEM, "sh", "-c", SHOW_STATE, preexec_fn=narrow)
        assert handed.stdout.split() == ["77", "99", "0027"] and direct.returncode == 0
        # the ignored signals (SigIgn, on stderr) the command inherits too
        assert (handed.stdout, handed.stderr) == (direct.stdout, direct.stderr)
        assert served.plans() == 1

    def test_args_info_and_json_status_fds(self, served):
        args_r, args_w = os.pipe()
        info_r, info_w = os.pipe()
        json_r, json_w = os.pipe()
        os.write(args_w, b"\0".join(a.encode() for a in SYSTEM) + b"\0")
        os.close(args_w)
        try:
            result = served.run("run", "--args", str(args_r), "--info-fd", str(info_w), "--json-status-fd",
                                str(json_w), "--unshare-pid", "sh", "-c", "exit 3", pass_fds=(args_r, info_w, json_w))
        finally:
            for fd in (args_r, info_w, json_w):
                os.close(fd)
        with os.fdopen(info_r) as f:
            info = json.loads(f.read())
        with os.fdopen(json_r) as f:
            lines = [json.loads(line) for line in f.read().splitlines()]
        assert result.returncode == 3, result.stderr
        assert info["child-pid"] > 0 and "pid-namespace" in info
        assert lines[0]["child-pid"] == info["child-pid"] and lines[-1] == {"exit-code": 3}
        assert served.workers() == 1  # a worker serves the status fds (the Python CLI's)

    def test_nested_mount_proc_unprivileged_as_with_bwrap(self, served):
        if os.getuid() == 0:
            pytest.skip("the case is an unprivileged caller's")
        result = served.run("run", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-pid", "--unshare-user",
                            "--cap-drop", "ALL", "--proc", "/proc", "--", "unshare", "--user", "--map-root-user",
                            "--pid", "--fork", "--mount-proc", "true")
        assert result.returncode == 0, result.stderr
        assert served.plans() == 1


def outlives(marker: Path) -> bool:
    """Whether a sandbox that keeps touching `marker` still does so a while later."""
    time.sleep(0.5)
    marker.unlink(missing_ok=True)
    time.sleep(0.5)
    return marker.exists()


@pytest.fixture(params=["plan", "worker"])
def path(request: pytest.FixtureRequest) -> list[str]:
    """Options that send the command line down one path: none (the client runs the plan
    itself), or a --sync-fd (an fd the Python CLI holds while its sandbox runs: a worker's
    to hold; stderr here, which stays the command's too)."""
    return [] if request.param == "plan" else ["--sync-fd", "2"]


def _took(inst: Installation, path: list[str], count: int = 1) -> bool:
    """Whether `count` clients took `path` (and none another)."""
    return (inst.plans(), inst.workers()) == ((count, 0) if not path else (0, count))


class TestSignalsAndDeath:
    def _start(self, inst: Installation, *args: str, **kw) -> subprocess.Popen[str]:
        proc = subprocess.Popen([str(inst.client), "run", *SYSTEM, *args], env=clean_env(), cwd="/",
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        return proc

    def _sigterm(self, inst: Installation, path: list[str]) -> tuple[int, str]:
        """SIGTERM to the client of a command that traps it: (the client's status, the command's output)."""
        proc = self._start(inst, *path, "sh", "-c", 'trap "echo got-term; exit 9" TERM; echo ready; '
                           'while :; do sleep 0.05; done')
        try:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=TIMEOUT)
        finally:
            kill_trees({proc.pid, *descendants(proc.pid)})
        return proc.returncode, out

    def test_sigterm_reaches_the_command(self, served, path):
        assert self._sigterm(served, path) == (9, "got-term\n")
        assert _took(served, path)

    def test_sigterm_reaches_the_command_every_time(self, served, path):
        # the client blocks every signal while it sends its request: the worker takes on the mask
        # its caller gave it (sent in the request), not what /proc showed then, which once lost a
        # SIGTERM in about 1 run of 20 (the worker ran with every signal blocked)
        for _ in range(8):
            assert self._sigterm(served, path) == (9, "got-term\n")
        assert _took(served, path, 8)

    def test_a_signal_that_ends_the_command(self, served, path):
        """Killed by signal N: the status is 128+N, as the Python CLI's (and bwrap's)."""
        result = served.run("run", *SYSTEM, *path, "sh", "-c", "kill -USR1 $$")
        assert result.returncode == 128 + signal.SIGUSR1, result.stderr
        assert _took(served, path)

    def test_killing_the_clients_group_ends_the_sandbox(self, served, path, tmp_path):
        """What a caller's group kill (a shell's job control, a supervisor) does to the Python CLI
        and its sandbox: the plan's sandbox is in the client's group; a worker's, the server ends."""
        marker = tmp_path / "alive"
        proc = self._start(served, *path, "--bind", str(tmp_path), str(tmp_path), "sh", "-c",
                           f"touch {marker}; echo ready; while :; do touch {marker}; sleep 0.05; done",
                           process_group=0)
        inside = descendants(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=TIMEOUT)
            assert not outlives(marker), "the sandbox outlived its client's group"
        finally:
            kill_trees({proc.pid, *inside})
        assert _took(served, path)

    def test_a_client_killed_alone_leaves_its_sandbox_as_bwrap_does(self, served, tmp_path):
        """Without --die-with-parent, bwrap's sandbox (and the Python CLI's) outlives a SIGKILL of
        bwrap alone: so does the sandbox of a plan the client ran."""
        marker = tmp_path / "alive"
        proc = self._start(served, "--bind", str(tmp_path), str(tmp_path), "sh", "-c",
                           f"touch {marker}; echo ready; while :; do touch {marker}; sleep 0.05; done")
        inside = descendants(proc.pid)
        try:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
            assert outlives(marker), "the sandbox died with its client"
        finally:
            kill_trees({proc.pid, *inside})
        assert served.plans() == 1

    def test_die_with_parent_is_the_clients(self, served, path, tmp_path):
        marker = tmp_path / "alive"
        # a shell is the client's parent; killing it ends the client (PDEATHSIG) and so the sandbox
        parent = subprocess.Popen(
            ["sh", "-c", f'"$0" run {" ".join([*SYSTEM, *path])} --bind {tmp_path} {tmp_path} --die-with-parent '
             f'sh -c "touch {marker}; echo ready; while :; do touch {marker}; sleep 0.05; done"; echo never',
             str(served.client)],
            env=clean_env(), cwd="/", stdout=subprocess.PIPE, text=True)
        _kill_the_parent_and_check(parent, marker)
        assert _took(served, path)

    def test_die_with_parent_in_an_args_file(self, served, path, tmp_path):
        marker = tmp_path / "alive"
        options = [*SYSTEM, *path, "--bind", str(tmp_path), str(tmp_path), "--die-with-parent"]
        code = ("import os,subprocess,sys\nr,w=os.pipe()\n"
                "os.write(w,b''.join(a.encode()+b'\\0' for a in sys.argv[2].split('\\n')))\nos.close(w)\n"
                "subprocess.run([sys.argv[1],'run','--args',str(r),'sh','-c',sys.argv[3]],pass_fds=(r,))\n")
        parent = subprocess.Popen(
            [sys.executable, "-c", code, str(served.client), "\n".join(options),
             f"touch {marker}; echo ready; while :; do touch {marker}; sleep 0.05; done"],
            env=clean_env(), cwd="/", stdout=subprocess.PIPE, text=True)
        _kill_the_parent_and_check(parent, marker)
        assert _took(served, path)


def _kill_the_parent_and_check(parent: subprocess.Popen[str], marker: Path) -> None:
    """Once the sandbox under `parent` says ready, kill `parent`: the sandbox (touching `marker`) must end."""
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == "ready\n"
        parent.kill()
        parent.wait(timeout=TIMEOUT)
        assert not outlives(marker), "the sandbox outlived its client's parent"
    finally:
        kill_trees({parent.pid, *descendants(parent.pid)})


# ---------------------------------------------------------------- what runs directly

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


def _allow_all_filter() -> None:
    """preexec: a seccomp filter that allows everything (no_new_privs first, as an unprivileged caller must)."""
    libc = ctypes.CDLL(None, use_errno=True)

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    program = (SockFilter * 1)(SockFilter(0x06, 0, 0, 0x7FFF0000))  # BPF_RET|BPF_K SECCOMP_RET_ALLOW
    prog = SockFprog(1, program)
    if os.getuid() != 0 and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def _no_new_privs() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


class TestConfinedClientsRunDirectly:
    """A client confined more than the server runs the command line itself (so its
    confinement holds for the sandbox), never through the warmer server."""

    @pytest.mark.parametrize("confine", [_allow_all_filter, _no_new_privs], ids=["seccomp", "no_new_privs"])
    def test_confined_caller(self, served, confine):
        result = served.run("run", *SYSTEM, "sh", "-c", "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status",
                            preexec_fn=confine)
        assert result.returncode == 0, result.stderr
        status = dict(line.split(":\t") for line in result.stdout.splitlines())
        assert status["NoNewPrivs"] == "1"  # the command is as confined as its caller: run directly
        assert served.served() == 0  # the client saw the server differ and sent it nothing

    @pytest.mark.parametrize("confine", [_allow_all_filter, _no_new_privs], ids=["seccomp", "no_new_privs"])
    def test_the_server_refuses_a_confined_peer(self, served, confine):
        """A confined process that speaks the wire itself (no client's check of the server) gets FALLBACK."""
        from sandbox._core import cliwire as wire

        result = subprocess.run([sys.executable, "-c", RAW_REQUEST, served.socket, served.identity()],
                                capture_output=True, timeout=TIMEOUT, preexec_fn=confine,
                                env=clean_env(PYTHONPATH=UNIT_TESTS))
        assert result.returncode == 0, result.stderr
        assert wire.parse_frame(result.stdout) == (wire.FALLBACK, 0)
        assert served.served() == 0
        assert "confined otherwise" in served.ran_directly()[0]

    @pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
    def test_a_traced_client(self, served):
        """A tracer follows the client's children: the sandbox must be one, so the client runs directly."""
        result = subprocess.run(["strace", "-f", "-o", "/dev/null", str(served.client), "run", *SYSTEM, "sh", "-c",
                                 "echo traced"], env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT)
        assert (result.returncode, result.stdout) == (0, "traced\n"), result.stderr
        assert served.served() == 0

    def test_inside_a_sandbox(self, served, tmp_path):
        """A process in a sandbox that sees the socket (a bind of /) gets nothing from the server."""
        result = subprocess.run(
            [str(served.root / "sandbox-py"), "run", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--",
             str(served.client), "run", *SYSTEM, "sh", "-c", "echo inner"],
            env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
        assert (result.returncode, result.stdout) == (0, "inner\n"), result.stderr
        assert served.served() == 0

    def test_disabled_by_the_environment(self, served):
        result = served.run("run", *SYSTEM, "true", env=clean_env(SANDBOX_CLI_SERVER="0"))
        assert result.returncode == 0
        assert served.notes() == []

    def test_a_package_setting_in_the_environment(self, served):
        result = served.run("run", *SYSTEM, "true", env=clean_env(SANDBOX_NETNS_POOL="0"))
        assert result.returncode == 0
        assert served.notes() == []

    def test_other_interpreter_settings(self, served):
        """PYTHONPATH and its kin decide what a direct run would import: a client whose differ runs directly."""
        result = served.run("run", *SYSTEM, "true", env=clean_env(PYTHONPATH="/nonexistent"))
        assert result.returncode == 0
        assert served.served() == 0
        assert "PYTHON* variables are not the server's (PYTHONPATH)" in served.ran_directly()[0]

    def test_inert_interpreter_settings(self, served):
        """Those that change nothing a run does or says (bytecode caching, buffering) may differ."""
        env = {k: v for k, v in clean_env(PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1").items()}
        assert served.run("run", *SYSTEM, "true", env=env).returncode == 0
        assert served.served() == 1, served.notes()

    def test_a_client_of_another_build(self, install):
        install.start_server(identity="1:2:3")
        result = install.run("run", *SYSTEM, "sh", "-c", "echo direct")
        assert (result.returncode, result.stdout) == (0, "direct\n")
        assert install.served() == 0
        assert install.server is not None
        assert install.server.wait(timeout=TIMEOUT) == 0  # it made way for the client's own build

    def test_another_user_cannot_reach_the_socket(self, served):
        if os.getuid() != 0:
            pytest.skip("needs root to act as another user")
        probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n"
                 "try:\n s.connect(sys.argv[1])\nexcept PermissionError:\n sys.exit(3)\n")
        result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                                 "-c", probe, served.socket], capture_output=True, timeout=TIMEOUT)
        assert result.returncode == 3, result.stderr
        assert os.stat(os.path.dirname(served.socket)).st_mode & 0o777 == 0o700

    def test_a_process_posing_as_the_server_gets_nothing(self, install):
        """Something confined that took the socket's name: the client checks it before it sends."""
        os.makedirs(os.path.dirname(install.socket), mode=0o700, exist_ok=True)
        fake = subprocess.Popen(
            [sys.executable, "-c",
             "import socket,sys\ns=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\ns.bind(sys.argv[1])\n"
             "s.listen()\nprint('ready',flush=True)\nc,_=s.accept()\nc.settimeout(5)\n"
             "try:\n d=c.recv(1<<20)\nexcept OSError:\n d=b''\nprint(len(d),flush=True)\n", install.socket],
            stdout=subprocess.PIPE, text=True, preexec_fn=_no_new_privs)
        try:
            assert fake.stdout is not None
            assert fake.stdout.readline() == "ready\n"
            result = install.run("run", *SYSTEM, "sh", "-c", "echo direct", env=clean_env(SANDBOX_CLI_SERVER="1"))
            assert (result.returncode, result.stdout) == (0, "direct\n"), result.stderr
            assert fake.stdout.readline() == "0\n"  # connected, then closed unheard
        finally:
            fake.kill()
            fake.wait()


class TestFirstUse:
    def test_the_server_warms_up_once_its_starter_is_gone(self, install):
        # the client that starts a server runs its own command line meanwhile: the server waits for
        # its end (`--after PIDFD`), at most AFTER_SECONDS, before it warms up and listens
        from sandbox.cliserver import AFTER_SECONDS

        starter = subprocess.Popen(["sleep", "60"])
        pidfd = os.pidfd_open(starter.pid)
        try:
            install.server = subprocess.Popen(
                [str(install.root / "sandbox-py"), "serve", "--socket", install.socket, "--client",
                 install.identity(), "--idle", "60", "--log", str(install.log), "--after", str(pidfd)],
                env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(pidfd,))
            started = time.monotonic()
            time.sleep(AFTER_SECONDS / 2)
            assert not os.path.exists(install.socket)  # still waiting
            while not os.path.exists(install.socket):  # and then not longer than AFTER_SECONDS
                assert install.server.poll() is None and time.monotonic() < started + TIMEOUT
                time.sleep(0.02)
            assert starter.poll() is None and time.monotonic() - started >= AFTER_SECONDS
            assert install.run("run", *SYSTEM, "true").returncode == 0 and install.served() == 1
        finally:
            os.close(pidfd)
            starter.kill()
            starter.wait()

    def test_the_first_run_starts_a_server_and_runs_directly(self, install):
        first = install.run("run", *SYSTEM, "sh", "-c", "echo one")
        assert (first.returncode, first.stdout) == (0, "one\n")
        deadline = time.monotonic() + TIMEOUT
        log = install.socket.removesuffix(".sock") + ".log"
        while True:
            second = install.run("run", *SYSTEM, "sh", "-c", "echo two")
            assert (second.returncode, second.stdout) == (0, "two\n")
            if os.path.exists(log) and any(line.endswith("runs the plan itself")
                                           for line in Path(log).read_text().splitlines()):
                break
            assert time.monotonic() < deadline, "no server took over"
            time.sleep(0.2)
        assert servers_of(install.socket)
