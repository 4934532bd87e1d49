"""Every executor refuses by capability: for each capability, a Plan that needs
exactly it is refused by the executors that lack it and accepted by the others.

The executors are the declared ones (their own `TRAITS`); a new executor is
walked by adding it to EXECUTORS. Pure: nothing runs.
"""

from __future__ import annotations

import dataclasses

import pytest

from sandbox import spec as S
from sandbox.backends.blob import TRAITS as BLOB
from sandbox.backends.brokered import TRAITS as BROKERED
from sandbox.backends.bwrap import TRAITS as BWRAP
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.backends.template import RECYCLE_TRAITS
from sandbox.backends.template import TRAITS as TEMPLATE
from sandbox.capabilities import ALL, Capability, Traits
from sandbox.cgroups import CgroupInfo
from sandbox.errors import SandboxError
from sandbox.host import HostInfo, PoolInfo, executor_cgroups
from sandbox.plan import OpFlag, Plan, compile_plan
from sandbox.refusal import NEEDS, refusal
from sandbox.sync import Sync
from sandbox.workerpool.pool import TRAITS as WORKERPOOL

EXECUTORS = {t.name + ":" + t.title: t for t in (NATIVE, BWRAP, TEMPLATE, RECYCLE_TRAITS, WORKERPOOL, BLOB, BROKERED)}
WORLD = (S.RoBind("/usr", "/usr"), S.Proc("/proc"))
ROOT = HostInfo(uid=0, gid=0, cwd="/", environ={}, executor=NATIVE, is_root=True, pool=None)

# For each capability a refusal checks: the Spec (and sync, and a change to the
# host) whose Plan needs it and nothing else an executor could lack.
NEEDING: dict[Capability, tuple[S.Spec, Sync, dict[str, object]]] = {
    Capability.HANDED_NAMESPACES: (S.Spec(mounts=WORLD, namespaces=S.Namespaces(user=False)), Sync(userns_fd=5), {}),
    Capability.WITHOUT_USER_NS: (S.Spec(mounts=WORLD, namespaces=S.Namespaces(user=False)), Sync(), {}),
    Capability.WITHOUT_MOUNT_NS: (S.Spec(namespaces=S.Namespaces(mount=False)), Sync(), {}),
    Capability.WITHOUT_PID_NS: (S.Spec(mounts=(S.RoBind("/usr", "/usr"),), namespaces=S.Namespaces(pid=False)),
                                Sync(), {}),
    Capability.FORWARD: (S.Spec(mounts=WORLD, forward={8080: 80}), Sync(), {}),
    Capability.FD_SOURCE: (S.Spec(mounts=(*WORLD, S.RoBind("/proc/self/fd/5", "/mnt"))), Sync(), {}),
    Capability.KEEP_SYS_ADMIN: (S.Spec(mounts=WORLD, uid=0, gid=0, cap_add=("CAP_SYS_ADMIN",)), Sync(), {}),
    Capability.TMPFS_ROOT: (S.Spec(mounts=(S.Tmpfs("/"), *WORLD)), Sync(), {}),
    Capability.LANDLOCK: (S.Spec(mounts=WORLD, landlock=True), Sync(), {}),
    # no Spec mount makes one (RoBind is nodev), so the plan is changed below (_plan)
    Capability.RDONLY_DEV_BIND: (S.Spec(mounts=(*WORLD, S.RoBind("/dev/null", "/n"))), Sync(), {}),
    Capability.SELF_CONTAINED_SETUP: (S.Spec(mounts=WORLD, limits=S.Limits(nofile=64)), Sync(),
                                      {"core_missing": "not built"}),
    Capability.OVERLAY: (S.Spec(mounts=(S.Overlay("/", ["/srv/layer0", "/srv/layer1"]), *WORLD)), Sync(), {}),
    Capability.SYNC_FDS: (S.Spec(mounts=WORLD), Sync(info_fd=5), {}),
    Capability.KEEP_CAPS: (S.Spec(mounts=WORLD, cap_add=("CAP_NET_RAW",)), Sync(), {}),
    Capability.COMMAND_AS_PID_1: (S.Spec(mounts=WORLD, as_pid_1=True), Sync(), {}),
    # planning makes these only for a host that offers them (HostInfo.current of an executor that can):
    # here the host offers them to every executor, as the CLI server's plan for the native backend is
    # offered to the blob executor (sandbox.cliserver.fastpath)
    Capability.JOIN_POOLED_NETNS: (S.Spec(mounts=WORLD, network="pool"), Sync(), {"pool": PoolInfo()}),
    Capability.CGROUPS: (S.Spec(mounts=WORLD, limits=S.Limits(nproc=8)), Sync(),
                         {"cgroups": CgroupInfo(mechanism="cgroup2", controllers=frozenset({"pids"}), reason="")}),
}


