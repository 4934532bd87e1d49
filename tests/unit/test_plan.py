"""Plan compilation semantics (sandbox.plan). Pure: nothing runs, nothing needs privileges."""

from __future__ import annotations

import dataclasses
import resource

import pytest

from sandbox import Limits, Namespaces, Spec
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.cgroups import CgroupInfo, CgroupLimits
from sandbox.errors import UnavailableError
from sandbox.host import LIMITED_RESOURCES, HostInfo, hard_limits
from sandbox.mounts import Bind, Chmod, Dev, DevBind, Dir, File, Proc, RemountRo, RoBind, Symlink, Tmpfs
from sandbox.plan import (
    DEFAULT_PATH,
    DEV_MODE,
    DEV_SHM_MODE,
    FALLBACK_RLIMITS,
    RLIMITS,
    Op,
    OpFlag,
    OpKind,
    Plan,
    compile_plan,
    cwd_candidates,
    parent_mode_for,
    resolve_env,
)
from sandbox.refusal import refusal
from sandbox.spec import CAPABILITIES

HOST = HostInfo(executor=NATIVE,
    uid=1000,
    gid=1001,
    cwd="/home/u/project",
    environ={"HOME": "/home/u", "PATH": "/host/bin", "LANG": "C.UTF-8", "LC_ALL": "C", "LC_TIME": "en_GB",
             "TERM": "xterm", "SECRET_TOKEN": "hunter2", "lc_lower": "x", "XLC_X": "y"},
)
ROOT = HostInfo(executor=NATIVE, uid=0, gid=0, cwd="/root", environ={"HOME": "/root"})


def plan_of(spec: Spec, host: HostInfo = HOST) -> Plan:
    """compile_plan with the fake host."""
    return compile_plan(spec, host)


def only_op(mount: object, pid: bool = True) -> Op:
    """The single Op compiled from a Spec holding only `mount`."""
    plan = plan_of(Spec(mounts=[mount], namespaces=Namespaces(pid=pid)))  # type: ignore[list-item]
    assert len(plan.ops) == 1
    return plan.ops[0]


# ---------------------------------------------------------------- parent modes


@pytest.mark.parametrize(
    ("perms", "expected"),
    [
        (0o755, 0o755), (0o700, 0o700), (0o750, 0o750), (0o705, 0o705), (0o711, 0o755), (0o001, 0o705),
        (0o020, 0o750), (0o000, 0o700), (0o1777, 0o755), (0o4700, 0o700), (0o640, 0o750), (0o604, 0o705),
    ],
)
def test_parent_mode_rule(perms: int, expected: int) -> None:
    # bwrap: 0755, minus group r-x if perms grant the group nothing, minus other r-x likewise.
    assert parent_mode_for(perms) == expected


def test_parent_mode_without_perms_is_private() -> None:
    assert parent_mode_for(None) == 0o700


@pytest.mark.parametrize("perms", [0o755, 0o700, 0o750, 0o701, 0o070, 0o2770])
def test_dir_parents_follow_the_rule(perms: int) -> None:
    op = only_op(Dir("/a/b/c", perms=perms))
    assert (op.kind, op.dest, op.mode) == (OpKind.DIR, "/a/b/c", perms)
    expected = 0o700 | (0o050 if perms & 0o070 else 0) | (0o005 if perms & 0o007 else 0)
    assert op.parent_mode == expected


@pytest.mark.parametrize("perms", [0o755, 0o700, 0o1777, 0o750])
def test_tmpfs_parents_follow_the_rule(perms: int) -> None:
    op = only_op(Tmpfs("/t/u", perms=perms, size=4096))
    assert (op.kind, op.mode, op.size) == (OpKind.TMPFS, perms, 4096)
    assert op.parent_mode == parent_mode_for(perms)


@pytest.mark.parametrize(
    "mount",
    [Bind("/usr", "/a/b"), RoBind("/usr", "/a/b"), DevBind("/dev", "/a/b"), Symlink("x", "/a/b"),
     Proc("/a/proc"), Dev("/a/dev")],
)
def test_binds_links_proc_dev_make_private_parents(mount: object) -> None:
    # bwrap 0.8 makes the parents of these 0700 (checked against the real bwrap).
    assert only_op(mount).parent_mode == 0o700


def test_file_with_default_perms_makes_0755_parents() -> None:
    op = only_op(File("/etc/x/f", data=b"hi"))
    assert (op.kind, op.mode, op.data) == (OpKind.FILE, 0o666, b"hi")
    assert op.parent_mode == 0o755


