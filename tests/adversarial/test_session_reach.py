"""Attack: a process inside a Session reaching another session, its caller
or the host through the session's machinery: the session's pid 1 (which
holds the control socket: a command started through it could be handed any
fd), the call process beside each command (its call socket), the fds a
command inherits, and the arguments of exec.

pid 1 and the call processes run as the commands' uid: only their being
non-dumpable keeps a command from their /proc files and from ptrace. The
contrast case shows the same reach succeeding against a process of the same
uid that is dumpable (what pid 1 would be without PR_SET_DUMPABLE 0).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from conftest import make_base_spec  # tests/, on sys.path (rootdir)

import sandbox

pytestmark = pytest.mark.integration

PTRACE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for pid in map(int, sys.argv[1:]):
    rc = libc.ptrace(16, pid, 0, 0)  # PTRACE_ATTACH
    print(pid, "attached" if rc == 0 else os.strerror(ctypes.get_errno()))
    if rc == 0:  # let it go again (PTRACE_DETACH, no signal), or the session stays stopped
        os.waitpid(pid, getattr(os, "__WALL", 0x40000000))
        libc.ptrace(17, pid, 0, 0)
"""
# For each pid: every fd it holds, opened through /proc (readlink and open), its environ and memory.
PROBE = """
import os, sys
for pid in sys.argv[1:]:
    for what in ("fd", "environ", "mem"):
        try:
            if what == "fd":
                for n in os.listdir(f"/proc/{pid}/fd"):
                    os.readlink(f"/proc/{pid}/fd/{n}")
                    os.close(os.open(f"/proc/{pid}/fd/{n}", os.O_RDONLY | os.O_NONBLOCK))
            else:
                os.close(os.open(f"/proc/{pid}/{what}", os.O_RDONLY))
            print(f"{pid}:{what}-open")
        except OSError as exc:
            print(f"{pid}:{what}-denied:{exc.errno}")
"""


@pytest.fixture
def session(require_native: None) -> Iterator[sandbox.Session]:
    with sandbox.Session(make_base_spec()) as s:
        yield s


def sh(s: sandbox.Session, script: str) -> str:
    return s.exec(["sh", "-c", script], capture_output=True, text=True, timeout=60).stdout  # type: ignore[no-any-return]


def test_pid_1_and_the_call_process_are_out_of_reach(session: sandbox.Session) -> None:
    # $PPID of the shell is its call process; pid 1 holds the control socket
    out = sh(session, f"python3 -c '{PROBE}' 1 $PPID; python3 -c '{PTRACE}' 1 $PPID")
    assert "-open" not in out and out.count("-denied") == 6, out
    assert "attached" not in out and out.count("Operation not permitted") == 2, out


def test_the_same_reach_works_on_a_dumpable_process(session: sandbox.Session) -> None:
    """The contrast: a process of the same uid, dumpable, is reached by the same probe."""
    out = sh(session, f"sleep 100 & p=$!; python3 -c '{PROBE}' $p; python3 -c '{PTRACE}' $p; kill -9 $p")
    assert "fd-open" in out and "environ-open" in out and "mem-open" in out and "attached" in out, out


def test_a_command_holds_only_its_stdio(session: sandbox.Session) -> None:
    assert sh(session, "ls /proc/self/fd").split() == ["0", "1", "2", "3"]  # 3: ls's own directory
    inherited = session.exec(["sh", "-c", "ls /proc/self/fd"], capture_output=True, text=True,
                             stdin=sandbox.DEVNULL).stdout
    assert inherited.split() == ["0", "1", "2", "3"]


def test_one_session_cannot_reach_another(require_native: None) -> None:
    with sandbox.Session(make_base_spec()) as a, sandbox.Session(make_base_spec()) as b:
        b.start(["python3", "-c", "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', 8799)); "
                 "s.listen(); time.sleep(1000)"])
        b.write_file("/tmp/b-only", b"b")
        assert sh(b, "sleep 0.2; python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8799))' "
                     "&& echo reached") == "reached\n"
        out = sh(a, "ps -e -o pid=,args=; cat /tmp/b-only 2>&1; "
                    "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8799))' 2>&1 | tail -1")
        assert "8799" not in out.split("\n")[0] and "sleep(1000)" not in out
        assert "No such file" in out and "Connection refused" in out, out
        ns_a = sh(a, "readlink /proc/self/ns/mnt /proc/self/ns/pid /proc/self/ns/net /proc/self/ns/user")
        ns_b = sh(b, "readlink /proc/self/ns/mnt /proc/self/ns/pid /proc/self/ns/net /proc/self/ns/user")
        assert all(x != y for x, y in zip(ns_a.split(), ns_b.split(), strict=True))
        assert not any(line.split()[0] == str(b.pid) for line in os.popen("true").readlines())


def test_exec_arguments_are_data(session: sandbox.Session) -> None:
    args = ["$(id)", "; touch /tmp/pwned", "`id`", "--", "-c", "a\nb", "", "x" * 100_000]
    done = session.exec(["printf", "%s\\0", *args], capture_output=True, timeout=60)
    assert done.stdout.split(b"\0")[:-1] == [a.encode() for a in args]
    assert sh(session, "ls /tmp") == ""
    assert sh(session, "pwd").strip() != ""
    with pytest.raises(sandbox.SpecError, match=r"\.\."):
        session.exec(["pwd"], cwd="/../../..")
    with pytest.raises(sandbox.SpecError):
        session.exec(["true"], env={"A": "x\0y"})
    with pytest.raises(sandbox.SpecError):
        session.exec(["tr\0ue"])
