"""The split of a Plan for a Template (pure): what the template prepares, what each sandbox does."""

from __future__ import annotations

import dataclasses

import pytest

from sandbox import spec as S
from sandbox.backends.template import RECYCLE_TRAITS
from sandbox.backends.template import TRAITS as TEMPLATE
from sandbox.cgroups import CgroupInfo
from sandbox.errors import UnavailableError
from sandbox.host import HostInfo, PoolInfo
from sandbox.plan import OpFlag, OpKind, compile_plan
from sandbox.refusal import CAP_NET_ADMIN, CAP_SETFCAP, CAP_SYS_ADMIN, refusal
from sandbox.warm_plan import net_kept_plan, plan_for_call, recycle_plan, template_plans

USER = HostInfo(executor=TEMPLATE, uid=1000, gid=1000, cwd="/", environ={}, pool=PoolInfo())
RECYCLING = dataclasses.replace(USER, executor=RECYCLE_TRAITS)
ROOT = HostInfo(executor=TEMPLATE, uid=0, gid=0, cwd="/", environ={}, is_root=True, pool=PoolInfo())
WORLD = (S.RoBind("/usr"), S.Symlink("usr/bin", "/bin"), S.Proc(), S.Dev(), S.Tmpfs("/tmp"),
         S.Bind("/srv", "/tmp/srv"), S.File("/etc/rw", b"x"), S.File("/etc/ro", b"y", readonly=True),
         S.Chmod("/etc/rw", 0o600), S.Dir("/work"))


def plans(host: HostInfo = USER, **fields: object):  # type: ignore[no-untyped-def]
    return template_plans(compile_plan(S.Spec(mounts=WORLD, **fields), host))  # type: ignore[arg-type]


def kinds(ops) -> list[tuple[OpKind, str]]:  # type: ignore[no-untyped-def]
    return [(op.kind, op.dest) for op in ops]


def test_each_sandbox_makes_afresh_what_it_may_write() -> None:
    ops = plans().sandbox.ops
    assert kinds(ops) == [
        (OpKind.PROC, "/proc"), (OpKind.TMPFS, "/dev/shm"), (OpKind.DEVPTS, "/dev/pts"), (OpKind.TMPFS, "/tmp"),
        (OpKind.BIND, "/tmp/srv"), (OpKind.FILE, "/etc/rw"), (OpKind.CHMOD, "/etc/rw"),
    ]
    proc, bind, rw = ops[0], ops[4], ops[5]
    assert proc.flags & OpFlag.FRESH and proc.covers  # a new proc, with its covers
    assert bind.src == "/tmp/srv"  # re-bound from the template's copy, beneath the fresh /tmp
    assert rw.flags & OpFlag.FRESH  # a private copy of the writable file


def test_the_template_builds_everything_then_makes_shared_filesystems_read_only() -> None:
    shared = plans().shared
    proc = next(op for op in shared.ops if op.kind is OpKind.PROC)
    assert not proc.covers  # fully visible: its sandboxes' fresh procs need it
    tail = kinds(shared.ops)[len(WORLD):]
    assert tail == [(OpKind.REMOUNT_RO, "/"), (OpKind.REMOUNT_RO, "/dev"), (OpKind.REMOUNT_RO, "/tmp")]


def test_a_mount_stacked_at_a_tmpfs_path_is_not_made_read_only_by_its_remount() -> None:
    # presets.minimal_system(Bind(dir, "/tmp")): the Tmpfs's remount lands before the Bind covers it
    split = template_plans(compile_plan(S.Spec(mounts=(*WORLD, S.Bind("/srv", "/tmp"))), USER))
    shared = kinds(split.shared.ops)
    assert shared.index((OpKind.REMOUNT_RO, "/tmp")) < shared.index((OpKind.BIND, "/tmp"))
    assert (OpKind.REMOUNT_RO, "/tmp") not in shared[shared.index((OpKind.BIND, "/tmp")):]
    bind = split.sandbox.ops[-1]
    assert (bind.kind, bind.dest, bind.src) == (OpKind.BIND, "/tmp", "/tmp")  # on the fresh /tmp, from the copy
    assert not bind.flags & OpFlag.RDONLY


def test_a_dev_covered_at_its_path_gets_no_shm_or_pts_of_its_own() -> None:
    split = template_plans(compile_plan(S.Spec(mounts=(*WORLD, S.Bind("/srv", "/dev"))), USER))
    assert (OpKind.DEVPTS, "/dev/pts") not in kinds(split.sandbox.ops)  # they would land in /srv


