"""Planning for warm sandboxes: which of a Plan's operations a template
process prepares once, and which each sandbox cloned or forked from it into a
copy of that root does afresh, in place (newroot "/"). Pure, like sandbox.plan,
whose decisions these are.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import replace

from . import spec as S
from .errors import SpecError
from .plan import Op, OpFlag, OpKind, Plan, compile_mount, landlock_rules


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def template_ops(ops: Sequence[Op]) -> tuple[Op, ...]:
    """What the template builds: every op (what its sandboxes make afresh
    needs a mount point), its own procfs without covers (a fresh proc may be
    mounted in a user namespace only where a fully visible one is), then its
    root, /dev and tmpfs read-only: each is one filesystem shared by every
    sandbox, and read-only mounts stay locked so in their copies."""
    out = [replace(op, covers=()) if op.kind is OpKind.PROC else op for op in ops]
    if not any(op.dest == "/" and op.kind is OpKind.BIND for op in ops):
        out.append(Op(OpKind.REMOUNT_RO, "/", flags=OpFlag.RDONLY | OpFlag.NODEV | OpFlag.NOSUID))
    out += [Op(OpKind.REMOUNT_RO, op.dest, flags=OpFlag.RDONLY | OpFlag.NODEV | OpFlag.NOSUID,
               origin=op.origin)
            for op in ops if op.kind in (OpKind.DEV, OpKind.TMPFS)]
    return tuple(out)


def sandbox_ops(ops: Sequence[Op]) -> tuple[Op, ...]:
    """What each sandbox of a Template applies on its copy of the template's
    root, so that nothing one writes is visible to another: a fresh tmpfs for
    every Tmpfs, a fresh proc (with its covers), a fresh /dev/shm and devpts,
    a private copy of every writable File; and every op beneath one of those
    again (they cover the template's): binds then come from the copy itself."""
    fresh: list[str] = []
    out: list[Op] = []
    for op in ops:
        inside = _under(op.dest, fresh)
        if op.kind is OpKind.DEV and not inside:
            shm, pts = posixpath.join(op.dest, "shm"), posixpath.join(op.dest, "pts")
            out += [Op(OpKind.TMPFS, shm, mode=op.shm_mode, flags=OpFlag.NODEV, origin=op.origin),
                    Op(OpKind.DEVPTS, pts, origin=op.origin)]
            fresh += [shm, pts]
        elif op.kind in (OpKind.TMPFS, OpKind.DEV, OpKind.PROC):
            out.append(op)
            fresh += [op.dest] if op.kind is not OpKind.PROC else []
        elif op.kind is OpKind.BIND and inside:
            out.append(replace(op, src=op.dest))  # cloned from the copy before anything covers it
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
    the tasks' per-task binds too), rlimits, disable_userns."""
    uid = plan.uid if plan.uid != 0 else ZYGOTE_ROOT_STAND_IN
    map_root = plan.user_ns and any(op.kind is OpKind.DEV for op in plan.ops) and (uid, plan.gid) != (0, 0)
    return replace(plan, ops=template_ops(plan.ops), uid=uid, map_root_first=map_root, nested_userns=map_root,
                   disable_userns=False, rlimits=(), keep_caps=0, die_with_parent=True, reaper=True, seccomp=b"",
                   landlock=False, landlock_best_effort=False, landlock_rules=(), forward=(), check_network=False)


def task_plan(plan: Plan, zygote: Plan) -> Plan:
    """The plan of one task forked from `zygote` (zygote_plan(plan)):
    sandbox_ops on its copy of the zygote's root; new user (its ids mapped
    onto the zygote's), mount, pid (the task is their pid 1), ipc, uts and
    loopback-only network namespaces; and plan's own seccomp, Landlock,
    rlimits, capabilities, cwd and probe paths."""
    map_root = any(op.kind is OpKind.DEV for op in plan.ops) and (plan.uid, plan.gid) != (0, 0)
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