def _host(executor: Traits, **changes: object) -> HostInfo:
    return dataclasses.replace(ROOT, executor=executor, **changes)


def _plan(capability: Capability, host: HostInfo) -> Plan:
    spec, sync, _ = NEEDING[capability]
    plan = compile_plan(spec, host, sync)
    if capability is Capability.RDONLY_DEV_BIND:
        ops = [dataclasses.replace(op, flags=op.flags & ~OpFlag.NODEV) if op.dest == "/n" else op for op in plan.ops]
        plan = dataclasses.replace(plan, ops=tuple(ops))
    return plan


def test_every_capability_a_refusal_checks_is_walked() -> None:
    assert {need[0] for need in NEEDS} == set(NEEDING)


@pytest.mark.parametrize("capability", list(NEEDING), ids=lambda c: c.name)
@pytest.mark.parametrize("name", list(EXECUTORS))
def test_a_plan_is_refused_exactly_by_the_executors_lacking_what_it_needs(name: str, capability: Capability) -> None:
    executor = EXECUTORS[name]
    changes = NEEDING[capability][2]
    full = _host(Traits("test", "an executor that can do anything", ALL), **changes)
    assert refusal(_plan(capability, full), full) is None, "the plan needs nothing beyond the capability"
    host = _host(executor, **changes)
    refused = refusal(_plan(capability, host), host)
    if executor.can(capability):
        assert refused is None
    else:
        assert isinstance(refused, SandboxError)
        assert executor.title in str(refused), refused


def test_a_missing_capability_with_a_reason_says_it() -> None:
    host = _host(TEMPLATE)
    refused = refusal(_plan(Capability.FD_SOURCE, host), host)
    assert str(refused) == "a Template cannot bind a caller's fd (/proc/self/fd/N would name the template's own)"


@pytest.mark.parametrize("name", list(EXECUTORS))
def test_only_executors_that_can_join_a_pooled_namespace_are_planned_into_one(name: str) -> None:
    executor = EXECUTORS[name]
    pooled = HostInfo.current(executor)
    assert (pooled.pool is not None) == executor.can(Capability.JOIN_POOLED_NETNS)
    host = _host(executor, is_root=False, uid=1000, gid=1000, pool=PoolInfo(serves_none=True))
    if not executor.can(Capability.JOIN_POOLED_NETNS):
        host = dataclasses.replace(host, pool=None)
    network = compile_plan(S.Spec(mounts=WORLD), host).network
    assert (network == "pool") == executor.can(Capability.JOIN_POOLED_NETNS)


@pytest.mark.parametrize("name", list(EXECUTORS))
def test_cgroups_are_offered_only_to_executors_that_place_sandboxes_in_them(name: str) -> None:
    executor = EXECUTORS[name]
    info = executor_cgroups(executor)
    if not executor.can(Capability.CGROUPS):
        assert info == CgroupInfo(reason=f"{executor.title} does not place its sandboxes in cgroups")
        limited = _host(executor, cgroups=info)
        spec = S.Spec(mounts=WORLD, limits=S.Limits(nproc=8, require_cgroups=True))
        refused = refusal(compile_plan(spec, limited), limited)
        assert refused is not None and "does not place its sandboxes in cgroups" in str(refused)


def test_a_template_mounts_an_overlay_and_bwrap_does_not() -> None:
    """A Template serves an image root warm (sandbox.warm_overlay): each sandbox its own overlay."""
    assert TEMPLATE.can(Capability.OVERLAY) and not BWRAP.can(Capability.OVERLAY)
    host = _host(TEMPLATE)
    assert refusal(_plan(Capability.OVERLAY, host), host) is None
