"""The holder: the detached process that keeps a Session across command lines.

`sandbox session start` starts it (climain.py) as `sandbox-py session
_hold`, in a session of its own with its stdio on /dev/null. It reserves
its id by binding its socket (clisock.py: mode 0600 from the bind, in the
0700 per-user directory, beneath that directory's fd: bind never follows a
link and fails on any name already there), opens its log beside it, starts
the `Session` of the Spec its starter sends through a pipe, and tells the
starter its id (or the error, which the starter prints) on another pipe.

It then serves connections, one thread each, until it is stopped (a stop
request, SIGTERM, SIGINT), the session's pid 1 ends (its pidfd says so),
or no request came for `--idle-timeout` seconds with no command running.
Every connection's peer is checked first (clisock.check_peer: the
owner's uid, in the holder's own namespaces); a refused peer, a malformed
or oversized message, or an exec without exactly its three stdio fds is
refused with a line in the log and a message to the peer, and only that
connection ends. An exec's command gets exactly the fds that came with
its request, never one of the holder's. When the holder ends it closes the
Session (every process of it gone) and removes its socket if the name
still names it; its log stays for the owner to read, unless the owner
stopped it.

Data flow (one `sandbox exec ID -- CMD`; AF_UNIX SOCK_STREAM, length-prefixed JSON, fds by SCM_RIGHTS):

  client (climain.py)             holder (a thread per connection)     the Session's pid 1
  -------------------             --------------------------------     -------------------
  connect ---------------------->  check_peer: owner's uid, same ns
  {"op": "exec", argv, cwd, env,
   user} + its stdin/out/err ---->  Session.start(argv, stdio=those) ->  forks a call process,
                                                                         which execs CMD with
                   <---- {"started": pid}                                the client's own fds
  {"signal": N} (relayed) ------->  proc.send_signal(N) -------------->
                   <---- {"exit": status, "killed_by"} <----------------  CMD ends
  the client goes away ---------->  proc.kill(): CMD's tree ends
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import selectors
import signal
import socket
import stat
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ExecError, ExecNotFoundError, SandboxError
from . import clisock
from .clisock import Refused

if TYPE_CHECKING:
    from ..process import SandboxProcess
    from .session import Session

REQUEST_TIMEOUT = 10.0  # seconds a connection may take to send its request
MAX_CONNECTIONS = 64  # served at once; more wait in the listen backlog
EXEC_KEYS = frozenset({"op", "argv", "cwd", "env", "user"})
STOPPED_BY = "stopped by"  # the reason of a stop request: its log goes with it
CLOSE_GRACE = 2.0  # seconds the connections get to send their last reply when the holder ends


class Log:
    """The holder's log: one timestamped line per event, appended (O_APPEND: whole lines)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __call__(self, text: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{os.getpid()}] {' '.join(text.splitlines())}\n"
        with contextlib.suppress(OSError):
            os.write(self.fd, line.encode(errors="replace"))


def bind(directory: int, name: str | None) -> tuple[socket.socket, str, tuple[int, int]]:
    """A listening socket named for a new session in the directory of fd `directory`: `name`,
    else a fresh random id. Returns (socket, id, its (dev, ino)). Refused if `name` is taken by a
    live session, or by anything but a socket of ours (a planted link or file is never followed
    or removed); a dead holder's socket is replaced."""
    for _ in range(16):
        ident = clisock.check_id(name) if name else secrets.token_hex(4)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        previous = os.umask(0o177)  # the socket is 0600 from its creation: no moment anyone else may connect
        try:
            sock.bind(f"/proc/self/fd/{directory}/{clisock.socket_name(ident)}")
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            if not remove_stale(directory, ident) and name:
                raise Refused(f"a session named {name!r} is running") from None
            continue
        finally:
            os.umask(previous)
        sock.listen(64)
        st = os.stat(clisock.socket_name(ident), dir_fd=directory, follow_symlinks=False)
        return sock, ident, (st.st_dev, st.st_ino)
    raise Refused("no free session id (the directory is full of live sessions?)")


def remove_stale(directory: int, ident: str) -> bool:
    """Remove the socket of session `ident` if its holder is gone (nobody listens); True if it
    was. Refused if the name is not a socket of ours: that is left as it is."""
    try:
        sock, peer = clisock.connect(directory, ident)
    except ConnectionRefusedError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(clisock.socket_name(ident), dir_fd=directory)
        return True
    except FileNotFoundError:
        return True
    sock.close()
    peer.close()
    return False


