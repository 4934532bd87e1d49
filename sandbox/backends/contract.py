"""The backend contract: what an executor of a Plan provides, and the record it returns."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..capabilities import Traits
from ..cgroups import Walls
from ..plan import Plan


class ExitSource(Protocol):
    """Turns the first process's wait status into the command's returncode."""

    def returncode(self, raw_status: int) -> int:
        """The command's returncode (-N if signal N killed it), given the first process's wait status."""
        ...

    def close(self) -> None:
        """Release what it holds (called once the returncode is known, or when abandoned)."""
        ...


class WaitStatus:
    """The first process is the command itself: its own wait status says it all."""

    def returncode(self, raw_status: int) -> int:
        """os.waitstatus_to_exitcode of the status."""
        return os.waitstatus_to_exitcode(raw_status)

    def close(self) -> None:
        """Nothing to release."""


@dataclass(frozen=True)
class Launched:
    """A sandbox whose command has been exec'd.

    `pid` is the host pid of its first process (the one to wait for and to
    signal); `timings` are µs since the start, with at least `start`, `child`
    (the sandbox's first process exists), `ready` (setup done) and `exec`
    (the command seen exec'd), plus the backend's own stages; `isolation` what
    the isolation checks established; `on_exit` runs once the sandbox has
    ended (gives back a leased namespace, stops a port relay); `signal`, when
    set, is how a signal for the sandbox reaches its command where sending it
    to `pid` would not pass it on (bwrap's monitor dies of a SIGTERM and
    leaves the command running); `sandbox_pid`, when set, is the host pid of
    the sandbox's first process where `pid` stands outside the sandbox
    (bwrap's monitor).

    `pidfd`, when not -1, is a pidfd of the first process, which is then not
    the caller's child (a Template's sandbox is its server's): it is waited
    for by polling the pidfd and signalled through it, and its status comes
    from `exit` alone (given a SIGKILL status if it reports none). The
    record's owner closes it. `ended_fd`, when not -1, becomes readable once
    the command's status is in, or its writer gone: `exit` is then an
    EarlyStatus, whose arrived() says which. A status that arrived means
    every other process of the sandbox has gone: the wait ends there, not at
    the first process's own exit (the namespaces' teardown); a first process
    that is the caller's child is then reaped in the background
    (sandbox.reaper). `walls`, when set, holds the sandbox's cgroup (its
    usage, which limit ended it; removed once the first process is reaped).
    """

    pid: int
    exit: ExitSource
    timings: dict[str, float]
    isolation: dict[str, Any] = field(default_factory=dict)
    on_exit: Callable[[], None] | None = None
    pidfd: int = -1
    ended_fd: int = -1
    signal: Callable[[int], None] | None = None
    sandbox_pid: int | None = None
    walls: Walls | None = None


class EarlyStatus(ExitSource, Protocol):
    """An exit source whose status may arrive before the first process has exited."""

    def arrived(self) -> bool:
        """Take the status once `ended_fd` is readable: True if it came,
        False if its writer has gone without one (wait for the pidfd then)."""
        ...


class Backend(Protocol):
    """An executor of Plans: `traits` declares what it can do."""

    name: str
    traits: Traits

    def available(self) -> tuple[bool, str]:
        """(usable here, why or why not); may be slow: callers cache it."""
        ...

    def launch(self, plan: Plan, argv: list[str], stdio: tuple[int, int, int],
               pass_fds: tuple[int, ...]) -> Launched:
        """Start `argv` under `plan`; return once it has been exec'd.

        Raises SetupError, ExecError, IsolationError or UnavailableError.
        """
        ...