def test_the_template_process() -> None:
    shared = plans().shared
    assert (shared.user_ns, shared.mount_ns, shared.pid_ns, shared.reaper, shared.exec_fd) == (True, True, True,
                                                                                                False, True)
    assert (shared.ipc_ns, shared.uts_ns, shared.cgroup_ns) == (False, False, False)
    assert (shared.seccomp, shared.landlock, shared.rlimits, shared.env) == (b"", False, (), ())
    # it clones per-call binds itself; its standbys bring up the loopback of their fresh network namespaces
    assert shared.keep_caps == (1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN) and shared.host_tree
    assert (shared.uid, shared.gid) == (1000, 1000) and not shared.nested_userns and not shared.map_root_first
    dev = next(op for op in shared.ops if op.kind is OpKind.DEV)
    assert dev.flags & OpFlag.NO_DEVPTS  # no devpts in the template's /dev: it needs no uid 0 mapped
    assert not shared.die_with_parent  # it ends when the caller's socket closes, not with a thread
    root = plans(ROOT).shared
    assert root.keep_caps == (1 << CAP_SYS_ADMIN) | (1 << CAP_SETFCAP) | (1 << CAP_NET_ADMIN)  # and map uid 0


def test_a_pooled_template_joins_the_pool_user_namespace() -> None:
    split = plans(network="pool")
    assert split.shared.network == "pool" and not split.shared.user_ns
    assert split.shared.keep_caps == 1 << CAP_SYS_ADMIN  # setns (the pool maps the caller's ids to themselves)
    root = plans(ROOT, network="pool").shared
    assert root.keep_caps == (1 << CAP_SYS_ADMIN) | (1 << CAP_SETFCAP)  # and uid 0 into its sandboxes
    assert (split.sandbox.host_uid, split.sandbox.network, split.sandbox.recycle_lease) == (1000, "pool", True)


def test_the_sandbox_plan_keeps_the_command_side() -> None:
    plan = compile_plan(S.Spec(mounts=WORLD, env={"A": "1"}, limits=S.Limits(nofile=10)), USER)
    sandbox = template_plans(plan).sandbox
    assert (sandbox.env, sandbox.rlimits, sandbox.seccomp, sandbox.reaper) == (plan.env, plan.rlimits,
                                                                               plan.seccomp, True)
    assert not sandbox.die_with_parent  # the template's death ends it


def test_per_call_overrides() -> None:
    base = plans(landlock=True).sandbox
    call = plan_for_call(base, USER, env={"PATH": "/x"}, cwd="/work", limits=S.Limits(nofile=5),
                         binds=[S.RoBind("/data", "/tmp/data")])
    assert (call.env, call.path, call.cwd_candidates, call.cwd_strict) == (("PATH=/x",), "/x", ("/work",), True)
    assert call.rlimits == ((7, 5),)
    extra = call.ops[-1]
    assert (extra.kind, extra.src, extra.dest) == (OpKind.BIND, "/data", "/tmp/data")
    assert extra.flags & OpFlag.FROM_FD and extra.flags & OpFlag.RDONLY
    assert ("/tmp/data", False) in call.landlock_rules
    assert plan_for_call(base, USER) is base


@pytest.mark.parametrize("env", [{"PATH": ""}, {"PATH": "/x"}, {}], ids=["empty", "set", "unset"])
def test_a_calls_path_is_planned_as_spawn_plans_it(env: dict[str, str]) -> None:
    """execvp's rule in one place: an empty PATH is the current directory, an unset one glibc's default."""
    call = plan_for_call(plans().sandbox, USER, env=env)
    assert call.path == compile_plan(S.Spec(mounts=WORLD, env=env), USER).path


@pytest.mark.parametrize(("fields", "why"), [
    ({"namespaces": S.Namespaces(pid=False)}, "pid namespace"),
    ({"namespaces": S.Namespaces(user=False)}, "user namespace"),
    ({"forward": {8080: 80}}, "forward"),
    ({"uid": 0, "gid": 0, "cap_add": ("CAP_SYS_ADMIN",)}, "CAP_SYS_ADMIN"),
])
def test_refusals(fields: dict[str, object], why: str) -> None:
    plan = compile_plan(S.Spec(mounts=WORLD, **fields), ROOT)  # type: ignore[arg-type]
    refused = refusal(plan, ROOT)
    assert isinstance(refused, UnavailableError) and why in str(refused)
    assert refusal(compile_plan(S.Spec(mounts=WORLD), ROOT), ROOT) is None
    no_mount = compile_plan(S.Spec(namespaces=S.Namespaces(mount=False)), ROOT)
    assert "a Template needs a mount namespace (each sandbox" in str(refusal(no_mount, ROOT))


