"""The backend contract: what an executor of a Plan provides, and which one runs.

A backend is a module of this package that defines `BACKEND`, an object
implementing `Backend`: it says whether it can run on this host and starts a
command under a Plan, returning a `Launched` record. It interprets the Plan and
decides nothing (decisions are `sandbox.plan`'s). Adding one means a module
and a line in `NAMES`.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import UnavailableError
from ..plan import Plan

NAMES = ("native", "bwrap")  # the order "auto" tries them in


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
    ended (gives back a leased namespace, stops a port relay).
    """

    pid: int
    exit: ExitSource
    timings: dict[str, float]
    isolation: dict[str, Any] = field(default_factory=dict)
    on_exit: Callable[[], None] | None = None


class Backend(Protocol):
    """An executor of Plans."""

    name: str

    def available(self) -> tuple[bool, str]:
        """(usable here, why or why not); may be slow: callers cache it."""
        ...

    def launch(self, plan: Plan, argv: list[str], stdio: tuple[int, int, int],
               pass_fds: tuple[int, ...]) -> Launched:
        """Start `argv` under `plan`; return once it has been exec'd.

        Raises SetupError, ExecError, IsolationError or UnavailableError.
        """
        ...


class _Missing:
    """Stands for a backend whose module cannot be imported (e.g. the compiled core is not built)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason

    def available(self) -> tuple[bool, str]:
        return False, self.reason

    def launch(self, plan: Plan, argv: list[str], stdio: tuple[int, int, int],
               pass_fds: tuple[int, ...]) -> Launched:
        raise UnavailableError(f"{self.name} backend unavailable: {self.reason}")


@functools.cache
def get(name: str) -> Backend:
    """The backend called `name` (ValueError for an unknown name)."""
    if name not in NAMES:
        raise ValueError(f"backend must be 'auto', {', '.join(repr(n) for n in NAMES)}, not {name!r}")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ImportError as exc:
        return _Missing(name, str(exc))
    return module.BACKEND


_lock = threading.Lock()


@functools.cache
def _availability(name: str) -> tuple[bool, str]:
    return get(name).available()


def availability(name: str, refresh: bool = False) -> tuple[bool, str]:
    """`get(name).available()`, cached per process (`refresh=True` asks again)."""
    with _lock:
        if refresh:
            _availability.cache_clear()
        return _availability(name)


def choose(requested: str) -> tuple[str, str]:
    """(backend name, reason) for a request of `requested` ("auto" or a name).

    Raises UnavailableError if the requested backend (or, for "auto", every
    backend) cannot run here, ValueError for an unknown name.
    """
    if requested != "auto":
        ok, reason = availability(get(requested).name)
        if not ok:
            raise UnavailableError(f"{requested} backend unavailable: {reason}")
        return requested, "requested"
    refused: list[tuple[str, str]] = []
    for name in NAMES:
        ok, reason = availability(name)
        if ok:
            if not refused:
                return name, f"auto: this host allows the {name} path"
            return name, "auto: " + "; ".join(f"{n} refused ({why})" for n, why in refused)
        refused.append((name, reason))
    raise UnavailableError("no sandbox backend: " + "; ".join(f"{n}: {why}" for n, why in refused))
