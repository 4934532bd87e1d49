"""Which executor must refuse which Plan, decided before anything runs.

`refusal(plan, host)` is asked by every entry point (spawn, Template,
WorkerPool, explain) once the Plan is compiled, so every executor refuses
the same sandbox with the same typed error at the same moment, before a
process or mount exists. It compares what the Plan needs with the
capabilities the executor declares (`host.executor`, sandbox.capabilities),
never with its name. Pure, like sandbox.plan: what it knows of the caller
comes in as a HostInfo.
"""

from __future__ import annotations

import errno as E
from collections.abc import Callable

from . import spec as S
from .capabilities import Capability as C
from .errors import SandboxError, SetupError, SpecError, UnavailableError
from .host import HostInfo
from .plan import OpFlag, OpKind, Plan
from .sync import FD_FIELDS

# Capability numbers (bits of Plan.keep_caps and HostInfo.effective_caps).
CAP_SYS_ADMIN = S.CAPABILITIES.index("CAP_SYS_ADMIN")  # creating a namespace without a user namespace
CAP_SETFCAP = S.CAPABILITIES.index("CAP_SETFCAP")  # mapping uid 0 into a child user namespace
CAP_NET_ADMIN = S.CAPABILITIES.index("CAP_NET_ADMIN")  # configuring a network namespace (its loopback)


def refusal(plan: Plan, host: HostInfo) -> SandboxError | None:
    """Why `host.executor` must not run `plan`, or None. Decided before
    anything runs, so every executor fails the same way at the same moment."""
    for check in (_namespaces_allowed, _cgroups_required, _capabilities):
        refused = check(plan, host)
        if refused is not None:
            return refused
    return None


def _namespaces_allowed(plan: Plan, host: HostInfo) -> SandboxError | None:
    others = plan.mount_ns or plan.pid_ns or plan.net_ns or plan.ipc_ns or plan.uts_ns or plan.cgroup_ns
    joins_userns = plan.sync.userns_fd >= 0  # bwrap is handed a user namespace to create them in
    if (not plan.user_ns and others and not host.is_root and not host.effective_caps >> CAP_SYS_ADMIN & 1
            and not joins_userns):
        # Without a user namespace only root (or a caller holding CAP_SYS_ADMIN
        # in its user namespace, as after joining one) may create namespaces
        # (bwrap would quietly add a user namespace instead).
        return SetupError("Creating new namespace failed: Operation not permitted (no user namespace requested)",
                          step="clone", errno=E.EPERM, backend=host.backend)
    return None


def _cgroups_required(plan: Plan, host: HostInfo) -> SandboxError | None:
    if plan.require_cgroups and plan.limits_fallback:
        return UnavailableError(f"limits.require_cgroups: no cgroup for {', '.join(plan.limits_fallback)} with "
                                f"{host.executor.title} here: {host.cgroups.reason}")
    return None


# What a Plan needs, one capability each, in the order they are checked (the
# first missing one is the refusal): a test of the Plan, and the error of an
# executor that lacks the capability (given its title and its reason).
Need = tuple[C, Callable[[Plan, HostInfo], bool], Callable[[str, str, Plan, HostInfo], SandboxError]]


def _unavailable(what: str) -> Callable[[str, str, Plan, HostInfo], SandboxError]:
    return lambda title, why, plan, host: UnavailableError(f"{title} {what}{why}")


def _outside_work(plan: Plan) -> list[str]:
    return [what for what, used in (("limits", plan.rlimits), ("probe_paths", plan.probe_paths),
                                    ("forward", plan.forward), ("check_network", plan.check_network)) if used]


def _sync_refusal(title: str, why: str, plan: Plan, host: HostInfo) -> SandboxError:
    used = [f"sync.{name}" for name in (*FD_FIELDS, "lock_files") if getattr(plan.sync, name) not in (-1, ())]
    return UnavailableError(f"{', '.join(used)}: {title} cannot report to or wait on the caller's sync fds{why}")


def _pid_1_refusal(title: str, why: str, plan: Plan, host: HostInfo) -> SandboxError:
    cause = "as_pid_1=True" if plan.pid_ns else "no pid namespace (Namespaces(pid=False))"
    return UnavailableError(f"{title} cannot run the command as pid 1 of its sandbox: {cause}{why}")


