"""Attack: an `--args` file that names, as the fd of an option, a number that is one of the CLI server's own fds.

The CLI server (sandbox/cliserver) parses a client's command line in its own
process to answer it with a plan, and it reads the words of the client's
`--args` files there. An option inside such a file that takes an fd
(`--file FD DEST`, `--seccomp FD`, `--sync-fd FD`, ... every one of the
grammar's options whose value is an FD) means the client's fd of that
number; parsing it in the server would read (to EOF) and close the
server's fd of that number instead: its lock, its wake-up pipe (a read
that never ends: the single-threaded server, and every later client of the
user, stalls), its log, its listener, or another client's connection (whose
request a caller would then read as its own data). Each fd must be read in
the caller's process or received from it (a worker holds the client's fds
at their numbers), never looked up by number in the server.

For every fd-valued option of the grammar and every fd the server holds
(another client's connection among them: a command run by a worker is
going on meanwhile), the caller holds at that number a file of its own
and runs an `--args` file naming it. The command must get exactly the
caller's data (or the run fails with a clear message), the server must
answer at once, keep every fd it had, stay up, and serve the other
client and later ones as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from integration.cli_helpers import SYSTEM, TIMEOUT, Installation, clean_env, cli_install, cli_served  # noqa: F401

from sandbox.bwrap.grammar import OPTIONS

pytestmark = pytest.mark.integration

FD_OPTIONS = [o for o in OPTIONS if "FD" in o.metavar and o.refused is None]

# The caller: puts a file of its own at fd number argv[1] (its content: argv[2]) and an --args file
# (argv[3]'s words) at fd 200, then execs the client (argv[4:]).
CALLER = r"""
import os, sys
number, own, words, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
def memfd(data):
    fd = os.memfd_create("caller")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
for fd, data in ((number, own.encode()), (200, words.encode().replace(b"\n", b"\0"))):
    made = memfd(data)
    os.dup2(made, fd, inheritable=True)
    os.close(made)
os.execv(argv[0], argv)
"""


def _fds_of(pid: int) -> dict[int, str]:
    """The fds of process `pid` (3 and above) and what each is."""
    out = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:
            continue
    return {fd: what for fd, what in out.items() if fd > 2}


SO_ACCEPTCON = 0x10000  # /proc/net/unix's flags of a listening socket (include/linux/net.h)


def _socket_inode(link: str) -> str:
    return link.removeprefix("socket:[").removesuffix("]")


def _listener_inode(server: int) -> str:
    """The inode of the server's listening socket: of its sockets, the one /proc/net/unix flags as
    accepting connections (__SO_ACCEPTCON). Not by path: the server binds under a scratch name, through
    its directory's fd, and renames it into place, and /proc/net/unix keeps the name it was bound with."""
    ours = {_socket_inode(what) for what in _fds_of(server).values() if what.startswith("socket:")}
    with open("/proc/net/unix") as f:
        listening = [fields[6] for fields in (line.split() for line in f)
                     if len(fields) >= 7 and fields[6] in ours and int(fields[3], 16) & SO_ACCEPTCON]
    assert len(listening) == 1, f"the server's listening sockets: {listening}"
    return listening[0]


def _peers_of(pid: int) -> set[str]:
    """The inodes of the sockets connected to those of process `pid` (ss lists each socket's peer)."""
    ours = {_socket_inode(what) for what in _fds_of(pid).values() if what.startswith("socket:")}
    out = subprocess.run(["ss", "-xaH"], capture_output=True, text=True, check=True).stdout
    return {fields[-1] for fields in (line.split() for line in out.splitlines())
            if len(fields) >= 4 and fields[-3] in ours}


def _lasting_fds(server: int, listener: str, other: int) -> dict[int, str]:
    """The server's fds that last while it serves: its lock, pipe, epoll, log, its listener and the
    connection of the client `other` (a worker serves it); not the ones it replaces as it serves
    (a spare's control socket, a pidfd)."""
    conn = _peers_of(other)
    return {fd: what for fd, what in _fds_of(server).items()
            if not what.startswith(("socket:", "anon_inode:[pidfd]")) or _socket_inode(what) in {listener, *conn}}


def _option_words(option_name: str, nargs: int, metavar: tuple[str, ...], number: int) -> list[str]:
    values = [str(number) if m == "FD" else "/own" for m in metavar][:nargs]
    return [option_name, *values]


def _attack(served: Installation, option_name: str, words: list[str], number: int) -> subprocess.CompletedProcess[str]:
    own = f"the caller's own data at fd {number}\n"
    args = "\n".join([*SYSTEM, "--unshare-pid", *words])
    return subprocess.run(
        [sys.executable, "-c", CALLER, str(number), own, args, str(served.root / "bwrap"), "--args", "200",
         "sh", "-c", "cat /own 2>/dev/null || echo no file"],
        capture_output=True, text=True, timeout=TIMEOUT, env=clean_env(), cwd="/")


def _other_client(served: Installation) -> subprocess.Popen[str]:
    """A client whose command a worker runs meanwhile: the server holds its connection."""
    return subprocess.Popen([str(served.client), "run", *SYSTEM, "--sync-fd", "2", "sh", "-c", "read x; echo $x"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), cwd="/")


def test_no_option_of_an_args_file_reaches_the_servers_fds(served: Installation) -> None:
    assert served.run("run", *SYSTEM, "true").returncode == 0
    server = served.server
    assert server is not None
    other = _other_client(served)
    try:
        listener = _listener_inode(server.pid)
        deadline = time.monotonic() + TIMEOUT
        while True:  # until the server holds the other client's connection, beside its listener
            everything = _fds_of(server.pid)  # named in the attacks: its lock, pipe, epoll, log, listener,
            before = _lasting_fds(server.pid, listener, other.pid)  # a spare's socket, pidfds, the other's
            if sum(what.startswith("socket:") for what in before.values()) == 2:
                break
            assert time.monotonic() < deadline and other.poll() is None, (everything, before, served.notes())
            time.sleep(0.02)
        for option in FD_OPTIONS:
            for number in sorted(everything):
                words = _option_words(option.name, option.nargs, option.metavar, number)
                result = _attack(served, option.name, words, number)
                what = f"{' '.join(words)} (the server's fd {number}: {everything[number]})"
                if result.returncode == 0 and option.name in ("--file", "--bind-data", "--ro-bind-data"):
                    assert result.stdout == f"the caller's own data at fd {number}\n", what
                elif result.returncode != 0:  # a clear message, in the bwrap words of the Python CLI
                    assert result.stderr.startswith("bwrap: ") and "Traceback" not in result.stderr, \
                        (what, result.stderr)
                assert server.poll() is None, what
                now = _fds_of(server.pid)
                assert {fd: now.get(fd) for fd in before} == before, (what, result.stderr)
        assert served.ran_directly() == []
        attacks = len(FD_OPTIONS) * len(everything)
        assert sum(": needs a worker: " in line and " in its --args " in line for line in served.notes()) == attacks
        out, err = other.communicate("still served\n", timeout=TIMEOUT)
        assert (other.returncode, out) == (0, "still served\n"), err
    finally:
        if other.poll() is None:
            other.kill()
            other.communicate()
    plans = served.plans()
    assert served.run("run", *SYSTEM, "true").returncode == 0
    assert served.plans() == plans + 1
