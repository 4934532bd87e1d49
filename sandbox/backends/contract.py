"""The backend contract: what an executor of a Plan provides, and the handle it returns."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ..capabilities import Traits
from ..cgroups import Usage
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
class Ended:
    """How a sandbox ended: the command's `returncode` (-N if signal N killed
    it), its resource `usage` where the executor counts it, and `killed_by`:
    the limit that ended it ("memory", "pids", "cpu", "timeout", "output";
    sandbox.killedby decides) or None."""

    returncode: int
    usage: Usage | None = None
    killed_by: str | None = None


class Handle(Protocol):
    """A started sandbox, as its executor reaches it: what sandbox.SandboxProcess
    (Popen's semantics) and the other faces build on.

    `pid` is the host pid of the process to which signals for the sandbox go
    and whose end is its end; `sandbox_pid` the host pid of the sandbox's first
    process inside its namespaces (the same unless the executor stands outside,
    as bwrap's monitor does); `timings` are µs since the start, with at least
    `start`, `child` (the sandbox's first process exists), `ready` (setup done)
    and `exec` (the command seen exec'd), plus the executor's own stages;
    `isolation` what the isolation checks established. Not thread-safe: its
    owner serializes the calls."""

    pid: int
    sandbox_pid: int
    timings: dict[str, float]
    isolation: dict[str, Any]

    def wait_fds(self) -> list[int]:
        """New fds (the caller closes them), one of which becomes readable once
        reap() may find the sandbox ended; [] when there is nothing left to
        wait for (reap() says how it ended)."""
        ...

    def reap(self, caller_end: str | None = None, woken: bool = False) -> Ended | None:
        """How the sandbox ended, once it has (never blocks), else None;
        `caller_end` is "timeout" or "kill" when the caller ended it; `woken`:
        every fd of the last wait_fds() has just been seen readable, which
        the handle need not check again. Once it returns an Ended,
        everything the sandbox held has been released."""
        ...

    def signal(self, sig: int) -> None:
        """Pass `sig` on to the sandbox's command; SIGKILL ends every process
        of the sandbox. Nothing happens if it has ended."""
        ...

    def close(self) -> None:
        """Release what the handle holds without waiting (it is abandoned)."""
        ...


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
               pass_fds: tuple[int, ...]) -> Handle:
        """Start `argv` under `plan`; return once it has been exec'd.

        Raises SetupError, ExecError, IsolationError or UnavailableError.
        """
        ...


@dataclass
class FunctionsBackend:
    """A Backend made of an executor's module-level functions: its `traits`,
    `available` and `launch` (its name is its traits'), and `applies` for
    one found from the environment (sandbox.backends: None, it serves
    anywhere)."""

    traits: Traits
    available: Callable[[], tuple[bool, str]]
    launch: Callable[[Plan, list[str], tuple[int, int, int], tuple[int, ...]], Handle]
    name: str = ""
    applies: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        self.name = self.name or self.traits.name