def _rdonly_dev_bind(plan: Plan) -> tuple[int, str] | None:
    for op in plan.ops:
        if op.kind is OpKind.BIND and op.flags & OpFlag.RDONLY and not op.flags & OpFlag.NODEV:
            return op.origin, op.dest
    return None


def _rdonly_dev_refusal(title: str, why: str, plan: Plan, host: HostInfo) -> SandboxError:
    origin, dest = _rdonly_dev_bind(plan) or (0, "")
    return SpecError(f"mounts[{origin}]", dest, f"{title} cannot bind read-only with device access{why}")


NEEDS: tuple[Need, ...] = (
    (C.HANDED_NAMESPACES, lambda p, h: p.sync.userns_fd >= 0 or p.sync.pidns_fd >= 0,
     lambda title, why, plan, host: UnavailableError(
         f"sync.userns_fd and sync.pidns_fd: {title} cannot create its namespaces inside ones it is handed{why} "
         "(natively, the caller joins them itself before it starts the sandbox)")),
    (C.SYNC_FDS, lambda p, h: p.sync.active, _sync_refusal),
    (C.WITHOUT_USER_NS, lambda p, h: not p.user_ns, _unavailable("needs a user namespace")),
    (C.WITHOUT_MOUNT_NS, lambda p, h: not p.mount_ns, _unavailable("needs a mount namespace")),
    (C.WITHOUT_PID_NS, lambda p, h: not p.pid_ns, _unavailable("needs a pid namespace")),
    (C.FORWARD, lambda p, h: bool(p.forward or p.check_network),
     _unavailable("does not forward ports or check the network namespace")),
    (C.FD_SOURCE, lambda p, h: any(op.flags & OpFlag.FD_SOURCE for op in p.ops),
     _unavailable("cannot bind a caller's fd")),
    (C.KEEP_SYS_ADMIN, lambda p, h: bool(p.keep_caps >> CAP_SYS_ADMIN & 1),
     _unavailable("cannot keep CAP_SYS_ADMIN")),
    (C.KEEP_CAPS, lambda p, h: p.keep_caps != 0, _unavailable("cannot let the command keep a capability: cap_add")),
    (C.COMMAND_AS_PID_1, lambda p, h: not p.reaper, _pid_1_refusal),
    (C.TMPFS_ROOT, lambda p, h: any(op.dest == "/" and op.kind is OpKind.TMPFS for op in p.ops),
     _unavailable("cannot make a Tmpfs at /")),
    (C.SELF_CONTAINED_SETUP, lambda p, h: bool(_outside_work(p) and h.core_missing),
     lambda title, why, plan, host: UnavailableError(f"{title} needs the compiled core for "
                                               f"{', '.join(_outside_work(plan))}{why}: {host.core_missing}")),
    (C.LANDLOCK, lambda p, h: p.landlock and not p.landlock_best_effort,
     lambda title, why, plan, host: UnavailableError(
         f"landlock=True: {title} has no Landlock support{why}; use landlock='best-effort' to run without it")),
    (C.RDONLY_DEV_BIND, lambda p, h: _rdonly_dev_bind(p) is not None, _rdonly_dev_refusal),
    (C.OVERLAY, lambda p, h: any(op.kind is OpKind.OVERLAY for op in p.ops),
     _unavailable("cannot mount an Overlay (an image root: sandbox.presets.image(..., root='merged') "
                  "binds a merged tree instead)")),
    (C.JOIN_POOLED_NETNS, lambda p, h: p.network == "pool",
     _unavailable("cannot join a network namespace leased from the process-wide pool")),
    (C.CGROUPS, lambda p, h: p.cgroup is not None, _unavailable("cannot place the sandbox in a cgroup of its own")),
)


def _capabilities(plan: Plan, host: HostInfo) -> SandboxError | None:
    executor = host.executor
    for capability, needed, error in NEEDS:
        if not executor.can(capability) and needed(plan, host):
            return error(executor.title, executor.why_not(capability), plan, host)
    return None