def owns_name(directory: int, ident: str, mine: tuple[int, int]) -> bool:
    """Whether the socket's name still names our socket (`mine`: its (dev, ino))."""
    try:
        st = os.stat(clisock.socket_name(ident), dir_fd=directory, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == mine


class Holder:
    """Serves one Session at its socket until stopped; see the module's docstring."""

    def __init__(self, session: Session, listener: socket.socket, directory: int, ident: str,
                 socket_id: tuple[int, int], log: Log, idle_timeout: float | None) -> None:
        self.session, self.listener, self.directory, self.ident = session, listener, directory, ident
        self.socket_id, self.log, self.idle_timeout = socket_id, log, idle_timeout
        self.started = time.time()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._last = time.monotonic()
        self._running = 0  # exec'd commands not ended yet
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._wake_lock = threading.RLock()  # stop() comes from any thread, or a signal handler in the main one
        self.why_stopped = ""
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None  # publish()'s: the thread serving it

    # ------------------------------------------------------------ the main thread

    def serve(self, signals: bool = True) -> None:
        """Accept and serve connections until stopped, then end the session.
        `signals`: SIGTERM and SIGINT stop it (the holder process's main thread)."""
        for sig in (signal.SIGTERM, signal.SIGINT) if signals else ():
            signal.signal(sig, lambda signum, frame: self.stop(f"signal {signal.Signals(signum).name}"))
        pidfd = os.pidfd_open(self.session.pid)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self.listener, selectors.EVENT_READ, self._accept)
                sel.register(pidfd, selectors.EVENT_READ, lambda: self.stop("the session's pid 1 ended"))
                sel.register(self._wake_r, selectors.EVENT_READ, lambda: None)
                while not self.why_stopped:
                    for key, _ in sel.select(self._idle_left()):
                        key.data()
                    if self._idle_left() == 0:
                        self.stop(f"idle for {self.idle_timeout} s")
        finally:
            os.close(pidfd)
            self._end()

    def stop(self, why: str) -> None:
        """Make the main thread end the session (any thread, or a signal handler)."""
        if not self.why_stopped:
            self.why_stopped = why
        with self._wake_lock, contextlib.suppress(OSError):
            if self._wake_w >= 0:  # not yet closed by _end: the number is still this pipe's
                os.write(self._wake_w, b"x")

    def _idle_left(self) -> float | None:
        if self.idle_timeout is None:
            return None
        with self._lock:
            if self._connections or self._running:
                return None if not self._connections else 1.0
            return max(0.0, self._last + self.idle_timeout - time.monotonic())

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        with self._lock:
            if len(self._connections) >= MAX_CONNECTIONS:
                self.log(f"refused a connection: {MAX_CONNECTIONS} are being served")
                conn.close()
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._connections[conn] = thread
            self._last = time.monotonic()
        thread.start()

    def _end(self) -> None:
        """Remove the socket (if the name is still ours), close the session, let the connections
        send their last replies, close the rest."""
        self.log(f"ending: {self.why_stopped}")
        if owns_name(self.directory, self.ident, self.socket_id):
            with contextlib.suppress(OSError):
                os.unlink(clisock.socket_name(self.ident), dir_fd=self.directory)
        self.listener.close()
        try:
            self.session.close()
        finally:
            self.stopped.set()
            self._finish_connections()
            self.log("ended: the session is closed, its socket removed")
        if self.why_stopped.startswith(STOPPED_BY):  # asked for: nothing is left to explain
            with contextlib.suppress(OSError):
                os.unlink(clisock.log_name(self.ident), dir_fd=self.directory)
        with contextlib.suppress(OSError):
            os.close(self.directory)  # the per-user directory: a published session's process goes on
        with self._wake_lock:  # forgotten first, closed after: stop() never writes to a reused number
            wake = (self._wake_r, self._wake_w)
            self._wake_r = self._wake_w = -1
        for fd in wake:
            os.close(fd)

    def _finish_connections(self) -> None:
        deadline = time.monotonic() + CLOSE_GRACE
        with self._lock:
            threads = list(self._connections.items())
        for _, thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for conn, thread in threads:
            if thread.is_alive():
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                thread.join(1.0)

    # ------------------------------------------------------------ one connection (its own thread)

    def _serve(self, conn: socket.socket) -> None:
        who = "a peer"
        fds: list[int] = []
        try:
            conn.settimeout(REQUEST_TIMEOUT)
            peer = clisock.check_peer(conn)
            who = f"pid {peer.pid}"
            peer.close()
            message, fds = clisock.receive(conn, clisock.MAX_FDS)
            if message is not None:
                self._dispatch(conn, message, fds, who)
        except Refused as exc:
            self.log(f"refused {who}: {exc}")
            _reply(conn, {"error": str(exc), "status": clisock.EXIT_SETUP})
        except (OSError, TimeoutError) as exc:
            self.log(f"{who}: connection failed: {exc}")
        except Exception as exc:  # one connection's failure never ends the holder
            self.log(f"{who}: error: {type(exc).__name__}: {exc}")
            _reply(conn, {"error": f"the session's holder failed: {exc}", "status": clisock.EXIT_SETUP})
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()
            with self._lock:
                self._connections.pop(conn, None)
                self._last = time.monotonic()

    def _dispatch(self, conn: socket.socket, message: dict[str, Any], fds: list[int], who: str) -> None:
        op = message.get("op")
        if op != "exec" and fds:
            raise Refused(f"a {op!r} request carries no fds")
        if op == "exec":
            self._exec(conn, message, fds, who)
        elif op == "info":
            clisock.send(conn, {"id": self.ident, "pid": os.getpid(), "session_pid": self.session.pid,
                                "started": self.started, "running": self._running})
        elif op == "stop":
            self.log(f"{who}: stop")
            self.stop(f"{STOPPED_BY} {who}")
            self.stopped.wait()
            clisock.send(conn, {"stopped": True})
        else:
            raise Refused(f"unknown request {op!r} (exec, info, stop)")

    def _exec(self, conn: socket.socket, message: dict[str, Any], fds: list[int], who: str) -> None:
        argv, cwd, env, user = exec_request(message, fds)
        try:
            proc = self.session.start(argv, stdin=fds[0], stdout=fds[1], stderr=fds[2], cwd=cwd,
                                      env=self._environ(env), user=_user(user))
        except (SandboxError, OSError) as exc:
            status = 127 if isinstance(exc, ExecNotFoundError) else 126 if isinstance(exc, ExecError) else 125
            self.log(f"{who}: exec {argv[0]!r} failed: {exc}")
            clisock.send(conn, {"error": str(exc), "status": status})
            return
        finally:
            for fd in fds:
                os.close(fd)
            fds.clear()
        self.log(f"{who}: exec {argv[0]!r}: pid {proc.pid}")
        with self._lock:
            self._running += 1
        try:
            self._relay(conn, proc)
        finally:
            with self._lock:
                self._running -= 1

    def _environ(self, extra: dict[str, str] | None) -> dict[str, str] | None:
        """The session's environment with `extra` on top (None: the session's own)."""
        if not extra:
            return None
        base = dict(item.split("=", 1) for item in self.session.plan.env if "=" in item)
        return {**base, **extra}

    def _relay(self, conn: socket.socket, proc: SandboxProcess) -> None:
        """Report the start, pass the signals the client sends, report the end; the client gone
        before the end kills the command's tree."""
        lock = threading.Lock()
        clisock.send(conn, {"started": proc.pid})
        conn.settimeout(None)
        waiter = threading.Thread(target=_report_end, args=(conn, proc, lock), daemon=True)
        waiter.start()
        try:
            while True:
                message, _ = clisock.receive(conn)
                if message is None:
                    break
                sig = message.get("signal")
                if isinstance(sig, int) and not isinstance(sig, bool) and 0 < sig < signal.NSIG:
                    proc.send_signal(sig)
                else:
                    self.log(f"ignored a message while a command runs: {str(message)[:200]}")
        except (Refused, OSError) as exc:
            self.log(f"connection of pid {proc.pid}'s client failed: {exc}")
        finally:
            if proc.poll() is None:
                self.log(f"the client of pid {proc.pid} went away: its tree is killed")
                proc.kill()
            waiter.join()


