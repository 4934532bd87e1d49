"""The Template's wire (sandbox.backends.template.wire <-> csrc/core/wire.c): the
requests Python builds, read back by the C core's own reader
(sbx_parse_request, sbx_check_store, which the server uses), field by field
and fd by fd; every truncation, trailing byte, wrong magic, version or fd
count refused; the reports the caller reads (sbx_template_report) checked
whole, every forged or short one refused with its fds closed; and the WorkerPool zygote's
ctypes prototype of sbx_fork_sandbox_ns, derived from the cdef and called
for real. Nothing runs in a sandbox and nothing needs privileges."""

from __future__ import annotations

import array
import ctypes
import errno
import itertools
import os
import socket
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from sandbox import Spec
from sandbox._core.binding import ffi, lib
from sandbox.backends.template import TRAITS as TEMPLATE
from sandbox.backends.template import wire
from sandbox.host import HostInfo
from sandbox.plan import compile_plan
from sandbox.workerpool import forkcall

HOST = HostInfo(executor=TEMPLATE, uid=1000, gid=1001, cwd="/home/u", environ={"HOME": "/home/u", "PATH": "/usr/bin"})
ARGV = ("/bin/echo", "hello", "wörld", "")
ENV = ("PATH=/usr/bin", "A=b")


def sandbox_blob(reaper: bool = True) -> bytes:
    return wire.sandbox_blob(compile_plan(Spec(seccomp=None, as_pid_1=not reaper), HOST))


