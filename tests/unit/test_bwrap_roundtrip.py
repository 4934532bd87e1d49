"""Spec -> to_bwrap_args -> from_bwrap_args is the identity (no sandbox is started).

Specs are generated over every mount kind (with try, perms, size, file data),
every namespace switch, network, hostname, uid/gid, env, cwd, limits, flags
and capabilities, inside the domain the bwrap grammar can express (see
`to_bwrap_args`): PWD in env equal to the cwd, no env_inherit, a root caller
(so the user namespace is not implied), the default seccomp policy. File data
travels through real memfds that `from_bwrap_args` reads and closes.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sandbox import spec as S
from sandbox.backends.bwrap.render import render_op, render_plan
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.bwrap.argv import BwrapArgv
from sandbox.bwrap.parse import from_bwrap_args
from sandbox.bwrap.unparse import to_bwrap_args
from sandbox.errors import SpecError
from sandbox.host import HostInfo
from sandbox.plan import OpFlag, compile_plan, parent_mode_for

CALLER_CWD = "/"
SLOW_OK = [HealthCheck.filter_too_much, HealthCheck.too_slow]

names = st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=6)
components = names.filter(lambda c: c not in (".", ".."))
paths = st.lists(components, min_size=1, max_size=3).map(lambda parts: "/" + "/".join(parts))
perms = st.integers(0, 0o7777)
text = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=12)


@st.composite
def mounts(draw: st.DrawFn) -> S.Mount:
    dest = draw(paths)
    kind = draw(st.sampled_from(sorted(set(S.MOUNT_TYPES) - {"overlay"})))  # no option spells one (--image: a ref)
    klass = S.MOUNT_TYPES[kind]
    if issubclass(klass, S.Bind):
        return klass(draw(paths), draw(st.one_of(st.none(), st.just(dest))), draw(st.booleans()))
    if klass is S.Tmpfs:
        return S.Tmpfs(dest, draw(st.one_of(st.none(), st.integers(1, 2**63 - 1))), draw(perms))
    if klass is S.Dir:
        return S.Dir(dest, draw(perms))
    if klass is S.Symlink:
        return S.Symlink(draw(text.filter(bool)), dest)
    if klass is S.File:
        return S.File(dest, draw(st.binary(max_size=300)), draw(perms), draw(st.booleans()))
    if klass is S.Chmod:
        return S.Chmod(dest, draw(perms))
    return klass(dest)


@st.composite
def specs(draw: st.DrawFn) -> S.Spec:
    ns = S.Namespaces(user=draw(st.booleans()), mount=True, pid=draw(st.booleans()), ipc=draw(st.booleans()),
                      uts=draw(st.booleans()), cgroup=draw(st.booleans()))
    cwd = draw(st.one_of(st.none(), paths))
    env = draw(st.dictionaries(names.filter(lambda n: "=" not in n), text, max_size=4))
    env["PWD"] = cwd or CALLER_CWD
    limits = S.Limits(**{name: draw(st.one_of(st.none(), st.integers(1, 2**40)))
                         for name in ("cpu_s", "memory_mb", "file_mb", "nofile", "nproc")})
    caps = draw(st.sets(st.sampled_from(S.CAPABILITIES), max_size=3))
    ids = st.one_of(st.none(), st.integers(0, 2**31 - 1)) if ns.user else st.none()
    fields = dict(
        namespaces=ns, network=draw(st.sampled_from(S.NETWORK_MODES)),
        hostname=draw(st.one_of(st.none(), names.filter(lambda h: len(h) <= 64))) if ns.uts else None,
        uid=draw(ids), gid=draw(ids), env=env, cwd=cwd, limits=limits,
        die_with_parent=draw(st.booleans()), new_session=draw(st.booleans()),
        as_pid_1=draw(st.booleans()) if ns.pid else False,
        cap_add=tuple(c for c in S.CAPABILITIES if c in caps),
    )
    try:
        return S.Spec(mounts=tuple(draw(st.lists(mounts(), max_size=6))), **fields)
    except SpecError:
        assume(False)
        raise


def parse(args: list[str]) -> tuple[S.Spec, list[str]]:
    return from_bwrap_args(args, environ={"LEAK": "must not appear"}, cwd=CALLER_CWD, uid=0, gid=0)


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=SLOW_OK)
@given(spec=specs(), argv=st.lists(text.filter(bool), min_size=1, max_size=3))
def test_spec_round_trips(spec: S.Spec, argv: list[str]) -> None:
    before = open_fds()
    args = to_bwrap_args(spec, argv)
    try:
        back, command = parse(list(args))
    except BaseException:
        args.close()
        raise
    assert command == argv
    assert back == spec
    assert open_fds() == before, "every data fd was read and closed exactly once"


@given(spec=specs())
@settings(max_examples=100, deadline=None, database=None, suppress_health_check=SLOW_OK)
def test_each_data_fd_is_used_once(spec: S.Spec) -> None:
    with to_bwrap_args(spec, ["true"]) as args:
        used = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--file", "--ro-bind-data", "--seccomp")]
        assert sorted(int(fd) for fd in used) == sorted(args.fds)
        assert len(set(used)) == len(used)


def test_file_data_is_in_memfds_not_files() -> None:
    spec = S.Spec(mounts=[S.File("/etc/a", b"secret"), S.File("/etc/b", b"", readonly=True)])
    with to_bwrap_args(spec, ["true"]) as args:
        assert len(args.fds) == 2
        for fd in args.fds:
            assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:")
        assert os.pread(args.fds[0], 100, 0) == b"secret"


def test_dev_bind_try_and_size_options_are_rendered() -> None:
    spec = S.Spec(mounts=[S.DevBind("/dev", "/hostdev", optional=True), S.Tmpfs("/t", size=4096, perms=0o700)])
    args = to_bwrap_args(spec, ["true"])
    assert args[args.index("--dev-bind-try"):][:3] == ["--dev-bind-try", "/dev", "/hostdev"]
    i = args.index("--tmpfs")
    assert args[i - 4:i + 2] == ["--perms", "0700", "--size", "4096", "--tmpfs", "/t"]


@pytest.mark.parametrize("changes, field", [
    ({"namespaces": S.Namespaces(mount=False)}, "namespaces.mount"),
    ({"uid": 2**31}, "uid"),
    ({"limits": S.Limits(file_bytes=10)}, "limits.file_bytes"),
])
def test_what_the_grammar_cannot_say_is_refused(changes: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as info:
        to_bwrap_args(S.Spec(**changes), ["true"])
    assert info.value.field == field


@pytest.mark.parametrize("policy", [None, S.Spec().seccomp])
def test_no_filter_and_the_default_policy_round_trip(policy: object) -> None:
    args = to_bwrap_args(S.Spec(seccomp=policy), ["true"])
    assert ("--seccomp-default" in args) == (policy is not None) and "--seccomp" not in args
    back, _ = parse(list(args))
    assert back.seccomp == policy


def test_env_inherit_is_resolved_against_the_given_environ() -> None:
    spec = S.Spec(env_inherit=["KEEP_*"], env={"KEEP_B": "mine", "PWD": CALLER_CWD})
    args = to_bwrap_args(spec, ["true"], environ={"KEEP_A": "a", "KEEP_B": "theirs", "DROP": "x"})
    back, _ = parse(list(args))
    assert back.env_dict == {"KEEP_A": "a", "KEEP_B": "mine", "PWD": CALLER_CWD}


def test_plan_rendering_matches_native_parent_modes() -> None:
    """A plan op whose parent mode differs from bwrap's implicit rule gets explicit --dir parents."""
    spec = S.Spec(mounts=[S.File("/a/b/f", b"x", perms=0o600)], seccomp=None)
    plan = compile_plan(spec, HostInfo(executor=NATIVE, uid=0, gid=0, cwd="/", environ={}))
    op = plan.ops[0]
    with render_plan(plan) as args:
        assert isinstance(args, BwrapArgv)
        file_at = args.index("--file")
        if op.parent_mode == parent_mode_for(op.mode):  # the plan agrees with bwrap's rule: nothing extra
            assert "--dir" not in args
        else:
            wanted = f"{op.parent_mode:04o}"
            assert args[file_at - 10:file_at - 2] == ["--perms", wanted, "--dir", "/a", "--perms", wanted,
                                                      "--dir", "/a/b"]