@pytest.mark.parametrize(("perms", "expected"), [(0o600, 0o700), (0o640, 0o750)])
def test_file_parents_follow_the_rule_like_bwrap(perms: int, expected: int) -> None:
    assert only_op(File("/f/g/h", perms=perms)).parent_mode == expected


def test_tmpfs_default_size_is_zero() -> None:
    assert only_op(Tmpfs("/t")).size == 0


# ---------------------------------------------------------------- op flags


@pytest.mark.parametrize(
    ("mount", "flags"),
    [
        (Bind("/a"), OpFlag.NODEV | OpFlag.NOSUID),
        (RoBind("/a"), OpFlag.RDONLY | OpFlag.NODEV | OpFlag.NOSUID),
        (DevBind("/a"), OpFlag.NOSUID),
        (Bind("/a", optional=True), OpFlag.NODEV | OpFlag.OPTIONAL | OpFlag.NOSUID),
        (RoBind("/a", optional=True), OpFlag.RDONLY | OpFlag.NODEV | OpFlag.OPTIONAL | OpFlag.NOSUID),
        (DevBind("/a", optional=True), OpFlag.OPTIONAL | OpFlag.NOSUID),
        (File("/f", readonly=True), OpFlag.RDONLY),
        (File("/f"), OpFlag.NONE),
        (RemountRo("/a"), OpFlag.RDONLY | OpFlag.NODEV | OpFlag.NOSUID),
        (Tmpfs("/a"), OpFlag.NODEV),
        (Chmod("/a", 0o700), OpFlag.NONE),
        (Dir("/a"), OpFlag.NONE),
    ],
)
def test_op_flags(mount: object, flags: OpFlag) -> None:
    assert only_op(mount).flags == flags


def test_bind_ops_carry_source_and_destination() -> None:
    op = only_op(RoBind("/usr/lib", "/lib"))
    assert (op.kind, op.src, op.dest) == (OpKind.BIND, "/usr/lib", "/lib")
    op = only_op(Symlink("usr/bin", "/bin"))
    assert (op.kind, op.src, op.dest) == (OpKind.SYMLINK, "usr/bin", "/bin")
    op = only_op(Chmod("/x", 0o711))
    assert (op.kind, op.dest, op.mode) == (OpKind.CHMOD, "/x", 0o711)


def test_ops_keep_order_and_origin() -> None:
    mounts = [Tmpfs("/t"), Dir("/t/a"), Symlink("a", "/t/l"), RemountRo("/t")]
    plan = plan_of(Spec(mounts=mounts))
    assert [op.kind for op in plan.ops] == [OpKind.TMPFS, OpKind.DIR, OpKind.SYMLINK, OpKind.REMOUNT_RO]
    assert [op.origin for op in plan.ops] == [0, 1, 2, 3]


def test_op_kind_numbers_match_the_c_enum() -> None:
    binding = pytest.importorskip("sandbox._core.binding", reason="the compiled core is not built")
    lib = binding.lib
    for kind in OpKind:
        assert getattr(lib, f"SBX_OP_{kind.name}") == kind.value
    for flag in OpFlag:
        if flag is not OpFlag.NONE:
            assert getattr(lib, f"SBX_F_{flag.name}") == flag.value


def test_every_bind_is_nosuid() -> None:
    for mount in (Bind("/a"), RoBind("/a"), DevBind("/a"), Bind("/a", optional=True)):
        assert only_op(mount).flags & OpFlag.NOSUID


def test_dev_carries_its_modes() -> None:
    op = only_op(Dev())
    assert (op.kind, op.mode, op.shm_mode) == (OpKind.DEV, DEV_MODE, DEV_SHM_MODE)
    assert (DEV_MODE, DEV_SHM_MODE) == (0o755, 0o1777)


# ---------------------------------------------------------------- proc


def test_proc_is_fresh_with_a_pid_namespace() -> None:
    assert only_op(Proc(), pid=True).flags == OpFlag.FRESH


def test_proc_is_the_hosts_without_a_pid_namespace() -> None:
    op = only_op(Proc(), pid=False)
    assert op.kind is OpKind.PROC
    assert not op.flags & OpFlag.FRESH


# ---------------------------------------------------------------- environment


def test_env_is_empty_by_default() -> None:
    plan = plan_of(Spec())
    assert plan.env == ()
    assert plan.path == DEFAULT_PATH


