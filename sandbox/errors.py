"""Typed errors raised by the sandbox package.

Every error a caller can act on has its own class; all derive from SandboxError.
"""

from __future__ import annotations

import errno as _errno
import os
import reprlib
import signal as _signal


class SandboxError(Exception):
    """Base class of every error raised by this package."""


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


class NetnsPoolError(SandboxError):
    """A namespace could not be created or verified, or the pool is closed."""


def signal_name(number: int) -> str:
    """"SIGSYS" for 31; "signal N" for a number that names none (for messages)."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
