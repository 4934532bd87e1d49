"""The brokered executor: inside a task sandbox, a sandbox is started beside it by the task's broker.

A task sandbox's seccomp policy denies new namespaces, so a Spec cannot be
started in one; its broker (sandbox.task.broker, on the trusted side,
reached at the socket SANDBOX_TASK_BROKER names) starts it instead, beside
the task sandbox, as narrow as the task sandbox or narrower. This executor
is found from the environment, the way anyio finds the running event loop:
`applies()` is "SANDBOX_TASK_BROKER is set", and "auto" tries it before the
others, so no caller tests where it runs.

The broker plans the sandbox again from a task description
(`description.description_of`, of the Spec the Plan was
compiled from: `Plan.source`), so what a description cannot show is
refused by name before anything is sent (a SpecError naming the field), and
what this executor cannot do at all is a missing capability below, refused
by sandbox.refusal as every executor's is. The command gets its stdio only.
`timings`, `isolation` and `usage` are empty: they are measured beside this
sandbox, by the broker, not in it.
"""

from __future__ import annotations

import os
import stat

from ...capabilities import ALL, Capability, Traits
from ...errors import SpecError, UnavailableError
from ...plan import Plan
from ..contract import Backend, FunctionsBackend, Handle

__all__ = ["BACKEND", "BROKER_ENV", "TRAITS", "applies", "available", "broker_path", "launch"]

BROKER_ENV = "SANDBOX_TASK_BROKER"  # inside a task sandbox: the path of its broker's socket

_NARROWS = "a nested sandbox can only narrow the task sandbox it is started from"
_DESCRIBED = "the broker builds the nested sandbox's root from a task description"
_STDIO_ONLY = "the broker takes the command's stdio only"
_LACKS = {
    Capability.WITHOUT_USER_NS: _NARROWS, Capability.WITHOUT_MOUNT_NS: _NARROWS,
    Capability.WITHOUT_PID_NS: _NARROWS, Capability.KEEP_SYS_ADMIN: _NARROWS, Capability.KEEP_CAPS: _NARROWS,
    Capability.LANDLOCK: _NARROWS, Capability.RDONLY_DEV_BIND: _NARROWS, Capability.COMMAND_AS_PID_1: _NARROWS,
    Capability.TMPFS_ROOT: _DESCRIBED, Capability.OVERLAY: _DESCRIBED,
    Capability.FD_SOURCE: _STDIO_ONLY, Capability.SYNC_FDS: _STDIO_ONLY, Capability.HANDED_NAMESPACES: _STDIO_ONLY,
    Capability.JOIN_POOLED_NETNS: "the broker gives it a network namespace of its own",
    Capability.CGROUPS: "the broker places it in the cgroup it makes for it",
}
TRAITS = Traits("brokered", "a nested sandbox", ALL - set(_LACKS), because=_LACKS)


def applies() -> bool:
    """Whether this process is where the executor serves: SANDBOX_TASK_BROKER is set (a task sandbox sets it)."""
    return BROKER_ENV in os.environ


def broker_path() -> str | None:
    """The path of this sandbox's broker socket, None outside a task sandbox; UnavailableError
    when SANDBOX_TASK_BROKER is set but names no socket here."""
    text = os.environ.get(BROKER_ENV)
    if text is None:
        return None
    why = "not an absolute path"
    if text.startswith("/"):
        try:
            why = "not a socket" if not stat.S_ISSOCK(os.stat(text).st_mode) else ""
        except OSError as exc:
            why = exc.strerror or str(exc)
    if why:
        raise UnavailableError(
            f"no sandbox.task broker is reachable: {BROKER_ENV}={text} names no broker socket ({why}; it "
            "names a socket inside a task sandbox: this process is not in one, or the path is covered there)")
    return text


def available() -> tuple[bool, str]:
    """A broker socket is where SANDBOX_TASK_BROKER says (read at each call: the environment may change)."""
    try:
        path = broker_path()
    except UnavailableError as exc:
        return False, str(exc)
    if path is None:
        return False, f"not inside a task sandbox ({BROKER_ENV} is not set)"
    return True, f"inside a task sandbox: its broker ({BROKER_ENV}={path}) starts the sandbox beside it"


def launch(plan: Plan, argv: list[str], stdio: tuple[int, int, int], pass_fds: tuple[int, ...]) -> Handle:
    """Send the task description of `plan.source` to the broker; the handle waits on the request's socket."""
    # lazy: `import sandbox.task` adds about 115 ms to `import sandbox` (python -X importtime), and only a
    # process inside a task sandbox that starts a sandbox pays it
    from .description import description_of
    from .handle import ask

    if pass_fds:
        raise SpecError("pass_fds", pass_fds, "a nested sandbox gets its stdio only (no other fds)")
    if plan.source is None:
        raise UnavailableError("the brokered executor starts a Spec: this Plan was not compiled from one")
    path = broker_path()
    if path is None:
        raise UnavailableError(f"brokered backend unavailable: not inside a task sandbox ({BROKER_ENV} is not set)")
    description = description_of(plan.source)
    return ask(path, {"kind": "task", "sandbox": description.to_dict()}, argv, stdio)


BACKEND: Backend = FunctionsBackend(TRAITS, available, launch, applies=applies)