@pytest.mark.parametrize(("env", "path"), [({}, "/bin:/usr/bin"), ({"PATH": "/x:/y"}, "/x:/y"), ({"PATH": ""}, ".")])
def test_path_is_never_empty(env: dict[str, str], path: str) -> None:
    # execvp's reading: unset is glibc's default, empty is the current directory
    assert plan_of(Spec(env=env)).path == path


def test_explicit_env_only() -> None:
    plan = plan_of(Spec(env={"PATH": "/x/bin", "A": "1"}))
    assert sorted(plan.env) == ["A=1", "PATH=/x/bin"]
    assert plan.path == "/x/bin"


def test_env_inherit_patterns_match_case_sensitively() -> None:
    env = resolve_env(Spec(env_inherit=["LC_*", "TERM"]), HOST.environ)
    assert env == {"LC_ALL": "C", "LC_TIME": "en_GB", "TERM": "xterm"}


def test_explicit_env_wins_over_inherited() -> None:
    env = resolve_env(Spec(env_inherit=["LC_*", "PATH"], env={"LC_ALL": "POSIX", "NEW": "1"}), HOST.environ)
    assert env == {"LC_ALL": "POSIX", "LC_TIME": "en_GB", "PATH": "/host/bin", "NEW": "1"}


def test_inherited_path_finds_the_command() -> None:
    assert plan_of(Spec(env_inherit=["PATH"])).path == "/host/bin"


@pytest.mark.parametrize("pattern", ["*", "?*"])
def test_wildcard_inherits_everything(pattern: str) -> None:
    assert resolve_env(Spec(env_inherit=[pattern]), HOST.environ) == dict(HOST.environ)


@pytest.mark.parametrize("pattern", ["LC_[AT]*", "LC_?IME", "[LT]*"])
def test_fnmatch_classes(pattern: str) -> None:
    env = resolve_env(Spec(env_inherit=[pattern]), HOST.environ)
    expected = {k: v for k, v in HOST.environ.items()
                if k in {"LC_[AT]*": {"LC_ALL", "LC_TIME"}, "LC_?IME": {"LC_TIME"},
                         "[LT]*": {"LANG", "LC_ALL", "LC_TIME", "TERM"}}[pattern]}
    assert env == expected


def test_nothing_else_leaks() -> None:
    plan = plan_of(Spec(env={"A": "1"}, env_inherit=["LANG"]))
    names = {e.split("=", 1)[0] for e in plan.env}
    assert names == {"A", "LANG"}
    assert not any("hunter2" in e for e in plan.env)


# ---------------------------------------------------------------- cwd


def test_given_cwd_is_strict() -> None:
    plan = plan_of(Spec(cwd="/work"))
    assert plan.cwd_candidates == ("/work",)
    assert plan.cwd_strict


def test_default_cwd_candidates_are_callers_cwd_then_home_then_root() -> None:
    # $HOME is the command's (as bwrap, which only knows the command's env)
    plan = plan_of(Spec(env={"HOME": "/home/u"}))
    assert plan.cwd_candidates == ("/home/u/project", "/home/u", "/")
    assert plan_of(Spec()).cwd_candidates == ("/home/u/project", "/")
    assert not plan.cwd_strict


def test_declared_home_is_preferred_over_the_hosts() -> None:
    cands, strict = cwd_candidates(Spec(env={"HOME": "/sandbox/home"}), HOST, {"HOME": "/sandbox/home"})
    assert cands == ("/home/u/project", "/sandbox/home", "/")
    assert not strict


def test_cwd_candidates_skip_missing_and_relative_values() -> None:
    host = HostInfo(executor=NATIVE, uid=1, gid=1, cwd=None, environ={"HOME": "relative"})
    assert plan_of(Spec(env={"HOME": "relative"}), host).cwd_candidates == ("/",)
    host = HostInfo(executor=NATIVE, uid=1, gid=1, cwd="/", environ={"HOME": "/"})
    assert plan_of(Spec(), host).cwd_candidates == ("/",)


# ---------------------------------------------------------------- limits


def test_rlimit_units() -> None:
    # no cgroup on this HostInfo: memory_mb and nproc fall back to RLIMIT_DATA and RLIMIT_NPROC
    plan = plan_of(Spec(limits=Limits(cpu_s=3, memory_mb=256, file_mb=2, nofile=64, nproc=10, address_space_mb=512)))
    assert dict(plan.rlimits) == {
        resource.RLIMIT_CPU: 3,
        resource.RLIMIT_AS: 512 << 20,
        resource.RLIMIT_DATA: 256 << 20,
        resource.RLIMIT_FSIZE: 2 << 20,
        resource.RLIMIT_NOFILE: 64,
        resource.RLIMIT_NPROC: 10,
    }
    assert plan.cgroup is None and plan.limits_mechanism == "rlimit"
    assert plan.limits_fallback == ("memory_mb", "nproc")


