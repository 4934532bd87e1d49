"""The CLI server's loop: answer clients with plans, keep a spare worker waiting for the others.

One process per user and installation, started by the first `sandbox run`
(or `bwrap`) that finds no server, holding the lock beside its socket; it
exits after `idle` seconds with no client. It stays single-threaded, so
that each worker is a plain fork of a process that has imported and warmed
everything a `run` needs (sandbox.cli's whole path, the host probe).

The server accepts each client, checks it (peer.py) and reads its request
without taking it (MSG_PEEK: the fds come as copies, and the request stays
queued). Then the one decision (fastpath.py): a command line a plan carries
is answered with that plan, which the client runs itself, and the server is
done with it; any other goes to the spare (spare.py), forked ahead, which
takes the connection, reads the request for real and becomes the client's
worker (worker.py), running the Python CLI for it and sending its exit
status; the server forks the next spare. The server keeps its copy of a
worker's connection to see the client go away (EPOLLRDHUP): it then kills
the worker's process group, as a caller killing the client's group would
have ended the Python CLI and every process of the sandbox still in that
group; and to send the status of a worker killed by a signal. Each client's
outcome, and why, is a line of the notes (`log`).

Data flow (one client; AF_UNIX SOCK_SEQPACKET, fds by SCM_RIGHTS):

  client (csrc/client/cliclient.c)        server (this loop)              spare / worker (fork)
  -------------------------        ------------------              ---------------------
  connect, request {argv, cwd,
   env, stdio + --args fds} ---->  peer.py: the peer's uid
                                   MSG_PEEK the request
                                   fastpath.py decides:
                    <---- PLAN {blob} (a plan carries it: the client
  runs the plan itself             runs it; the server is done)
                    <---- FALLBACK (nothing used yet: the client runs the command line directly)
                                   else: hand the connection ---->  takes the request,
                                   to the spare, fork the next      runs the Python CLI
  SIGNAL (one it received) ----------------------------------------> to the command
                    <----------------------------------------------- STATUS {returncode}
  the client dies: EPOLLRDHUP ---> kill the worker's group
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import threading
import time
from dataclasses import dataclass

from .._core import cliwire as wire
from .._core.fdpass import recv_fds, send_fds
from . import fastpath, spare
from .peer import Peer, Unverified, controlling_tty

IDLE_SECONDS = 120.0
# A spare taken by a client is replaced once its worker ends, or this long after: forking the
# next one while a worker runs competes with it for the CPUs, and a caller that runs one command
# after the other only needs the next spare when the command before has ended.
SPARE_DELAY = 0.05
LEARNED_MAX = 1 << 18  # a worker's "L" message: its command line, cwd and environment (a request is < 192 KiB)
REQUEST_TIMEOUT = 2.0  # the request follows the connection at once: a client silent longer is dropped
NOTES_MAX = 4 << 20  # bytes of notes kept: a server that serves for days starts them afresh past this


@dataclass(eq=False)
class _Worker:
    pid: int
    pidfd: int
    ctrl: socket.socket | None  # the server's end of its control socket, until it has said all
    conn: socket.socket | None = None  # the server's copy of its client's connection, once it has one


@dataclass(eq=False)
class _Client:
    """A connection whose request has not come yet, and what its peer's check found: checked as
    soon as it connects, while the client checks the server in turn before it sends."""

    conn: socket.socket
    peer: Peer
    deadline: float
    refused: Exception | None  # why the peer may not be served (Unverified, OSError), or None
    tty: bool  # the peer has a controlling terminal


class _Stale(Exception):
    """A client of another build: it runs directly, and this server makes way."""


class Server:
    """The listening socket named `name` in the directory of fd `directory` (ours, mode 0700:
    start.py checked it), serving clients whose executable is `client` (st_dev, st_ino,
    mtime_ns; None: any). `notes`: the fd (O_APPEND) to note each client's outcome in (-1:
    none); the server owns both fds from now on."""

    def __init__(self, directory: int, name: str, client: tuple[int, int, int] | None, idle: float = IDLE_SECONDS,
                 notes: int = -1) -> None:
        self.dir = directory
        self.name = name
        self.client = client
        self.idle = idle
        self.stale = False  # a client of another build came: stop serving
        self.workers: dict[int, _Worker] = {}  # by pidfd
        self.by_fd: dict[int, _Worker] = {}  # by ctrl or conn fd
        self.waiting: dict[int, _Client] = {}  # by conn fd
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
        self._notes = notes
        self._init = -1  # sandbox-init, for plans with a reaper (_init_fd)

    def listen(self) -> None:
        """Bind the socket (replacing a dead server's; the caller holds the lock) in the directory
        of our fd, never through its name (a directory swapped meanwhile is not ours), with mode
        0600 from the start (the umask at bind: no moment when another process may connect), and
        give it its name only once it listens (a client never finds it refusing connections)."""
        # a SIGTERM meanwhile (start.py's handler raises SystemExit) waits until close() can know the socket
        previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            self._listen()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        scratch = f".{self.name}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(scratch, dir_fd=self.dir)
        previous = os.umask(0o177)
        try:  # bind() creates the name and never follows a link there (EADDRINUSE)
            listener.bind(f"/proc/self/fd/{self.dir}/{scratch}")
        finally:
            os.umask(previous)
        try:
            listener.listen(128)
            # rename() replaces whatever had the name (a dead server's socket, a link: never what it names)
            os.rename(scratch, self.name, src_dir_fd=self.dir, dst_dir_fd=self.dir)
        except OSError:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(scratch, dir_fd=self.dir)
            raise
        st = os.stat(self.name, dir_fd=self.dir, follow_symlinks=False)
        self._ident = (st.st_dev, st.st_ino)
        self.listener = listener
        self.epoll.register(listener.fileno(), select.EPOLLIN)

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
        assert self.listener is not None
        while not self.stale and not self.terminating:
            now = time.monotonic()
            if self.spare is None and (not self.workers or now >= self.spare_due):
                self._fork_spare()
            self._drop_late(now)
            busy = len(self.workers) > (self.spare is not None) or bool(self.waiting)
            timeouts = [c.deadline - now for c in self.waiting.values()]
            if self.spare is None:
                timeouts.append(self.spare_due - now)
            if not busy:
                timeouts.append(self.last_client + self.idle - now)
            events = self.epoll.poll(max(0.0, min(timeouts)) if timeouts else None)
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
                if fd == self.listener.fileno():
                    self._accept()
                    continue
                client = self.waiting.get(fd)
                if client is not None:
                    self._request(client)
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
                st = os.stat(self.name, dir_fd=self.dir, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == self._ident:
                    os.unlink(self.name, dir_fd=self.dir)
            self.listener.close()
            self.listener = None
        if self.spare is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.spare.pid, signal.SIGKILL)
            os.waitpid(self.spare.pid, 0)
        for client in list(self.waiting.values()):
            self._forget(client)
            client.peer.close()
        for fd in (self._notes, self._init, self.dir):
            if fd >= 0:
                os.close(fd)
        self._notes = self._init = self.dir = -1
        self.epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------ clients

    def note(self, text: str) -> None:
        """A line of the notes: each client's outcome, and why."""
        if self._notes >= 0:
            with contextlib.suppress(OSError):
                if os.write(self._notes, text.encode(errors="backslashreplace") + b"\n") and \
                        os.lseek(self._notes, 0, os.SEEK_CUR) > NOTES_MAX:
                    os.ftruncate(self._notes, 0)  # appends (the server's and its workers') go on from 0

    def _accept(self) -> None:
        assert self.listener is not None
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. EMFILE: the client waits in the backlog, or runs directly
                return
            self.last_client = time.monotonic()
            try:
                peer = Peer.of(conn)
            except (Unverified, OSError) as exc:
                self.note(f"a client: runs directly: {exc}")
                self._answer_fallback(conn)
                continue
            refused: Exception | None = None
            tty = False
            try:
                peer.check(allow_tty=True)
                tty = controlling_tty(peer.pid) != 0
            except Exception as exc:  # Unverified, OSError, or a /proc entry read otherwise than expected
                refused = exc
            # its blocking mode stays as accept() left it: a worker shares the open file (the server's
            # own reads and writes say MSG_DONTWAIT)
            client = _Client(conn, peer, self.last_client + REQUEST_TIMEOUT, refused, tty)
            self.waiting[conn.fileno()] = client
            self.epoll.register(conn.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
            # the client checked the server while the server checked it: its request may be here
            # already (else it stays waiting, and the loop serves it when it comes)
            self._request(client)

    def _forget(self, client: _Client) -> None:
        """The client is no longer waiting (its connection stays open, and its pidfd)."""
        fd = client.conn.fileno()
        self.epoll.unregister(fd)
        del self.waiting[fd]

    def _drop_late(self, now: float) -> None:
        for client in [c for c in self.waiting.values() if c.deadline <= now]:
            self._forget(client)
            client.peer.close()
            self.note(f"pid {client.peer.pid}: no request came")
            self._close(client.conn)

    def _close(self, conn: socket.socket) -> None:
        self._drain(conn)
        self.closed.add(conn.fileno())
        conn.close()

    def _answer_fallback(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.send(wire.frame(wire.FALLBACK), socket.MSG_DONTWAIT)
        self._close(conn)

    def _request(self, client: _Client) -> None:
        """The client's request came (or the client went): answer it, or hand it to a worker."""
        try:  # a look only: the request stays queued for a worker, its fds come as copies
            data, fds, flags = recv_fds(client.conn, wire.MAX_REQUEST + 1, wire.MAX_FDS,
                                             socket.MSG_PEEK | socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds, flags = b"", [], 0
        self._forget(client)
        pid = client.peer.pid
        if not data:
            client.peer.close()
            self._close(client.conn)
            return
        try:
            fds = self._answer(client, data, fds, flags)
        except Exception as exc:  # a bug, or a request made to provoke one: this client runs directly, no other
            self.note(f"pid {pid}: runs directly: the server failed on its request ({exc!r})")
            self._answer_fallback(client.conn)
        finally:
            client.peer.close()
            for fd in fds:
                os.close(fd)

    def _answer(self, client: _Client, data: bytes, fds: list[int], flags: int) -> list[int]:
        """Answer the request `data` (with the server's copies of its fds, `fds`); the fds left to close."""
        pid = client.peer.pid
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise wire.WireError("a request larger than SBX_CLI_MAX_REQUEST, or with too many fds")
            if client.refused is not None:
                raise client.refused
            if wire.announced_fds(data) != len(fds):  # before any lookup: a request's fds are indexed by it
                raise wire.WireError(f"{len(fds)} fds came, {wire.announced_fds(data)} were announced")
            found = fastpath.lookup(data, fds)  # a request seen before (checked then, and as for its bytes, now)
            if found is None:
                request = self._check(data, fds)
                try:
                    found = fastpath.decide(data, request, fds)
                except (fastpath.Worker, OSError):
                    raise
                except Exception as exc:  # a bug of the planning's: the Python CLI still says what it means
                    raise fastpath.Worker(f"the server could not plan it ({exc!r})") from None
            client.peer.confirm()  # alive still: the pid checked at the connection is still its
            answer, files = found
            self._send_plan(client.conn, answer)
            with contextlib.suppress(OSError):  # the plan is on its way: what is left is bookkeeping
                fastpath.take(files)
            self.note(f"pid {pid}: runs the plan itself")
            self._close(client.conn)
        except fastpath.Worker as why:
            try:
                if client.tty:  # a worker's sandbox would not be in the client's session
                    raise Unverified(f"the client has a controlling terminal ({why})") from None
                client.peer.check_for_worker()  # the spare checks it again, and asks for the proof
            except Unverified as exc:
                self.note(f"pid {pid}: runs directly: {exc}")
                self._answer_fallback(client.conn)
                return fds
            self.note(f"pid {pid}: needs a worker: {why}")
            self._to_worker(client.conn, fds)
            return []
        except _Stale as exc:
            self.note(f"pid {pid}: runs directly: {exc}")
            self._answer_fallback(client.conn)
            self.stale = True
        except (Unverified, wire.WireError, OSError) as exc:
            self.note(f"pid {pid}: runs directly: {exc}")
            self._answer_fallback(client.conn)
        return fds

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        """Take what the client sent (its request, a signal frame) before closing: a unix socket
        closed with data unread makes the peer's next read fail (ECONNRESET), its answer unread.
        A message is taken whole by a read of one byte, and its fds, with no room made for them,
        are dropped by the kernel, never installed here."""
        while True:
            try:
                data, _, _ = recv_fds(conn, 1, 0, socket.MSG_DONTWAIT)
            except OSError:
                return
            if not data:
                return

    def _check(self, data: bytes, fds: list[int]) -> wire.Request:
        """The request, if what its bytes say may be served here; else Unverified, WireError or
        _Stale. (The peer was checked as it connected.)"""
        request = wire.parse_request(data)
        if len(fds) != len(request.fd_numbers):
            raise wire.WireError(f"{len(fds)} fds came, {len(request.fd_numbers)} were announced")
        if self.client is not None and request.exe != self.client:
            raise _Stale("the client is not this server's build")
        spare.same_interpreter_settings(request.environ)
        return request

    def _send_plan(self, conn: socket.socket, answer: fastpath.Answer) -> None:
        """Send the answer (with sandbox-init's fd when the plan has a reaper); Worker if it cannot go."""
        try:
            send_fds(conn, answer.data, [self._init_fd()] if answer.reaper else [], socket.MSG_DONTWAIT)
        except OSError as exc:
            if exc.errno != errno.EMSGSIZE:
                raise
            raise fastpath.Worker(f"its plan of {len(answer.data)} bytes does not fit the socket") from None

    def _init_fd(self) -> int:
        """sandbox-init (O_PATH), opened once: the server's own, not the native backend's cached
        one (a worker, forked from the server, closes every fd it did not get from its client)."""
        if self._init < 0:
            from .._core.binding import INIT_PATH  # lazy: the server runs without the C core (bwrap only)

            self._init = os.open(INIT_PATH, os.O_PATH | os.O_CLOEXEC)
        return self._init

    def _to_worker(self, conn: socket.socket, peeked: list[int]) -> None:
        """Hand the connection to the spare, which becomes the client's worker."""
        for fd in peeked:  # the spare takes the request itself: these copies must not outlive this
            os.close(fd)
        peeked.clear()
        if self.spare is None:
            self._fork_spare()
        w = self.spare
        assert w is not None and w.ctrl is not None
        try:
            send_fds(w.ctrl, b"C", [conn.fileno()])
        except OSError:
            self._answer_fallback(conn)
            return
        w.conn = conn
        self.by_fd[conn.fileno()] = w
        self.epoll.register(conn.fileno(), select.EPOLLRDHUP)
        self.spare = None  # the loop forks the next one (see SPARE_DELAY)
        self.spare_due = time.monotonic() + SPARE_DELAY

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
            spare.run(self.listener, theirs, self.client, self._notes, self.learned)  # never returns
        theirs.close()
        w = _Worker(pid=pid, pidfd=os.pidfd_open(pid), ctrl=ours)
        self.workers[w.pidfd] = w
        self.by_fd[ours.fileno()] = w
        self.epoll.register(w.pidfd, select.EPOLLIN)
        self.epoll.register(ours.fileno(), select.EPOLLIN)
        self.spare = w

    def _control(self, w: _Worker) -> None:
        """A message from a worker: "S" (a stale client), "L" and the command line it parsed
        (for the next spare), or its end."""
        assert w.ctrl is not None
        try:
            msg, fds, _ = recv_fds(w.ctrl, LEARNED_MAX, 1, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return
        except OSError:
            msg, fds = b"", []
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
