"""What comes back from a task: its reply, loaded safely, and the errors a task can end with.

A reply is pickled by code in the sandbox, so loading it with pickle would let
that code run anything in the caller (pickle calls whatever callable the data
names). By default it is loaded with an allowlist instead: plain data
(numbers, strings, bytes, containers, datetime, Decimal, Fraction, UUID, paths)
and exception classes the caller has already imported; `result_types` adds
classes the caller vouches for, `trusted=True` loads anything.

Even an allowed callable is a lever: `list(range(10**9))` or `bytes(10**9)`
is a few bytes of pickle that would make the caller build gigabytes. Plain
data never needs the copying constructors (list, tuple, set, frozenset, dict,
bytes, bytearray, Counter, deque: pickle has opcodes for their contents), so
a reply that names one is loaded again by a checked loader, which charges
every call and __new__ what its arguments make it copy or allocate (a
sized argument's length, bytes(n)'s n; a range or an iterator its length)
against a budget the size of the reply: what a reply makes the caller hold
stays proportional to what it sent, and that is capped by max_reply.
"""

from __future__ import annotations

import io
import pickle
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import BrokenExecutor, Future
from typing import Any, ClassVar, Generic, TypeVar

from ..cgroups import Usage
from ..errors import SandboxError
from .sources import restore_frames

SAFE_GLOBALS: dict[str, frozenset[str]] = {
    "builtins": frozenset({"int", "float", "complex", "str", "bytes", "bytearray", "bool", "tuple", "list", "dict",
                           "set", "frozenset", "slice", "range"}),
    "collections": frozenset({"OrderedDict", "deque", "Counter", "defaultdict"}),
    "datetime": frozenset({"date", "time", "datetime", "timedelta", "timezone"}),
    "decimal": frozenset({"Decimal"}),
    "fractions": frozenset({"Fraction"}),
    "uuid": frozenset({"UUID", "SafeUUID"}),
    "pathlib": frozenset({"PurePath", "PurePosixPath", "PosixPath", "Path"}),
}


T = TypeVar("T")

# Allowed callables that copy an argument (or allocate a size) the data chooses.
_COPYING = frozenset({("builtins", name) for name in ("list", "tuple", "set", "frozenset", "dict", "bytes",
                                                       "bytearray")} | {("collections", "Counter"),
                                                                        ("collections", "deque")})


class TaskFuture(Future[T], Generic[T]):
    """A WorkerPool task's Future, with what the task wrote to its stdout and
    stderr (bytes, complete once the future is done: what the output cap
    kept of each) and how many bytes of each the cap dropped
    (`stdout_dropped`, `stderr_dropped`)."""

    def __init__(self) -> None:
        super().__init__()
        self.stdout = b""
        self.stderr = b""
        self.stdout_dropped = 0
        self.stderr_dropped = 0
        self.timings: dict[str, float] = {}  # µs: queued (from submit to its channels sent), then since
        # then: the fork's stamps (fork.*, in the zygote: a task forked for itself), started and done
        self.end = SandboxEnd()  # the engine fills it when the task's sandbox has ended

    @property
    def usage(self) -> Usage | None:
        """What the task's sandbox used: its cgroup's counts (mechanism "rlimit":
        none are kept). None until the future is done, or if the task never
        ran. A future is done as soon as the task's reply is in; its sandbox
        ends just after (~1-2 ms), and this waits for that end."""
        return self.end.wait(self).usage

    @property
    def killed_by(self) -> str | None:
        """The limit that ended the task's sandbox: "memory", "pids", "cpu",
        "timeout", "output", or None (as `usage`, once it has ended)."""
        return self.end.wait(self).killed_by


class SandboxEnd:
    """How a task's sandbox ended, shared by its future and the engine (which
    drops the future itself once it is done)."""

    WAIT_S = 10.0  # at most, for a sandbox whose reply is in to end (then: None)

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.killed_by: str | None = None
        self.event = threading.Event()

    def set(self, usage: Usage | None, killed_by: str | None) -> None:
        self.usage, self.killed_by = usage, killed_by
        self.event.set()

    def wait(self, future: Future[Any]) -> SandboxEnd:
        if future.done() and not future.cancelled():
            self.event.wait(self.WAIT_S)
        return self