CGROUP_HOST = HostInfo(executor=NATIVE, uid=1, gid=1, cwd="/", environ={}, cgroups=CgroupInfo(
    mechanism="cgroup1", controllers=frozenset({"memory", "pids", "cpu"}), reason="test"))


def test_cgroup_limits_leave_the_rlimits() -> None:
    plan = plan_of(Spec(limits=Limits(memory_mb=100, nproc=32, cpu_cores=0.5, nofile=9)), CGROUP_HOST)
    assert plan.cgroup == CgroupLimits(memory_bytes=100 << 20, pids=32, cpu_quota_us=50_000)
    assert dict(plan.rlimits) == {resource.RLIMIT_NOFILE: 9}
    assert (plan.limits_fallback, plan.limits_mechanism) == ((), "cgroup1")
    assert plan_of(Spec(limits=Limits(nofile=9)), CGROUP_HOST).cgroup is None  # nothing asks for one


def test_a_missing_controller_falls_back_alone() -> None:
    host = dataclasses.replace(CGROUP_HOST, cgroups=dataclasses.replace(
        CGROUP_HOST.cgroups, controllers=frozenset({"memory"})))
    plan = plan_of(Spec(limits=Limits(memory_mb=100, nproc=32, cpu_cores=2)), host)
    assert plan.cgroup == CgroupLimits(memory_bytes=100 << 20)
    assert dict(plan.rlimits) == {resource.RLIMIT_NPROC: 32}
    assert plan.limits_fallback == ("nproc", "cpu_cores")


def test_require_cgroups_is_refused_without_them() -> None:
    spec = Spec(limits=Limits(memory_mb=100, require_cgroups=True))
    err = refusal(plan_of(spec, HOST), HOST)
    assert isinstance(err, UnavailableError) and "memory_mb" in str(err) and HOST.cgroups.reason in str(err)
    assert refusal(plan_of(spec, CGROUP_HOST), CGROUP_HOST) is None


def test_no_limits_no_rlimits() -> None:
    assert plan_of(Spec()).rlimits == ()
    assert dict(plan_of(Spec(limits=Limits(nofile=5))).rlimits) == {resource.RLIMIT_NOFILE: 5}


def test_rlimits_are_capped_at_the_callers_hard_limit() -> None:
    host = HostInfo(executor=NATIVE, uid=1, gid=1, cwd="/", environ={},
                    hard_limits={resource.RLIMIT_NOFILE: 1024, resource.RLIMIT_CPU: 100})
    limits = Limits(nofile=1 << 20, cpu_s=5, nproc=7)
    assert dict(plan_of(Spec(limits=limits), host).rlimits) == {
        resource.RLIMIT_NOFILE: 1024, resource.RLIMIT_CPU: 5, resource.RLIMIT_NPROC: 7}


def test_the_smallest_request_for_a_resource_wins() -> None:
    host = HostInfo(executor=NATIVE, uid=1, gid=1, cwd="/", environ={}, hard_limits={resource.RLIMIT_FSIZE: 3 << 20})
    assert plan_of(Spec(limits=Limits(file_mb=2, file_bytes=5 << 20)), host).rlimits == (
        (resource.RLIMIT_FSIZE, 2 << 20),)
    assert plan_of(Spec(limits=Limits(file_mb=4, file_bytes=5 << 20)), host).rlimits == (
        (resource.RLIMIT_FSIZE, 3 << 20),)


def test_hard_limits_are_read_for_every_limited_resource() -> None:
    assert {res for res, _unit in [*RLIMITS.values(), *FALLBACK_RLIMITS.values()]} == set(LIMITED_RESOURCES)
    expected = {res: resource.getrlimit(res)[1] for res in LIMITED_RESOURCES}
    assert hard_limits() == {res: hard for res, hard in expected.items() if hard != resource.RLIM_INFINITY}
    assert HostInfo.current(NATIVE).hard_limits == hard_limits()
    assert HOST.hard_limits == {}  # not given: nothing is capped


# ---------------------------------------------------------------- signals


def test_the_command_starts_with_default_signals() -> None:
    assert plan_of(Spec()).reset_signals is True
    assert plan_of(Spec(as_pid_1=True)).reset_signals is True
    assert plan_of(Spec(namespaces=Namespaces(pid=False))).reset_signals is True


# ---------------------------------------------------------------- identity


