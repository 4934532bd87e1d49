"""The harness process's side of sandbox-launch's handoff (csrc/client/handoff.h; its wire: cliwire.h).

A harness that execs `sandbox-launch` per command pays for a whole sandbox
setup every time. When the harness process holds a warm `sandbox.Template`
for the command's Spec, the launcher instead connects to that template's
socket and hands over its request (argv, its stdio fds by SCM_RIGHTS, its
cwd and environment); one thread of this process starts the command through
the Template and relays back only the exit status, while passing on the
signals the launcher receives. The launcher's death (the harness's timeout
kill) kills the sandbox: its connection closes and the sandbox is killed.

Everything runs on one daemon thread (`Handoff`): it builds the Templates
(so their die-with-parent is tied to a thread that lives as long as the
process), accepts connections and waits for sandboxes, with one selector.

Only the launches this process prepared are served. Same uid, or being a
child of this process, is not enough: a sandbox this process starts may run
as the same uid, as its child (`as_pid_1`), and see the socket's directory.
So every `route()` (one prepared command line) issues a ticket, a number
and 32 random bytes, good for one request on one template's socket; the
launcher gets it in its environment (ENV: "ID:SECRET:PATH"), takes it out
of the environment before anything else (the command never sees it) and
sends it in its request; the secret is compared in constant time, and a
ticket this process does not hold (used, evicted, made up) is answered
FALLBACK, so the launcher sets the sandbox up itself. Each template's socket
has a random name, in a directory of mode 0300 (its owner can bind in it but
not list it): only the ticket tells where it is, and nothing of it is on
the launcher's command line (which every process that can see the launcher
reads). A connection from a process that is not a child of this process is
closed unanswered, and the launcher checks in turn that the socket's server
is its parent.
"""

from __future__ import annotations

import atexit
import contextlib
import hmac
import os
import secrets
import selectors
import socket
import stat
import tempfile
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from .._core import cliwire as wire
from .._core.fdpass import recv_fds
from .._core.peer import Peer, Unverified
from ..errors import ExecError, ExecNotFoundError, SandboxError
from ..process import SandboxProcess
from ..spec import Spec
from ..template import Template

# The wire is the CLI client's (csrc/client/cliwire.h: struct sbx_cli_request with the launch's ticket, struct
# sbx_cli_frame), read and written by field name through _core/cliwire.py: never retyped here.
SECRET_SIZE = wire.SECRET_SIZE
STATUS, ERROR, FALLBACK, SIGNAL = wire.STATUS, wire.ERROR, wire.FALLBACK, wire.SIGNAL
ENV = "SANDBOX_HANDOFF"  # the launcher's ticket: "ID:SECRET:PATH"
MAX_REQUEST = 1 << 20  # the launcher falls back on its own beyond what the socket takes
MAX_TICKETS = 4096  # tickets issued and not yet used; beyond, the oldest is dropped (its launch falls back)
MAX_PENDING = 64  # accepted connections whose request has not come yet; beyond, a new one falls back

__all__ = ["Handoff", "close", "handoff"]


@dataclass
class _Warm:
    """One warm template and its listening socket."""

    template: Template
    listener: socket.socket
    path: str  # what the launcher connects to (it checks that its parent listens there)
    name: str  # the socket's name in the directory
    prefix: list[str]
    env: dict[str, str]
    cwd: str
    stale: bool = False


@dataclass(eq=False)
class _Ticket:
    """One prepared launch: the secret its request must carry, on the socket of `warm`."""

    secret: bytes = field(repr=False)
    warm: _Warm


@dataclass(eq=False)
class _Running:
    """One handed-off command: its launcher's connection and its sandbox."""

    conn: socket.socket
    proc: SandboxProcess
    done: bool = False  # its status has been sent


