"""Typed errors raised by the sandbox package.

Every error a caller can act on has its own class; all derive from SandboxError.
"""

from __future__ import annotations

import errno as _errno
import os
import reprlib
import signal as _signal
import subprocess
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cgroups import Usage


class SandboxError(Exception):
    """Base class of every error raised by this package.

    Every one pickles to an equal error (same class, args and attributes),
    whatever its constructor takes, so it crosses a process (a Ray node, a
    multiprocessing worker) as itself."""

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's own reduce calls the class with self.args, which fails for a
        # constructor of other (or keyword-only) parameters: rebuild without calling it.
        args = OSError.__reduce__(self)[1] if isinstance(self, OSError) else self.args
        return _rebuild, (type(self), args, dict(vars(self)))


def _rebuild(cls: type[SandboxError], args: tuple[Any, ...], state: dict[str, Any]) -> SandboxError:
    """An error of `cls` with `args` and the attributes `state`, its constructor not called."""
    exc = cls.__new__(cls, *args)
    if isinstance(exc, OSError):
        OSError.__init__(exc, *args)  # errno, strerror, filename: fields of the C struct, not of vars()
    else:
        exc.args = args
    exc.__dict__.update(state)
    return exc


class SpecError(SandboxError, ValueError):
    """A Spec (or a CLI option) is invalid. Raised before anything runs.

    `field` names the offending field, `value` holds what was given.
    """

    def __init__(self, field: str, value: object, problem: str) -> None:
        self.field = field
        self.value = value
        self.problem = problem
        super().__init__(f"{field}={shown(value)}: {problem}")


def shown(value: object) -> str:
    """How an error shows a value a caller gave: its repr(), shortened if long or
    deep, or its type where repr() fails (an int too long for str())."""
    try:
        return _shown.repr(value)
    except Exception:  # noqa: BLE001 - e.g. an int of more digits than str() converts
        return f"<{type(value).__name__} object>"


# How a SpecError shows the value: in full unless it is long or deeply nested
# (a value parsed from JSON may be both; repr() of a deep one would recurse too far).
_shown = reprlib.Repr()
_shown.maxlevel = 6
_shown.maxstring = _shown.maxother = 400
_shown.maxlong = 100
_shown.maxlist = _shown.maxtuple = _shown.maxdict = _shown.maxset = _shown.maxfrozenset = 40


FORK_HINT = ("; a process limit refused the fork: Limits.nproc counts every process of the sandbox, its pid 1 "
             "(sandbox-init, which reaps the others) too, so allow at least 2 (or as_pid_1=True); where no cgroup "
             "holds it, RLIMIT_NPROC counts every process of the uid")


class SetupError(SandboxError):
    """A step of sandbox setup failed; the command never ran.

    `step` names the setup step ("bind", "tmpfs", "uid_map", ...), `path` the
    path it worked on (or None), `errno` the kernel's error number, and
    `backend` which backend ran ("native" or "bwrap").
    """

    def __init__(
        self,
        message: str,
        *,
        step: str,
        path: str | None = None,
        errno: int = 0,
        backend: str = "native",
    ) -> None:
        if errno == _errno.EAGAIN and (step == "fork" or "fork" in message) and FORK_HINT not in message:
            message += FORK_HINT  # fork(2)'s EAGAIN: a process limit, the sandbox's or the uid's
        self.step = step
        self.path = path
        self.errno = errno
        self.backend = backend
        super().__init__(message)


class ExecError(SandboxError, OSError):
    """The command could not be executed inside the sandbox.

    Instances are also FileNotFoundError (command missing) or PermissionError
    (not executable) where that applies; use `ExecError.from_errno`.
    `backend` says which backend ran ("native" or "bwrap").
    """

    backend: str = "native"

    @classmethod
    def from_errno(cls, err: int, command: str, backend: str = "native") -> ExecError:
        """Build the most specific ExecError subclass for `err`."""
        klass = {
            _errno.ENOENT: ExecNotFoundError,
            _errno.EACCES: ExecPermissionError,
            _errno.EPERM: ExecPermissionError,
        }.get(err, ExecError)
        exc = klass(err, f"can't execute {command!r} in the sandbox: {os.strerror(err)}")
        exc.filename = command
        exc.backend = backend
        return exc


class ExecNotFoundError(ExecError, FileNotFoundError):
    """The command does not exist inside the sandbox."""


class ExecPermissionError(ExecError, PermissionError):
    """The command exists inside the sandbox but cannot be executed."""


class UnavailableError(SandboxError, RuntimeError):
    """No backend able to run the request is available on this host."""


class IsolationError(SandboxError):
    """An isolation check found something that should not be visible; the
    command never ran. `path` names the leaking probe path (if that was it)."""

    def __init__(self, message: str, *, path: str | None = None, errno: int = 0) -> None:
        self.path = path
        self.errno = errno
        super().__init__(message)


class SessionError(SandboxError):
    """A sandbox.Session cannot serve a call: it was closed, or it ended (its
    pid 1 was killed from outside, or could not start a command's process)."""


class SessionUserError(SessionError, ValueError):
    """The `user=` of a Session call names no user of the session's own
    /etc/passwd, or an id (uid, gid) its user namespace does not map: the
    message names the user, or the id and the mapped range."""


_Arg = str | bytes | os.PathLike[str] | os.PathLike[bytes]


class TimeoutExpired(subprocess.TimeoutExpired):
    """run()'s (and task.run()'s) timeout: a subprocess.TimeoutExpired (catch
    either), whose sandbox was killed, with what it used: `usage` (as on a
    CompletedProcess) and `killed_by` ("timeout", or the limit that ended it
    first). `output` and `stderr` hold what it wrote until then."""

    def __init__(self, cmd: _Arg | Sequence[_Arg], timeout: float, output: bytes | str | None = None,
                 stderr: bytes | str | None = None, *, usage: Usage | None = None,
                 killed_by: str | None = None) -> None:
        super().__init__(cmd, timeout, output, stderr)
        self.args = (cmd, timeout, output, stderr)  # what pickle calls the class with, however it was called
        self.usage = usage
        self.killed_by = killed_by


class RequestTooLargeError(SandboxError, ValueError):
    """A request is larger than the executor takes: `size` (bytes, or fds)
    where at most `limit` fit; `what` says what was counted."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(what, size, limit)
        self.what, self.size, self.limit = what, size, limit

    def __str__(self) -> str:
        return f"{self.what}: {self.size}, more than the {self.limit} a Template takes"


class NetnsPoolError(SandboxError):
    """A namespace could not be created or verified, or the pool is closed."""


def signal_name(number: int) -> str:
    """"SIGSYS" for 31; "signal N" for a number that names none (for messages)."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
