"""sandbox-launch's handoff to a warm Template in the harness process
(NativeSandbox(warm=True), sandbox.compat.handoff), run as the harness runs it:

    spec = sandbox.prepare(argv, cwd)
    subprocess.run(spec.argv, cwd=cwd, env=spec.env, ...)

Every test checks that the handoff served the command (or, for the fallback
cases, that it did not), so none passes through the launcher's own setup by
accident.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import pids_with_marker, sleep_cmd, sleepers, wait_until  # tests/, on sys.path (rootdir)
from warm_handoff import served, warm_box  # noqa: F401  (warm_box: the fixture `box`)

from sandbox.compat import handoff
from sandbox.compat.avatar import ExecSpec, NativeSandbox, SandboxUnavailable

pytestmark = pytest.mark.integration

TIMEOUT = 60


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """The workspace: the harness's cwd."""
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def prepared(box: NativeSandbox, argv: list[str], ws: Path) -> ExecSpec:
    spec = box.prepare(argv, ws)
    assert "--handoff" in spec.argv and handoff.ENV in spec.env and spec.preexec_fn is None
    return spec


def socket_path(spec: ExecSpec) -> str:
    """The socket a prepared launch hands off on (the last field of its ticket)."""
    return spec.env[handoff.ENV].split(":", 2)[2]


