"""sandbox.plan_cache: one compiled plan per Spec object and caller state, never a stale one."""

from __future__ import annotations

import dataclasses
import resource
from typing import Any

import pytest

from sandbox import Limits, Proc, Spec, Tmpfs
from sandbox.backends.bwrap import TRAITS as BWRAP
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.cgroups import CgroupInfo
from sandbox.host import HostInfo, PoolInfo
from sandbox.plan import compile_plan
from sandbox.plan_cache import MAX_PLANS, _caller_state, compiled_plan
from sandbox.sync import Sync

HOST = HostInfo(executor=NATIVE, uid=1000, gid=1000, cwd="/home/u", environ={"LANG": "C", "HOME": "/home/u"},
                hard_limits={resource.RLIMIT_NOFILE: 4096}, pool=PoolInfo(serves_none=False))
ROOT = dataclasses.replace(HOST, uid=0, gid=0, is_root=True, effective_caps=0)
SPEC = Spec(mounts=[Proc(), Tmpfs("/tmp")], env_inherit=("LANG",), limits=Limits(nofile=1000))

# Every field of HostInfo, changed to a value that may change the plan.
CHANGED: dict[str, Any] = {
    "uid": 0, "gid": 0, "cwd": "/srv", "environ": {"LANG": "fr_FR.UTF-8"},
    "hard_limits": {resource.RLIMIT_NOFILE: 64}, "is_root": True, "executor": BWRAP,
    "pool": PoolInfo(serves_none=True), "core_missing": "not built", "effective_caps": 1 << 21,
    "proc_root_only": ("program_cpu",),
    "cgroups": CgroupInfo(mechanism="cgroup2", controllers=frozenset({"memory"}), reason="delegated"),
}


@pytest.mark.parametrize("field", sorted(f.name for f in dataclasses.fields(HostInfo)))
def test_every_field_of_the_caller_state_is_in_the_key(field: str) -> None:
    changed = dataclasses.replace(HOST, **{field: CHANGED[field]})
    assert _caller_state(SPEC, changed) != _caller_state(SPEC, HOST)


def test_the_same_spec_and_caller_get_the_same_plan_object() -> None:
    first = compiled_plan(SPEC, HOST)
    assert compiled_plan(SPEC, HOST) is first
    assert first == compile_plan(SPEC, HOST)


@pytest.mark.parametrize("base", [HOST, ROOT], ids=["user", "root"])
@pytest.mark.parametrize("field", sorted(CHANGED))
def test_a_changed_caller_state_compiles_again(field: str, base: HostInfo) -> None:
    compiled_plan(SPEC, base)
    host = dataclasses.replace(base, **{field: CHANGED[field]})
    assert compiled_plan(SPEC, host) == compile_plan(SPEC, host)


def test_the_environment_counts_only_when_the_spec_inherits_from_it() -> None:
    spec = Spec(mounts=[Proc()])
    first = compiled_plan(spec, HOST)
    assert compiled_plan(spec, dataclasses.replace(HOST, environ={"OTHER": "1"})) is first
    inheriting = compiled_plan(SPEC, HOST)
    assert dict(e.split("=", 1) for e in inheriting.env)["LANG"] == "C"
    changed = compiled_plan(SPEC, dataclasses.replace(HOST, environ={"LANG": "de_DE"}))
    assert dict(e.split("=", 1) for e in changed.env)["LANG"] == "de_DE"


def test_equal_specs_are_separate_entries_and_sync_fds_count() -> None:
    copy = SPEC.replace()
    assert compiled_plan(copy, HOST) == compiled_plan(SPEC, HOST)
    synced = compiled_plan(SPEC, HOST, Sync(block_fd=9))
    assert synced == compile_plan(SPEC, HOST, Sync(block_fd=9)) != compiled_plan(SPEC, HOST)


def test_the_cache_is_bounded() -> None:
    specs = [Spec(mounts=[Tmpfs(f"/t{i}")]) for i in range(MAX_PLANS + 10)]
    plans = [compiled_plan(s, HOST) for s in specs]
    assert compiled_plan(specs[-1], HOST) is plans[-1]  # the newest is kept
    assert compiled_plan(specs[0], HOST) is not plans[0]  # the oldest was dropped, and is compiled again
    assert compiled_plan(specs[0], HOST) == plans[0]