def aligned(data: bytes) -> Any:
    """A private, 8-aligned copy of `data`, as the server's buffer is."""
    buf = ffi.new("uint64_t[]", max(1, (len(data) + 7) // 8))
    ffi.memmove(buf, data, len(data))
    return buf


def parse(msg: bytes, nfds: int, stored: Any = ffi.NULL) -> Any:
    """sbx_parse_request on `msg` with `nfds` fds: its view, or None if refused."""
    view = ffi.new("struct sbx_request_view *")
    buf = aligned(msg)
    parse.keep = buf  # type: ignore[attr-defined]  # the view points into it
    return view if lib.sbx_parse_request(buf, len(msg), stored, nfds, view) == 0 else None


def offset(view_ptr: Any, msg_buf: Any) -> int:
    return int(ffi.cast("uintptr_t", view_ptr)) - int(ffi.cast("uintptr_t", msg_buf))


def strings(view: Any, n: int) -> list[str]:
    out, p = [], view.strings
    for _ in range(n):
        s = ffi.string(p)
        out.append(s.decode())
        p += len(s) + 1
    return out


def fd_count(reaper: bool, join: bool, stdio_mask: int, n_pass: int, n_cgroup: int = 0) -> int:
    return 1 + (not reaper) + join + n_cgroup + bin(stdio_mask).count("1") + n_pass


def test_sizes_come_from_the_cdef() -> None:
    assert wire.REQUEST_SIZE == ffi.sizeof("struct sbx_request") == len(wire.header(blob_len=0))
    assert wire.FAILURE_SIZE == ffi.sizeof("struct sbx_report")


def test_the_header_read_back_by_name() -> None:
    data = wire.header(blob_len=40, argc=3, envc=2, n_pass=4, flags=lib.SBX_REQ_JOIN_NETNS, stdio_mask=5)
    head = ffi.new("struct sbx_request *")
    ffi.memmove(head, data, len(data))
    assert (head.magic, head.version, head.blob_len, head.argc, head.envc, head.n_pass, head.flags,
            head.stdio_mask) == (lib.SBX_REQ_MAGIC, lib.SBX_REQ_VERSION, 40, 3, 2, 4, lib.SBX_REQ_JOIN_NETNS, 5)


@pytest.mark.parametrize(("reaper", "join", "stdio_mask", "targets", "n_cgroup"),
                         list(itertools.product((True, False), (True, False), (0, 1, 5, 7), ((), (3,), (9, 4, 200)),
                                                (0, 4))))
def test_every_request_is_read_back_whole_by_the_c_reader(reaper: bool, join: bool, stdio_mask: int,
                                                          targets: tuple[int, ...], n_cgroup: int) -> None:
    blob = sandbox_blob(reaper)
    msg = wire.request(blob, ARGV, ENV, targets, join_netns=join, stdio_mask=stdio_mask, n_cgroup=n_cgroup)
    nfds = fd_count(reaper, join, stdio_mask, len(targets), n_cgroup)
    view = parse(msg, nfds)
    assert view is not None
    buf = parse.keep  # type: ignore[attr-defined]
    assert offset(view.blob, buf) == wire.REQUEST_SIZE
    assert bytes(ffi.buffer(view.blob, len(blob))) == blob
    assert [view.targets[k] for k in range(len(targets))] == list(targets)
    assert strings(view, len(ARGV) + len(ENV)) == [*ARGV, *ENV]
    # the fds in the order csrc/core/sandbox.h gives: report, status, netns, cgroups, stdio, pass
    order = ["report"] + ([] if reaper else ["status"]) + (["netns"] if join else [])
    assert view.cgroup_at == len(order)
    order += [f"cgroup{i}" for i in range(n_cgroup)]
    order += [f"stdio{i}" for i in range(3) if stdio_mask & (1 << i)]
    got = {"report": view.report, "status": view.status, "netns": view.netns,
           **{f"stdio{i}": view.stdio[i] for i in range(3)},
           **{f"cgroup{i}": view.cgroup_at + i for i in range(n_cgroup)}}
    assert {name: got[name] for name in order} == {name: k for k, name in enumerate(order)}
    assert all(got[name] == -1 for name in got if name not in order and not name.startswith("cgroup"))
    assert view.pass_at == len(order)
    # one fd more or fewer than announced: refused
    assert parse(msg, nfds - 1) is None
    assert parse(msg, nfds + 1) is None


def test_a_request_for_the_stored_blob() -> None:
    stored = aligned(sandbox_blob())
    msg = wire.request(b"", ARGV, ENV, (), join_netns=False, stdio_mask=0)
    view = parse(msg, 1, stored)
    assert view is not None and view.blob == ffi.cast("char *", stored)
    assert parse(msg, 1) is None  # nothing stored: refused


def test_every_truncation_and_trailing_byte_is_refused() -> None:
    msg = wire.request(sandbox_blob(), ARGV, ENV, (7,), join_netns=True, stdio_mask=3)
    nfds = fd_count(True, True, 3, 1)
    assert parse(msg, nfds) is not None
    for n in range(len(msg)):
        assert parse(msg[:n], nfds) is None, n
    assert parse(msg + b"x", nfds) is None
    assert parse(msg + b"\0", nfds) is None


@pytest.mark.parametrize("field", ["magic", "version", "argc", "envc", "blob_len", "n_pass", "stdio_mask",
                                   "n_cgroup", "reserved"])
def test_a_header_that_lies_is_refused(field: str) -> None:
    msg = wire.request(sandbox_blob(), ARGV, ENV, (7,), join_netns=False, stdio_mask=0)
    head = ffi.new("struct sbx_request *")
    ffi.memmove(head, msg, wire.REQUEST_SIZE)
    setattr(head, field, {"magic": 0x1234, "version": lib.SBX_REQ_VERSION + 1, "argc": 0}.get(
        field, getattr(head, field) + 1))
    bad = bytes(ffi.buffer(head)) + msg[wire.REQUEST_SIZE:]
    assert parse(bad, fd_count(True, False, 0, 1)) is None
    if field not in ("n_pass", "stdio_mask", "n_cgroup"):
        # refused whatever fds come with it; a count of fds the message does
        # not carry is caught by the fds alone (a 4-byte target more can be
        # read out of the first string)
        assert parse(bad, fd_count(True, False, head.stdio_mask, head.n_pass, head.n_cgroup)) is None


def test_too_many_cgroup_fds_are_refused() -> None:
    for n, ok in ((lib.SBX_REQ_MAX_CGROUP, True), (lib.SBX_REQ_MAX_CGROUP + 1, False)):
        msg = wire.request(sandbox_blob(), ARGV, ENV, (), join_netns=False, stdio_mask=0, n_cgroup=n)
        assert (parse(msg, fd_count(True, False, 0, 0, n)) is not None) == ok


def test_too_many_pass_fds_are_refused() -> None:
    targets = tuple(range(lib.SBX_REQ_MAX_FDS + 1))
    msg = wire.request(sandbox_blob(), ARGV, ENV, targets, join_netns=False, stdio_mask=0)
    assert parse(msg, fd_count(True, False, 0, len(targets))) is None


def store_ok(msg: bytes, nfds: int) -> bool:
    return lib.sbx_check_store(aligned(msg), len(msg), nfds) == 0


def test_a_store_request_is_checked_whole() -> None:
    blob = sandbox_blob()
    plain = wire.store_request(blob, 0)
    assert store_ok(plain, 1)
    assert not store_ok(plain, 2)
    leases = wire.store_request(blob, lib.SBX_REQ_STANDBY | lib.SBX_REQ_JOIN_NETNS)
    assert store_ok(leases, 1 + lib.SBX_N_STANDBY)
    assert not store_ok(leases, 1)
    for n in range(len(plain)):
        assert not store_ok(plain[:n], 1), n
    assert not store_ok(plain + b"\0", 1)
    head = ffi.new("struct sbx_request *")
    ffi.memmove(head, plain, wire.REQUEST_SIZE)
    head.version = 0  # a request of before the version field
    assert not store_ok(bytes(ffi.buffer(head)) + blob, 1)
    head.version, head.n_cgroup = lib.SBX_REQ_VERSION, 1  # a store enters no cgroup
    assert not store_ok(bytes(ffi.buffer(head)) + blob, 1)
    assert not store_ok(bytes(ffi.buffer(head)) + blob, 2)
    # ... but hands its standbys theirs (cgroup mode): a set of n_cgroup per standby, after the leases
    placed = wire.store_request(blob, lib.SBX_REQ_STANDBY, 3)
    assert store_ok(placed, 1 + 3 * lib.SBX_N_STANDBY)
    assert not store_ok(placed, 1 + 3)
    assert not store_ok(placed, 1)
    both = wire.store_request(blob, lib.SBX_REQ_STANDBY | lib.SBX_REQ_JOIN_NETNS, 2)
    assert store_ok(both, 1 + lib.SBX_N_STANDBY + 2 * lib.SBX_N_STANDBY)
    assert not store_ok(wire.store_request(blob, lib.SBX_REQ_STANDBY, lib.SBX_REQ_MAX_CGROUP + 1),
                        1 + (lib.SBX_REQ_MAX_CGROUP + 1) * lib.SBX_N_STANDBY)
    # a store request is not a sandbox request, nor the other way round
    assert parse(plain, 1) is None
    assert not store_ok(wire.request(blob, ARGV, ENV, (), join_netns=False, stdio_mask=0), 1)


def _report_pair() -> tuple[int, socket.socket]:
    """A report socket as sbx_template_send makes one (its first fd, sent
    beside a request), and the end the sandbox answers on."""
    server, caller = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    out = ffi.new("int *")
    try:
        msg = b"\0" * 8
        assert lib.sbx_template_send(caller.fileno(), msg, len(msg), ffi.NULL, 0, out) == 0
        data, anc, _, _ = server.recvmsg(16, socket.CMSG_SPACE(4 * 4))
        assert data == msg
        fds = [fd for level, kind, payload in anc if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
               for fd in array.array("i", payload)]
        assert len(fds) == 1
        return out[0], socket.socket(fileno=fds[0])
    finally:
        server.close()
        caller.close()


def _answer(data: bytes, fds: list[int] = ()) -> tuple[int, Any]:  # type: ignore[assignment]
    report, sandbox = _report_pair()
    try:
        with sandbox:
            sandbox.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])
        answer = ffi.new("struct sbx_template_answer *")
        return lib.sbx_template_report(report, answer), answer
    finally:
        os.close(report)


