"""The caller's synchronization fds (sandbox.sync) as the Plan carries them:
validated, serialized only when set, and the decisions they change."""

from __future__ import annotations

import dataclasses

import pytest

from sandbox import backends
from sandbox import spec as S
from sandbox.errors import SpecError, UnavailableError
from sandbox.host import HostInfo
from sandbox.plan import OpFlag, compile_plan
from sandbox.refusal import refusal
from sandbox.sync import NO_SYNC, Sync


def host(backend: str = "native", uid: int = 1000) -> HostInfo:
    return dataclasses.replace(HostInfo.current(backends.get(backend).traits), uid=uid, gid=uid, environ={}, cwd="/")


@pytest.mark.parametrize("value", [-2, True, "3", 1.0])
def test_a_sync_fd_is_an_fd_or_minus_one(value):
    with pytest.raises(SpecError, match="sync.block_fd"):
        Sync(block_fd=value)


def test_the_fds_set_are_listed_and_make_it_active():
    assert not NO_SYNC.active and NO_SYNC.fds() == ()
    sync = Sync(started_fd=7, block_fd=9)
    assert sync.active and sorted(sync.fds()) == [7, 9]


def test_the_caller_maps_the_ids_with_a_userns_block_fd():
    """devpts needs uid 0 mapped during setup, so a Dev makes the plan map 0
    first and nest; with a userns_block_fd the caller's maps stay as they are."""
    spec = S.Spec(mounts=(S.Dev(),), uid=1000, gid=1000)
    assert compile_plan(spec, host()).map_root_first
    plan = compile_plan(spec, host(), Sync(userns_block_fd=5))
    assert not plan.map_root_first and not plan.nested_userns and plan.sync.userns_block_fd == 5


def test_joining_namespaces_by_fd_is_the_bwrap_backends():
    spec = S.Spec(namespaces=S.Namespaces(user=False), network="host")
    plan = compile_plan(spec, host("native"), Sync(userns_fd=5))
    assert isinstance(refusal(plan, host("native")), UnavailableError)
    assert refusal(compile_plan(spec, host("bwrap"), Sync(userns_fd=5)), host("bwrap")) is None


def test_a_bind_of_a_callers_fd_is_marked_and_not_for_a_template():
    spec = S.Spec(mounts=(S.RoBind("/proc/self/fd/5", "/mnt"), S.RoBind("/proc/self/fdinfo", "/x")))
    ops = compile_plan(spec, host()).ops
    assert [bool(op.flags & OpFlag.FD_SOURCE) for op in ops] == [True, False]
    refused = refusal(compile_plan(spec, host("template")), host("template"))
    assert refused is not None and "cannot bind a caller's fd" in str(refused)


def test_the_blob_carries_the_fds_only_when_set():
    from sandbox._core import blob as wire
    from sandbox._core.binding import lib

    plain = wire.header(wire.serialize(compile_plan(S.Spec(), host()), "/tmp"))
    assert not plain.opts & lib.SBX_OPT_SYNC
    synced = wire.header(wire.serialize(compile_plan(S.Spec(), host(), Sync(block_fd=9, info_fd=4)), "/tmp"))
    assert synced.opts & lib.SBX_OPT_SYNC
    assert (synced.block_fd, synced.info_fd, synced.started_fd) == (9, 4, -1)


def test_lock_files_need_a_pid_1_to_hold_them() -> None:
    """bwrap's --lock-file: the sandbox's pid 1 takes them (sandbox-init), so a plan without one refuses."""
    h = host()
    assert compile_plan(S.Spec(namespaces=S.Namespaces(pid=True)), h, Sync(lock_files=("/a",))).sync.active
    for spec in (S.Spec(namespaces=S.Namespaces(pid=False)),
                 S.Spec(namespaces=S.Namespaces(pid=True), as_pid_1=True)):
        with pytest.raises(SpecError, match="pid 1"):
            compile_plan(spec, h, Sync(lock_files=("/a",)))
    for bad in (("relative",), ("/a\0b",), "/a"):
        with pytest.raises(SpecError, match="sync.lock_files"):
            Sync(lock_files=bad)  # type: ignore[arg-type]
