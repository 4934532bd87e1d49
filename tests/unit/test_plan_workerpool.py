"""The WorkerPool's plans (sandbox.plan: zygote_plan, task_plan, with_task_binds),
its Spec (sandbox.workerpool.interpreter) and its reply loader. Pure: nothing runs."""

from __future__ import annotations

import datetime
import os
import pickle
import sys

import cloudpickle
import pytest

from sandbox import Bind, Dev, Dir, File, Limits, Namespaces, Proc, RoBind, Spec, SpecError, Symlink, Tmpfs
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.host import HostInfo
from sandbox.plan import OpFlag, OpKind, compile_plan
from sandbox.seccomp import DEFAULT_POLICY
from sandbox.warm_plan import ZYGOTE_ROOT_STAND_IN, task_plan, with_task_binds, zygote_plan
from sandbox.workerpool.interpreter import check_spec, executable_chain, interpreter_paths, zygote_spec
from sandbox.workerpool.results import RemoteError, RemoteTraceback, ReplyLoader, UnsafeResultError

USER = HostInfo(executor=NATIVE, uid=1000, gid=1001, cwd="/home/u", environ={})
ROOT = HostInfo(executor=NATIVE, uid=0, gid=0, cwd="/root", environ={})
MOUNTS = (RoBind("/usr"), Symlink("usr/bin", "/bin"), Proc(), Dev(), Tmpfs("/tmp"), Dir("/work"),
          Tmpfs("/scratch"), Dir("/scratch/sub"), File("/scratch/sub/f", b"data"), File("/etc/conf", b"x"))


def plans(host: HostInfo = USER, **fields: object):
    spec = Spec(mounts=MOUNTS, seccomp=DEFAULT_POLICY, limits=Limits(nofile=64), **fields)  # type: ignore[arg-type]
    plan = compile_plan(spec, host)
    zygote = zygote_plan(plan)
    return plan, zygote, task_plan(plan, zygote)


def test_the_zygote_applies_nothing_a_task_applies_itself() -> None:
    plan, zygote, _ = plans(landlock=True, disable_userns=True, cap_add=["CAP_NET_RAW"])
    assert plan.seccomp and plan.rlimits and plan.landlock_rules and plan.keep_caps and plan.disable_userns
    assert (zygote.seccomp, zygote.rlimits, zygote.landlock, zygote.landlock_rules) == (b"", (), False, ())
    assert (zygote.keep_caps, zygote.disable_userns) == (0, False)
    assert zygote.reaper and zygote.die_with_parent


def test_the_zygote_root_is_shared_and_read_only() -> None:
    _, zygote, _ = plans()
    proc = next(op for op in zygote.ops if op.kind is OpKind.PROC)
    assert proc.covers == ()  # fully visible: a task's fresh proc needs one
    read_only = {op.dest for op in zygote.ops if op.kind is OpKind.REMOUNT_RO}
    assert read_only == {"/", "/dev", "/tmp", "/scratch"}


def test_a_zygote_never_runs_as_uid_0() -> None:
    _, zygote, task = plans(ROOT)
    assert (zygote.uid, zygote.host_uid) == (ZYGOTE_ROOT_STAND_IN, 0)
    assert (task.uid, task.host_uid) == (0, ZYGOTE_ROOT_STAND_IN)  # the task's 0 is the caller's 0 outside
    assert zygote.map_root_first and zygote.nested_userns  # devpts: 0 mapped during its setup
    _, zygote, task = plans(USER)
    assert (zygote.uid, task.host_uid, task.uid) == (1000, 1000, 1000)
    _, zygote, task = plans(USER, uid=0, gid=0)
    assert (zygote.uid, zygote.host_uid, task.host_uid, task.uid) == (ZYGOTE_ROOT_STAND_IN, 1000, 1, 0)


def test_a_task_gets_every_namespace_and_the_spec_limits() -> None:
    plan, _, task = plans(landlock=True)
    assert (task.user_ns, task.mount_ns, task.pid_ns, task.ipc_ns, task.uts_ns, task.network) == (
        True, True, True, True, True, "none")
    assert task.seccomp == plan.seccomp and task.rlimits == plan.rlimits
    assert task.landlock_rules == plan.landlock_rules and task.cwd_candidates == plan.cwd_candidates
    assert not task.reaper and task.die_with_parent and task.hostname is None


def test_a_task_makes_fresh_what_it_could_write() -> None:
    _, _, task = plans()
    got = [(op.kind, op.dest) for op in task.ops]
    assert got == [
        (OpKind.PROC, "/proc"), (OpKind.TMPFS, "/dev/shm"), (OpKind.DEVPTS, "/dev/pts"), (OpKind.TMPFS, "/tmp"),
        (OpKind.TMPFS, "/scratch"), (OpKind.DIR, "/scratch/sub"), (OpKind.FILE, "/scratch/sub/f"),
        (OpKind.FILE, "/etc/conf"),
    ]
    proc = task.ops[0]
    assert proc.flags & OpFlag.FRESH and proc.covers  # a task's own proc has every cover
    assert task.ops[-1].flags & OpFlag.FRESH  # a writable File outside a tmpfs: a private copy per task


def test_a_task_with_devpts_maps_root_first_unless_it_is_root() -> None:
    assert plans(USER)[2].map_root_first
    assert not plans(ROOT)[2].map_root_first


