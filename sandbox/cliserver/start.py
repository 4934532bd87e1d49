"""The CLI server's start: its lock, its warm-up, and the life of its loop (server.py).

`run_server` takes the lock beside the socket (one server per user and
installation), warms up (imports and computes once what each `run`
needs: the host probe, the parser, the wire's cffi types) and serves
until idle. The checks of the socket's directory and of the files in it
are owndir.py's (shared with the socket's naming, __init__.socket_path,
and with the session holders' sockets, sandbox/session/clisock.py).

The server's own files (the lock, the notes, the socket) are opened
beneath an fd of their directory, checked once as ours and 0700, and
never through a link: a process that can write in that directory (a
sandbox given a bind of it) could otherwise plant a link there and have
the server create, truncate or append to the file it names, as the
server's user (root's: any file). The lock is created with O_EXCL, or an
existing one opened with O_NOFOLLOW and taken only if it is a regular
file of ours with one link; the notes are made afresh with O_EXCL, and
workers write through the server's fd; the socket is bound with its mode
set by the umask (server.py).
"""

from __future__ import annotations

import fcntl
import os
import signal

from .._core import cliwire as wire
from ..backends import choose, host_for
from ..bwrap import memo, parse
from .owndir import fresh_file, open_own, open_own_dir
from .peer import controlling_tty, fingerprint
from .server import IDLE_SECONDS, Server
from .worker import ioprio_calls


def _warm_wire() -> None:
    """cffi parses a C type on its first use: each of the wire's, once, here."""
    head = wire.ffi.new("struct sbx_cli_request *", {"magic": wire.MAGIC, "version": wire.VERSION, "argc": 1,
                                                     "nfds": 1, "size": 4})
    wire.parse_request(bytes(wire.ffi.buffer(head)) + b"\0\0\0\0" + b"a\0/\0")
    wire.parse_frame(wire.frame(wire.STATUS))
    fingerprint("/proc/self")
    controlling_tty(os.getpid())


def run_server(path: str, client: tuple[int, int, int] | None, idle: float = IDLE_SECONDS, log: str = "") -> int:
    """Serve at `path` until idle; 0 also when another server holds the lock already. `log`: the
    notes' file ("": none), made afresh."""
    directory = open_own_dir(os.path.dirname(path))
    try:
        lock = open_own(directory, os.path.basename(path).removesuffix(".sock") + ".lock", os.O_RDWR)
    except OSError:
        os.close(directory)
        raise
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(directory)
            return 0
        for sig in (signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _terminate)  # until the loop takes over: the socket goes with the server
        try:
            notes = _open_notes(log, path, directory)
        except OSError:
            os.close(directory)
            raise
        server = Server(directory, os.path.basename(path), client, idle, notes)
        try:
            warm()
            server.listen()
            server.serve_forever()
        finally:
            server.close()
        return 0
    finally:
        os.close(lock)


def _open_notes(log: str, path: str, directory: int) -> int:
    """The notes' fd (-1: none), made afresh: beside the socket, beneath its checked directory;
    elsewhere, beneath the directory the caller named."""
    if not log:
        return -1
    flags = os.O_WRONLY | os.O_APPEND
    if os.path.dirname(os.path.abspath(log)) == os.path.dirname(os.path.abspath(path)):
        return fresh_file(directory, os.path.basename(log), flags)
    parent = os.open(os.path.dirname(os.path.abspath(log)), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return fresh_file(parent, os.path.basename(log), flags)
    finally:
        os.close(parent)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(0)


def warm() -> None:
    """Import and compute once what each `run` needs, so that a plan is mostly looked up and a
    worker only forks."""
    # lazy: serve_command imports this module before its --after wait, and warm() runs after it: at the top,
    # these would load 52 ms of modules (import timed, median of 7) while the client's first command still runs
    from .. import api, netpool, process  # noqa: F401
    from ..probe import probe

    netpool.disable()  # its refill thread would make the server multi-threaded; a one-shot CLI has no pool
    probe()
    name, _ = choose("auto")
    parse.parse_bwrap_args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "true"])
    host_for(name)  # the pool is disabled above: this only reads
    _warm_wire()
    ioprio_calls()
    memo.enable()  # the Specs of command lines seen, by their words (fastpath.py answers from them)
    import gc

    gc.collect()
    gc.freeze()  # a worker's collections never walk (and so copy) the server's objects