def run(box: NativeSandbox, argv: list[str], ws: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run `argv` as the harness does; check that the handoff served it."""
    before = served()
    spec = prepared(box, argv, ws)
    kw.setdefault("cwd", ws)
    kw.setdefault("env", spec.env)
    done = subprocess.run(spec.argv, timeout=TIMEOUT, capture_output=True, text=True, check=False,
                          **kw)  # type: ignore[call-overload]
    assert served() == before + 1, done.stderr
    return done


# ---------------------------------------------------------------- exit status and signals

@pytest.mark.parametrize("code", [0, 1, 3, 125, 255])
def test_exit_code_passes_through(box: NativeSandbox, ws: Path, code: int) -> None:
    assert run(box, ["sh", "-c", f"exit {code}"], ws).returncode == code


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGSEGV, signal.SIGINT])
def test_death_by_signal_is_minus_n(box: NativeSandbox, ws: Path, sig: signal.Signals) -> None:
    assert run(box, ["sh", "-c", f"kill -{int(sig)} $$"], ws).returncode == -sig


def test_a_shell_sees_128_plus_n(box: NativeSandbox, ws: Path) -> None:
    spec = prepared(box, ["sh", "-c", "kill -TERM $$"], ws)
    script = " ".join(f"'{a}'" for a in spec.argv) + "; echo $?"
    done = subprocess.run(["sh", "-c", script], cwd=ws, env=spec.env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.stdout.strip() == str(128 + signal.SIGTERM), done.stderr


def test_missing_command_is_127_and_not_executable_126(box: NativeSandbox, ws: Path) -> None:
    missing = run(box, ["no-such-command-here"], ws)
    assert missing.returncode == 127 and missing.stderr.startswith("sandbox: "), missing.stderr
    (ws / "script").write_text("#!/bin/sh\necho hi\n")
    assert run(box, [str(ws / "script")], ws).returncode == 126


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 42), (signal.SIGINT, 43)])
def test_signals_to_the_launcher_reach_the_command(box: NativeSandbox, ws: Path, sig: signal.Signals,
                                                   code: int) -> None:
    before = served()
    script = f'trap "exit {code}" {sig.name[3:]}; touch ready; while :; do sleep 0.05; done'
    spec = prepared(box, ["sh", "-c", script], ws)
    with subprocess.Popen(spec.argv, cwd=ws, env=spec.env) as launcher:
        try:
            assert wait_until(lambda: (ws / "ready").exists(), timeout=TIMEOUT)
            launcher.send_signal(sig)
            assert launcher.wait(timeout=TIMEOUT) == code
        finally:
            launcher.kill()
    assert served() == before + 1


# ---------------------------------------------------------------- stdio, cwd, env, the world

def test_stdio_passes_through(box: NativeSandbox, ws: Path) -> None:
    done = run(box, ["sh", "-c", "read line; echo \"out:$line\"; echo err >&2"], ws, input="hello\n")
    assert (done.returncode, done.stdout, done.stderr) == (0, "out:hello\n", "err\n")


def test_cwd_and_env_are_the_launchers(box: NativeSandbox, ws: Path) -> None:
    (ws / "sub").mkdir()
    spec = box.prepare(["sh", "-c", 'pwd; echo "$EXTRA"; echo "${RIGGED-unset}"'], ws)
    done = run(box, ["sh", "-c", 'pwd; echo "$EXTRA"; echo "${RIGGED-unset}"'], ws, cwd=ws / "sub",
               env={**spec.env, "EXTRA": "from the harness"})
    assert done.stdout.splitlines() == [str(ws / "sub"), "from the harness", "unset"], done.stderr


def test_the_world_is_the_native_modes(box: NativeSandbox, ws: Path) -> None:
    done = run(box, ["sh", "-c", "echo hi > out && ! touch /usr/x 2>/dev/null && echo t > /tmp/t && "
                     "tail -n +3 /proc/net/dev | cut -d: -f1"], ws)
    assert done.returncode == 0, done.stderr
    assert (ws / "out").read_text() == "hi\n"
    assert done.stdout.split() == ["lo"]
    assert run(box, ["sh", "-c", "test ! -e /tmp/t"], ws).returncode == 0  # a fresh /tmp each time


# ---------------------------------------------------------------- lifetimes

def test_killing_the_launcher_kills_its_sandbox(box: NativeSandbox, ws: Path, no_leftovers: str) -> None:
    spec = prepared(box, ["sh", "-c", f"{sleep_cmd(no_leftovers)} & {sleep_cmd(no_leftovers)}"], ws)
    with subprocess.Popen(spec.argv, cwd=ws, env=spec.env) as launcher:
        assert wait_until(lambda: len(sleepers(no_leftovers)) == 2, timeout=TIMEOUT)
        launcher.kill()
    assert wait_until(lambda: not pids_with_marker(no_leftovers), timeout=TIMEOUT)


HARNESS = textwrap.dedent("""
    import subprocess, sys
    from pathlib import Path
    from sandbox.compat.avatar import NativeSandbox
    ws, marker = Path(sys.argv[1]), sys.argv[2]
    box = NativeSandbox(warm=True)
    box.prewarm(ws)
    spec = box.prepare(["sleep", "1000", marker], ws)
    assert "--handoff" in spec.argv
    launcher = subprocess.Popen(spec.argv, cwd=ws, env=spec.env)
    print(launcher.pid, flush=True)
    sys.stdin.read()
""")


def test_killing_the_harness_kills_launcher_and_sandbox(box: NativeSandbox, ws: Path, no_leftovers: str,
                                                        tmp_path: Path) -> None:
    # A SIGKILLed harness cannot remove its handoff directory: it makes it in this test's own tmp_path
    scratch = tmp_path / "harness-tmp"
    scratch.mkdir()
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(ws), no_leftovers], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(scratch)})
    try:
        launcher = int(harness.stdout.readline())  # type: ignore[union-attr]
        assert wait_until(lambda: len(sleepers(no_leftovers)) == 1, timeout=TIMEOUT)
    finally:
        harness.kill()
        harness.wait()
        harness.stdout.close()  # type: ignore[union-attr]
        harness.stdin.close()  # type: ignore[union-attr]
    assert wait_until(lambda: not os.path.exists(f"/proc/{launcher}"), timeout=TIMEOUT)
    assert wait_until(lambda: not pids_with_marker(no_leftovers), timeout=TIMEOUT)


# ---------------------------------------------------------------- falling back

def test_a_closed_handoff_falls_back_to_the_launchers_own_setup(box: NativeSandbox, ws: Path) -> None:
    spec = prepared(box, ["sh", "-c", "echo ok > fell-back; exit 5"], ws)
    handoff.close()  # the socket and the template are gone
    done = subprocess.run(spec.argv, cwd=ws, env=spec.env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 5 and (ws / "fell-back").read_text() == "ok\n", done.stderr


def test_a_dead_template_falls_back_and_is_not_used_again(box: NativeSandbox, ws: Path) -> None:
    spec = prepared(box, ["sh", "-c", "exit 6"], ws)
    server = handoff.handoff()
    (warm,) = server._warm.values()
    os.kill(warm.template.pid, signal.SIGKILL)
    assert wait_until(lambda: handoff._gone(warm.template.pid), timeout=TIMEOUT)
    before = server.served
    done = subprocess.run(spec.argv, cwd=ws, env=spec.env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 6, done.stderr
    assert server.served == before
    assert "--handoff" not in box.prepare(["true"], ws).argv  # stale: the launcher's own setup from now on


STRANGER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(sys.argv[1]); s.listen(8)
    print("ready", flush=True)
    while True:
        c, _ = s.accept()
        c.send(b"\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00")  # STATUS 0, whatever was asked
""")