def test_per_task_binds_come_from_fds_with_their_landlock_rules() -> None:
    _, _, task = plans(landlock=True)
    bound = with_task_binds(task, [Bind("/host/in", "/work"), RoBind("/host/ro", "/ro")])
    extra = bound.ops[len(task.ops):]
    assert [(op.kind, op.src, op.dest) for op in extra] == [(OpKind.BIND, "/host/in", "/work"),
                                                             (OpKind.BIND, "/host/ro", "/ro")]
    assert all(op.flags & OpFlag.FROM_FD and op.flags & OpFlag.NOSUID for op in extra)
    assert extra[1].flags & OpFlag.RDONLY and not extra[0].flags & OpFlag.RDONLY
    rules = dict(bound.landlock_rules)
    assert rules["/work"] is True and rules["/ro"] is False and rules["/usr"] is False
    assert with_task_binds(plans()[2], [Bind("/a", "/b")]).landlock_rules == ()
    with pytest.raises(SpecError, match=r"binds\[0\]"):
        with_task_binds(task, [Tmpfs("/x")])  # type: ignore[list-item]


@pytest.mark.parametrize("fields,field", [
    ({"network": "host"}, "network"),
    ({"namespaces": Namespaces(ipc=False)}, "namespaces"),
    ({"forward": {8080: 9000}}, "forward"),
    ({"die_with_parent": False}, "die_with_parent"),
    ({"mounts": (RoBind("/usr"),)}, "mounts"),
    ({"mounts": (RoBind("/usr"), Proc())}, "mounts"),
])
def test_what_tasks_cannot_be_given_is_refused_by_field(fields: dict, field: str) -> None:
    fields.setdefault("mounts", MOUNTS)
    with pytest.raises(SpecError) as info:
        check_spec(Spec(**fields))
    assert info.value.field == field


def test_the_zygote_spec_adds_the_interpreter_read_only() -> None:
    spec = zygote_spec(Spec(mounts=(Proc(), Dev(), Tmpfs("/tmp"))))
    added = spec.mounts[3:]
    assert all(isinstance(m, RoBind) and m.dest_path() == m.src for m in added)
    assert {m.src for m in added} == set(interpreter_paths())
    assert any(os.path.realpath(sys.executable) == m.src or os.path.realpath(sys.executable).startswith(m.src + "/")
               for m in added)
    covered = zygote_spec(Spec(mounts=(RoBind("/"), Proc(), Dev())))
    assert covered.mounts == (RoBind("/"), Proc(), Dev())  # a read-only bind of / already shows everything


def test_interpreter_paths_are_the_fewest(tmp_path) -> None:
    paths = interpreter_paths()
    assert paths == sorted(set(paths))
    assert not any(p != q and q.startswith(p.rstrip("/") + "/") for p in paths for q in paths)
    link = tmp_path / "py"
    link.symlink_to(sys.executable)
    assert executable_chain(str(link))[:2] == [str(link), sys.executable]


# ---------------------------------------------------------------- the reply loader

def test_plain_data_loads_safely() -> None:
    value = {"a": [1, 2.5, "x", b"y", None, True, (1, 2), {3}], "t": datetime.datetime(2024, 1, 2, 3, 4)}
    assert ReplyLoader().outcome(cloudpickle.dumps((True, value))) == (True, value)


@pytest.mark.parametrize("payload", [
    os.system, eval, pickle.loads, type("Dynamic", (), {})(),
])
def test_code_and_foreign_classes_are_refused(payload: object) -> None:
    with pytest.raises(UnsafeResultError):
        ReplyLoader().loads(cloudpickle.dumps(payload))


def test_a_crafted_reduce_is_refused() -> None:
    crafted = b"cos\nsystem\n(S'true'\ntR."  # protocol 0: os.system('true')
    with pytest.raises(UnsafeResultError, match="os.system"):
        ReplyLoader().loads(crafted)


def test_trusted_and_listed_types_load() -> None:
    data = cloudpickle.dumps(Namespaces(pid=False))
    with pytest.raises(UnsafeResultError):
        ReplyLoader().loads(data)
    assert ReplyLoader(result_types=[Namespaces]).loads(data) == Namespaces(pid=False)
    assert ReplyLoader(trusted=True).loads(data) == Namespaces(pid=False)


class Custom(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"custom {code}")
        self.code = code


def record(exc: BaseException, pickled: bytes | None) -> dict:
    kind = type(exc)
    return {"module": kind.__module__, "qualname": kind.__qualname__, "message": str(exc), "exception": pickled,
            "args": cloudpickle.dumps((exc.args, exc.__dict__)), "traceback": "Traceback: here\n"}


def test_exceptions_come_back_with_their_remote_traceback() -> None:
    exc = ReplyLoader().exception(record(KeyError("k"), cloudpickle.dumps(KeyError("k"))))
    assert isinstance(exc, KeyError) and isinstance(exc.__cause__, RemoteTraceback)
    assert "Traceback: here" in str(exc.__cause__)
    # pickled by value (as a class of an unimportable module is): made again from the caller's class
    rebuilt = ReplyLoader().exception(record(Custom(7), b"not a pickle"))
    assert isinstance(rebuilt, Custom) and rebuilt.code == 7 and str(rebuilt) == "custom 7"
    unknown = record(Custom(1), None) | {"module": "nowhere", "qualname": "Gone"}
    gone = ReplyLoader().exception(unknown)
    assert isinstance(gone, RemoteError) and gone.type_name == "nowhere.Gone" and "custom 1" in str(gone)