def _report_end(conn: socket.socket, proc: SandboxProcess, lock: threading.Lock) -> None:
    returncode = proc.wait()
    with lock:
        _reply(conn, {"exit": returncode, "killed_by": proc.killed_by})
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RD)  # the relay's read ends: nothing more is taken from this client


def _reply(conn: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError, Refused):
        clisock.send(conn, message)


def _user(user: str | None) -> str | int | None:
    """`--user`'s word as Session.start takes it: a uid as a number, else the name."""
    return int(user) if user is not None and user.isdigit() else user


def exec_request(message: dict[str, Any], fds: Sequence[int]) -> tuple[list[str], str | None,
                                                                        dict[str, str] | None, str | None]:
    """(argv, cwd, extra environment, user) of an exec request, checked; Refused naming the field."""
    unknown = set(message) - EXEC_KEYS
    if unknown:
        raise Refused(f"unknown fields in an exec request: {', '.join(sorted(unknown))}")
    if len(fds) != 3:
        raise Refused(f"an exec request must carry the caller's stdin, stdout and stderr (3 fds by "
                      f"SCM_RIGHTS), not {len(fds)}")
    argv = message.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise Refused("exec: argv must be a non-empty list of strings without NUL")
    cwd, env, user = message.get("cwd"), message.get("env"), message.get("user")
    if cwd is not None and (not isinstance(cwd, str) or "\0" in cwd):
        raise Refused("exec: cwd must be a string without NUL")
    if env is not None and not (isinstance(env, dict) and all(
            isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v
            for k, v in env.items())):
        raise Refused("exec: env must map names (no '=') to strings, without NUL")
    if user is not None and (not isinstance(user, str) or not user or "\0" in user):
        raise Refused("exec: user must be a name or a number")
    return argv, cwd, env, user


# ---------------------------------------------------------------- the process


def publish(session: Session, name: str | None = None) -> Holder:
    """Serve `session` (of this process) at a socket of the per-user directory, as a holder
    process serves its own, on a thread of this process: `sandbox exec ID` then reaches it.
    The returned Holder's `ident` is the ID; it stops when the session ends (its pid 1's pidfd
    says so), or with `stop()`, and ends the session then, removing its socket."""
    directory = clisock.open_dir(create=True)
    listener, ident, socket_id = bind(directory, name)
    holder = Holder(session, listener, directory, ident, socket_id, Log(-1), None)
    holder.thread = threading.Thread(target=holder.serve, kwargs={"signals": False}, daemon=True,
                                     name=f"sandbox-session-{ident}")
    holder.thread.start()
    return holder
