"""Which backend must refuse which Plan, decided before anything runs.

`refusal(plan, host)` is asked by every entry point (spawn, Template,
WorkerPool, explain) once the Plan is compiled, so every backend refuses
the same sandbox with the same typed error at the same moment, before a
process or mount exists. Pure, like sandbox.plan: what it knows of the
caller comes in as a HostInfo.
"""

from __future__ import annotations

import errno as E

from . import spec as S
from .errors import SandboxError, SetupError, SpecError, UnavailableError
from .host import HostInfo
from .plan import OpFlag, OpKind, Plan

# Capability numbers (bits of Plan.keep_caps and HostInfo.effective_caps).
CAP_SYS_ADMIN = S.CAPABILITIES.index("CAP_SYS_ADMIN")  # creating a namespace without a user namespace
CAP_SETFCAP = S.CAPABILITIES.index("CAP_SETFCAP")  # mapping uid 0 into a child user namespace
CAP_NET_ADMIN = S.CAPABILITIES.index("CAP_NET_ADMIN")  # configuring a network namespace (its loopback)


def refusal(plan: Plan, host: HostInfo) -> SandboxError | None:
    """Why `host.backend` must not run `plan`, or None. Decided before
    anything runs, so every backend fails the same way at the same moment."""
    others = plan.mount_ns or plan.pid_ns or plan.net_ns or plan.ipc_ns or plan.uts_ns or plan.cgroup_ns
    joins_userns = plan.sync.userns_fd >= 0  # bwrap is handed a user namespace to create them in
    if (not plan.user_ns and others and not host.is_root and not host.effective_caps >> CAP_SYS_ADMIN & 1
            and not joins_userns):
        # Without a user namespace only root (or a caller holding CAP_SYS_ADMIN
        # in its user namespace, as after joining one) may create namespaces
        # (bwrap would quietly add a user namespace instead).
        return SetupError("Creating new namespace failed: Operation not permitted (no user namespace requested)",
                          step="clone", errno=E.EPERM, backend=host.backend)
    if host.backend != "bwrap" and (plan.sync.userns_fd >= 0 or plan.sync.pidns_fd >= 0):
        return UnavailableError("sync.userns_fd and sync.pidns_fd are for the bwrap backend (natively, the caller "
                                "joins the namespaces itself before it starts the sandbox)")
    if plan.require_cgroups and plan.limits_fallback:
        return UnavailableError(f"limits.require_cgroups: no cgroup for {', '.join(plan.limits_fallback)} on the "
                                f"{host.backend} backend here: {host.cgroups.reason}")
    if host.backend == "template":
        return template_refusal(plan)
    if host.backend != "bwrap":
        return None
    outside = [what for what, used in (("limits", plan.rlimits), ("probe_paths", plan.probe_paths),
                                       ("forward", plan.forward), ("check", plan.check_network)) if used]
    if outside and host.core_missing:
        # The bwrap backend does this work from outside the sandbox, with the
        # compiled core's helpers (entering its namespaces, openat2).
        return UnavailableError(f"the bwrap backend needs the compiled core for {', '.join(outside)}: "
                                f"{host.core_missing}")
    if plan.landlock and not plan.landlock_best_effort:
        return UnavailableError("landlock=True needs the native backend (bwrap has no Landlock support); "
                                "use landlock='best-effort' to run without it under bwrap")
    for op in plan.ops:
        if op.kind is OpKind.BIND and op.flags & OpFlag.RDONLY and not op.flags & OpFlag.NODEV:
            return SpecError(f"mounts[{op.origin}]", op.dest, "bwrap cannot bind read-only with device access")
    return None


# A Template (sandbox.template) executes a Plan in two parts: what its
# resident process prepares once and what each sandbox it clones does;
# sandbox.warm_plan splits it. What it cannot execute is refused here.

def template_refusal(plan: Plan) -> SandboxError | None:
    """Why a Template cannot execute `plan` (then use sandbox.spawn), or None."""
    why = None
    if not plan.user_ns:
        why = "needs a user namespace (its sandboxes are cloned by an unprivileged process)"
    elif not plan.mount_ns:
        why = "needs a mount namespace (each sandbox starts in a copy of the template's root)"
    elif not plan.pid_ns:
        why = "needs a pid namespace (without one its sandboxes would share the template's and see each other)"
    elif plan.forward or plan.check_network:
        why = "does not forward ports or check the network namespace"
    elif any(op.flags & OpFlag.FD_SOURCE for op in plan.ops):
        why = "cannot bind a caller's fd (/proc/self/fd/N would name the template's own)"
    elif plan.keep_caps >> CAP_SYS_ADMIN & 1:
        why = "cannot keep CAP_SYS_ADMIN (a sandbox could unmount what covers the template's shared mounts)"
    elif any(op.dest == "/" and op.kind is OpKind.TMPFS for op in plan.ops):
        why = "cannot make a Tmpfs at / (the root is the template's, shared by its sandboxes)"
    return UnavailableError(f"a Template {why}") if why else None
