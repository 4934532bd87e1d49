"""The Template backend: a third executor of the same Plan.

A Plan is split (sandbox.warm_plan.template_plans) into what a resident process,
sandbox-template (csrc/template/template.c), prepares once and what each sandbox it
clones does on a copy of that root. This module starts such servers and asks
them for sandboxes: per call it clones the extra binds' source trees, leases
a network namespace when the plan runs in the pool, and hands both over with
the stdio and passed fds. sandbox.Template holds one server; `BACKEND`, for
sandbox.spawn(..., backend="template"), keeps one per plan it has seen.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from ... import isolation, netpool
from ...capabilities import Capability, Traits
from ...cgroups import Walls, hierarchies_for
from ...errors import SandboxError
from ...plan import Plan
from ...warm_plan import TemplatePlans, template_plans
from ..handle import ProcessHandle
from ..native import ReaperStatus, SandboxStatus
from ..native import available as native_available
from ..walls import walls_for, walls_in
from .placed import PlacedCgroups
from .server import TEMPLATE_PATH, Server, Started, launched

__all__ = ["BACKEND", "KEPT_MARKER", "RECYCLE_TRAITS", "TRAITS", "Server", "available", "launch_in"]


def available() -> tuple[bool, str]:
    """The native core works here and sandbox-template is installed."""
    ok, reason = native_available()
    if not ok:
        return ok, reason
    if not TEMPLATE_PATH.exists():
        return False, f"sandbox-template missing at {TEMPLATE_PATH}; reinstall the package"
    return True, "native namespaces work and sandbox-template is installed"


def launch_in(server: Server, plan: Plan, argv: list[str], stdio: tuple[int, int, int],
              pass_fds: tuple[int, ...]) -> ProcessHandle:
    """Start `argv` in a sandbox cloned by `server`, under its sandbox plan
    `plan` (with one call's overrides, sandbox.warm_plan.plan_for_call).

    Its cgroup: with the server in cgroup mode, the one a standby entered
    ahead (placed.py) when the plan's cgroup limits are its Spec's, else
    one made here with the call's, which the standby moves into; without
    cgroup mode, when the plan has cgroup limits, one made here, its entry
    files sent with the request and entered by the sandbox's first process
    before anything of the request runs (in cgroup mode, a call whose
    cgroups would leave one of the standby's hierarchies gets a sandbox the
    server clones)."""
    placed = server.placed
    if placed is not None and (plan.cgroup == server.default.cgroup or _moves_to(placed, plan)):
        return _launch_placed(server, placed, plan, argv, stdio, pass_fds)
    walls = walls_for(plan, "template")
    try:
        fds = walls.cgroup.procs_fds if walls.cgroup is not None else []
        started = _start(server, plan, argv, stdio, pass_fds, fds, own=placed is not None)
        return _handle(plan, started, walls)
    except BaseException:
        walls.remove()  # whatever entered it has been killed or never ran
        raise
    finally:
        if walls.cgroup is not None:
            walls.cgroup.close_fds()


def _moves_to(placed: PlacedCgroups, plan: Plan) -> bool:
    """Whether a standby placed ahead can move into cgroups of the plan's
    limits: they are in every hierarchy its own are in (it leaves them all)."""
    if plan.cgroup is None:
        return False
    theirs = {h.parent for h in hierarchies_for(placed.info, plan.cgroup)}
    return {h.parent for h in hierarchies_for(placed.info, placed.limits)} <= theirs


def _launch_placed(server: Server, placed: PlacedCgroups, plan: Plan, argv: list[str],
                   stdio: tuple[int, int, int], pass_fds: tuple[int, ...]) -> ProcessHandle:
    """A sandbox in a cgroup made ahead, or (other limits than the Spec's)
    in one made now that the standby moves into: the request carries one
    more set made ahead, for the next standby, and the sandbox's report
    names the cgroup it lives in and the one made ahead it left."""
    own = walls_for(plan, "template") if plan.cgroup != server.default.cgroup else None
    tag, ahead = placed.take()
    placed.sending(tag, ahead)
    keep = [False]  # the set goes back to those made ahead, its fds open

    def unsent() -> None:
        keep[0] = placed.give_back(tag)
    try:
        own_fds = own.cgroup.procs_fds if own is not None and own.cgroup is not None else []
        started = _start(server, plan, argv, stdio, pass_fds, own_fds, next_fds=ahead.procs_fds,
                         unsent=unsent)
        if not started.next_used:
            unsent()  # still ours: for the next call
    except BaseException:
        if own is not None:
            own.remove()  # whatever entered it has been killed or never ran
        raise
    finally:
        if own is not None and own.cgroup is not None:
            own.cgroup.close_fds()
        if not keep[0]:
            ahead.close_fds()
    if own is not None:
        if started.cgroup_left:
            placed.discard(started.cgroup_left)  # the standby's, empty since it moved
        return _handle(plan, started, own)
    mine = placed.claim(started.cgroup_tag)
    if mine is None:  # every sandbox of a server in cgroup mode enters a set of ours: a bug
        signal.pidfd_send_signal(started.pidfd, signal.SIGKILL)
        os.close(started.pidfd)
        os.close(started.status_fd)
        if started.lease is not None:
            started.lease.release(wait=False, unprivileged_tenant=True)
        raise SandboxError(f"the template's sandbox reported a cgroup it was not given (tag {started.cgroup_tag})")
    return _handle(plan, started, walls_in(mine, plan))


def _start(server: Server, plan: Plan, argv: list[str], stdio: tuple[int, int, int], pass_fds: tuple[int, ...],
           cgroup_fds: list[int], next_fds: list[int] | None = None, own: bool = False,
           unsent: Callable[[], None] | None = None) -> Started:
    """The request, with a leased network namespace for a pooled plan."""
    lease = None
    if plan.network == "pool":
        pool = server.pool
        if pool is None or pool.closed:
            if unsent is not None:
                unsent()
            raise SandboxError("the network namespace pool this Template leases from was closed "
                               "(netpool.disable()): make a new Template")
        lease = pool.lease()
    # the lease goes to the server, which answers with the one the sandbox lives in (server.Server.spawn)
    return server.spawn(plan, argv, stdio, pass_fds, lease, cgroup_fds, next_fds=next_fds or (), own=own,
                        unsent=unsent)


def _handle(plan: Plan, started: Started, walls: Walls) -> ProcessHandle:
    findings = isolation.findings(plan, None)
    if plan.landlock:
        findings["landlock_abi"] = started.landlock_abi
    on_exit: Callable[[], None] | None = None
    if started.lease is not None:
        held, recycle = started.lease, plan.recycle_lease

        def on_exit() -> None:
            held.release(recycle=recycle, wait=False, unprivileged_tenant=recycle)
    exit_source = SandboxStatus(started.status_fd) if plan.reaper else ReaperStatus(started.status_fd)
    return launched(started, exit_source, findings, on_exit, walls)


# The argv[0] of the servers sandbox.spawn(..., backend="template") keeps for the process's life.
KEPT_MARKER = "sandbox-template-kept"


# A Template's sandboxes are cloned by its unprivileged resident process, each
# from a copy of one prepared root that all of them share.
TRAITS = Traits("template", "a Template", frozenset({
    Capability.CGROUPS, Capability.JOIN_POOLED_NETNS, Capability.LANDLOCK, Capability.OVERLAY,
    Capability.RDONLY_DEV_BIND, Capability.SELF_CONTAINED_SETUP, Capability.COMMAND_AS_PID_1,
    Capability.KEEP_CAPS}), because={
    Capability.WITHOUT_USER_NS: "its sandboxes are cloned by an unprivileged process",
    Capability.WITHOUT_MOUNT_NS: "each sandbox starts in a copy of the template's root",
    Capability.WITHOUT_PID_NS: "without one its sandboxes would share the template's and see each other",
    Capability.FD_SOURCE: "/proc/self/fd/N would name the template's own",
    Capability.KEEP_SYS_ADMIN: "a sandbox could unmount what covers the template's shared mounts",
    Capability.TMPFS_ROOT: "the root is the template's, shared by its sandboxes",
    Capability.HANDED_NAMESPACES: "its sandboxes are cloned into the template's own",
    Capability.SYNC_FDS: "its sandboxes are cloned by the template's process, which does not hold the caller's fds",
})

# Template(spec, recycle=True): a standby whose command has ended is reset by
# its pid 1 and serves the next request; what that pid 1 could not make again,
# or would have to give up to reset the sandbox, is refused (sandbox.refusal).
# Each request's command enters a cgroup made for that request alone (pid 1
# stays out of it), so cgroup limits are no reason.
RECYCLE_TRAITS = Traits("template-recycle", "Template(recycle=True)", TRAITS.capabilities - {
    Capability.COMMAND_AS_PID_1, Capability.KEEP_CAPS, Capability.OVERLAY, Capability.JOIN_POOLED_NETNS}, because={
    **TRAITS.because,
    Capability.COMMAND_AS_PID_1: "a recycled sandbox's pid 1 is the reaper that resets it",
    Capability.KEEP_CAPS: "a command that keeps a capability is cloned per request, never by a standby",
    Capability.OVERLAY: "each sandbox pivots into an overlay root of its own, which its pid 1 cannot make again",
    Capability.JOIN_POOLED_NETNS: "its pid 1 makes a fresh network namespace after each request",
})


# How many idle servers sandbox.spawn(..., backend="template") keeps: each is
# a process with two standby sandboxes and a few dozen fds, so a caller that
# runs many different Specs this way must not accumulate one per Spec.
MAX_KEPT = 8


class _TemplateBackend:
    """sandbox.spawn(..., backend="template"): one server per plan, kept while
    it is among the MAX_KEPT most recently used or still has sandboxes running."""

    name = TRAITS.name
    traits = TRAITS
    available = staticmethod(available)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[TemplatePlans, Server] = {}  # least recently used first
        self._running: dict[Server, int] = {}  # its sandboxes not reaped yet

    def _take(self, plans: TemplatePlans) -> Server:
        """The server of `plans` (its root the shared plan, its default the
        sandbox plan), counted as running one more sandbox until _ended."""
        stale: list[Server] = []
        with self._lock:
            server = self._servers.pop(plans, None)
            if server is not None and server.pool is not None and server.pool is not netpool.pool_for("pool"):
                stale.append(server)  # made with a pool that has been replaced since: it cannot join the new one's
                server = None
            if server is not None and not server.alive():
                stale.append(server)  # its fds and standbys' remains go with it
                server = None
            if server is None:
                server = Server(plans.shared, plans.sandbox, name=KEPT_MARKER)
            self._servers[plans] = server  # now the most recently used
            self._running[server] = self._running.get(server, 0) + 1  # never evicted while counted
            stale += self._evict()
        for old in stale:
            old.close()
        return server

    def _evict(self) -> list[Server]:
        """Past MAX_KEPT, the least recently used servers with no sandbox running (under the lock)."""
        idle = [k for k, srv in self._servers.items() if not self._running.get(srv)]
        out = []
        for key in idle[:max(0, len(self._servers) - MAX_KEPT)]:
            out.append(self._servers.pop(key))
        return out

    def launch(self, plan: Plan, argv: list[str], stdio: tuple[int, int, int],
               pass_fds: tuple[int, ...]) -> ProcessHandle:
        server = self._take(template_plans(plan))
        try:
            handle = launch_in(server, server.default, argv, stdio, pass_fds)
        except BaseException:
            self._ended(server)
            raise
        hook = handle.on_exit

        def ended() -> None:
            self._ended(server)
            if hook is not None:
                hook()
        handle.on_exit = ended
        return handle

    def _ended(self, server: Server) -> None:
        with self._lock:
            left = self._running.pop(server, 0) - 1
            if left > 0:
                self._running[server] = left

    def kept(self) -> int:
        """How many servers are kept now."""
        with self._lock:
            return len(self._servers)

    def close(self) -> None:
        """Stop every server (and so every sandbox they made)."""
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()


BACKEND = _TemplateBackend()

