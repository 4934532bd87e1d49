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
(peer.py), reads its request (wire.py) and becomes its worker (worker.py),
or answers FALLBACK. A request from a client of another build is also
reported to the server ("S"), which then exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from typing import NoReturn

from . import rehearse, wire, worker
from .peer import Peer, Unverified

REQUEST_TIMEOUT = 2.0  # the request follows the connection at once


def run(listener: socket.socket, ctrl: socket.socket, client: tuple[int, int, int] | None, log: str,
        learned: bytes = b"") -> NoReturn:
    """The spare's whole life: never returns. `listener`: the server's (a worker never accepts);
    `learned`: the previous worker's pure options, cwd and environment (rehearse.py), to make
    ready before a client comes."""
    try:
        listener.close()
        os.setpgid(0, 0)  # the server kills this group when the client goes away
        signal.set_wakeup_fd(-1)  # the server's wake-up pipe and handler are the server's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        ctrl.setblocking(True)
        rehearse.until_client(ctrl, lambda: rehearse.rehearse(learned))
        msg, fds, _ = wire.recv_fds(ctrl, 16, 1, socket.MSG_CMSG_CLOEXEC)
        if msg != b"C" or len(fds) != 1:  # the server is gone (or says something else): so is the spare
            os._exit(1)
        _serve(socket.socket(fileno=fds[0]), ctrl, client, log)
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


def _serve(conn: socket.socket, ctrl: socket.socket, client: tuple[int, int, int] | None, log: str) -> NoReturn:
    conn.settimeout(REQUEST_TIMEOUT)
    fds: list[int] = []
    pid = 0
    try:
        peer = Peer.of(conn)
        pid = peer.pid
        data, fds, flags = wire.recv_fds(conn, wire.MAX_REQUEST + 1, wire.MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        request = wire.parse_request(data)
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != len(request.fd_numbers):
            raise wire.WireError(f"{len(fds)} fds came, {len(request.fd_numbers)} were announced")
        if client is not None and request.exe != client:
            with contextlib.suppress(OSError):
                ctrl.send(b"S")  # another installation, or this one rebuilt: the server makes way
            raise Unverified("the client is not this server's build")
        peer.check()
        same_interpreter_settings(request.environ)
        if threading.active_count() != 1:
            raise Unverified("the worker is not single-threaded")
    except (Unverified, wire.WireError, OSError) as exc:
        worker.note(log, f"pid {pid}: runs directly: {exc}")
        with contextlib.suppress(OSError):
            conn.send(wire.frame(wire.FALLBACK))
        os._exit(worker.FALLBACK_EXIT)
    conn.settimeout(None)
    worker.note(log, f"pid {pid}: handed off")
    worker.run(conn, peer, request, fds, log, ctrl)