def _open_fds() -> set[int]:
    """This process's open fds (not the one the listing itself used)."""
    def is_open(fd: int) -> bool:
        try:
            os.fstat(fd)
        except OSError:
            return False
        return True
    return {fd for fd in map(int, os.listdir("/proc/self/fd")) if is_open(fd)}


def test_a_started_report_is_read_whole_with_its_pidfd_pid_and_lease() -> None:
    stamps = ffi.new("struct sbx_stamps_report *", {"step": lib.SBX_STEP_NONE, "op": 3, "err": -2, "detail": 7,
                                                     "t_ns": list(range(10, 10 + lib.SBX_N_STAMPS))})
    netns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    pidfd = os.pidfd_open(os.getpid())
    before = _open_fds()
    kind, answer = _answer(bytes(ffi.buffer(stamps)), [pidfd, netns])
    try:
        assert kind == lib.SBX_ANSWER_STARTED
        r = answer.report
        assert (r.step, r.op, r.err & 0xFFFFFFFF, r.detail) == (lib.SBX_STEP_NONE, 3, 0xFFFFFFFE, 7)
        assert list(r.t_ns)[:lib.SBX_N_STAMPS] == list(range(10, 10 + lib.SBX_N_STAMPS))
        assert answer.pid == os.getpid()  # the kernel's word on the sender (SO_PASSCRED)
        assert answer.netns_ino == os.fstat(netns).st_ino
        assert os.fstat(answer.pidfd).st_ino == os.fstat(pidfd).st_ino
        assert _open_fds() - before == {answer.pidfd}  # the lease's fd came and went
    finally:
        os.close(answer.pidfd)
        os.close(pidfd)
        os.close(netns)


