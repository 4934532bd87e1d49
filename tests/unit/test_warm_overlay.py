"""A Template's split of a Plan that mounts an Overlay (sandbox.warm_overlay):
the template binds each layer and each bind's source once, at hidden paths;
each sandbox builds a new root from them. Pure: nothing runs."""

from __future__ import annotations

import dataclasses

import pytest

from sandbox import spec as S
from sandbox._core.blob import header
from sandbox.backends.template import RECYCLE_TRAITS
from sandbox.backends.template import TRAITS as TEMPLATE
from sandbox.backends.template.wire import sandbox_blob
from sandbox.errors import SpecError, UnavailableError
from sandbox.host import HostInfo
from sandbox.plan import OpFlag, OpKind, Plan, compile_plan
from sandbox.refusal import refusal
from sandbox.warm_overlay import WARM_DIR, WARM_NEWROOT, sandbox_newroot
from sandbox.warm_plan import TemplatePlans, recycle_plan, template_plans, zygote_plan

HOST = HostInfo(uid=1000, gid=1000, cwd="/", environ={}, executor=TEMPLATE, is_root=False, pool=None)


Ops = list[tuple[OpKind, str, str]]


def _ops(plan: Plan) -> Ops:
    return [(op.kind, op.dest, op.src) for op in plan.ops]


def _plans(*mounts: S.Mount) -> tuple[Ops, Ops, TemplatePlans]:
    plans = template_plans(compile_plan(S.Spec(mounts=mounts), HOST))
    return _ops(plans.shared), _ops(plans.sandbox), plans


def test_the_template_binds_the_layers_and_sources_once_and_the_sandbox_overlays_them() -> None:
    shared, sandbox, plans = _plans(S.Overlay("/", ["/srv/l0", "/srv/l1"]), S.Proc(), S.Dev(), S.Tmpfs("/tmp"),
                                    S.RoBind("/srv/data", "/data"))
    assert (OpKind.BIND, f"{WARM_DIR}/l0", "/srv/l1") in shared  # top first, as overlayfs stacks them
    assert (OpKind.BIND, f"{WARM_DIR}/l1", "/srv/l0") in shared
    assert (OpKind.BIND, f"{WARM_DIR}/b4", "/srv/data") in shared
    assert (OpKind.DIR, WARM_NEWROOT, "") in shared
    assert not any(kind in (OpKind.OVERLAY, OpKind.TMPFS) for kind, _, _ in shared)
    assert sandbox[1:6] == [(OpKind.PROC, "/proc", ""), (OpKind.BIND, "/dev", "/dev"), (OpKind.TMPFS, "/dev/shm", ""),
                            (OpKind.DEVPTS, "/dev/pts", ""), (OpKind.TMPFS, "/tmp", "")]  # /dev: as in place
    assert (OpKind.DEV, "/dev", "") in shared
    overlay = plans.sandbox.ops[0]
    assert overlay.lowers == (f"{WARM_DIR}/l0", f"{WARM_DIR}/l1") and overlay.dest == "/"
    assert sandbox[-1] == (OpKind.BIND, "/data", f"{WARM_DIR}/b4")
    layers = [op for op in plans.shared.ops if op.dest.startswith(f"{WARM_DIR}/l")]
    assert all(op.flags & OpFlag.RDONLY and op.flags & OpFlag.NODEV and op.flags & OpFlag.NOSUID for op in layers)


def test_the_sandbox_builds_a_new_root_where_others_work_in_place() -> None:
    _, _, plans = _plans(S.Overlay("/", ["/srv/l0"]), S.Proc())
    assert sandbox_newroot(plans.sandbox) == WARM_NEWROOT
    blob = sandbox_blob(plans.sandbox)
    assert blob[header(blob).newroot:].split(b"\0")[0] == WARM_NEWROOT.encode()
    _, _, plain = _plans(S.RoBind("/usr"), S.Proc())
    assert sandbox_newroot(plain.sandbox) == "/"


def test_a_kept_upper_and_recycling_are_refused_naming_why() -> None:
    with pytest.raises(SpecError, match=r"mounts\[0\].*shared by its sandboxes"):
        _plans(S.Overlay("/", ["/srv/l0"], upper="/srv/keep"), S.Proc())
    _, _, plans = _plans(S.Overlay("/", ["/srv/l0"]), S.Proc())
    recycling = dataclasses.replace(HOST, executor=RECYCLE_TRAITS)
    refused = refusal(recycle_plan(dataclasses.replace(plans.sandbox, reaper=True)), recycling)
    assert isinstance(refused, UnavailableError) and "Overlay" in str(refused) and "recycle=True" in str(refused)


def test_a_workerpool_zygotes_overlays_are_read_only_for_its_tasks() -> None:
    """One overlay mount is shared by every task forked from the zygote: it is
    remounted read-only there (as its root, /dev and tmpfs are)."""
    plan = compile_plan(S.Spec(mounts=(S.Overlay("/", ["/srv/l0"]), S.Proc(), S.Dev(),
                                       S.Overlay("/mnt/o", ["/srv/l1"]))), HOST)
    ro = {op.dest for op in zygote_plan(plan).ops if op.kind is OpKind.REMOUNT_RO}
    assert {"/", "/mnt/o", "/dev"} <= ro