class TaskError(SandboxError):
    """The task's sandbox ended without a reply: it exited (os._exit, a crash)
    or was killed. `returncode` is its exit code, or -N if signal N ended it;
    `stdout` and `stderr` what it wrote (what its output cap kept; the bytes
    dropped in `stdout_dropped`, `stderr_dropped`); `usage` and `killed_by`
    as on its TaskFuture (killed_by "memory": its cgroup's OOM killer ended
    it)."""

    usage: Usage | None
    killed_by: str | None

    def __init__(self, message: str, *, returncode: int | None = None, stdout: bytes = b"",
                 stderr: bytes = b"", stdout_dropped: int = 0, stderr_dropped: int = 0) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.stdout_dropped = stdout_dropped
        self.stderr_dropped = stderr_dropped
        self.usage: Usage | None = None
        self.killed_by: str | None = None


class TaskTimeoutError(TaskError, TimeoutError):
    """The task ran past its timeout; its whole sandbox was killed."""


class TaskLimitError(TaskError):
    """The task sent more than a cap allows (`limit`: "max_reply" or
    "max_output", `cap` its value in bytes); its whole sandbox was killed.
    Past max_reply its reply is dropped; past max_output (on_overflow
    "raise") `stdout` and `stderr` hold what the cap kept (the first `cap`
    bytes of each), `stdout_dropped` and `stderr_dropped` what it did not,
    and `killed_by` is "output"."""

    def __init__(self, message: str, *, limit: str, cap: int, stdout: bytes = b"", stderr: bytes = b"",
                 stdout_dropped: int = 0, stderr_dropped: int = 0) -> None:
        super().__init__(message, stdout=stdout, stderr=stderr, stdout_dropped=stdout_dropped,
                         stderr_dropped=stderr_dropped)
        self.limit = limit
        self.cap = cap


class TaskExit(TaskError):
    """The task raised a BaseException that is not an Exception (SystemExit,
    KeyboardInterrupt, GeneratorExit...): raising it here as itself would end
    the caller's loop, so it comes back wrapped. `exception` is the one the
    task raised (rebuilt, or a RemoteError naming it); `__cause__` the remote
    traceback."""

    def __init__(self, exception: BaseException) -> None:
        super().__init__(f"the task raised {type(exception).__name__}({_short(exception)})")
        self.exception = exception


def _short(exc: BaseException) -> str:
    try:
        text = ", ".join(repr(a) for a in exc.args)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the error
        text = "..."
    return text if len(text) <= 200 else text[:200] + "..."


class RemoteError(SandboxError):
    """The task raised an exception that cannot be rebuilt here (its class is
    not allowed, or it could not be pickled): `type_name` and `message` say
    what it was; `__cause__` holds the remote traceback."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.message = message


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a task (set as its __cause__)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


class BrokenWorkerPool(BrokenExecutor, SandboxError):
    """The pool's zygote died or could not start; no task can run any more."""


class UnsafeResultError(SandboxError, pickle.UnpicklingError):
    """The reply names a class or function the safe loader does not rebuild."""


def _exception_class(module: str, name: str, allowed: frozenset[tuple[str, str]]) -> type | None:
    """None if a reply may name `module.name` through pickle's own lookup (the
    allowlist, `allowed`); an exception class the caller has already imported;
    else UnsafeResultError."""
    if name in SAFE_GLOBALS.get(module, ()) or (module, name) in allowed:
        return None
    found = _loaded_attr(module, name)
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    raise UnsafeResultError(
        f"the task's reply holds {module}.{name}, which is not rebuilt without trust: return plain data, "
        "list the class in WorkerPool(result_types=...), or pass trust_results=True (the task's code could "
        "then run code in this process)")


class _NamesCopying(Exception):
    """The reply names a copying constructor: load it with _CheckedUnpickler."""