def test_a_socket_not_served_by_the_parent_is_not_used(box: NativeSandbox, ws: Path, tmp_path: Path) -> None:
    """A socket served by another process (even one claiming success) is
    ignored: the launcher runs the plan itself."""
    path = str(tmp_path / "stranger.sock")
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER, path], stdout=subprocess.PIPE, text=True)
    try:
        assert stranger.stdout.readline() == "ready\n"  # type: ignore[union-attr]
        spec = prepared(box, ["sh", "-c", "exit 7"], ws)
        number, secret, _ = spec.env[handoff.ENV].split(":", 2)
        env = {**spec.env, handoff.ENV: f"{number}:{secret}:{path}"}
        done = subprocess.run(spec.argv, cwd=ws, env=env, capture_output=True, text=True, timeout=TIMEOUT)
        assert done.returncode == 7, done.stderr
    finally:
        stranger.kill()
        stranger.wait()
        stranger.stdout.close()  # type: ignore[union-attr]


def test_a_connection_from_another_process_is_refused(box: NativeSandbox, ws: Path) -> None:
    """The server serves only its own children: a grandchild (as a sandboxed
    command would be) that connects gets the connection closed, unanswered."""
    path = socket_path(prepared(box, ["true"], ws))
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect(sys.argv[1])\n"
             "try:\n"
             "    s.sendmsg([b'x' * 20], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(12))])\n"
             "    print(repr(s.recv(100)))\n"
             "except (BrokenPipeError, ConnectionResetError):\n"
             "    print(repr(b''))\n")
    outer = f"{sys.executable} -c \"$0\" \"$1\" | cat"  # the prober runs as a grandchild of ours
    before = served()
    done = subprocess.run(["sh", "-c", outer, probe, path], capture_output=True, text=True, timeout=TIMEOUT)
    assert done.stdout.strip() == "b''", done.stderr
    assert served() == before


def test_prepare_warms_in_the_background(ws: Path) -> None:
    try:
        box = NativeSandbox(warm=True)
    except SandboxUnavailable as exc:
        pytest.skip(str(exc))
    try:
        first = box.prepare(["true"], ws)
        assert "--handoff" not in first.argv  # cold: the launcher's own setup, while the template is built
        assert subprocess.run(first.argv, cwd=ws, env=first.env, timeout=TIMEOUT).returncode == 0
        if not wait_until(lambda: "--handoff" in box.prepare(["true"], ws).argv, timeout=TIMEOUT):
            pytest.skip(f"no warm template here: {handoff.handoff()._failed}")
        assert run(box, ["true"], ws).returncode == 0
    finally:
        handoff.close()


def test_socket_is_private(box: NativeSandbox, ws: Path) -> None:
    """Its directory: its owner may bind in it and nobody may list it."""
    spec = prepared(box, ["true"], ws)
    directory = os.path.dirname(socket_path(spec))
    assert os.stat(directory).st_mode & 0o777 == 0o300
    assert socket_path(spec) not in " ".join(spec.argv)
