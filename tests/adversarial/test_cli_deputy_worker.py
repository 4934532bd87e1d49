"""Attack: a confined caller has the CLI server's worker act for it outside its confinement
(issue 36, breaches 2 and 3, and the note on scheduling).

The worker path runs a command line in a process forked from the server,
with the server's confinement. The check of the caller compared what
/proc shows, and /proc shows how many seccomp filters a process has, not
what they refuse, and no Landlock domain at all: a caller under a filter
refusing socket(AF_INET) got, from a server under another single filter, a
command that made an AF_INET socket; a caller confined by Landlock that
speaks the wire itself got a worker that read a file its domain forbids.

The worker path is now refused to a caller with a seccomp filter or
no_new_privs, and a caller must prove that no Landlock domain confines it
(ptrace access to the worker, which Landlock refuses from inside a
domain): the command then runs under the caller's own confinement (its
plan, or the Python CLI directly). And the worker takes on the caller's
scheduling policy and I/O priority, as the Python CLI would have had them.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .cli_deputy import (  # noqa: F401  (cli_install, cli_served: the fixtures `install`, `served`)
    IS_ROOT,
    SYSTEM,
    TIMEOUT,
    Installation,
    allow_all_filter,
    clean_env,
    cli_install,
    cli_served,
    deny_inet_filter,
    no_new_privs,
    request,
    start_server,
)

pytestmark = pytest.mark.integration

MAKE_INET = ("import socket\ntry:\n socket.socket(socket.AF_INET).close()\n print('made')\n"
             "except OSError as e:\n print(e)")
WORKER = ["--sync-fd", "2"]  # an fd the Python CLI holds while its sandbox runs: a worker's command line


def _server_like_the_caller() -> None:
    """The server's confinement as /proc shows it equal to the caller's, without its meaning:
    one seccomp filter (allowing everything), and no_new_privs as an unprivileged caller needs."""
    allow_all_filter()


@pytest.mark.parametrize("path", ["plan", "worker"])
def test_a_filter_refusing_inet_holds_for_the_command(install: Installation, path: str) -> None:
    start_server(install, preexec=_server_like_the_caller)
    result = install.run("run", *SYSTEM, *(WORKER if path == "worker" else []), "python3", "-c", MAKE_INET,
                         preexec_fn=deny_inet_filter)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[Errno 1] Operation not permitted", "the command made an AF_INET socket"
    assert install.workers() == 0


# A process that speaks the wire itself, confined by Landlock (reading files is handled, and no
# rule allows any: it may read no file once confined): `python -c LANDLOCKED SOCKET REQUEST_FILE`.
# It answers a worker's challenge as best it can, and writes the frames it got to stderr.
LANDLOCKED = textwrap.dedent("""
    import ctypes, os, socket, struct, sys
    path, data = sys.argv[1], open(sys.argv[2], 'rb').read()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if os.getuid() != 0 and libc.prctl(38, 1, 0, 0, 0) != 0:
        sys.exit('prctl(PR_SET_NO_NEW_PRIVS)')
    attr = struct.pack('Q', 1 << 2)  # handled_access_fs: LANDLOCK_ACCESS_FS_READ_FILE
    ruleset = libc.syscall(444, attr, len(attr), 0)
    if ruleset < 0 or libc.syscall(446, ruleset, 0) != 0:
        sys.exit(f'landlock: errno {ctypes.get_errno()}')
    try:
        open('/etc/hostname').close()
        sys.exit('landlock: not confined')
    except PermissionError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    socket.send_fds(s, [data], [0, 1, 2])
    while True:
        msg = s.recv(1 << 16)
        if len(msg) < 8:
            break
        kind, value = struct.unpack('ii', msg[:8])
        print(f'frame {kind} {value}', file=sys.stderr, flush=True)
        if kind == 7:  # CHALLENGE: the best proof it can make
            text = b''
            try:
                for name in os.listdir(f'/proc/{value}/fd'):
                    link = os.readlink(f'/proc/{value}/fd/{name}')
                    if 'sandbox-cli-proof' in link:
                        text = link.encode()
            except OSError as exc:
                print(f'no proof: {exc}', file=sys.stderr, flush=True)
            s.send(struct.pack('ii', 8, len(text)) + text)
        elif kind in (1, 2):  # STATUS, FALLBACK
            break
