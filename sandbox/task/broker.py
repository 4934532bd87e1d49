"""The broker: the trusted side of nested task sandboxes.

Untrusted code in a task sandbox cannot make a sandbox of its own (the
default seccomp policy denies new user namespaces, and with them every
mount). So each confined task sandbox gets a broker in the process that
started it, listening on a SOCK_SEQPACKET socket bound inside that sandbox
at the path SANDBOX_TASK_BROKER names (broker_socket.py: no path on the host
once the sandbox is up, no abstract name). Every process of the sandbox can
connect, whatever fds its parents closed; the kernel attaches each sender's
pid, uid and a pidfd of it to each message (SO_PASSCRED, SO_PASSPIDFD), so a
request from any other user, or from a process that is not in this broker's
sandbox (it must descend from the sandbox's first process, each link of the
chain read while a pidfd holds its process: _core/peer.py), is refused even
if a connection was handed there, and a sender that ended before its
request was read is refused too (its pid may be another process's by then).

What the broker reads is untrusted: each connection has its own thread,
a message is bounded in size and depth before it is parsed (wire.py), and
any error of one request is answered on its connection with a refusal
naming the problem; the serving thread only accepts, and outlives whatever
a request does. When the sandbox's first process ends (a pidfd), the broker
stops at once: what was queued for it is dropped with the listening socket,
and every nested sandbox is killed, so nothing of the sandbox's (its stdout,
say) outlives it in a child that a requester kept alive.

A request (sandbox.task.nested) carries the inner description in the
sandbox's own paths, the command, the requester's environment and its three
stdio fds; the rest of the conversation goes over its connection. The
broker translates every path back to the host's (through the parent's
binds, then resolving links on the host, so a link planted in a writable
grant cannot lead a bind elsewhere; and each source checked is held open
and bound from that fd, so one swapped for a link after the check cannot
either), checks `narrowed(parent, child)` (a
SpecError naming the field that widens goes back to the requester), refuses
a loopback URL in the environment that would forward a port the parent does
not have, and starts the child with task.spawn: a sibling of the parent,
confined on the parent's backend, with its own broker (so it can narrow
again). Then it relays signals (and kill) in, the exit status and the
record out. When the requester goes away (its connection closes: it died,
or the whole outer sandbox did), the child is killed; when the parent
sandbox ends, every child is.

Data flow (one nested sandbox; SOCK_SEQPACKET, the sender's credentials and pidfd on every message):

  parent task sandbox                  broker (the caller's process)         child sandbox
  -------------------                  -----------------------------         -------------
  task.spawn inside --- request {inner ---> credentials checked, paths
   (nested.py)          description,        translated to the host's,
                        argv, env} + 3      narrowed(parent, child) ---SpecError back
                        stdio fds           task.spawn on the parent's
                                            backend ------------------------> starts, stdio
                   <--- started {pid} ---                                    straight to the
                   ---- signal / kill ----> relayed ------------------------> requester's fds
                   <--- exit status, record <------------------------------- ends
  connection closed ----------------------> child killed
  parent's pid 1 ends (pidfd) ------------> broker stops, every child killed

What a nested sandbox cannot take from its parent: a path it does not show
(or write where it only reads), a network, port, socket or proxy host it
lacks, an environment pattern beyond its allowlist, the framework package
when covered. What it always inherits: the hidden modules (all of them,
SANDBOX_HIDE's too), the probes, the smaller limits, the records directory,
`required` enforcement. Limits bound each sandbox on its own: a child's CPU
time is not counted against its parent's.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import stat
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from .._core.peer import Peer, Unverified
from ..errors import SandboxError, SpecError, UnavailableError
from ..plan import resolve_env
from ..spec import Spec
from . import wire
from .broker_socket import BrokerSocket
from .compile import Compiled, env_ports
from .description import Bind, Layout, Sandbox
from .facts import HIDE_ENV
from .narrow import narrowed
from .translate import Translator

MAX_CHILDREN = 64  # nested sandboxes running at once per broker: more is refused, not queued
MAX_PENDING = 64  # connections whose request is not answered yet: more are refused at once
REQUEST_TIMEOUT = 10.0  # seconds a connection has to send its request

if TYPE_CHECKING:
    from .run import TaskProcess


class StartHere(Protocol):
    """How the broker starts a sandbox in this process: sandbox.task.run.start_here, handed in by its caller
    (run.py, which makes a broker for every sandbox it starts), so that the broker never imports run.py."""

    def __call__(self, args: list[str], sb: Sandbox, backend: str, env_in: dict[str, str], popen: dict[str, Any],
                 pinned: Mapping[str, str] | None = None) -> TaskProcess:
        ...


def pin(field: str, path: str) -> int:
    """An O_PATH fd of `path`, reached from / one component at a time without
    following a link; SpecError naming `field` if a link is met (the path was
    resolved before: one now is a swap) or the path does not exist."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for comp in (c for c in path.split("/") if c):
            nfd = os.open(comp, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise SpecError(field, path, "leads through a link (it changed after it was checked)")
    except OSError as exc:
        os.close(fd)
        raise SpecError(field, path, f"cannot be shown: {exc.strerror}") from None
    except SpecError:
        os.close(fd)
        raise
    return fd


class Broker:
    """The broker of one task sandbox (described by `sb`, compiled as `compiled`, on `backend`),
    listening on `listening` (made here if not given): bind its `host_path` into the sandbox at
    broker_socket.INSIDE, start the sandbox, then attach() its first process."""

    def __init__(self, sb: Sandbox, compiled: Compiled, backend: str, listening: BrokerSocket | None = None, *,
                 start: StartHere) -> None:
        self.parent, self.compiled, self.backend = sb, compiled, backend
        self._start_here = start
        self._socket = listening if listening is not None else BrokerSocket()
        self._socket.sock.setblocking(False)
        self._pid = 0
        self._pidfd = -1
        self._children: list[TaskProcess] = []
        self._starting = 0
        self._pending = 0
        self._lock = threading.Lock()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._serve, name="sandbox-task-broker", daemon=True)
        # inside -> host, the most specific target first
        self._reverse = Translator([(b.target, b.source) for b in compiled.binds])
        self._checking = self._checking_parent()

    @property
    def host_path(self) -> str:
        """Where the socket is on the host until attach(): what is bound into the sandbox."""
        return self._socket.path

    def attach(self, pid: int) -> None:
        """The sandbox started as `pid` (requests must come from it or its descendants;
        its end is the broker's end): remove the host path and serve."""
        self._pid = pid
        with contextlib.suppress(OSError):  # gone already: the first poll then sees no pidfd, and serves until close
            self._pidfd = os.pidfd_open(pid)
        self._socket.unlink()
        self._thread.start()

    def close(self) -> None:
        """Stop serving and kill every child still running."""
        self._stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._socket.close()
        for fd in (self._wake_r, self._wake_w, self._pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wake_r = self._wake_w = self._pidfd = -1

    def _stop(self) -> None:
        """No more requests; every child killed (from any thread, once)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            children = list(self._children)
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        for child in children:
            with contextlib.suppress(OSError):
                child.kill()

    # ------------------------------------------------------------ serving

    def _serve(self) -> None:
        """Accept connections until closed, or until the sandbox ends: then what it
        queued is dropped (the listening socket closed with what it carried) and
        every nested sandbox killed, whatever still holds their sockets or its pipes."""
        try:
            while not self._closed:
                try:
                    if self._sandbox_ended():
                        self._stop()
                        return
                    self._accept()
                except Exception:  # noqa: BLE001 (out of fds, say: the next poll tries again; never die)
                    time.sleep(0.05)
        finally:
            self._socket.close()

    def _sandbox_ended(self) -> bool:
        """Wait for a connection, close() or the end of the sandbox (True)."""
        poll = select.poll()
        poll.register(self._socket.sock, select.POLLIN)
        poll.register(self._wake_r, select.POLLIN)
        if self._pidfd >= 0:
            poll.register(self._pidfd, select.POLLIN)
        return any(fd == self._pidfd and fd >= 0 for fd, _ in poll.poll())

    def _accept(self) -> None:
        try:
            conn, _ = self._socket.sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        with self._lock:
            busy = self._closed or self._pending >= MAX_PENDING
            if not busy:
                self._pending += 1
        if busy:
            why = UnavailableError(f"refused by the sandbox.task broker: {MAX_PENDING} requests of this sandbox "
                                   "are waiting already, or the sandbox has ended")
            conn.settimeout(1.0)  # this thread accepts for everyone: it never waits on one requester
            self._refuse(conn, why)
            conn.close()
            return
        threading.Thread(target=self._conversation, args=(conn,), name="sandbox-task-broker-request",
                         daemon=True).start()

    def refusal(self, sender: Peer | None) -> str | None:
        """Why a message from `sender` is refused, or None: it must be a process of our uid that
        descends from this sandbox's first process, confirmed through its pidfd."""
        if sender is None:
            return "the request carries no credentials"
        try:
            sender.check_owner()
            if not self._pid or not sender.descends_from(self._pid, self._pidfd):
                return f"pid {sender.pid} is not a process of this broker's sandbox"
        except Unverified as exc:
            return str(exc)
        return None

    def _conversation(self, conn: socket.socket) -> None:
        """One connection: its request, answered; if a child started, relay until it ends.
        This thread lives as long as the child (whose parent-death signal is this thread's end)."""
        proc = None
        try:
            conn.settimeout(REQUEST_TIMEOUT)
            proc = self._answer(conn)
        except Exception as exc:  # noqa: BLE001 (whatever one request does, the broker answers and serves on)
            self._refuse(conn, exc)
        finally:
            with self._lock:
                self._pending -= 1
        if proc is None:
            conn.close()
            return
        conn.settimeout(None)
        self._relay(conn, proc)

    def _answer(self, conn: socket.socket) -> TaskProcess | None:
        """Read the request on `conn` and start its child; a refusal sent (None) if it is refused."""
        try:
            msg, fds, sender = wire.recv(conn)
        except wire.MessageError as exc:
            raise SpecError("request", "(the message)", f"is refused: {exc}") from None
        except OSError:
            return None  # gone before asking, or said nothing in time
        try:
            if msg is None:
                return None
            why = self.refusal(sender)
            if sender is not None:
                sender.close()  # judged: its pidfd is not held while the child starts
            if len(fds) != 3:
                raise SpecError("request", f"{len(fds)} fds", "must carry the three stdio fds of the command")
            if why is not None:
                raise UnavailableError(f"refused by the sandbox.task broker: {why}")
            self._reserve()
            try:
                proc = self._start(msg, fds)
            except BaseException:
                with self._lock:
                    self._starting -= 1
                raise
        finally:
            for fd in fds:
                os.close(fd)
            if sender is not None:
                sender.close()
        with self._lock:
            late = self._closed
            self._starting -= 1
            self._children.append(proc)
        if late:
            proc.kill()
        return proc

    def _reserve(self) -> None:
        with self._lock:
            if self._closed:
                raise UnavailableError("refused by the sandbox.task broker: its sandbox has ended")
            if len(self._children) + self._starting >= MAX_CHILDREN:
                raise UnavailableError(f"refused by the sandbox.task broker: {MAX_CHILDREN} nested sandboxes "
                                       "of this sandbox are running already")
            self._starting += 1

    @staticmethod
    def _refuse(conn: socket.socket, exc: BaseException) -> None:
        """Answer `exc` on `conn`: as itself if it is ours, else as a refusal naming it."""
        if not isinstance(exc, (SandboxError, OSError)):
            exc = SpecError("request", "(the message)", f"is refused: {type(exc).__name__}: {exc}"[:500])
        with contextlib.suppress(OSError):
            wire.send(conn, wire.error_message(exc))

    def _relay(self, chan: socket.socket, proc: TaskProcess) -> None:
        def control() -> None:
            while True:
                try:
                    msg, fds, sender = wire.recv(chan)
                except wire.MessageError:
                    continue
                except OSError:
                    msg, fds, sender = None, [], None
                if sender is not None:
                    sender.close()
                for fd in fds:
                    os.close(fd)
                if msg is None:  # the requester is gone
                    with contextlib.suppress(OSError):
                        proc.kill()
                    return
                with contextlib.suppress(Exception):
                    if msg.get("kill"):
                        proc.kill()
                    elif isinstance(msg.get("signal"), int):
                        proc.send_signal(msg["signal"])  # its handle knows how it reaches the command

        try:
            wire.send(chan, {"pid": proc.pid, "record": self.inside(proc.record)})
        except OSError:
            proc.kill()
        threading.Thread(target=control, name="sandbox-task-broker-control", daemon=True).start()
        rc = proc.wait()
        with self._lock:
            self._children.remove(proc)
        with contextlib.suppress(OSError):
            wire.send(chan, {"exit": rc, "record": self.inside(proc.record),
                             "record_path": self.inside(proc.record_path)})
        with contextlib.suppress(OSError):
            chan.shutdown(socket.SHUT_RDWR)
        chan.close()

    def inside(self, value: Any) -> Any:
        """`value` (a record, JSON-ready) with host paths as the parent sandbox shows them:
        what the requester is told names no host path it could not name itself."""
        if isinstance(value, str):
            return self.compiled.translator.word(value)
        if isinstance(value, dict):
            return {k: self.inside(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.inside(v) for v in value]
        return value

    # ------------------------------------------------------------ one request

    def _start(self, msg: Mapping[str, Any], stdio: list[int]) -> TaskProcess:
        argv, environ = msg.get("argv"), msg.get("environ")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise SpecError("argv", argv, "must be a non-empty list of strings")
        if not isinstance(environ, dict) or not all(isinstance(v, str) for v in environ.values()):
            raise SpecError("environ", "...", "must map names to strings")
        if msg.get("kind") != "task":
            raise SpecError("kind", msg.get("kind"), "this broker starts task descriptions only")
        child = Sandbox.from_dict(msg.get("sandbox") or {})
        host_env = self._reverse.env(environ)
        sb = narrowed(self._checking, self.host_view(child)).replace(enforce="required")
        self._check_env_ports(sb, host_env)
        # Each source checked is held open and bound from that fd: a path the
        # sandbox can write in, swapped for a link after the check, changes nothing.
        pins: dict[str, int] = {}
        try:
            for field, paths in (("read", sb.read), ("write", sb.write), ("binds", [b.source for b in sb.binds])):
                for path in paths:
                    if path not in pins:
                        pins[path] = pin(field, path)
            popen = {"stdin": stdio[0], "stdout": stdio[1], "stderr": stdio[2], "pass_fds": ()}
            return self._start_here(self._reverse.argv(argv), sb, self.backend, host_env, popen,
                              {path: f"/proc/self/fd/{fd}" for path, fd in pins.items()})
        finally:
            for fd in pins.values():
                os.close(fd)

    def host_view(self, child: Sandbox) -> Sandbox:
        """`child` (in the parent sandbox's paths) in host paths: translated
        back through the parent's binds, then with every link resolved on the host."""
        path, real = self._reverse.path, os.path.realpath
        socks = dict(self.parent.sockets)
        return child.replace(
            read=[real(path(p)) for p in child.read], write=[real(path(p)) for p in child.write],
            binds=[Bind(real(path(b.source)), b.target, b.writable) for b in child.binds],
            layout=None if child.layout is None else Layout(path(child.layout.outside), child.layout.inside),
            chdir=None if child.chdir is None else path(child.chdir),
            sockets={port: socks.get(port, path(p)) for port, p in child.sockets}, records=None)

    def _checking_parent(self) -> Sandbox:
        """The parent as narrowed() is to see it: grants with links resolved,
        every port it forwards, every module it hides."""
        real = os.path.realpath
        p = self.parent
        ports = sorted(port for port, target in self.compiled.forward if isinstance(target, int))
        inherited = self.compiled.spec.env_dict.get(HIDE_ENV, "")
        hide = [*p.hide, *(n for n in inherited.split(",") if n)]
        return p.replace(read=[real(x) for x in p.read], write=[real(x) for x in p.write],
                         binds=[Bind(real(b.source), b.target, b.writable) for b in p.binds],
                         ports=ports, hide=list(dict.fromkeys(hide)))

    def _check_env_ports(self, sb: Sandbox, environ: Mapping[str, str]) -> None:
        allowed = resolve_env(Spec(env_inherit=sb.env_allow), environ) if sb.env_allow else {}
        have = {port for port, _ in self.compiled.forward}
        extra = [port for port in env_ports({**allowed, **sb.env_dict}) if port not in have]
        if extra:
            raise SpecError("env", extra[0], "a loopback URL of the environment names a port the parent "
                            "sandbox does not forward: a nested sandbox can only narrow")
