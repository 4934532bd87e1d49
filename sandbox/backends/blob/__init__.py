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

`BACKEND.launch` runs sandbox-launch as the caller's child: a setup failure
is its exit status 125 and one "sandbox: ..." line on the command's stderr
(the launcher's contract), not a typed error, and the command gets its stdio
only. The timings are the launcher's start alone: its stages are not reported.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import time

from ...capabilities import ALL, Capability, Traits
from ...errors import SpecError
from ...plan import Plan
from ..contract import Backend, FunctionsBackend, Handle, WaitStatus
from ..handle import ProcessHandle

__all__ = ["BACKEND", "LAUNCHER_NAME", "TRAITS", "available", "launch", "launcher_path"]

LAUNCHER_NAME = "sandbox-launch"

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
    from ..native import available as native_available  # here: sandbox.launcher reads TRAITS without the core

    ok, reason = native_available()
    if not ok:
        return ok, reason
    if not os.access(launcher_path(), os.X_OK):
        return False, f"{LAUNCHER_NAME} missing at {launcher_path()}; reinstall the package"
    return True, f"native namespaces work and {LAUNCHER_NAME} is installed"


class _LaunchedHandle(ProcessHandle):
    """sandbox-launch as the sandbox's first process seen from here: it passes
    signals on, but a SIGKILL would end it alone (its sandbox dies with it only
    when the plan says die_with_parent), so its children are killed first."""

    def signal(self, sig: int) -> None:
        if sig == signal.SIGKILL and self.pid > 0:
            with contextlib.suppress(OSError), open(f"/proc/{self.pid}/task/{self.pid}/children") as f:
                for child in f.read().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(child), signal.SIGKILL)
        super().signal(sig)


def launch(plan: Plan, argv: list[str], stdio: tuple[int, int, int], pass_fds: tuple[int, ...]) -> Handle:
    """Start sandbox-launch with the plan and `argv`, its stdio `stdio` and the plan's environment."""
    from ..native import blob_for  # here: sandbox.launcher reads TRAITS without the core

    if pass_fds:
        raise SpecError("pass_fds", pass_fds, f"{LAUNCHER_NAME} gives its command stdio only")
    path = launcher_path()
    words = [path, "--plan", base64.b64encode(blob_for(plan)).decode(), "--", *argv]
    env = dict(entry.split("=", 1) for entry in plan.env if "=" in entry)
    start = time.monotonic()
    # posix_spawn: a vfork-like clone, never a copy of the caller's page tables
    # -1: the caller's own, inherited as a command it execs would inherit it; a source that is another
    # stdio slot is copied above them first, so that no dup2 overwrites what a later one reads
    copies = [os.dup(fd) if 0 <= fd < 3 and fd != i else -1 for i, fd in enumerate(stdio)]
    try:
        actions = [(os.POSIX_SPAWN_DUP2, copy if copy >= 0 else fd, i)
                   for i, (fd, copy) in enumerate(zip(stdio, copies, strict=True)) if fd >= 0]
        pid = os.posix_spawn(path, words, env, file_actions=actions, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
    finally:
        for copy in copies:
            if copy >= 0:
                os.close(copy)
    spawned = (time.monotonic() - start) * 1e6
    timings = {"start": 0.0, "child": spawned, "ready": spawned, "exec": spawned}
    return _LaunchedHandle(pid, WaitStatus(), timings)


BACKEND: Backend = FunctionsBackend(TRAITS, available, launch)