""")


def test_a_landlocked_caller_gets_no_worker_outside_its_domain(install: Installation, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("what the domain forbids\n")
    # the server as /proc shows the caller (no_new_privs: as an unprivileged caller's Landlock needs)
    start_server(install, preexec=None if IS_ROOT else no_new_privs)
    data = tmp_path / "request"
    data.write_bytes(request(install, ["sandbox", "run", *SYSTEM, "--ro-bind", str(tmp_path), str(tmp_path),
                                       *WORKER, "cat", str(secret)]))
    result = subprocess.run([sys.executable, "-c", LANDLOCKED, install.socket, str(data)], capture_output=True,
                            text=True, timeout=TIMEOUT, env=clean_env(), cwd="/")
    assert "landlock" not in result.stderr, result.stderr
    assert "what the domain forbids" not in result.stdout, "a worker read a file the caller's domain forbids"
    assert "frame 2 0" in result.stderr, result.stderr  # FALLBACK: the caller runs it itself, in its domain
    assert install.workers() == 0


def test_a_caller_proving_nothing_gets_no_worker(served: Installation) -> None:
    """The shipped client proves itself; a process that answers the challenge with a guess does not."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        s.connect(served.socket)
        socket.send_fds(s, [request(served, ["sandbox", "run", *SYSTEM, *WORKER, "true"])], [null, null, null])
        kind, value = _frame(s.recv(64))
        assert kind == 7 and value > 0  # CHALLENGE, from the worker's pid
        guess = b"/memfd:sandbox-cli-proof-" + b"0" * 32 + b" (deleted)"
        s.send(_frame_bytes(8, len(guess)) + guess)
        assert _frame(s.recv(64)) == (2, 0)  # FALLBACK
    finally:
        s.close()
        os.close(null)
    assert served.workers() == 0 and "did not prove" in served.ran_directly()[-1]


def _frame(data: bytes) -> tuple[int, int]:
    kind, value = struct.unpack("ii", data[:8])
    return kind, value


def _frame_bytes(kind: int, value: int) -> bytes:
    return struct.pack("ii", kind, value)


IOPRIO_CLASS_IDLE = 3
NR_IOPRIO_SET = 251  # x86_64
SHOW_SCHED = "chrt -p $$; ionice -p $$"


def _batch_and_idle_io() -> None:
    """preexec: SCHED_BATCH and the idle I/O class, both open to an unprivileged caller."""
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(NR_IOPRIO_SET, 1, 0, IOPRIO_CLASS_IDLE << 13) != 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")


def test_the_worker_takes_the_callers_scheduling_and_io_priority(served: Installation) -> None:
    direct = served.run("run", *SYSTEM, "sh", "-c", SHOW_SCHED, preexec_fn=_batch_and_idle_io,
                        env=clean_env(SANDBOX_CLI_SERVER="0"))
    handed = served.run("run", *SYSTEM, *WORKER, "sh", "-c", SHOW_SCHED, preexec_fn=_batch_and_idle_io)
    assert direct.returncode == 0 and "SCHED_BATCH" in direct.stdout and "idle" in direct.stdout, direct
    mine = direct.stdout.replace(f"pid {_pid(direct.stdout)}'s", "pid N's")
    assert handed.returncode == 0, handed.stderr
    assert handed.stdout.replace(f"pid {_pid(handed.stdout)}'s", "pid N's") == mine
    assert served.workers() == 1


def _pid(chrt: str) -> str:
    return chrt.split("'", 1)[0].removeprefix("pid ")


NR_SCHED_SETATTR = 314  # x86_64
SCHED_DEADLINE, SCHED_FLAG_RESET_ON_FORK = 6, 1


def _deadline() -> None:
    """preexec: SCHED_DEADLINE (20 ms of each 100), its children reset to SCHED_OTHER (else none may fork)."""
    attr = struct.pack("IIQiIQQQ", 48, SCHED_DEADLINE, SCHED_FLAG_RESET_ON_FORK, 0, 0, 20_000_000, 100_000_000,
                       100_000_000)
    if ctypes.CDLL(None, use_errno=True).syscall(NR_SCHED_SETATTR, 0, attr, 0) != 0:
        raise OSError(ctypes.get_errno(), "sched_setattr(SCHED_DEADLINE)")


@pytest.mark.skipif(not IS_ROOT, reason="SCHED_DEADLINE needs CAP_SYS_NICE")
def test_a_policy_the_worker_cannot_take_sends_the_command_line_back(served: Installation) -> None:
    """sched_setscheduler cannot set SCHED_DEADLINE: the caller runs it itself, as the Python CLI would have."""
    try:
        result = served.run("run", *SYSTEM, *WORKER, "sh", "-c", "echo ran", preexec_fn=_deadline)
    except subprocess.SubprocessError as exc:
        pytest.skip(f"no SCHED_DEADLINE here: {exc}")
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    assert served.workers() == 1 and "scheduling" in served.ran_directly()[-1]
