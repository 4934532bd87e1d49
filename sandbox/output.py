"""Output caps: how much of a sandbox's stdout and stderr the caller keeps.

One meaning for every executor (run, spawn's communicate, Template, the
WorkerPool, the task layer; sandbox.Session feeds the same class): a cap is
`max_output` bytes per stream, and `on_overflow` says what happens past it:

- ``"tail"``: keep the last `max_output` bytes, drop the rest; the command
  runs on (run()'s default);
- ``"head"``: keep the first `max_output` bytes, drop the rest; the command
  runs on;
- ``"kill"``: keep the first `max_output` bytes and kill the sandbox;
  `killed_by` is ``"output"``;
- ``"raise"``: as "kill", then raise OutputLimitError (a WorkerPool task's
  future: TaskLimitError), which carries what was kept.

What was kept is always returned, and the number of bytes dropped is given
beside it (`stdout_dropped`, `stderr_dropped`). The caller holds at most
`max_output` bytes per stream plus one read (64 KiB), whatever the command
writes.

    cap = OutputCap(1 << 20, "tail")
    for chunk in chunks:
        if cap.feed(chunk):     # True once: the cap was passed and the mode is kill/raise
            kill_the_sandbox()
    kept, dropped = cap.kept(), cap.dropped
"""

from __future__ import annotations

import collections
from typing import Any

from .errors import SandboxError, SpecError

MODES = ("tail", "head", "kill", "raise")
DEFAULT_MAX_OUTPUT = 64 << 20  # run()'s default cap, per stream (docs/output.md says why)


def check_cap(max_output: object, on_overflow: object, field: str = "max_output") -> int | None:
    """`max_output` as a cap in bytes (None: no cap), after checking both
    arguments; SpecError naming the one that is wrong."""
    if on_overflow not in MODES:
        raise SpecError("on_overflow", on_overflow, f"must be one of {', '.join(repr(m) for m in MODES)}")
    if max_output is None:
        return None
    if not isinstance(max_output, int) or isinstance(max_output, bool) or max_output <= 0:
        raise SpecError(field, max_output, "must be a positive number of bytes, or None for no cap")
    return max_output


class OutputCap:
    """One stream's cap: `feed` it the chunks read, in order; `kept()` is
    what the caller keeps and `dropped` how many bytes it did not.

    `max_bytes` None: no cap (everything is kept). `on_overflow` is one of
    MODES. `feed` returns True once, on the chunk that passes the cap, when
    the mode ends the sandbox ("kill", "raise"): the caller kills it then
    (and goes on feeding what is still read; it is dropped). `dropped` and
    `overflowed` can be read at any time. Holds at most `max_bytes` plus one
    chunk."""

    def __init__(self, max_bytes: int | None, on_overflow: str = "tail") -> None:
        self.max_bytes = check_cap(max_bytes, on_overflow)
        self.on_overflow = on_overflow
        self._dropped = 0  # bytes let go of (the excess still held by "tail" is counted by `dropped`)
        self._chunks: collections.deque[bytes] = collections.deque()
        self._size = 0  # bytes held in _chunks

    @property
    def dropped(self) -> int:
        """How many bytes fed so far are not kept."""
        return self._dropped + self._excess()

    @property
    def overflowed(self) -> bool:
        """Whether any byte fed so far is not kept."""
        return self.dropped > 0

    def _excess(self) -> int:
        return 0 if self.max_bytes is None else max(0, self._size - self.max_bytes)

    @property
    def ends_sandbox(self) -> bool:
        """Whether passing the cap ends the sandbox ("kill" or "raise")."""
        return self.on_overflow in ("kill", "raise")

    def feed(self, chunk: bytes) -> bool:
        """Take one chunk read from the stream; True if the sandbox must be killed now."""
        if not chunk:
            return False
        cap = self.max_bytes
        if cap is None:
            self._chunks.append(chunk)
            self._size += len(chunk)
            return False
        if self.on_overflow == "tail":
            return self._feed_tail(chunk, cap)
        room = cap - self._size
        if room >= len(chunk):
            self._chunks.append(chunk)
            self._size += len(chunk)
            return False
        if room > 0:
            self._chunks.append(chunk[:room])
            self._size = cap
        first = self._dropped == 0
        self._dropped += len(chunk) - max(room, 0)
        return first and self.ends_sandbox

    def _feed_tail(self, chunk: bytes, cap: int) -> bool:
        self._chunks.append(chunk)
        self._size += len(chunk)
        # let go of whole chunks from the front while the rest still covers the cap
        while self._size - len(self._chunks[0]) >= cap:
            gone = self._chunks.popleft()
            self._size -= len(gone)
            self._dropped += len(gone)
        return False

    def kept(self) -> bytes:
        """What is kept: at most `max_bytes` (the last ones for "tail")."""
        excess = self._excess()
        if excess:  # "tail": the first chunk still holds some bytes too many
            self._chunks[0] = self._chunks[0][excess:]
            self._size -= excess
            self._dropped += excess
        return b"".join(self._chunks)


class OutputLimitError(SandboxError):
    """A command wrote more than `max_output` bytes to a stream under
    on_overflow="raise": its sandbox was killed (`killed_by` "output").
    `stdout` and `stderr` are what was kept (the first `max_output` bytes
    of each; None for a stream not captured), `stdout_dropped` and
    `stderr_dropped` how many bytes were not; `returncode`, `usage` and
    `killed_by` as on the result it replaces."""

    def __init__(self, message: str, *, max_output: int, stdout: bytes | str | None = None,
                 stderr: bytes | str | None = None, stdout_dropped: int = 0, stderr_dropped: int = 0,
                 returncode: int | None = None, usage: Any = None, killed_by: str | None = "output") -> None:
        super().__init__(message)
        self.max_output = max_output
        self.stdout, self.stderr = stdout, stderr
        self.stdout_dropped, self.stderr_dropped = stdout_dropped, stderr_dropped
        self.returncode, self.usage, self.killed_by = returncode, usage, killed_by

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


def limit_error(proc: Any, stdout: bytes | None, stderr: bytes | None) -> OutputLimitError:
    """The OutputLimitError of a process (a SandboxProcess, a Session's AsyncProcess) that its
    caller killed at its cap under "raise": what was kept, and the process's counts and end."""
    return OutputLimitError(
        f"the command wrote more than max_output={proc.max_output} bytes to a stream; it was killed "
        f"(dropped: stdout {proc.stdout_dropped}, stderr {proc.stderr_dropped} bytes)",
        max_output=proc.max_output, stdout=stdout, stderr=stderr, stdout_dropped=proc.stdout_dropped,
        stderr_dropped=proc.stderr_dropped, returncode=proc.returncode, usage=getattr(proc, "usage", None),
        killed_by=proc.killed_by)


def _rebuild(cls: type[OutputLimitError], message: str, state: dict[str, Any]) -> OutputLimitError:
    exc = cls(message, max_output=state.get("max_output", 0))
    exc.__dict__.update(state)
    return exc
