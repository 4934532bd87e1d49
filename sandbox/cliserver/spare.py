"""The spare: a worker forked ahead of its client, waiting in accept().

Forking the warm server costs milliseconds here, and so does a fresh fork's
first touch of the server's memory (copy-on-write faults). The server keeps
one spare forked ahead, which touches its memory while it waits, so a
client meets a process that only has to check it and run its command line.

The spare accepts one connection on the server's listening socket, passes
a copy of it to the server at once (over its control socket, with "A"), so
the server forks the next spare and watches the connection. Until a
client comes it makes the previous client's command line ready (rehearse.py).
Then it checks
the client (peer.py), reads its request (wire.py) and becomes its worker
(worker.py), or answers FALLBACK. A request from a client of another build
is also reported to the server ("S"), which then exits.
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
    """The spare's whole life: never returns. `learned`: the previous client's pure
    options, cwd and environment (rehearse.py), to make ready before a client comes."""
    try:
        os.setpgid(0, 0)  # the server kills this group when the client goes away
        signal.set_wakeup_fd(-1)  # the server's wake-up pipe and handler are the server's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        rehearse.until_client(listener, lambda: rehearse.rehearse(learned))
        conn, _ = listener.accept()
        listener.close()
        socket.send_fds(ctrl, [b"A"], [conn.fileno()])
        _serve(conn, ctrl, client, log)
    finally:
        os._exit(1)


def _same_interpreter_settings(environ: list[bytes]) -> None:
    """Unverified unless the client's PYTHON* variables are the server's: they decide what the
    interpreter of a direct run would import (PYTHONPATH, PYTHONHOME...) and how it behaves."""
    theirs = sorted(e for e in environ if e.startswith(b"PYTHON"))
    ours = sorted(k + b"=" + v for k, v in os.environb.items() if k.startswith(b"PYTHON"))
    if theirs != ours:
        raise Unverified("the client's PYTHON* variables are not the server's")


def _serve(conn: socket.socket, ctrl: socket.socket, client: tuple[int, int, int] | None, log: str) -> NoReturn:
    conn.settimeout(REQUEST_TIMEOUT)
    fds: list[int] = []
    pid = 0
    try:
        peer = Peer.of(conn)
        pid = peer.pid
        data, fds, flags, _ = socket.recv_fds(conn, wire.MAX_REQUEST + 1, wire.MAX_FDS, socket.MSG_CMSG_CLOEXEC)
        request = wire.parse_request(data)
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) != len(request.fd_numbers):
            raise wire.WireError(f"{len(fds)} fds came, {len(request.fd_numbers)} were announced")
        if client is not None and request.exe != client:
            with contextlib.suppress(OSError):
                ctrl.send(b"S")  # another installation, or this one rebuilt: the server makes way
            raise Unverified("the client is not this server's build")
        peer.check()
        _same_interpreter_settings(request.environ)
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
