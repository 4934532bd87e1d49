"""One command of a Session: its call socket, as a backend contract.Handle.

The session's pid 1 forks a call process per command (csrc/session/session_call.c);
the caller holds the other end of that call's socket. STARTED comes once the
command has exec'd (with its pidfd: its host pid; none for a quiet request,
whose caller waits only for the end), FAILED instead if it could not be,
EXITED with its raw wait status when it ends; SIGNAL and KILL go the other
way. Closing the socket leaves the command running (until it ends, or the
session does). A SandboxProcess over a Call is what `Session.start` and
`Session.exec` run.
"""

from __future__ import annotations

import errno as E
import os
import signal
import socket
from collections.abc import Callable
from typing import Any

from .._core import fdpass
from .._core.binding import STEP_NAMES, lib
from ..backends.contract import Ended
from ..errors import ExecError, SandboxError, SessionError, SetupError
from ..killedby import killed_by
from . import wire


class Call:
    """A command of a Session (contract.Handle): `pid` is its host pid (-1
    until a STARTED frame names it), `session_pid` its pid inside the session."""

    def __init__(self, sock: socket.socket, argv: list[str], cwd: str,
                 session_ended: Callable[[], bool] = lambda: False) -> None:
        self._sock = sock
        self._session_ended = session_ended
        self.argv, self._cwd = argv, cwd
        self.pid = self.sandbox_pid = self.session_pid = -1
        self.timings: dict[str, float] = {}
        self.isolation: dict[str, Any] = {}
        self._ended: Ended | None = None

    def fileno(self) -> int:
        """The call socket's fd (readable once reap() may find it ended)."""
        return self._sock.fileno()

    def wait_fds(self) -> list[int]:
        """A dup of the call socket, readable when a frame (or EOF) has come."""
        return [] if self._ended is not None else [os.dup(self._sock.fileno())]

    def take_started(self) -> None:
        """Block for the first frame: STARTED, or raise why the command did not start."""
        got, fds = receive(self._sock)
        pid = -1
        for fd in fds:
            pid = host_pid(fd) if pid < 0 else pid
            os.close(fd)
        if got is not None and got.kind == wire.STARTED:
            self.pid = self.sandbox_pid = pid
            self.session_pid = got.pid
            return
        self._end(-signal.SIGKILL)
        raise SessionError("the session ended before the command started (its pid 1 is gone)") if got is None \
            else failure(got, self.argv, self._cwd)

    def reap(self, caller_end: str | None = None, woken: bool = False) -> Ended | None:
        """The command's end once EXITED has come (never blocks); EOF without
        it means the session itself ended (its pid 1 killed): SIGKILL. A
        FAILED frame (a quiet request's) raises its error, once."""
        while self._ended is None:
            try:
                data = self._sock.recv(wire.FRAME_SIZE, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return None
            except OSError:
                data = b""
            got = wire.parse_frame(data)
            if got is None and self.session_pid < 0 and self._session_ended():
                self._end(-signal.SIGKILL)  # a quiet request's: no frame ever came
                raise SessionError("the session ended before the command ended (its pid 1 is gone)")
            if got is None:
                return self._end(-signal.SIGKILL)
            if got.kind == wire.EXITED:
                return self._end(os.waitstatus_to_exitcode(got.value), caller_end)
            if got.kind == wire.FAILED:
                self._end(127 if got.step == lib.SBX_STEP_EXEC and got.value == E.ENOENT else 126)
                raise failure(got, self.argv, self._cwd)
            self.session_pid = got.pid  # STARTED: what comes next says how it ended
        return self._ended

    def _end(self, code: int, caller_end: str | None = None) -> Ended:
        self._ended = Ended(code, killed_by=killed_by(code, None, None, caller_end))
        self._sock.close()
        return self._ended

    def signal(self, sig: int) -> None:
        """Pass `sig` to the command; SIGKILL ends its whole process tree."""
        if self._ended is not None:
            return
        data = wire.frame(wire.KILL) if sig == signal.SIGKILL else wire.frame(wire.SIGNAL, int(sig))
        try:
            self._sock.send(data, socket.MSG_NOSIGNAL)
        except OSError:
            pass  # the call process has gone: reap() says how it ended

    def close(self) -> None:
        """Abandon it: the command runs on, unwatched, until it ends or the session does."""
        self._sock.close()


def receive(sock: socket.socket) -> tuple[wire.Frame | None, list[int]]:
    """One frame and the fds that came with it (None at EOF)."""
    try:
        data, fds, _ = fdpass.recv_fds(sock, wire.FRAME_SIZE, 1, socket.MSG_CMSG_CLOEXEC)
    except ConnectionResetError:
        return None, []
    return wire.parse_frame(data), fds


def host_pid(pidfd: int) -> int:
    """The host pid of a pidfd (its fdinfo's Pid line), or -1."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}", "rb") as f:
            for line in f:
                if line.startswith(b"Pid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def failure(got: wire.Frame, argv: list[str], cwd: str) -> SandboxError:
    """The typed error of a FAILED frame."""
    if got.kind != wire.FAILED:
        return SessionError(f"the session answered a command with frame kind {got.kind}, not STARTED")
    err = got.value
    if got.step == lib.SBX_STEP_EXEC:
        return ExecError.from_errno(err, argv[0], backend="session")
    if got.step == lib.SBX_STEP_CWD:
        return SetupError(f"Can't chdir to {cwd!r} in the session: {os.strerror(err)}", step="cwd", path=cwd,
                          errno=err, backend="session")
    step = STEP_NAMES.get(got.step, str(got.step))
    return SessionError(f"the session could not start the command: {step} failed with "
                        f"{E.errorcode.get(err, str(err))} ({os.strerror(err)})")