class _SafeUnpickler(pickle.Unpickler):
    """The fast loader (C): the allowlist, and no copying constructor at all."""

    def __init__(self, data: bytes, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _COPYING and (module, name) not in self.allowed:
            raise _NamesCopying
        found = _exception_class(module, name, self.allowed)
        return super().find_class(module, name) if found is None else found


class _CheckedUnpickler(pickle._Unpickler):
    """The checked loader (pure Python, so each call can be seen): every
    REDUCE and NEWOBJ is charged what it copies, against `budget` items."""

    dispatch: ClassVar[dict[int, Callable[[Any], None]]] = dict(pickle._Unpickler.dispatch)
    stack: list[Any]

    def __init__(self, data: bytes, allowed: frozenset[tuple[str, str]]) -> None:
        super().__init__(io.BytesIO(data))
        self.allowed = allowed
        self.budget = max(len(data), 1 << 16)

    def find_class(self, module: str, name: str) -> Any:
        found = _exception_class(module, name, self.allowed)
        return super().find_class(module, name) if found is None else found

    def _charge(self, make: Any, args: Any) -> None:
        for arg in args:
            self.budget -= _copy_cost(make, arg)
        if self.budget < 0:
            raise UnsafeResultError(f"the task's reply asks this process to build more than it sent "
                                    f"({getattr(make, '__name__', make)} of a large argument): refused")

    def load_reduce(self) -> None:
        args = self.stack[-1]
        self._charge(self.stack[-2], args)
        super().load_reduce()  # type: ignore[misc]

    def load_newobj(self) -> None:
        self._charge(self.stack[-2], self.stack[-1])
        super().load_newobj()  # type: ignore[misc]

    def load_newobj_ex(self) -> None:
        self._charge(self.stack[-3], (*self.stack[-2], *self.stack[-1].values()))
        super().load_newobj_ex()  # type: ignore[misc]

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex


def _copy_cost(make: Any, arg: Any) -> int:
    """What calling `make` with `arg` may copy or allocate, in items."""
    if isinstance(arg, int) and not isinstance(arg, bool):
        return abs(arg) if make in (bytes, bytearray) else 1  # bytes(n) makes n bytes
    if isinstance(arg, type):
        return 1  # a class as an argument (defaultdict's factory) is not iterated
    try:
        return len(arg)
    except (TypeError, OverflowError):  # OverflowError: a range longer than sys.maxsize
        return sys.maxsize if hasattr(type(arg), "__iter__") else 1  # an iterator claims no length


def _loaded_attr(module: str, qualname: str) -> Any:
    """`module.qualname` if that module is already imported (nothing is imported here), else None."""
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None or part.startswith("__"):
            return None
        obj = getattr(obj, part, None)
    return obj


class ReplyLoader:
    """Loads task replies: safely (an allowlist), or with pickle if trusted."""

    def __init__(self, trusted: bool = False, result_types: Iterable[type] = ()) -> None:
        self.trusted = trusted
        self.allowed = frozenset((t.__module__, t.__qualname__) for t in result_types)

    def loads(self, data: bytes) -> Any:
        """One pickled object."""
        if self.trusted:
            return pickle.loads(data)
        try:
            return _SafeUnpickler(data, self.allowed).load()
        except _NamesCopying:
            return _CheckedUnpickler(data, self.allowed).load()

    def outcome(self, data: bytes, sources: Iterable[str] = ()) -> tuple[bool, Any]:
        """(True, value) or (False, exception with the remote traceback as its
        __cause__; frames of code sent by value from the modules `sources`
        get their file and line back)."""
        ok, payload = self.loads(data)
        if ok:
            return True, payload
        return False, self.exception(payload, sources)

    def exception(self, record: dict[str, Any], sources: Iterable[str] = ()) -> BaseException:
        """The exception of an error record: unpickled if allowed; else made
        again from its class, if the caller has imported it (without running
        its __init__), with its args and attributes; else a RemoteError naming
        it. Its __cause__ is the remote traceback."""
        exc = self._rebuilt(record)
        if exc is None:
            name = f"{record.get('module', '?')}.{record.get('qualname', '?')}"
            exc = RemoteError(name, str(record.get("message", "")))
        cause = RemoteTraceback(restore_frames(str(record.get("traceback", "")), sources))
        exc.__cause__ = cause
        if not isinstance(exc, Exception):
            exc = TaskExit(exc)
            exc.__cause__ = cause
        return exc

    def _rebuilt(self, record: dict[str, Any]) -> BaseException | None:
        try:
            loaded = self.loads(record["exception"]) if record.get("exception") is not None else None
            if isinstance(loaded, BaseException):
                return loaded
        except Exception:  # noqa: BLE001, S110 - a class pickled by value is made again below
            pass
        cls = _loaded_attr(str(record.get("module")), str(record.get("qualname")))
        if not (isinstance(cls, type) and issubclass(cls, BaseException)) or record.get("args") is None:
            return None
        try:
            args, state = self.loads(record["args"])
            # as pickle does for exceptions, but without calling __init__
            exc = cls.__new__(cls, *args)
            exc.args = tuple(args)
            exc.__dict__.update(state)
            return exc
        except Exception:  # noqa: BLE001 - an exception we cannot make again comes back by name
            return None