CGROUPS = CgroupInfo(mechanism="cgroup2", controllers=frozenset({"memory", "pids", "cpu"}), reason="")


def test_a_calls_limits_get_their_cgroup_and_the_rest_as_rlimits() -> None:
    base = plans().sandbox
    call = plan_for_call(base, dataclasses.replace(USER, cgroups=CGROUPS), limits=S.Limits(memory_mb=64, nproc=8,
                                                                                           nofile=5))
    assert call.cgroup is not None and (call.cgroup.memory_bytes, call.cgroup.pids) == (64 << 20, 8)
    assert (call.limits_mechanism, call.limits_fallback, call.rlimits) == ("cgroup2", (), ((7, 5),))
    # no cgroups for this caller: memory and processes fall back to rlimits, or the call is refused
    bare = plan_for_call(base, USER, limits=S.Limits(memory_mb=64, nproc=8))
    assert bare.cgroup is None and bare.limits_mechanism == "rlimit" and set(bare.limits_fallback) == {
        "memory_mb", "nproc"}
    with pytest.raises(UnavailableError, match="require_cgroups.*memory_mb.*a Template"):
        plan_for_call(base, USER, limits=S.Limits(memory_mb=64, require_cgroups=True))


def test_the_template_itself_is_in_no_sandbox_cgroup() -> None:
    host = dataclasses.replace(USER, cgroups=CGROUPS)
    split = template_plans(compile_plan(S.Spec(mounts=WORLD, limits=S.Limits(nproc=8)), host))
    assert split.sandbox.cgroup is not None and split.shared.cgroup is None
    assert split.shared.limits_mechanism == "rlimit"


def recycle_refusal(host: HostInfo = USER, **fields: object) -> str:
    """Why Template(recycle=True) refuses a Spec of `fields` (sandbox.template's two questions), or ""."""
    plan = compile_plan(S.Spec(mounts=WORLD, **fields), host)  # type: ignore[arg-type]
    refused = refusal(plan, host) or refusal(recycle_plan(plan), dataclasses.replace(host, executor=RECYCLE_TRAITS))
    return str(refused or "")


def test_what_recycling_refuses_and_resets() -> None:
    assert recycle_refusal() == ""
    assert recycle_refusal(as_pid_1=True) == ("Template(recycle=True) cannot run the command as pid 1 of its sandbox: "
                                              "as_pid_1=True (a recycled sandbox's pid 1 is the reaper that resets it)")
    assert recycle_refusal(cap_add=["CAP_NET_RAW"]).startswith("Template(recycle=True) cannot let the command keep a "
                                                               "capability: cap_add (")
    assert recycle_refusal(dataclasses.replace(USER, cgroups=CGROUPS), limits=S.Limits(nproc=8)) == ""
    # a Template's own refusals come first, in its words
    assert recycle_refusal(forward={8080: 80}).startswith("a Template does not forward ports")
    limited = template_plans(compile_plan(S.Spec(mounts=WORLD, limits=S.Limits(nproc=8)),
                                          dataclasses.replace(USER, cgroups=CGROUPS)))
    assert limited.sandbox.cgroup is not None and limited.sandbox.cgroup.pids == 8
    recycled = recycle_plan(limited.sandbox)  # its pid 1 stays out of that cgroup: one process fewer
    assert recycled.cgroup is not None and recycled.cgroup.pids == 7
    pooled = compile_plan(S.Spec(mounts=WORLD, network="pool"), USER)
    assert pooled.network == "pool" and recycle_plan(pooled).network == "none"
    assert refusal(recycle_plan(pooled), RECYCLING) is None
    assert "leased from the process-wide pool" in str(refusal(pooled, RECYCLING))
    kept = net_kept_plan(plans().sandbox)
    assert OpKind.PROC not in {op.kind for op in kept.ops}
    assert [op for op in plans().sandbox.ops if op.kind is not OpKind.PROC] == list(kept.ops)