class Handoff:
    """The thread that serves sandbox-launch's handoffs for this process's warm Templates."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="sandbox-handoff-")
        self._dir_fd = _own_dir(self._dir)
        os.fchmod(self._dir_fd, 0o300)  # its owner binds in it, nobody lists it: a socket's name is a secret
        self._lock = threading.Lock()
        self._tickets: dict[int, _Ticket] = {}  # issued by route(), oldest first; guarded by _lock
        self._next_ticket = 0
        self._pending_requests = 0
        self._warm: dict[Hashable, _Warm] = {}
        self._pending: list[Callable[[], None]] = []
        self._warming: set[Hashable] = set()
        self._running: set[_Running] = set()
        self._failed: dict[Hashable, BaseException] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._sel.register(self._wake_r, selectors.EVENT_READ, ("wake", None))
        self._closed = False
        self.served = 0  # requests a Template answered: started, or refused with an error (not fallen back)
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="sandbox-handoff", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ warming (any thread)

    def route(self, key: Hashable) -> tuple[list[str], dict[str, str]] | None:
        """The launcher argv (without `--` and the command) that hands off to
        the warm template for `key`, and what to add to its environment (a
        new ticket, good for one launch); None if it is cold, stale, or
        another process's."""
        warm = self._warm.get(key)
        if warm is None or warm.stale or os.getpid() != self._pid:
            return None
        secret = secrets.token_bytes(SECRET_SIZE)
        with self._lock:
            number = self._next_ticket
            self._next_ticket = (number + 1) & 0xFFFFFFFF
            self._tickets.pop(number, None)  # (after 2**32 tickets) the new one is the newest
            self._tickets[number] = _Ticket(secret, warm)
            while len(self._tickets) > MAX_TICKETS:
                del self._tickets[next(iter(self._tickets))]
        return warm.prefix, {ENV: f"{number}:{secret.hex()}:{warm.path}"}

    def warm(self, key: Hashable, spec: Spec, plan_argv: list[str], wait: bool = True) -> None:
        """Build a Template of `spec` for `key` on the handoff thread (once);
        `plan_argv` is the launcher's argv to fall back on, up to `--`.

        With `wait`, block until it is warm and raise what Template raised;
        without, return at once (the template is used once it is ready; a
        failure is kept, and the key is not tried again).
        """
        done = threading.Event()
        failure: list[BaseException] = []
        with self._lock:
            if not wait and (key in self._warming or key in self._failed):
                return
            self._warming.add(key)

        def build() -> None:
            try:
                if key not in self._warm or self._warm[key].stale:
                    self._add(key, spec, plan_argv)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                failure.append(exc)
                self._failed[key] = exc
            finally:
                with self._lock:
                    self._warming.discard(key)
                done.set()

        self._call(build)
        if wait:
            done.wait()
            if failure:
                raise failure[0]

    def close(self) -> None:
        """Stop serving, end every warm Template (and its sandboxes)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        os.write(self._wake_w, b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _call(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                raise SandboxError("the handoff server is closed")
            self._pending.append(fn)
        os.write(self._wake_w, b"x")

    def _add(self, key: Hashable, spec: Spec, plan_argv: list[str]) -> None:
        # The same loopback-only network, but leased from the pool (where it
        # runs): a fresh namespace costs more than the rest of the clone.
        template = Template(spec.replace(network="pool") if spec.network == "none" else spec)
        name = f"{secrets.token_hex(16)}.sock"
        path = os.path.join(self._dir, name)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            # bound in the directory this process made, through its fd: by path, a link a sandbox put in
            # its place would have the socket made wherever it points
            listener.bind(f"/proc/self/fd/{self._dir_fd}/{name}")
        except BaseException:
            listener.close()
            raise
        listener.listen(64)
        listener.setblocking(False)
        prefix = [plan_argv[0], "--handoff", *plan_argv[1:]]
        warm = _Warm(template, listener, path, name, prefix, spec.env_dict, spec.cwd or "")
        self._sel.register(listener, selectors.EVENT_READ, ("listen", warm))
        old = self._warm.get(key)
        self._warm[key] = warm
        if old is not None:
            self._retire(old)

    def _retire(self, warm: _Warm) -> None:
        warm.stale = True
        try:
            self._sel.unregister(warm.listener)
        except (KeyError, ValueError):
            pass
        warm.listener.close()
        try:
            os.unlink(warm.name, dir_fd=self._dir_fd)
        except OSError:
            pass
        with self._lock:
            for number in [n for n, t in self._tickets.items() if t.warm is warm]:
                del self._tickets[number]
        warm.template.close()

    # ------------------------------------------------------------ the loop (handoff thread)

    def _loop(self) -> None:
        try:
            while not self._closed:
                for key, _ in self._sel.select():
                    kind, data = key.data
                    if kind == "wake":
                        self._wake()
                    elif kind == "listen":
                        self._accept(data)
                    elif kind == "request":
                        self._request(key.fileobj, data)  # type: ignore[arg-type]
                    elif kind == "launcher":
                        self._from_launcher(data)
        finally:
            self._shutdown()

    def _wake(self) -> None:
        try:
            os.read(self._wake_r, 512)
        except BlockingIOError:
            pass
        with self._lock:
            calls, self._pending = self._pending, []
        for fn in calls:
            fn()

    def _accept(self, warm: _Warm) -> None:
        try:
            conn, _ = warm.listener.accept()
        except (BlockingIOError, OSError):
            return
        if not _our_child(conn):
            conn.close()  # not a launcher this process started: it gets EOF, and nothing is read from it
            return
        if self._pending_requests >= MAX_PENDING:
            _reply(conn, FALLBACK, 0, "too many handoffs are waiting for their request")
            conn.close()
            return
        self._pending_requests += 1
        self._sel.register(conn, selectors.EVENT_READ, ("request", warm))

    def _request(self, conn: socket.socket, warm: _Warm) -> None:
        self._sel.unregister(conn)
        self._pending_requests -= 1
        try:
            msg, fds, _ = recv_fds(conn, MAX_REQUEST, 3, socket.MSG_CMSG_CLOEXEC)
        except OSError:
            conn.close()
            return
        try:
            if len(fds) != 3 or not self._admit(warm, msg):
                _reply(conn, FALLBACK, 0, "not a launch this process prepared")
                conn.close()
                return
            self._start(conn, warm, msg, fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _admit(self, warm: _Warm, msg: bytes) -> bool:
        """Whether `msg` carries a ticket issued for `warm` and not used yet
        (the secret compared in constant time); the ticket is used up."""
        try:
            number, secret = wire.ticket_of(msg)
        except wire.WireError:
            return False
        with self._lock:
            ticket = self._tickets.get(number)
            if ticket is None or ticket.warm is not warm or not hmac.compare_digest(ticket.secret, secret):
                return False
            del self._tickets[number]
        return True

    def _start(self, conn: socket.socket, warm: _Warm, msg: bytes, fds: list[int]) -> None:
        try:
            cwd, argv, env = _parse(msg)
        except ValueError as exc:
            _reply(conn, ERROR, 125, f"bad handoff request: {exc}")
            conn.close()
            return
        try:
            proc = warm.template.spawn(argv, stdin=fds[0], stdout=fds[1], stderr=fds[2],
                                       env=None if env == warm.env else env,
                                       cwd=None if cwd == warm.cwd else cwd)
        except BaseException as exc:  # noqa: BLE001 - every failure is the launcher's to report
            self._refused(conn, warm, argv, exc)
            return
        self.served += 1
        conn.setblocking(False)
        running = _Running(conn, proc)
        self._running.add(running)
        self._sel.register(conn, selectors.EVENT_READ, ("launcher", running))
        # The wait has a thread of its own: SandboxProcess.wait() ends when
        # the status arrives, before the sandbox's namespaces are torn down.
        threading.Thread(target=self._wait, args=(running,), name="sandbox-handoff-wait", daemon=True).start()

    def _refused(self, conn: socket.socket, warm: _Warm, argv: list[str], exc: BaseException) -> None:
        """Tell the launcher why the command did not start (exit codes as the launcher's own)."""
        if _gone(warm.template.pid):
            _reply(conn, FALLBACK, 0, "the template has gone")
            self._retire(warm)
        else:
            self.served += 1
            if isinstance(exc, ExecError):
                _reply(conn, ERROR, 127 if isinstance(exc, ExecNotFoundError) else 126, exc.strerror or str(exc))
            else:
                _reply(conn, ERROR, 125, str(exc) or type(exc).__name__)
        conn.close()

    def _from_launcher(self, running: _Running) -> None:
        try:
            data = running.conn.recv(wire.FRAME_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if len(data) == wire.FRAME_SIZE:
            kind, value = wire.parse_frame(data)
            if kind == SIGNAL and 0 < value < 65:
                running.proc.send_signal(value)
            return
        # The connection closed: after its status (done), or because the launcher has gone (the harness's
        # timeout killed it, or anyone did): then so does its sandbox.
        self._sel.unregister(running.conn)
        if not running.done:
            running.proc.kill()
        running.conn.close()
        self._running.discard(running)

    def _wait(self, running: _Running) -> None:
        """(its own thread) Wait for the command and send its status; the loop closes the connection."""
        code = running.proc.wait()
        running.done = True
        _reply(running.conn, STATUS, code)

    def _shutdown(self) -> None:
        for key in list(self._sel.get_map().values()):
            if key.data[0] == "request":
                key.fileobj.close()  # type: ignore[union-attr]
        for running in list(self._running):
            running.proc.kill()
            running.conn.close()
        for warm in self._warm.values():
            if not warm.stale:
                self._retire(warm)
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        with self._lock:
            self._tickets.clear()
        _remove_own_dir(self._dir, self._dir_fd)


def _own_dir(path: str) -> int:
    """An fd of the directory mkdtemp made at `path` (not of a link put in its place since)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
        os.close(fd)
        raise SandboxError(f"handoff directory {path}: not the private directory this process just made")
    return fd


def _remove_own_dir(path: str, fd: int) -> None:
    """Empty the directory through its fd, then remove it by `path` only if it is still there (a
    sandbox that could write the temporary directory may have moved it, and put anything there)."""
    try:
        os.fchmod(fd, 0o700)
        for name in os.listdir(fd):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=fd)
        here = os.lstat(path)
        mine = os.fstat(fd)
        if (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
            os.rmdir(path)
    except OSError:
        pass
    finally:
        os.close(fd)


def _parse(msg: bytes) -> tuple[str, list[str], dict[str, str]]:
    """(cwd, argv, env) from an admitted request; ValueError (wire.WireError) if it is malformed."""
    request = wire.parse_request(msg)
    if request.fd_numbers != [0, 1, 2]:
        raise wire.WireError(f"fds {request.fd_numbers}, not the launcher's stdio")
    env = {}
    for item in map(os.fsdecode, request.environ):
        name, sep, value = item.partition("=")
        if sep and name and name != ENV:  # (the launcher took it out already)
            env[name] = value
    return os.fsdecode(request.cwd), [os.fsdecode(a) for a in request.argv], env


def _our_child(conn: socket.socket) -> bool:
    """Whether the peer is a same-uid child of this process (its pidfd confirming what /proc said),
    as every launcher the harness starts is (not enough on its own: so is a sandbox this process
    started with `as_pid_1`; the ticket decides)."""
    try:
        peer = Peer.of(conn)
    except (Unverified, OSError):
        return False
    try:
        peer.check_owner()
        return peer.parent() == os.getpid()
    except (Unverified, OSError, ValueError, IndexError):
        return False
    finally:
        peer.close()


def _gone(pid: int) -> bool:
    """Whether the template process has exited (a zombie, or reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


def _reply(conn: socket.socket, kind: int, value: int, text: str = "") -> None:
    try:
        conn.send(wire.frame(kind, value) + text.encode()[:4000])
    except OSError:
        pass  # the launcher has gone: nobody to tell


_handoff: Handoff | None = None
_handoff_lock = threading.Lock()


def handoff() -> Handoff:
    """This process's handoff server (started on first use)."""
    global _handoff
    with _handoff_lock:
        if _handoff is None or _handoff._pid != os.getpid():
            _handoff = Handoff()
        return _handoff


def close() -> None:
    """Close this process's handoff server, if any: its Templates end (and
    every sandbox they run); launchers prepared for them fall back to their
    own setup. A later warm NativeSandbox starts a new one."""
    global _handoff
    with _handoff_lock:
        server, _handoff = _handoff, None
    if server is not None and server._pid == os.getpid():
        server.close()


atexit.register(close)  # an interpreter that exits normally removes its server's socket directory