def test_a_failure_report_is_read_with_the_lease_it_gives_back() -> None:
    record = ffi.new("struct sbx_report *", {"step": lib.SBX_STEP_EXEC, "op": -1, "err": 2, "detail": 0})
    data = bytes(ffi.buffer(record))
    netns = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    before = _open_fds()
    try:
        kind, answer = _answer(data, [netns])
        assert kind == lib.SBX_ANSWER_FAILED and answer.pidfd == -1
        r = answer.report
        assert (r.step, r.op, r.err, r.detail) == (lib.SBX_STEP_EXEC, -1, 2, 0)
        assert answer.netns_ino == os.fstat(netns).st_ino
        assert _open_fds() == before
    finally:
        os.close(netns)
    assert wire.parse_failure(data) == (lib.SBX_STEP_EXEC, -1, 2, 0)
    assert wire.parse_failure(data[:-1]) is None


STAMPS = bytes(ffi.buffer(ffi.new("struct sbx_stamps_report *", {"step": lib.SBX_STEP_NONE})))
FAILURE = bytes(ffi.buffer(ffi.new("struct sbx_report *", {"step": lib.SBX_STEP_EXEC, "err": 2})))


@pytest.mark.parametrize("data, with_fd", [
    (b"\0" * 5, True),                      # a size the protocol has not
    (STAMPS[:-1], True),                     # a short stamps report
    (STAMPS + b"\0" * 8, True),              # a long one (truncated on receipt)
    (STAMPS, False),                         # "started" without the sandbox's pidfd
    (STAMPS[:16], True),                     # a failure that says step 0, "no failure"
    (FAILURE + b"\0", True),                 # a failure with a trailing byte
])
def test_a_forged_or_short_report_is_refused_and_its_fds_closed(data: bytes, with_fd: bool) -> None:
    pidfd = os.pidfd_open(os.getpid())
    before = _open_fds()
    try:
        kind, answer = _answer(data, [pidfd] if with_fd else [])
        assert kind == lib.SBX_ANSWER_BAD
        assert answer.pidfd == -1 and answer.netns_ino == 0  # no lease is taken back on its word
        assert answer.report.step == lib.SBX_STEP_CONFIG  # a bug, or a forgery: never "started"
        assert _open_fds() == before
    finally:
        os.close(pidfd)


def test_a_report_socket_closed_without_a_word_is_eof() -> None:
    report, sandbox = _report_pair()
    sandbox.close()
    answer = ffi.new("struct sbx_template_answer *")
    try:
        assert lib.sbx_template_report(report, answer) == lib.SBX_ANSWER_EOF
        assert answer.pidfd == -1
    finally:
        os.close(report)


def test_a_request_the_server_cannot_take_leaves_nothing_open() -> None:
    server, caller = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.close()
    out = ffi.new("int *")
    with caller:
        before = _open_fds()
        assert lib.sbx_template_send(caller.fileno(), b"\0" * 8, 8, ffi.NULL, 0, out) == -errno.EPIPE
        assert out[0] == -1 and _open_fds() == before
    fds = ffi.new("int[]", lib.SBX_REQ_MAX_FDS)
    assert lib.sbx_template_send(0, b"\0" * 8, 8, fds, lib.SBX_REQ_MAX_FDS, out) == -errno.EMSGSIZE


