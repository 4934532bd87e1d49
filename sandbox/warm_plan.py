"""Planning for warm sandboxes: which of a Plan's operations a template
process prepares once, and which each sandbox cloned or forked from it into a
copy of that root does afresh, in place (newroot "/"). Pure, like sandbox.plan,
whose decisions these are. Two executors use it: sandbox.Template
(template_plans, plan_for_call: a resident C process clones sandboxes that
exec a command) and sandbox.WorkerPool (zygote_plan, task_plan: an
interpreter forks sandboxes that run a function).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from . import spec as S
from .errors import SpecError
from .host import HostInfo
from .paths import root_holding
from .plan import (
    DEFAULT_PATH,
    Op,
    OpFlag,
    OpKind,
    Plan,
    command_path,
    compile_mount,
    landlock_rules,
    maps_root_first,
    plan_cgroup,
    plan_rlimits,
)
from .refusal import CAP_NET_ADMIN, CAP_SETFCAP, CAP_SYS_ADMIN, refusal
from .seccomp.resident import allows_resident, refuses_keyrings
from .warm_overlay import OVERLAY_MOUNTER_CAPS, mounts_overlay, overlay_split

# The ops that mount something over their destination (what a later op at the
# same path, or above it, covers).
MOUNTING = frozenset({OpKind.BIND, OpKind.TMPFS, OpKind.PROC, OpKind.DEV, OpKind.FILE, OpKind.DEVPTS,
                      OpKind.MQUEUE, OpKind.OVERLAY})


def on_mqueue(ops: Sequence[Op], i: int) -> bool:
    """Whether op i is a RemountRo or Chmod that acts on an Mqueue (the last
    mount at or above its path): the template mounts none (each sandbox
    its own), so it leaves that to the sandbox."""
    if ops[i].kind not in (OpKind.REMOUNT_RO, OpKind.CHMOD):
        return False
    below = [op for op in ops[:i] if op.kind in MOUNTING and root_holding(ops[i].dest, (op.dest,))]
    return bool(below) and below[-1].kind is OpKind.MQUEUE


def template_ops(ops: Sequence[Op]) -> tuple[Op, ...]:
    """What the template builds: every op (what its sandboxes make afresh
    needs a mount point), its own procfs without covers (a fresh proc may be
    mounted in a user namespace only where a fully visible one is), then its
    root, /dev, tmpfs and overlays read-only: each is one filesystem shared
    by every sandbox, and read-only mounts stay locked so in their copies.

    A remount acts on the topmost mount at its path, so each is made once
    everything beneath its mount is in place, but before a later op mounts
    over it (at its path or above): made last, the remount of a Tmpfs would
    land on a Bind stacked on it at the same path, and that bind, cloned into
    every sandbox, would be read-only there (a bind's read-only flag is
    locked in a less privileged mount namespace)."""
    out = [replace(op, covers=()) if op.kind is OpKind.PROC
           else Op(OpKind.DIR, op.dest, mode=0o755, parent_mode=op.parent_mode, origin=op.origin)
           if op.kind is OpKind.MQUEUE  # an mqueue: each sandbox's own IPC namespace's
           else Op(OpKind.DIR, op.dest, mode=0o755, origin=op.origin) if on_mqueue(ops, i)
           else op for i, op in enumerate(ops)]
    pending: dict[int, list[Op]] = {}  # op index -> the remounts made right before it (len(ops): at the end)
    shared = [(-1, Op(OpKind.REMOUNT_RO, "/", flags=OpFlag.RDONLY | OpFlag.NODEV | OpFlag.NOSUID))
              ] if not any(op.dest == "/" and op.kind is OpKind.BIND for op in ops) else []
    shared += [(i, Op(OpKind.REMOUNT_RO, op.dest, flags=OpFlag.RDONLY | OpFlag.NODEV | OpFlag.NOSUID,
                      origin=op.origin))
               for i, op in enumerate(ops) if op.kind in (OpKind.DEV, OpKind.TMPFS, OpKind.OVERLAY)]
    for i, remount in shared:
        cover = next((j for j in range(i + 1, len(ops))
                      if ops[j].kind in MOUNTING and root_holding(remount.dest, (ops[j].dest,))), len(ops))
        pending.setdefault(cover, []).append(remount)
    ordered: list[Op] = []
    for j, op in enumerate(out):
        ordered += [*pending.get(j, ()), op]
    return tuple(ordered + pending.get(len(ops), []))


def covered(ops: Sequence[Op], i: int) -> bool:
    """Whether a later op of `ops` mounts over op i (at its path or above)."""
    return any(op.kind in MOUNTING and root_holding(ops[i].dest, (op.dest,)) for op in ops[i + 1:])


def sandbox_ops(ops: Sequence[Op]) -> tuple[Op, ...]:
    """What each sandbox of a Template applies on its copy of the template's
    root, so that nothing one writes is visible to another: a fresh tmpfs for
    every Tmpfs, a fresh proc (with its covers) and mqueue, a fresh /dev/shm
    and devpts on a Dev still in view, a private copy of every writable File;
    and every op at or beneath one of those again (they cover the
    template's): binds then come from the copy itself, and an Overlay too
    (the template's, read-only: one mount shared by every sandbox)."""
    fresh: list[str] = []
    out: list[Op] = []
    for i, op in enumerate(ops):
        inside = root_holding(op.dest, fresh) is not None
        if op.kind is OpKind.DEV and not inside:
            if covered(ops, i):
                continue  # its shm and pts would land on what covers it
            shm, pts = posixpath.join(op.dest, "shm"), posixpath.join(op.dest, "pts")
            out += [Op(OpKind.TMPFS, shm, mode=op.shm_mode, flags=OpFlag.NODEV, origin=op.origin),
                    Op(OpKind.DEVPTS, pts, origin=op.origin)]
            fresh += [shm, pts]
        elif op.kind in (OpKind.TMPFS, OpKind.DEV, OpKind.PROC, OpKind.MQUEUE):
            out.append(op)  # an mqueue: its own IPC namespace's queues, not the template's
            fresh.append(op.dest)
        elif op.kind in (OpKind.BIND, OpKind.OVERLAY) and inside:
            # cloned from the copy before anything covers it
            out.append(replace(op, src=op.dest) if op.kind is OpKind.BIND else
                       Op(OpKind.BIND, op.dest, src=op.dest, flags=OpFlag.RDONLY | OpFlag.NOSUID | OpFlag.NODEV,
                          parent_mode=op.parent_mode, origin=op.origin))
        elif op.kind is OpKind.FILE and not inside and not op.flags & OpFlag.RDONLY:
            out.append(replace(op, flags=op.flags | OpFlag.FRESH))
            fresh.append(op.dest)
        elif inside:
            out.append(op)
    return tuple(out)


# WorkerPool's zygote: a template whose sandboxes are forks of it (sbx_fork_sandbox).

# The zygote's uid when its tasks run as uid 0. A user namespace that maps its
# parent's uid 0 may only be made by a creator that held CAP_SETFCAP (the
# kernel's verify_root_map); the zygote runs task-free code but holds no
# capability at all, so it runs as this uid, and its tasks map their 0 onto it
# (the same id outside).
ZYGOTE_ROOT_STAND_IN = 1


def zygote_plan(plan: Plan) -> Plan:
    """The plan of a WorkerPool's zygote, from which tasks of `plan` are
    forked: template_ops' root (its proc uncovered, its root, /dev and tmpfs
    read-only), a reaper as pid 1 and the caller's death as its end, never
    uid 0 (ZYGOTE_ROOT_STAND_IN), no capability, and nothing each task applies
    itself: seccomp (tasks create user namespaces), Landlock (it would bind
    the tasks' per-task binds too), rlimits, cgroup limits (each task has a
    cgroup of its own), disable_userns."""
    uid = plan.uid if plan.uid != 0 else ZYGOTE_ROOT_STAND_IN
    map_root = maps_root_first(plan.user_ns, plan.ops, uid, plan.gid)
    return replace(plan, ops=template_ops(plan.ops), uid=uid, map_root_first=map_root, nested_userns=map_root,
                   disable_userns=False, rlimits=(), keep_caps=0, die_with_parent=True, reaper=True, seccomp=b"",
                   landlock=False, landlock_best_effort=False, landlock_rules=(), forward=(), check_network=False,
                   cgroup=None, limits_mechanism="rlimit")


def task_plan(plan: Plan, zygote: Plan) -> Plan:
    """The plan of one task forked from `zygote` (zygote_plan(plan)):
    sandbox_ops on its copy of the zygote's root; new user (its ids mapped
    onto the zygote's), mount, pid (the task is their pid 1), ipc, uts and
    loopback-only network namespaces; and plan's own seccomp, Landlock,
    rlimits, capabilities, cwd and probe paths."""
    map_root = maps_root_first(True, plan.ops, plan.uid, plan.gid)  # a task always has a user namespace
    return replace(plan, ops=sandbox_ops(plan.ops), user_ns=True, mount_ns=True, pid_ns=True, network="none",
                   recycle_lease=False, ipc_ns=True, uts_ns=True, host_uid=zygote.uid, host_gid=zygote.gid,
                   map_root_first=map_root, nested_userns=map_root or plan.disable_userns, hostname=None,
                   die_with_parent=True, reset_signals=False, reaper=False, forward=(), check_network=False)


def with_task_binds(plan: Plan, binds: Sequence[S.Bind]) -> Plan:
    """`plan` (a task_plan) with per-task binds on top, in order, their source
    trees cloned by the caller and handed over (FROM_FD): the task cannot see
    the host. Their Landlock rules join the plan's."""
    extra = []
    for i, bind in enumerate(binds):
        if not isinstance(bind, S.Bind):
            raise SpecError(f"binds[{i}]", bind, "must be a Bind, RoBind or DevBind")
        op = compile_mount(i, bind, True)
        extra.append(replace(op, flags=op.flags | OpFlag.FROM_FD))
    rules = dict(plan.landlock_rules)
    for path, writable in landlock_rules(tuple(extra)):
        rules[path] = rules.get(path, False) or writable
    return replace(plan, ops=plan.ops + tuple(extra), landlock_rules=tuple(rules.items()) if plan.landlock else ())


# sandbox.Template: a resident sandbox-template process clones each sandbox (csrc/template/template.c).

@dataclass(frozen=True)
class TemplatePlans:
    """A Plan split for a Template: `shared` is what its resident process
    runs as (its namespaces, the root it builds, executing its server from an
    fd); `sandbox` is what each sandbox does on a copy of that root (newroot
    "/": the ops apply in place)."""

    shared: Plan
    sandbox: Plan


def server_ops(ops: Sequence[Op]) -> tuple[Op, ...]:
    """What a Template's process builds (warm_plan.template_ops), its /dev
    without devpts: each sandbox mounts its own, and the template then needs
    no uid 0 mapped (devpts wants one in some kernels)."""
    return tuple(replace(op, flags=op.flags | OpFlag.NO_DEVPTS) if op.kind is OpKind.DEV else op
                 for op in template_ops(ops))


def template_plans(plan: Plan) -> TemplatePlans:
    """Split `plan` (one sandbox.refusal accepts for a Template) for a Template.

    The template runs as the ids its sandboxes' id maps name outside
    (plan.host_uid/gid), in its own user namespace; or, when the sandboxes
    join pooled network namespaces, in the pool's user namespace (which owns
    them: joining one needs CAP_SYS_ADMIN there). It keeps CAP_SYS_ADMIN
    (over that user namespace alone: it clones per-call binds in its own
    mount namespace, from the copy of the host tree it keeps) and, as uid 0,
    CAP_SETFCAP (only a creator that had it may map uid 0 into a child user
    namespace) and, when its sandboxes get fresh network namespaces,
    CAP_NET_ADMIN (its standby sandboxes, still in its user namespace, bring
    up their loopback). It has a pid namespace of its own (it is pid 1 and reaps
    every sandbox), shares the caller's ipc, uts and cgroup namespaces (each
    sandbox gets its own as the plan says), and nothing of the command's: no
    seccomp filter (its sandboxes create user namespaces), no Landlock,
    rlimits, cgroup limits (each sandbox enters a cgroup of its own) or
    environment. Its /dev has no devpts, so it needs no uid 0
    mapped (each sandbox maps it during its own setup, as the plan says).
    """
    pooled = plan.network == "pool"
    split = overlay_split(plan.ops) if mounts_overlay(plan.ops) else None  # each sandbox its own overlay root
    caps = (1 << CAP_SYS_ADMIN) | ((plan.host_uid == 0) << CAP_SETFCAP) | (plan.net_ns << CAP_NET_ADMIN)
    caps |= OVERLAY_MOUNTER_CAPS if split else 0
    shared = replace(
        plan, ops=server_ops(split.template if split else plan.ops), user_ns=not pooled, recycle_lease=False,
        ipc_ns=False, uts_ns=False,
        cgroup_ns=False, uid=plan.host_uid, gid=plan.host_gid, map_root_first=False, nested_userns=False,
        disable_userns=False, hostname=None, env=(), path=DEFAULT_PATH, cwd_candidates=("/",), cwd_strict=False,
        rlimits=(), keep_caps=caps,
        die_with_parent=False, new_session=True,
        reaper=False, seccomp=b"", landlock=False, landlock_best_effort=False, landlock_rules=(), probe_paths=(),
        forward=(), check_network=False, exec_fd=True, host_tree=True,
        cgroup=None, limits_fallback=(), limits_mechanism="rlimit",  # each sandbox has a cgroup of its own
    )
    # The template's death ends every sandbox (they live in its pid namespace).
    early = plan.reaper and allows_resident(plan.seccomp)
    ops = split.sandbox if split else sandbox_ops(plan.ops)
    return TemplatePlans(shared=shared, sandbox=replace(plan, ops=ops, die_with_parent=False, seccomp_early=early,
                                                        keys_refused=refuses_keyrings(plan.seccomp)))


def recycle_plan(plan: Plan) -> Plan:
    """`plan` for a Template whose sandboxes are recycled: a network namespace
    of its own rather than one leased from the pool ("pool" serves "none": the
    same loopback-only namespace), since its pid 1 makes a fresh one after each
    request and mounts its proc again in it (csrc/template/template_recycle.c); its
    cgroup limits as recycled_cgroup says."""
    plan = replace(plan, network="none", recycle_lease=False) if plan.network == "pool" else plan
    return recycled_cgroup(plan)


def recycled_cgroup(plan: Plan) -> Plan:
    """`plan`'s cgroup limits for a recycled sandbox, where only the command
    (and what it forks) enters the cgroup made for its request, not the
    sandbox's pid 1: its process limit one fewer, so that pid 1 counts as
    sandbox-init does in every other sandbox's cgroup (at least 1)."""
    limits = plan.cgroup
    if limits is None or limits.pids is None:
        return plan
    return replace(plan, cgroup=replace(limits, pids=max(limits.pids - 1, 1)))


def net_kept_plan(plan: Plan) -> Plan:
    """What a recycled sandbox makes again when it keeps its network
    namespace (no socket left in it): every mount of `plan` but its proc,
    which shows the same pid and network namespaces, nothing of it the
    command's to write (csrc/template/template_recycle.c); but a proc at or beneath
    another of its mounts, which goes when that one is made again."""
    mounts = [op.dest for op in plan.ops if op.kind in MOUNTING and op.kind is not OpKind.PROC]
    return replace(plan, ops=tuple(op for op in plan.ops if op.kind is not OpKind.PROC
                                   or root_holding(op.dest, mounts) is not None))


def plan_for_call(plan: Plan, host: HostInfo, *, env: Mapping[str, str] | None = None, cwd: str | None = None,
                  limits: S.Limits | None = None, binds: Sequence[S.Bind] = (), recycled: bool = False) -> Plan:
    """A sandbox plan with one call's overrides: the complete environment,
    the working directory (must exist), the limits (their cgroup as
    `host.cgroups`, the Template's host cgroups, allows; the rest as rlimits
    under `host.hard_limits`, as sandbox.plan decides; `recycled`: for a
    recycled sandbox, recycled_cgroup), and extra binds (with_task_binds: the
    template's server clones their source trees from its copy of the host
    tree). Refused as sandbox.refusal refuses `host.executor` (the Template's
    traits): UnavailableError when the limits require cgroups this host lacks."""
    changes: dict[str, object] = {}
    if env is not None:
        changes.update(env=tuple(f"{k}={v}" for k, v in env.items()), path=command_path(env))
    if cwd is not None:
        changes.update(cwd_candidates=(cwd,), cwd_strict=True)
    if limits is not None:
        cgroup, fallback = plan_cgroup(limits, host.cgroups)
        changes.update(rlimits=plan_rlimits(limits, host.hard_limits, fallback), cgroup=cgroup,
                       limits_fallback=fallback, require_cgroups=limits.require_cgroups,
                       limits_mechanism=host.cgroups.mechanism if cgroup is not None else "rlimit")
    if not changes and not binds:
        return plan
    plan = replace(plan, **changes) if changes else plan  # type: ignore[arg-type]
    plan = recycled_cgroup(plan) if recycled and limits is not None else plan
    plan = with_task_binds(plan, binds) if binds else plan
    # what refusal() reads a call can change only by its limits (the cgroup, require_cgroups) and binds
    # (ops); an environment or a cwd alone skips it: ~30 µs of a warm spawn
    refused = refusal(plan, host) if limits is not None or binds else None
    if refused is not None:
        raise refused
    return plan
