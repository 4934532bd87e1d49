"""The covers every Proc gets are decided once, in the plan, and both backends carry them."""

from __future__ import annotations

import dataclasses
import os
import stat

import pytest

from sandbox import Proc, Spec
from sandbox._core import blob as wire
from sandbox._core.binding import ffi, lib
from sandbox.backends.bwrap.render import NEWROOT_SOURCE, render_op
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.host import HostInfo, root_only_proc_files
from sandbox.plan import OpKind, compile_plan
from sandbox.proc_covers import PROC_MASKED_FOR_ROOT, Cover, proc_covers

HOST = HostInfo(executor=NATIVE, uid=1000, gid=1000, cwd="/", environ={}, pool=None)
ROOT = HostInfo(executor=NATIVE, uid=0, gid=0, cwd="/", environ={}, pool=None, is_root=True)
PROC_COVERS = proc_covers(1000)


@pytest.mark.parametrize("pid_ns", [True, False])
def test_every_proc_gets_the_covers(pid_ns: bool) -> None:
    from sandbox import Namespaces

    spec = Spec(mounts=[Proc("/proc"), Proc("/p2")], namespaces=Namespaces(pid=pid_ns))
    ops = compile_plan(spec, HOST).ops
    assert [op.covers for op in ops] == [PROC_COVERS, PROC_COVERS]


def test_the_covers_hold_what_the_review_found() -> None:
    covers = dict(proc_covers(0))
    assert covers["sys"] is Cover.READ_ONLY  # core_pattern, as uid 0 of the host
    for name in ("slabinfo", "kpageflags", "timer_list", "vmallocinfo", "pagetypeinfo", "keys"):
        assert covers[name] is Cover.MASK
    # read-only covers come first: a mask below one is made on the read-only mount
    kinds = [cover for _, cover in covers.items()]
    assert kinds == sorted(kinds, key=lambda c: c is Cover.MASK)


def test_root_only_files_are_masked_where_the_sandbox_is_the_hosts_root() -> None:
    """Whatever uid it has inside, a root caller's sandbox is uid 0 of the host (the owner of those files)."""
    from sandbox import Proc as P

    for spec in (Spec(mounts=[P()]), Spec(mounts=[P()], uid=1000, gid=1000)):
        (op,) = compile_plan(spec, ROOT).ops
        assert set(PROC_MASKED_FOR_ROOT) <= {p for p, _ in op.covers}
    (op,) = compile_plan(Spec(mounts=[P()]), HOST).ops
    assert not set(PROC_MASKED_FOR_ROOT) & {p for p, _ in op.covers}


def test_the_running_kernels_root_only_files_are_masked_for_a_root_caller() -> None:
    """A file a kernel build adds (as /proc/program_cpu, mode 0400) is masked without being named anywhere."""
    root = dataclasses.replace(ROOT, proc_root_only=("program_cpu", "slabinfo"))
    (op,) = compile_plan(Spec(mounts=[Proc()]), root).ops
    masked = [p for p, c in op.covers if c is Cover.MASK]
    assert "program_cpu" in masked and masked.count("slabinfo") == 1
    (op,) = compile_plan(Spec(mounts=[Proc()]), dataclasses.replace(HOST, proc_root_only=("program_cpu",))).ops
    assert "program_cpu" not in {p for p, _ in op.covers}


def test_root_only_files_are_read_from_the_running_kernel() -> None:
    """Every top-level /proc file only root may read is found, and nothing else."""
    found = root_only_proc_files()
    for name in os.listdir("/proc"):
        st = os.lstat("/proc/" + name)
        only_root = stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o044
        assert (name in found) == (only_root and not name.isdigit()), name
    assert HostInfo(executor=NATIVE, uid=0, gid=0, cwd="/", environ={}).proc_root_only == found


