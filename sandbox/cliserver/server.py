"""The CLI server's loop: keep a spare worker waiting, watch the clients, report deaths.

One process per user and installation, started by the first `sandbox run`
(or `bwrap`) that finds no server, holding the lock beside its socket; it
exits after `idle` seconds with no client. It stays single-threaded, so
that each worker is a plain fork of a process that has imported and warmed
everything a `run` needs (sandbox.cli's whole path, the host probe).

The server itself never accepts: a spare (spare.py), forked ahead, does,
and passes the server a copy of the connection, upon which the server forks
the next spare. The spare checks the client and becomes its worker
(worker.py), which sends the client its exit status itself. The server
keeps its copy of the connection to see the client go away (EPOLLRDHUP):
it then kills the worker's process group, as a caller killing the client's
group would have ended the Python CLI and every process of the sandbox
still in that group; and to send the status of a worker killed by a signal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass

from . import spare, wire

IDLE_SECONDS = 120.0
# A spare taken by a client is replaced once its worker ends, or this long after: forking the
# next one while a worker runs competes with it for the CPUs, and a caller that runs one command
# after the other only needs the next spare when the command before has ended.
SPARE_DELAY = 0.05
LEARNED_MAX = 1 << 18  # a worker's "L" message: its command line, cwd and environment (a request is < 192 KiB)


@dataclass(eq=False)
class _Worker:
    pid: int
    pidfd: int
    ctrl: socket.socket | None  # the server's end of its control socket, until it has said all
    conn: socket.socket | None = None  # the server's copy of its client's connection, once accepted


class Server:
    """The listening socket at `path` (its directory must be ours, mode 0700),
    serving clients whose executable is `client` (st_dev, st_ino, mtime_ns;
    None: any). `log`: a file to note each client's outcome in ("": none)."""

    def __init__(self, path: str, client: tuple[int, int, int] | None, idle: float = IDLE_SECONDS,
                 log: str = "") -> None:
        self.path = path
        self.client = client
        self.idle = idle
        self.log = log
        self.stale = False  # a client of another build came: stop serving
        self.workers: dict[int, _Worker] = {}  # by pidfd
        self.by_fd: dict[int, _Worker] = {}  # by ctrl or conn fd
        self.spare: _Worker | None = None
        self.spare_due = 0.0  # when to fork the next spare while workers run
        self.closed: set[int] = set()  # fds closed while handling the current batch of events
        self.terminating = False  # SIGTERM came: stop serving
        # SIGTERM wakes the loop through this pipe (signal.set_wakeup_fd), whatever it was doing
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.listener: socket.socket | None = None
        self.epoll = select.epoll()
        self.epoll.register(self._wake_r, select.EPOLLIN)
        self.last_client = time.monotonic()
        self._ident: tuple[int, int] | None = None
        self.learned = b""  # the last command line a worker parsed, for the next spare (rehearse.py)

    def listen(self) -> None:
        """Bind the socket (replacing a dead server's; the caller holds the lock)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        listener.bind(self.path)
        os.chmod(self.path, 0o600)
        listener.listen(128)
        st = os.stat(self.path)
        self._ident = (st.st_dev, st.st_ino)
        self.listener = listener

    def serve_forever(self) -> None:
        """Serve until idle (or stale) with no worker but the spare left."""
        previous = signal.signal(signal.SIGTERM, self._terminate)
        old_wakeup = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        try:
            self._loop()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            signal.signal(signal.SIGTERM, previous)

    def _terminate(self, signum: int, frame: object) -> None:
        self.terminating = True

    def _loop(self) -> None:
        while not self.stale and not self.terminating:
            now = time.monotonic()
            if self.spare is None and (not self.workers or now >= self.spare_due):
                self._fork_spare()
            busy = len(self.workers) > (self.spare is not None)
            if self.spare is None:
                timeout: float | None = max(0.0, self.spare_due - now)
            else:
                timeout = None if busy else max(0.0, self.last_client + self.idle - now)
            events = self.epoll.poll(timeout)
            if not events and not busy and time.monotonic() >= self.last_client + self.idle:
                return
            self.closed.clear()
            for fd, _ in events:
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self._wake_r, 64):
                            pass
                    continue
                if fd in self.closed:  # closed by an earlier event of this batch: its number may be reused
                    continue
                w = self.workers.get(fd)
                if w is not None:
                    self._reap(w)
                    continue
                w = self.by_fd.get(fd)
                if w is not None and w.ctrl is not None and fd == w.ctrl.fileno():
                    self._control(w)
                elif w is not None:
                    self._client_gone(w)

    def close(self) -> None:
        """Stop listening (the socket is removed if it is still ours), end the spare."""
        if self.listener is not None:
            with contextlib.suppress(OSError):
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self._ident:
                    os.unlink(self.path)
            self.listener.close()
            self.listener = None
        if self.spare is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.spare.pid, signal.SIGKILL)
            os.waitpid(self.spare.pid, 0)
        self.epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------ workers

    def _fork_spare(self) -> None:
        assert self.listener is not None
        if threading.active_count() != 1:  # a fork copies one thread: whatever the others held stays held
            raise RuntimeError("the CLI server is not single-threaded")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        ours.setblocking(False)
        pid = os.fork()
        if pid == 0:
            ours.close()
            spare.run(self.listener, theirs, self.client, self.log, self.learned)
        theirs.close()
        w = _Worker(pid=pid, pidfd=os.pidfd_open(pid), ctrl=ours)
        self.workers[w.pidfd] = w
        self.by_fd[ours.fileno()] = w
        self.epoll.register(w.pidfd, select.EPOLLIN)
        self.epoll.register(ours.fileno(), select.EPOLLIN)
        self.spare = w

    def _control(self, w: _Worker) -> None:
        """A message from a worker: "A" with its connection (it accepted), "S" (a stale client),
    "L" and the command line it parsed (for the next spare), or its end."""
        assert w.ctrl is not None
        try:
            msg, fds, _, _ = socket.recv_fds(w.ctrl, LEARNED_MAX, 1, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return
        except OSError:
            msg, fds = b"", []
        if msg == b"A" and fds and w.conn is None:
            self.last_client = time.monotonic()
            w.conn = socket.socket(fileno=fds[0])
            self.by_fd[w.conn.fileno()] = w
            self.epoll.register(w.conn.fileno(), select.EPOLLRDHUP)
            if self.spare is w:
                self.spare = None  # the loop forks the next one (see SPARE_DELAY)
                self.spare_due = time.monotonic() + SPARE_DELAY
            return
        for fd in fds:
            os.close(fd)
        if msg[:1] == b"L":
            self.learned = msg[1:]
            return
        if msg == b"S":
            self.stale = True
        if not msg or msg == b"S":
            self._drop_ctrl(w)

    def _drop_ctrl(self, w: _Worker) -> None:
        if w.ctrl is not None:
            self.epoll.unregister(w.ctrl.fileno())
            del self.by_fd[w.ctrl.fileno()]
            self.closed.add(w.ctrl.fileno())
            w.ctrl.close()
            w.ctrl = None

    def _client_gone(self, w: _Worker) -> None:
        assert w.conn is not None
        self.epoll.unregister(w.conn.fileno())
        del self.by_fd[w.conn.fileno()]
        self.closed.add(w.conn.fileno())
        w.conn.close()
        w.conn = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.pid, signal.SIGKILL)

    def _reap(self, w: _Worker) -> None:
        _, status = os.waitpid(w.pid, 0)
        self._drop_ctrl(w)
        if w.conn is not None:
            if os.WIFSIGNALED(status):  # a worker that exits sent its status itself
                with contextlib.suppress(OSError):
                    w.conn.send(wire.frame(wire.STATUS, -os.WTERMSIG(status)))
            self.epoll.unregister(w.conn.fileno())
            del self.by_fd[w.conn.fileno()]
            self.closed.add(w.conn.fileno())
            w.conn.close()
        self.epoll.unregister(w.pidfd)
        del self.workers[w.pidfd]
        self.closed.add(w.pidfd)
        os.close(w.pidfd)
        if self.spare is w:
            self.spare = None


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
    """Import and compute once what each `run` needs, so that a worker only forks."""
    from .. import api, cli, netpool, process  # noqa: F401
    from ..backends import choose, host_for
    from ..bwrap import monitor, parse  # noqa: F401
    from ..probe import probe

    netpool.disable()  # its refill thread would make the server multi-threaded; a one-shot CLI has no pool
    probe()
    name, _ = choose("auto")
    parse.parse_bwrap_args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "true"])
    host_for(name)  # the pool is disabled above: this only reads
    _warm_wire()
    import gc

    gc.collect()
    gc.freeze()  # a worker's collections never walk (and so copy) the server's objects