def test_the_zygote_prototype_is_the_cdef() -> None:
    restype, argtypes = forkcall.ctypes_prototype(ffi, lib.sbx_fork_sandbox_ns)
    kind = ffi.typeof(lib.sbx_fork_sandbox_ns)
    assert restype is ctypes.c_int
    assert len(argtypes) == len(kind.args) == 11
    for arg, got in zip(kind.args, argtypes, strict=True):
        scalar = None if arg.kind == "pointer" else forkcall.CTYPES_SCALARS[arg.cname]
        assert got is (ctypes.c_void_p if scalar is None else getattr(ctypes, scalar))


def test_a_type_without_a_ctypes_counterpart_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(forkcall.CTYPES_SCALARS, "size_t")
    with pytest.raises(TypeError, match="size_t"):
        forkcall.ctypes_prototype(ffi, lib.sbx_fork_sandbox_ns)


def test_the_zygote_prototype_calls_the_real_function() -> None:
    """Through ctypes.PyDLL, as the zygote calls it: a blob the C check
    refuses returns before any clone, and the result lands in the struct
    cffi allocated, where Python reads it by name."""
    import sandbox._native as native

    fork = ctypes.PyDLL(native.__file__).sbx_fork_sandbox_ns
    fork.restype, fork.argtypes = forkcall.ctypes_prototype(ffi, lib.sbx_fork_sandbox_ns)
    res = ffi.new("struct sbx_result *")
    blob, stdio, fds = ffi.new("char[]", 64), ffi.new("int[3]", [0, 1, 2]), ffi.new("int[]", [0])

    def addr(cdata: Any) -> int:
        return int(ffi.cast("uintptr_t", cdata))

    assert fork(addr(blob), 64, addr(stdio), addr(fds), 0, addr(fds), 0, addr(fds), 0, 0, addr(res)) == -1
    assert (res.step, res.err, res.pid) == (lib.SBX_STEP_CONFIG, 22, -1)
    with pytest.raises(ctypes.ArgumentError):
        fork(addr(blob), 64, addr(stdio), addr(fds), 0, addr(fds), 0, addr(fds), "zero", 0, addr(res))
    with pytest.raises(TypeError):
        fork(addr(blob), 64, addr(stdio), addr(fds), 0, addr(fds), 0, addr(fds), 0, addr(res))


def test_cpythons_fork_hooks_are_all_three_or_none() -> None:
    """sbx_fork_python_hooks: some of the three is refused and changes
    nothing; none (the default) is accepted. (The zygote's forks call them:
    test_workerpool's reseeded random is the after-fork hook at work.)"""
    hook = ffi.cast("void (*)(void)", ctypes.cast(ctypes.pythonapi.PyOS_BeforeFork, ctypes.c_void_p).value)
    assert lib.sbx_fork_python_hooks(hook, ffi.NULL, ffi.NULL) == -1
    assert lib.sbx_fork_python_hooks(ffi.NULL, hook, hook) == -1
    assert lib.sbx_fork_python_hooks(ffi.NULL, ffi.NULL, ffi.NULL) == 0


def test_a_refused_plan_calls_no_fork_hook() -> None:
    """A blob the C check refuses returns before the clone: no hook runs
    (PyOS_BeforeFork without its after-fork would leave the import lock
    held). Counting hooks, in a child interpreter: they stay its own."""
    code = textwrap.dedent("""
        import ctypes, sys
        import sandbox._native as native
        from sandbox._core.binding import ffi, lib
        from sandbox.workerpool import forkcall
        calls = []
        kinds = [ctypes.CFUNCTYPE(None)(lambda name=name: calls.append(name)) for name in ("b", "p", "c")]
        hooks = [ffi.cast("void (*)(void)", ctypes.cast(k, ctypes.c_void_p).value) for k in kinds]
        assert lib.sbx_fork_python_hooks(*hooks) == 0
        fork = ctypes.PyDLL(native.__file__).sbx_fork_sandbox_ns
        fork.restype, fork.argtypes = forkcall.ctypes_prototype(ffi, lib.sbx_fork_sandbox_ns)
        res = ffi.new("struct sbx_result *")
        blob, stdio, fds = ffi.new("char[]", 64), ffi.new("int[3]", [0, 1, 2]), ffi.new("int[]", [0])
        addr = lambda c: int(ffi.cast("uintptr_t", c))
        assert fork(addr(blob), 64, addr(stdio), addr(fds), 0, addr(fds), 0, addr(fds), 0, 0, addr(res)) == -1
        print(res.step == lib.SBX_STEP_CONFIG, calls)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "[]"]