def test_bwrap_renders_the_covers_for_bwrap_only() -> None:
    (op,) = compile_plan(Spec(mounts=[Proc("/proc")]), HOST).ops
    assert render_op(op, [], match_native=False) == ["--proc", "/proc"]
    args = render_op(op, [], match_native=True)
    assert args[:2] == ["--proc", "/proc"]
    assert ["--ro-bind-try", NEWROOT_SOURCE + "/proc/sys", "/proc/sys"] == args[2:5]
    masked = [args[i + 2] for i in range(len(args)) if args[i] == "--ro-bind" and args[i + 1] == "/dev/null"]
    assert masked == ["/proc/" + p for p, c in PROC_COVERS if c is Cover.MASK and os.path.lexists("/proc/" + p)]


def _check(data: bytes) -> int:
    """sbx_check_blob on a private, 8-aligned copy of `data`."""
    buf = ffi.new("uint64_t[]", max(1, (len(data) + 7) // 8))
    ffi.memmove(buf, data, len(data))
    return lib.sbx_check_blob(buf, len(data))


def test_native_blob_carries_the_covers_and_the_validator_wants_them_terminated() -> None:
    plan = compile_plan(Spec(mounts=[Proc("/proc")]), HOST)
    data = bytearray(wire.serialize(plan, "/tmp/x"))
    assert _check(bytes(data)) == 0
    h = wire.header(bytes(data))
    raw = ffi.new("struct sbx_op *")
    ffi.memmove(raw, bytes(data[h.ops_off:h.ops_off + wire.OP_SIZE]), wire.OP_SIZE)
    assert raw.kind == OpKind.PROC
    entries = bytes(data[raw.data:raw.data + raw.data_len]).split(b"\0")[:-1]
    assert entries == [(c.value + p).encode() for p, c in PROC_COVERS]
    data[raw.data + raw.data_len - 1] = ord("x")  # the last entry unterminated
    assert _check(bytes(data)) != 0


# ---------------------------------------------------------------- the cover sets (S.Proc.covers)

def test_procs_cover_the_strict_set_unless_they_say_otherwise() -> None:
    assert Proc().covers == "strict"
    assert proc_covers(1000) == proc_covers(1000, (), "strict")
    assert proc_covers(0, ("program_cpu",)) == proc_covers(0, ("program_cpu",), "strict")


def test_bwraps_set_covers_nothing_for_a_caller_other_than_root() -> None:
    """bwrap covers an entry only where its access(W_OK) test passes, which
    it never does for a caller other than root; so a user namespace made
    inside can mount a procfs of its own."""
    assert proc_covers(1000, ("slabinfo",), "bwrap") == ()
    (op,) = compile_plan(Spec(mounts=[Proc(covers="bwrap")]), HOST).ops
    assert op.covers == ()
    assert render_op(op, [], match_native=True) == ["--proc", "/proc"]


def test_bwraps_set_for_root_holds_bwraps_entries_and_the_root_only_masks() -> None:
    covers = proc_covers(0, ("program_cpu",), "bwrap")
    assert [p for p, c in covers if c is Cover.READ_ONLY] == ["sys", "sysrq-trigger", "irq", "bus"]
    masked = [p for p, c in covers if c is Cover.MASK]
    assert set(PROC_MASKED_FOR_ROOT) | {"program_cpu", "sys/net/ipv4/tcp_fastopen_key"} == set(masked)
    assert "keys" not in masked  # not a root-only file: bwrap leaves it


def test_each_proc_gets_its_own_set() -> None:
    spec = Spec(mounts=[Proc("/proc"), Proc("/p2", covers="bwrap")])
    assert [op.covers for op in compile_plan(spec, HOST).ops] == [PROC_COVERS, ()]


def test_the_set_is_validated_and_round_trips() -> None:
    from sandbox.errors import SpecError

    with pytest.raises(SpecError) as info:
        Spec(mounts=[Proc(covers="none")])
    assert info.value.field.endswith("covers")
    spec = Spec(mounts=[Proc("/proc", covers="bwrap")])
    assert Spec.from_json(spec.to_json()) == spec