def test_dev_modes_are_rendered_where_bwrap_makes_others() -> None:
    (op,) = compile_plan(S.Spec(mounts=[S.Dev("/d")]), HostInfo(executor=NATIVE, uid=0, gid=0, cwd="/", environ={})).ops
    assert render_op(op, [], match_native=True) == ["--dev", "/d", "--chmod", "1777", "/d/shm"]
    assert render_op(op, [], match_native=False) == ["--dev", "/d"]
    other = dataclasses.replace(op, mode=0o700, shm_mode=0o755)
    assert render_op(other, [], match_native=True) == ["--dev", "/d", "--chmod", "0700", "/d"]
    with pytest.raises(SpecError):
        render_op(other, [], match_native=False)  # the grammar's --dev has the default modes


@pytest.mark.parametrize("mount", [S.Bind("/a"), S.RoBind("/a"), S.DevBind("/a"), S.RemountRo("/a")])
def test_binds_without_nosuid_are_refused(mount: S.Mount) -> None:
    """bwrap binds (and remounts) nosuid whatever it is told: a plan that says otherwise cannot run there."""
    (op,) = compile_plan(S.Spec(mounts=[mount]), HostInfo(executor=NATIVE, uid=0, gid=0, cwd="/", environ={})).ops
    assert render_op(op, [])
    with pytest.raises(SpecError):
        render_op(dataclasses.replace(op, flags=op.flags & ~OpFlag.NOSUID), [])