def test_ids_default_to_the_callers() -> None:
    plan = plan_of(Spec())
    assert (plan.uid, plan.gid, plan.host_uid, plan.host_gid) == (1000, 1001, 1000, 1001)
    plan = plan_of(Spec(uid=0, gid=5))
    assert (plan.uid, plan.gid, plan.host_uid, plan.host_gid) == (0, 5, 1000, 1001)


@pytest.mark.parametrize(
    ("uid", "gid", "dev", "user", "expected"),
    [
        (None, None, True, True, True),  # host ids 1000/1001
        (1000, 1000, True, True, True),
        (0, 0, True, True, False),
        (0, 7, True, True, True),
        (7, 0, True, True, True),
        (1000, 1000, False, True, False),
        (None, None, True, False, False),
    ],
)
def test_map_root_first_when_dev_needs_root(uid: int | None, gid: int | None, dev: bool, user: bool,
                                            expected: bool) -> None:
    mounts = [Tmpfs("/t"), *([Dev()] if dev else [])]
    spec = Spec(mounts=mounts, uid=uid, gid=gid) if user else Spec(mounts=mounts, namespaces=Namespaces(user=False))
    assert plan_of(spec).map_root_first is expected


def test_host_root_with_dev_maps_directly() -> None:
    assert not plan_of(Spec(mounts=[Dev()]), ROOT).map_root_first
    assert plan_of(Spec(mounts=[Dev()], uid=1000), ROOT).map_root_first


@pytest.mark.parametrize(
    ("pid", "as_pid_1", "expected"),
    [(True, False, True), (True, True, False), (False, False, False)],
)
def test_reaper_iff_pid_namespace_and_not_as_pid_1(pid: bool, as_pid_1: bool, expected: bool) -> None:
    plan = plan_of(Spec(namespaces=Namespaces(pid=pid), as_pid_1=as_pid_1))
    assert plan.reaper is expected
    assert plan.pid_ns is pid


def test_namespaces_and_network() -> None:
    plan = plan_of(Spec(namespaces=Namespaces(ipc=False, cgroup=False, uts=False)))
    assert (plan.user_ns, plan.mount_ns, plan.pid_ns, plan.ipc_ns, plan.uts_ns, plan.cgroup_ns) == (
        True, True, True, False, False, False)
    assert plan.net_ns
    assert not plan_of(Spec(network="host")).net_ns


def test_capabilities_become_a_bitmask() -> None:
    plan = plan_of(Spec(cap_add=["CAP_NET_BIND_SERVICE", "CAP_CHOWN", "CAP_CHECKPOINT_RESTORE"]))
    assert plan.keep_caps == (1 << 10) | (1 << 0) | (1 << 40)
    assert CAPABILITIES.index("CAP_NET_BIND_SERVICE") == 10
    assert plan_of(Spec()).keep_caps == 0


def test_session_and_parent_options_pass_through() -> None:
    plan = plan_of(Spec(die_with_parent=False, new_session=False, hostname="h"))
    assert (plan.die_with_parent, plan.new_session, plan.hostname) == (False, False, "h")
    plan = plan_of(Spec())
    assert (plan.die_with_parent, plan.new_session, plan.hostname) == (True, True, None)


def test_plans_are_hashable_and_equal_for_equal_input() -> None:
    # The native backend caches serialized plans by the Plan itself.
    spec = Spec(mounts=[RoBind("/usr"), File("/f", data=b"x"), Dev()], env={"A": "1"},
                limits=Limits(nofile=10), cap_add=["CAP_CHOWN"])
    a, b = plan_of(spec), plan_of(spec)
    assert a == b
    assert hash(a) == hash(b)
    assert plan_of(spec.replace(env={"A": "2"})) != a


def test_compile_is_pure() -> None:
    environ = dict(HOST.environ)
    spec = Spec(env_inherit=["*"])
    plan_of(spec)
    assert HOST.environ == environ


def test_a_read_only_file_over_an_earlier_file_is_a_private_copy_bound_over_it() -> None:
    """bwrap's --file then --ro-bind-data on one path (Flatpak's /.flatpak-info): the later is
    bound over the earlier; a writable one is written in place, as bwrap's --file."""
    ops = plan_of(Spec(mounts=[File("/f", b"1"), File("/f", b"2"), File("/f", b"3", readonly=True),
                               File("/g", b"4", readonly=True)])).ops
    assert [bool(op.flags & OpFlag.FRESH) for op in ops] == [False, False, True, False]
    assert ops[2].flags & OpFlag.RDONLY and ops[2].data == b"3"
