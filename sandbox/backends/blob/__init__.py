"""The blob executor: a process of its own runs the serialized plan.

`sandbox-launch --plan BASE64 -- COMMAND` (csrc/client/launcher.c, for harnesses
that run an argv themselves: sandbox.launcher) and the CLI client answered
with a plan (csrc/client/cliplan.c, sandbox.cliserver.fastpath) both start a
sandbox from the native core's blob, as their own child, and then only pass
it signals and wait: nothing of the caller's Python runs after the spawn.
What needs that Python (a relay of forwarded ports, the network check, the
caller's sync fds, a pooled network namespace, a cgroup made for the
sandbox, namespaces handed over) is what its `TRAITS` leave out, so
sandbox.refusal refuses such a plan before anything runs, by capability.

`BACKEND.launch` runs sandbox-launch as the caller's child with a pipe whose
write end only the launcher holds (`--report-fd`, blob/report.py): through it
the launcher reports the sandbox's start (its timing stamps) or its setup's
failure record, so `launch` returns once the command has been exec'd, or
raises the typed error the native backend raises (SetupError, ExecError,
IsolationError). A launcher that cannot be started (its report pipe, its
posix_spawn) or that ends before it reports is SetupError(step="launch").
The command keeps its stdio and `pass_fds` (`--pass-fd`).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ... import isolation
from ..._core.peer import child_pidfd
from ...capabilities import ALL, Capability, Traits
from ...errors import SetupError
from ...plan import Plan
from ..contract import Backend, FunctionsBackend, Handle, WaitStatus
from ..handle import ProcessHandle

__all__ = ["BACKEND", "LAUNCHER_NAME", "TRAITS", "available", "launch", "launcher_path"]

LAUNCHER_NAME = "sandbox-launch"
T = TypeVar("T")

# What only the caller's Python could do once the sandbox has started, or
# before (a pooled namespace it leases, a cgroup it makes): a process that
# runs the blob alone has none of it.
TRAITS = Traits("blob", LAUNCHER_NAME, ALL - {
    Capability.JOIN_POOLED_NETNS, Capability.CGROUPS, Capability.HANDED_NAMESPACES, Capability.FORWARD,
    Capability.SYNC_FDS}, because={
    Capability.FORWARD: "no process of the caller's relays the ports or checks the namespace",
    Capability.SYNC_FDS: "the caller's fds stay with the caller",
})


def launcher_path() -> str:
    """Where the package build put sandbox-launch (it may be missing)."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(package, "_bin", LAUNCHER_NAME)


def available() -> tuple[bool, str]:
    """The native core works here and sandbox-launch is installed."""
    from ..native import available as native_available  # lazy: sandbox.launcher reads TRAITS without the core

    ok, reason = native_available()
    if not ok:
        return ok, reason
    if not os.access(launcher_path(), os.X_OK):
        return False, f"{LAUNCHER_NAME} missing at {launcher_path()}; reinstall the package"
    return True, f"native namespaces work and {LAUNCHER_NAME} is installed"


def launch(plan: Plan, argv: list[str], stdio: tuple[int, int, int], pass_fds: tuple[int, ...]) -> Handle:
    """Start sandbox-launch with the plan and `argv`, its stdio `stdio` and the plan's environment; return
    once the command has been exec'd, or raise its setup's typed error."""
    # lazy: sandbox.launcher reads TRAITS without the core
    from ..native import blob_for
    from .report import read_record, started

    blob = blob_for(plan)
    kept = [fd for fd in pass_fds if fd >= 3]  # 0-2: the command's stdio, as natively
    r, w = _launcher_call("pipe2 (its report pipe)", os.pipe2, os.O_CLOEXEC)
    try:
        if w < 3:  # above stdio, which the spawn's dup2s overwrite
            w, low = _launcher_call("fcntl(F_DUPFD_CLOEXEC) (its report pipe)", fcntl.fcntl, w,
                                    fcntl.F_DUPFD_CLOEXEC, 3), w
            os.close(low)
        since = time.monotonic_ns()
        words = [launcher_path(), "--report-fd", str(w), *(word for fd in kept for word in ("--pass-fd", str(fd)))]
        pid = _launcher_call("posix_spawn", _spawn, [*words, "--plan", base64.b64encode(blob).decode(), "--", *argv],
                             plan, stdio, (w, *kept))
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)

    try:
        data = read_record(r)
    except BaseException:  # interrupted: the sandbox, if it started, goes with its launcher
        _kill_launched(pid)
        raise
    finally:
        os.close(r)
    sandbox_pid, timings, landlock_abi = started(data, pid, blob, argv, since, LAUNCHER_NAME)
    findings = isolation.findings(plan, None)
    if plan.landlock:
        findings["landlock_abi"] = landlock_abi  # 0: best-effort, and the kernel has none
    # sandbox-launch passes signals on; its child, the sandbox's pid 1, is the first process inside: a
    # SIGKILL, which would end the launcher alone, reaches it too, and the sandbox has ended once it has gone
    return ProcessHandle(pid, WaitStatus(), timings, isolation=findings, sandbox_pid=sandbox_pid,
                         first_pidfd=child_pidfd(sandbox_pid, pid))


def _kill_launched(pid: int) -> None:
    """Kill sandbox-launch `pid` and its sandbox, whose pid is not known yet (its children), and reap it."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{pid}/children") as f:
        for child in f.read().split():
            with contextlib.suppress(OSError):
                os.kill(int(child), signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _launcher_call(what: str, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)`, a step of starting sandbox-launch itself: its failure (the report pipe not made, the
    launcher not spawned: nothing of the sandbox exists yet) is SetupError(step="launch") with its errno."""
    try:
        return call(*args)
    except OSError as exc:
        raise SetupError(f"{LAUNCHER_NAME} could not be started: {what}: {os.strerror(exc.errno or 0)}",
                         step="launch", errno=exc.errno or 0, backend="blob") from exc


def _spawn(words: list[str], plan: Plan, stdio: tuple[int, int, int], kept: tuple[int, ...]) -> int:
    """posix_spawn sandbox-launch, with `kept` open at their numbers: a vfork-like clone, never a copy of the
    caller's page tables."""
    env = dict(entry.split("=", 1) for entry in plan.env if "=" in entry)
    # -1: the caller's own, inherited as a command it execs would inherit it; a source that is another
    # stdio slot is copied above them first, so that no dup2 overwrites what a later one reads
    copies = [os.dup(fd) if 0 <= fd < 3 and fd != i else -1 for i, fd in enumerate(stdio)]
    try:
        actions = [(os.POSIX_SPAWN_DUP2, copy if copy >= 0 else fd, i)
                   for i, (fd, copy) in enumerate(zip(stdio, copies, strict=True)) if fd >= 0]
        # dup2 onto itself: the fd stays where it is, its close-on-exec cleared for this exec alone
        actions += [(os.POSIX_SPAWN_DUP2, fd, fd) for fd in kept]
        return os.posix_spawn(words[0], words, env, file_actions=actions, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    finally:
        for copy in copies:
            if copy >= 0:
                os.close(copy)


BACKEND: Backend = FunctionsBackend(TRAITS, available, launch)
