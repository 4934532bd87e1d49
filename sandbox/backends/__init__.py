"""Which backend runs: the registry of executors of a Plan, and the choice.

A backend is a module of this package that defines `BACKEND`, an object
implementing `contract.Backend`: it declares what it can do (its `traits`,
sandbox.capabilities), says whether it can run on this host and starts a
command under a Plan, returning a `contract.Handle` on it. It interprets
the Plan and decides nothing (decisions are `sandbox.plan`'s, refusals
`sandbox.refusal`'s, both by capability). Adding one means a module and a
line in `NAMES`. This module is the registry: it loads backends by name,
chooses one, and reads the host as it is for one (`host_for`); backends
import only the contract.

A backend may serve only where the environment says it does, as anyio finds
the running event loop: its `applies()` (optional) says whether this process
is there, and its availability is then read at each choice, never cached.
"auto" skips it where it does not apply, without naming it, and tries it
first where it does: the brokered executor, inside a task sandbox.
"""

from __future__ import annotations

import functools
import importlib
import threading
from collections.abc import Callable, Iterator

from .. import netpool
from ..capabilities import ALL, Capability, Traits
from ..errors import SpecError, UnavailableError
from ..forksafe import fresh_in_child
from ..host import HostInfo
from ..plan import Plan
from .contract import Backend, Ended, ExitSource, Handle, WaitStatus
from .handle import ProcessHandle

__all__ = ["NAMES", "Backend", "Ended", "ExitSource", "Handle", "ProcessHandle", "WaitStatus", "availability",
           "choose", "get", "host_for", "launch", "serves_here"]

NAMES = ("brokered", "native", "bwrap")  # the order "auto" tries them in
# chosen only by name: sandbox.Template's executor; a process of its own running the blob (sandbox-launch)
EXPLICIT = ("template", "blob")
_CHOICES = ", ".join(repr(n) for n in ("auto", *NAMES, *EXPLICIT[:-1])) + f" or {EXPLICIT[-1]!r}"


class _Missing:
    """Stands for a backend whose module cannot be imported (e.g. the compiled core is not built)."""

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        # what it could do is unknown: plans are compiled as if it could do anything, and it runs nothing
        self.traits = Traits(name, f"the {name} backend", ALL)

    def available(self) -> tuple[bool, str]:
        return False, self.reason

    def launch(self, plan: Plan, argv: list[str], stdio: tuple[int, int, int],
               pass_fds: tuple[int, ...]) -> Handle:
        raise UnavailableError(f"{self.name} backend unavailable: {self.reason}")


@functools.cache
def get(name: str) -> Backend:
    """The backend called `name` (SpecError, a ValueError, for an unknown name)."""
    if name not in NAMES + EXPLICIT:
        raise SpecError("backend", name, f"must be {_CHOICES}")
    try:
        module = importlib.import_module(f"{__name__}.{name}")
    except ImportError as exc:
        return _Missing(name, str(exc))
    backend: Backend = module.BACKEND
    return backend


def host_for(name: str) -> HostInfo:
    """The host as a Plan for the backend `name` sees it (HostInfo.current of
    its traits). The one side effect, and the reason it is here and not in
    the facts: a backend that can join a pooled network namespace gets the
    process-wide pool started, filling in the background (sandbox.netpool)."""
    traits = get(name).traits
    if traits.can(Capability.JOIN_POOLED_NETNS):
        netpool.pool_for("none")
    return HostInfo.current(traits)


_lock = threading.Lock()
fresh_in_child(globals(), "_lock")


@functools.cache
def _availability(name: str) -> tuple[bool, str]:
    return get(name).available()


def serves_here(name: str) -> bool:
    """Whether the backend `name` serves this process (one without `applies` serves anywhere)."""
    applies = _applies(get(name))
    return applies is None or bool(applies())


def _applies(backend: Backend) -> Callable[[], bool] | None:
    """A backend's `applies`, if it is found from the environment (optional in the contract)."""
    applies: Callable[[], bool] | None = getattr(backend, "applies", None)
    return applies


def _candidates() -> Iterator[str]:
    """The backends "auto" tries here, in order (each loaded only when the one before it is refused)."""
    return (name for name in NAMES if serves_here(name))


def availability(name: str, refresh: bool = False) -> tuple[bool, str]:
    """`get(name).available()`, cached per process (`refresh=True` asks again), unless the backend is found
    from the environment (it has `applies`): that is read again at each call."""
    backend = get(name)
    if _applies(backend) is not None:
        return backend.available()
    return _cached_availability(name, refresh)


def _cached_availability(name: str, refresh: bool = False) -> tuple[bool, str]:
    with _lock:
        if refresh:
            _availability.cache_clear()
        return _availability(name)


def choose(requested: str) -> tuple[str, str]:
    """(backend name, reason) for a request of `requested` ("auto" or a name).

    Raises UnavailableError if the requested backend (or, for "auto", every
    backend) cannot run here, SpecError (a ValueError) for an unknown name.
    """
    if not isinstance(requested, str) or requested not in ("auto", *NAMES, *EXPLICIT):
        raise SpecError("backend", requested, f"must be {_CHOICES}")
    if requested != "auto":
        ok, reason = availability(get(requested).name)
        if not ok:
            raise UnavailableError(f"{requested} backend unavailable: {reason}")
        return requested, "requested"
    refused: list[tuple[str, str]] = []
    for name in NAMES:
        backend = get(name)
        applies = _applies(backend)
        if applies is None:
            ok, reason = _cached_availability(name)
        elif applies():
            ok, reason = backend.available()
        else:
            continue  # not where it serves: not named either
        if ok:
            if applies is not None:  # found from the environment: its reason says where it is
                return name, f"auto: {reason}"
            if not refused:
                return name, f"auto: this host allows the {name} path"
            return name, "auto: " + "; ".join(f"{n} refused ({why})" for n, why in refused)
        refused.append((name, reason))
    raise UnavailableError("no sandbox backend: " + "; ".join(f"{n}: {why}" for n, why in refused))


def launch(name: str, plan: Plan, argv: list[str], stdio: tuple[int, int, int],
           pass_fds: tuple[int, ...]) -> Handle:
    """`get(name).launch(...)`. An UnavailableError (the backend found it cannot
    sandbox here) names every backend's reason when none of the others can either."""
    try:
        return get(name).launch(plan, argv, stdio, pass_fds)
    except UnavailableError as exc:
        tried = tuple(_candidates())
        others = {n: availability(n) for n in tried if n != name}
        if not others or any(ok for ok, _ in others.values()):
            raise
        prefix = f"{name} backend unavailable: "
        own = str(exc).removeprefix(prefix)
        named = tried if name in tried else (name, *tried)
        reasons = [f"{n}: {own if n == name else others[n][1]}" for n in named]
        raise UnavailableError("no sandbox backend: " + "; ".join(reasons)) from None
