"""Typed errors raised by the sandbox package.

Every error a caller can act on has its own class; all derive from SandboxError.
"""

from __future__ import annotations

import errno as _errno
import os
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
        super().__init__(f"{field}={value!r}: {problem}")


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


class NetnsPoolError(SandboxError):
    """A namespace could not be created or verified, or the pool is closed."""


def signal_name(number: int) -> str:
    """"SIGSYS" for 31; "signal N" for a number that names none (for messages)."""
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
