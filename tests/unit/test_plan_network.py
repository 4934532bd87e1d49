"""The planner's network and refusal decisions: which namespace a sandbox
gets, which ids its maps write, and what a backend must refuse up front."""

from __future__ import annotations

import dataclasses
import errno

import pytest

from sandbox import Namespaces, RoBind, SetupError, Spec, SpecError, UnavailableError, backends
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.host import HostInfo, PoolInfo
from sandbox.plan import OpFlag, compile_plan
from sandbox.refusal import refusal

USER = HostInfo(executor=NATIVE, uid=1000, gid=1000, cwd="/", environ={})
ROOT = HostInfo(executor=NATIVE, uid=0, gid=0, cwd="/", environ={}, is_root=True)


def host(base: HostInfo = USER, backend: str = "native", **changes: object) -> HostInfo:
    return dataclasses.replace(base, executor=backends.get(backend).traits, **changes)


@pytest.mark.parametrize(("spec", "h", "expected"), [
    (Spec(), USER, "none"),
    (Spec(network="host"), USER, "host"),
    (Spec(network="pool"), USER, "pool"),
    (Spec(network="pool"), host(backend="bwrap", pool=None), "none"),  # bwrap makes its own
    (Spec(check=True), USER, "pool"),  # the check reads a leased namespace
    (Spec(forward={8080: 9000}), USER, "pool"),
    (Spec(forward={8080: 9000}), host(backend="bwrap", pool=None), "none"),
    (Spec(), host(pool=PoolInfo(serves_none=True)), "pool"),
    (Spec(), host(backend="bwrap", pool=None), "none"),
    (Spec(network="host", check=True), USER, "host"),
    # network capabilities are checked against the namespace's owner: a leased one is the pool's
    (Spec(cap_add=["CAP_NET_BIND_SERVICE"]), host(pool=PoolInfo(serves_none=True)), "none"),
    (Spec(cap_add=["CAP_CHOWN"]), host(pool=PoolInfo(serves_none=True)), "pool"),
])
def test_network_namespace_is_decided_by_the_plan(spec: Spec, h: HostInfo, expected: str) -> None:
    plan = compile_plan(spec, h)
    assert plan.network == expected
    assert plan.net_ns is (expected == "none")


def test_ids_are_the_callers_whatever_the_network() -> None:
    # The pool's user namespace maps the caller's ids to themselves, so the
    # sandbox's maps name them in a leased namespace too.
    for spec in (Spec(network="pool"), Spec(), Spec(network="host")):
        plan = compile_plan(spec, USER)
        assert (plan.host_uid, plan.host_gid, plan.uid, plan.gid) == (1000, 1000, 1000, 1000)


@pytest.mark.parametrize(("namespaces", "recycle"), [
    (Namespaces(), True),
    (Namespaces(pid=False), False),  # a process could outlive pid 1 in the namespace
    (Namespaces(user=False), False),  # capabilities over the namespace's owner
])
def test_a_lease_is_recycled_only_when_the_tenant_surely_left(namespaces: Namespaces, recycle: bool) -> None:
    plan = compile_plan(Spec(network="pool", namespaces=namespaces), ROOT)
    assert plan.recycle_lease is recycle
    assert compile_plan(Spec(namespaces=namespaces), ROOT).recycle_lease is False  # nothing leased


@pytest.mark.parametrize("backend", ["native", "bwrap"])
def test_no_user_namespace_is_refused_for_non_root_on_every_backend(backend: str) -> None:
    h = host(backend=backend)
    err = refusal(compile_plan(Spec(namespaces=Namespaces(user=False)), h), h)
    assert isinstance(err, SetupError)
    assert (err.step, err.errno, err.backend) == ("clone", errno.EPERM, backend)
    h = host(ROOT, backend=backend)
    assert refusal(compile_plan(Spec(namespaces=Namespaces(user=False)), h), h) is None


def test_bwrap_refuses_what_it_cannot_express() -> None:
    bw = host(backend="bwrap")
    assert isinstance(refusal(compile_plan(Spec(landlock=True), bw), bw), UnavailableError)
    assert refusal(compile_plan(Spec(landlock="best-effort"), bw), bw) is None
    assert refusal(compile_plan(Spec(landlock=True), USER), USER) is None
    # No Spec says "read-only with devices", but a plan edited by hand may.
    plan = compile_plan(Spec(mounts=[RoBind("/usr"), RoBind("/dev")]), bw)
    ro_dev = dataclasses.replace(plan.ops[1], flags=plan.ops[1].flags & ~OpFlag.NODEV)
    plan = dataclasses.replace(plan, ops=(plan.ops[0], ro_dev))
    err = refusal(plan, bw)
    assert isinstance(err, SpecError) and err.field == "mounts[1]"
    assert refusal(plan, USER) is None
