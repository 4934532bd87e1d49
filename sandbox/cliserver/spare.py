"""The spare: a worker forked ahead of its client, waiting for the server to hand it one.

Forking the warm server costs milliseconds here, and so does a fresh fork's
first touch of the server's memory (copy-on-write faults). The server keeps
one spare forked ahead, which touches its memory while it waits, so a
client that needs a worker (fastpath.py says which) meets a process that
only has to check it and run its command line.

The server passes the spare a client's connection over its control socket
("C", the connection in SCM_RIGHTS), its request still queued there, and
forks the next spare. Until then the spare makes the previous worker's
command line ready (rehearse.py). Then it checks the client again
(peer.py), for what a worker needs too (no seccomp filter, no
no_new_privs), reads its request (wire.py), has the client prove that no
Landlock domain confines it (`prove`), and becomes its worker (worker.py),
or answers FALLBACK. A request from a client of another build is also
reported to the server ("S"), which then exits.

The proof: Landlock refuses a process in a domain ptrace access to any
process outside that domain (or a domain nested in it), whatever its
capabilities, and reading the links of /proc/PID/fd needs that access. The
spare opens a memfd named with a fresh random nonce and asks the client
for its link (wire.CHALLENGE, with the spare's pid); only a client with
ptrace access to the spare can tell it. /proc shows no Landlock domain,
and a process with CAP_SYS_ADMIN (root) may enter one without
no_new_privs: this is how one is ruled out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from typing import NoReturn

from .._core import cliwire as wire
from .._core.fdpass import recv_fds
from . import rehearse, worker
from .peer import Peer, Unverified

REQUEST_TIMEOUT = 2.0  # the request follows the connection at once
PENDING_MAX = 64  # signals a client may relay while it proves itself (one that sends more proves nothing)


def run(listener: socket.socket, ctrl: socket.socket, client: tuple[int, int, int] | None, notes: int,
        learned: bytes = b"") -> NoReturn:
    """The spare's whole life: never returns. `listener`: the server's (a worker never accepts);
    `notes`: the fd of the server's notes (-1: none); `learned`: the previous worker's pure
    options, cwd and environment (rehearse.py), to make ready before a client comes."""
    try:
        listener.close()
        os.setpgid(0, 0)  # the server kills this group when the client goes away
        signal.set_wakeup_fd(-1)  # the server's wake-up pipe and handler are the server's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        ctrl.setblocking(True)
        rehearse.until_client(ctrl, lambda: rehearse.rehearse(learned))
        msg, fds, _ = recv_fds(ctrl, 16, 1, socket.MSG_CMSG_CLOEXEC)
        if msg != b"C" or len(fds) != 1:  # the server is gone (or says something else): so is the spare
            os._exit(1)
        _serve(socket.socket(fileno=fds[0]), ctrl, client, notes)
    finally:
        os._exit(1)


# PYTHON* variables that change nothing a run of the Python CLI does or says: where bytecode is
# cached, hashing's seed, buffering (the CLI flushes each message), what only an interactive
# session, breakpoint() or asyncio read, and the allocator's tracing.
INERT = frozenset({b"PYTHONDONTWRITEBYTECODE", b"PYTHONPYCACHEPREFIX", b"PYTHONHASHSEED", b"PYTHONUNBUFFERED",
                   b"PYTHONSTARTUP", b"PYTHONBREAKPOINT", b"PYTHONASYNCIODEBUG", b"PYTHONMALLOC",
                   b"PYTHONTRACEMALLOC"})


def same_interpreter_settings(environ: list[bytes]) -> None:
    """Unverified unless the client's PYTHON* variables are the server's (but INERT ones): they
    decide what the interpreter of a direct run would import (PYTHONPATH, PYTHONHOME...) and how
    it behaves. The message names those that differ."""
    theirs = dict(e.partition(b"=")[::2] for e in environ if e.startswith(b"PYTHON"))
    ours = {k: v for k, v in os.environb.items() if k.startswith(b"PYTHON")}
    differ = sorted(k.decode(errors="replace") for k in theirs.keys() | ours.keys()
                    if k not in INERT and theirs.get(k) != ours.get(k))
    if differ:
        raise Unverified(f"the client's PYTHON* variables are not the server's ({', '.join(differ)})")


def prove(conn: socket.socket) -> tuple[int, ...]:
    """Unverified unless the client at `conn` proves ptrace access to this process (so no Landlock
    domain confines it that does not confine this process too); the signals it relayed meanwhile."""
    fd = os.memfd_create(wire.PROOF_PREFIX.removeprefix("/memfd:") + os.urandom(16).hex(), os.MFD_CLOEXEC)
    try:
        expected = os.fsencode(os.readlink(f"/proc/self/fd/{fd}"))
        conn.send(wire.frame(wire.CHALLENGE, os.getpid()))
        pending: list[int] = []
        while True:
            data = conn.recv(wire.FRAME_SIZE + wire.MAX_PROOF + 1)
            kind, value = wire.parse_frame(data[:wire.FRAME_SIZE]) if len(data) >= wire.FRAME_SIZE else (0, 0)
            if kind == wire.SIGNAL and len(data) == wire.FRAME_SIZE and len(pending) < PENDING_MAX:
                if 0 < value < signal.NSIG:
                    pending.append(value)
                continue
            if kind != wire.PROOF or data[wire.FRAME_SIZE:] != expected:
                raise Unverified("the client did not prove that no Landlock domain confines it "
                                 "(it could not read the worker's /proc entry)")
            return tuple(pending)
    finally:
        os.close(fd)


def _serve(conn: socket.socket, ctrl: socket.socket, client: tuple[int, int, int] | None, notes: int) -> NoReturn:
    conn.settimeout(REQUEST_TIMEOUT)
    fds: list[int] = []
    pid = 0
    try:
        peer = Peer.of(conn)
        pid = peer.pid
        data, fds, flags = recv_fds(conn, wire.MAX_REQUEST + 1, wire.MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        request = wire.parse_request(data)
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != len(request.fd_numbers):
            raise wire.WireError(f"{len(fds)} fds came, {len(request.fd_numbers)} were announced")
        if client is not None and request.exe != client:
            with contextlib.suppress(OSError):
                ctrl.send(b"S")  # another installation, or this one rebuilt: the server makes way
            raise Unverified("the client is not this server's build")
        peer.check()
        peer.check_for_worker()
        same_interpreter_settings(request.environ)
        if threading.active_count() != 1:
            raise Unverified("the worker is not single-threaded")
        pending = prove(conn)
    except Exception as exc:  # Unverified, WireError, OSError, or anything a hostile request provoked
        worker.note(notes, f"pid {pid}: runs directly: {exc}")
        with contextlib.suppress(OSError):
            conn.send(wire.frame(wire.FALLBACK))
        os._exit(worker.FALLBACK_EXIT)
    conn.settimeout(None)
    worker.note(notes, f"pid {pid}: handed off")
    worker.run(conn, peer, request, fds, notes, ctrl, pending)
