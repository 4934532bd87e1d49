"""The CLI server's start: its lock, its warm-up, and the life of its loop (server.py).

`run_server` takes the lock beside the socket (one server per user and
installation), warms up (imports and computes once what each `run`
needs: the host probe, the parser, the wire's cffi types) and serves
until idle. `own_dir` is the check of the socket's directory, shared
with the socket's naming (__init__.socket_path).
"""

from __future__ import annotations

import fcntl
import os
import signal

from . import wire
from .server import IDLE_SECONDS, Server


def _warm_wire() -> None:
    """cffi parses a C type on its first use: each of the wire's, once, here."""
    head = wire.ffi.new("struct sbx_cli_request *", {"magic": wire.MAGIC, "version": wire.VERSION, "argc": 1,
                                                     "nfds": 1, "size": 4})
    wire.parse_request(bytes(wire.ffi.buffer(head)) + b"\0\0\0\0" + b"a\0/\0")
    wire.parse_frame(wire.frame(wire.STATUS))
    from .peer import controlling_tty, fingerprint

    fingerprint("/proc/self")
    controlling_tty(os.getpid())


def own_dir(path: str) -> bool:
    """Whether `path` is a directory (not a link) of ours, mode 0700."""
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700


def run_server(path: str, client: tuple[int, int, int] | None, idle: float = IDLE_SECONDS, log: str = "") -> int:
    """Serve at `path` until idle; 0 also when another server holds the lock already."""
    if not own_dir(os.path.dirname(path)):
        raise OSError(f"{os.path.dirname(path)} is not a directory of ours with mode 0700")
    lock = os.open(path.removesuffix(".sock") + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0
        for sig in (signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _terminate)  # until the loop takes over: the socket goes with the server
        if log:
            os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))  # its notes only
        warm()
        server = Server(path, client, idle, log)
        server.listen()
        try:
            server.serve_forever()
        finally:
            server.close()
        return 0
    finally:
        os.close(lock)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(0)


def warm() -> None:
    """Import and compute once what each `run` needs, so that a plan is mostly looked up and a
    worker only forks."""
    from .. import api, cli, netpool, process  # noqa: F401
    from ..backends import choose, host_for
    from ..bwrap import memo, monitor, parse  # noqa: F401
    from ..probe import probe

    netpool.disable()  # its refill thread would make the server multi-threaded; a one-shot CLI has no pool
    probe()
    name, _ = choose("auto")
    parse.parse_bwrap_args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "true"])
    host_for(name)  # the pool is disabled above: this only reads
    _warm_wire()
    memo.enable()  # the Specs of command lines seen, by their words (fastpath.py answers from them)
    import gc

    gc.collect()
    gc.freeze()  # a worker's collections never walk (and so copy) the server's objects
