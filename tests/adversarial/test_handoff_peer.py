"""Attack: a process the harness started, but not as a launcher, uses its handoff server.

The server (sandbox.compat.handoff, run by a harness with a warm
NativeSandbox) served any same-uid child of the harness process, and its
socket sat at a guessable name (`0.sock`) in a directory its owner could
list. A sandbox the harness starts with `as_pid_1=True` is such a child (its
command is the harness's own clone), and one that sees the host's /tmp found
the socket and had the warm Template run whatever it asked: a command in the
native mode's world, whose workspace is writable, from a sandbox that could
not write there. A plain child of the harness could do the same.

Only a launch the harness prepared may be served (a one-use ticket in the
launcher's environment), the socket cannot be found from a sandbox, and the
ticket never reaches the command.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import wait_until
from warm_handoff import served, warm_box  # noqa: F401  (warm_box: the fixture `box`)

import sandbox
from sandbox import Dev, Proc, RoBind
from sandbox._core import cliwire as wire
from sandbox.compat import handoff
from sandbox.compat.avatar import ExecSpec, NativeSandbox

from .attack import PYTHON, require

pytestmark = pytest.mark.integration

TIMEOUT = 60
ENV = "SANDBOX_HANDOFF"  # the launcher's ticket (handoff.ENV)

# A forged request for each form the server might take: the handoff's own wire
# from before, and the one it shares with the CLI now (csrc/client/cliwire.h), with
# the launch's number and a made-up secret, or a zero one.
# Each asks the warm template to write WS/pwned-N; it prints the reply's kind
# (the first int of the frame), or "closed".
FORGE = textwrap.dedent("""
    import os, socket, struct, sys
    path, ws, number = sys.argv[1], sys.argv[2], int(sys.argv[3])
    OLD, MAGIC, VERSION = 0x48584253, 0x4c434253, 5  # the handoff's own wire before, the CLI's (cliwire.h) now
    def payload(n, old):
        parts = [ws, "sh"] if old else ["sh", ws]  # cwd and argv[0], in the order each wire has them
        parts += ["-c", f"echo pwned > {ws}/pwned-{n}", "PATH=/usr/bin:/bin"]
        return b"".join(p.encode() + b"\\0" for p in parts)
    def request(body, secret):  # struct sbx_cli_request with the launch's number, then fds 0, 1 and 2
        head = struct.pack("<8I32s2QqQ16Q", MAGIC, VERSION, 3, 1, 3, len(body), number, 0, secret, 0, 0, 0, 0,
                           *[(1 << 64) - 1] * 16)
        return head + struct.pack("<3i", 0, 1, 2) + body
    forms = [
        lambda: struct.pack("<6I32s", OLD, 2, 3, 1, len(payload(0, True)), number, os.urandom(32)) + payload(0, True),
        lambda: request(payload(1, False), os.urandom(32)),
        lambda: request(payload(2, False), bytes(32)),
    ]
    for n, message in enumerate(forms):
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.settimeout(30)
            s.connect(path)
            s.sendmsg([message()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
            reply = s.recv(4096)
            print(n, struct.unpack_from("<i", reply)[0] if len(reply) >= 8 else "closed", flush=True)
        except OSError as exc:
            print(n, type(exc).__name__, flush=True)
""")

# Inside a sandbox that sees the host's /tmp: list the server's directory.
LIST = textwrap.dedent("""
    import os, sys
    try:
        print("listed", sorted(os.listdir(sys.argv[1])))
    except OSError as exc:
        print("refused", type(exc).__name__)
""")

# The command's view: its ticket variable, its fds; and every environ and
# cmdline its /proc shows, dumped to the file argv[2] for the test to search.
INSIDE = textwrap.dedent("""
    import os, sys
    print("env", sys.argv[1] in os.environ)
    with open(sys.argv[2], "wb") as out:
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            for name in ("environ", "cmdline"):
                try:
                    with open(f"/proc/{pid}/{name}", "rb") as f:
                        out.write(f.read() + b"\\n")
                except OSError:
                    pass
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own fd, closed already
    listing = [fd for fd, target in fds.items() if fd > 2 and target.startswith("/proc/")]
    print("fds", sorted(fd for fd in fds if fd not in listing))
    print("sockets", sorted(fd for fd, target in fds.items() if target.startswith("socket:")))
""")


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    path = tmp_path / "workspace"
    path.mkdir()
    path.chmod(0o755)
    return path


def prepared(box: NativeSandbox, argv: list[str], ws: Path) -> ExecSpec:
    spec = box.prepare(argv, ws)
    assert "--handoff" in spec.argv
    return spec


def socket_path(spec: ExecSpec) -> str:
    """Where a prepared launch hands off (what an attacker would have to learn)."""
    if ENV in spec.env:
        return spec.env[ENV].split(":", 2)[2]
    return spec.argv[spec.argv.index("--handoff") + 1]  # (before tickets: on the command line)


def ticket_number(spec: ExecSpec) -> str:
    return spec.env[ENV].split(":", 1)[0] if ENV in spec.env else "0"


def launch(spec: ExecSpec, ws: Path) -> subprocess.CompletedProcess[str]:
    """Run a prepared command line as the harness does."""
    return subprocess.run(spec.argv, cwd=ws, env=spec.env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=TIMEOUT, check=False)


def assert_not_served(out: str, ws: Path, before: int) -> None:
    """No forged request was started: none answered STATUS (1), nothing written, none counted."""
    replies = dict(line.split(" ", 1) for line in out.splitlines())
    assert len(replies) == 3, out
    assert "1" not in replies.values(), out
    assert not list(ws.glob("pwned-*"))
    assert served() == before


def attack_spec() -> sandbox.Spec:
    """A sandbox the harness starts as its own child (as_pid_1: no reaper
    between) that sees the host read-only, its /tmp included."""
    return sandbox.Spec(mounts=(RoBind("/", "/"), Proc(), Dev()), as_pid_1=True,
                        env=(("PATH", "/usr/bin:/bin"),))


# ---------------------------------------------------------------- (a) peers that are not its launchers

def test_a_plain_child_of_the_harness_is_refused(box: NativeSandbox, ws: Path) -> None:
    """Same uid, a child of the server's process, the socket's path known:
    without the launch's ticket nothing is started."""
    spec = prepared(box, ["true"], ws)
    before = served()
    done = subprocess.run([sys.executable, "-I", "-c", FORGE, socket_path(spec), str(ws), ticket_number(spec)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert_not_served(done.stdout, ws, before)


def test_an_as_pid_1_sandbox_cannot_find_the_socket(box: NativeSandbox, ws: Path) -> None:
    """A sandbox that sees the host's /tmp cannot list the socket's directory."""
    require("native")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")
    spec = prepared(box, ["true"], ws)
    directory = os.path.dirname(socket_path(spec))
    done = sandbox.run([PYTHON, "-I", "-S", "-c", LIST, directory], attack_spec(), backend="native",
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused "), done.stdout
    assert os.path.basename(socket_path(spec)) not in done.stdout


def test_an_as_pid_1_sandbox_that_knows_the_socket_is_refused(box: NativeSandbox, ws: Path) -> None:
    """The same sandbox, told the socket's path (and the launch's number),
    has the warm template start nothing: it could not write the workspace,
    and still cannot."""
    require("native")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")
    spec = prepared(box, ["true"], ws)
    before = served()
    done = sandbox.run([PYTHON, "-I", "-S", "-c", FORGE, socket_path(spec), str(ws), ticket_number(spec)],
                       attack_spec(), backend="native", capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert_not_served(done.stdout, ws, before)


def test_a_ticket_is_good_for_one_launch(box: NativeSandbox, ws: Path) -> None:
    """A prepared command line run twice (or replayed by whoever read it)
    is handed off once; the second run sets its sandbox up itself."""
    spec = prepared(box, ["sh", "-c", "exit 4"], ws)
    before = served()
    assert launch(spec, ws).returncode == 4
    assert served() == before + 1
    again = launch(spec, ws)
    assert again.returncode == 4, again.stderr
    assert served() == before + 1


def test_a_ticket_is_good_on_its_own_templates_socket_only(box: NativeSandbox, ws: Path, tmp_path: Path) -> None:
    """A ticket for one warm template, sent to another's socket, is refused."""
    other = tmp_path / "other"
    other.mkdir()
    box.prewarm(other)
    spec = prepared(box, ["sh", "-c", "exit 9"], ws)
    target = socket_path(prepared(box, ["true"], other))
    if ENV in spec.env:
        number, secret, _ = spec.env[ENV].split(":", 2)
        spec = ExecSpec(argv=spec.argv, env={**spec.env, ENV: f"{number}:{secret}:{target}"})
    else:
        argv = list(spec.argv)
        argv[argv.index("--handoff") + 1] = target
        spec = ExecSpec(argv=argv, env=spec.env)
    before = served()
    done = launch(spec, ws)
    assert done.returncode == 9, done.stderr
    assert served() == before


# ---------------------------------------------------------------- (b) its launcher

def test_the_launcher_it_prepared_is_served(box: NativeSandbox, ws: Path) -> None:
    spec = prepared(box, ["sh", "-c", "echo ok > served; echo out; exit 3"], ws)
    before = served()
    done = launch(spec, ws)
    assert (done.returncode, done.stdout) == (3, "out\n"), done.stderr
    assert (ws / "served").read_text() == "ok\n"
    assert served() == before + 1


# ---------------------------------------------------------------- (c) the command never holds the ticket

@pytest.mark.parametrize("path", ["handoff", "fallback"])
def test_the_command_sees_no_ticket(box: NativeSandbox, ws: Path, path: str) -> None:
    """Neither in its environment, nor anywhere in its /proc, nor as an fd:
    whether the template runs it or the launcher sets the sandbox up itself."""
    dump = ws / "proc-dump"
    spec = prepared(box, [PYTHON, "-I", "-S", "-c", INSIDE, ENV, str(dump)], ws)
    secret = spec.env[ENV].split(":", 2)[1]
    assert secret not in " ".join(spec.argv)
    before = served()
    if path == "fallback":
        handoff.close()  # the socket has gone: the launcher runs the plan itself
    done = launch(spec, ws)
    assert done.returncode == 0, done.stderr
    if path == "handoff":
        assert served() == before + 1
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines == {"env": "False", "fds": "[0, 1, 2]", "sockets": "[]"}, done.stdout
    seen = dump.read_bytes()
    assert b"proc-dump" in seen  # (it read its own cmdline at least)
    assert secret.encode() not in seen
    assert os.path.basename(socket_path(spec)).encode() not in seen


def test_the_launchers_proc_environ_does_not_show_the_secret(box: NativeSandbox, ws: Path) -> None:
    """The launcher zeroes the secret where /proc/PID/environ reads it, so
    whoever can read the launcher's environment while it waits cannot
    learn it (nor the socket's name) there."""
    spec = prepared(box, ["sh", "-c", "touch ready; while [ ! -e go ]; do sleep 0.02; done"], ws)
    secret = spec.env[ENV].split(":", 2)[1]
    with subprocess.Popen(spec.argv, cwd=ws, env=spec.env, stdin=subprocess.DEVNULL) as launcher:
        try:
            assert wait_until(lambda: (ws / "ready").exists(), timeout=TIMEOUT)
            environ = Path(f"/proc/{launcher.pid}/environ").read_bytes()
            assert secret.encode() not in environ
            assert os.path.basename(socket_path(spec)).encode() not in environ
            (ws / "go").touch()
            assert launcher.wait(timeout=TIMEOUT) == 0
        finally:
            launcher.kill()


def test_forged_frames_are_the_documented_ones() -> None:
    """The forgeries above speak the wire format handoff.py defines (so a
    refusal is the ticket's doing, not a malformed request's)."""
    assert struct.calcsize("<8I32s2QqQ16Q") == wire.REQUEST_SIZE and (wire.MAGIC, wire.VERSION) == (0x4c434253, 5)
    body = b"sh\0/ws\0-c\0true\0PATH=/usr/bin:/bin\0"
    forged = struct.pack("<8I32s2QqQ16Q", wire.MAGIC, wire.VERSION, 3, 1, 3, len(body), 7, 0, b"s" * 32, 0, 0, 0, 0,
                         *[(1 << 64) - 1] * 16) + struct.pack("<3i", 0, 1, 2) + body
    assert wire.ticket_of(forged) == (7, b"s" * 32)
    request = wire.parse_request(forged)
    assert (request.argv, request.cwd, request.fd_numbers) == ([b"sh", b"-c", b"true"], b"/ws", [0, 1, 2])
    assert handoff.ENV == ENV
