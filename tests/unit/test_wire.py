"""The wire format (sandbox._core.blob, csrc/core/wire.c): real plans
serialized, read back by field name, and checked by the C core's own
validator, which must refuse every truncation and every out-of-range offset
or count. Nothing runs and nothing needs privileges: only the compiled module."""

from __future__ import annotations

import dataclasses
import os
import resource
from collections.abc import Iterator

import pytest

from sandbox import Limits, Namespaces, Spec
from sandbox._core import blob as wire
from sandbox._core.binding import ffi, lib
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.host import HostInfo
from sandbox.mounts import Bind, Chmod, Dev, Dir, File, Proc, RemountRo, RoBind, Symlink, Tmpfs
from sandbox.plan import OpKind, Plan, compile_plan
from sandbox.spec import Overlay

HOST = HostInfo(executor=NATIVE, uid=1000, gid=1001, cwd="/home/u/project",
                environ={"HOME": "/home/u", "PATH": "/host/bin"})
NEWROOT = "/tmp"

SPECS = {
    "empty": Spec(seccomp=None),
    "binds": Spec(mounts=(RoBind("/usr"), Bind("/tmp", "/work"), Bind("/missing", "/opt/m", optional=True),
                          Proc(), Dev(), Tmpfs("/tmp", size=1 << 20, perms=0o1777))),
    "files": Spec(mounts=(Tmpfs("/"), File("/etc/hosts", data=b"127.0.0.1 localhost\n", perms=0o644),
                          File("/etc/empty"), File("/etc/binary", data=bytes(range(256)), readonly=True),
                          Dir("/a/b/c", perms=0o700), Symlink("usr/bin", "/bin"), RemountRo("/a"),
                          Chmod("/a/b", 0o755)), hostname="box", cwd="/a"),
    "seccomp": Spec(mounts=(RoBind("/usr"), Symlink("usr/lib", "/lib")),
                    limits=Limits(cpu_s=10, nofile=64, file_bytes=4096)),
    "landlock": Spec(mounts=(RoBind("/usr"), Bind("/tmp")), landlock=True, seccomp=None,
                     namespaces=Namespaces(pid=False), uid=0, gid=0),
    "probes": Spec(mounts=(RoBind("/usr"),), probe_paths=("/etc/shadow", "/root/.ssh", "/home"),
                   cap_add=("CAP_NET_RAW",), disable_userns=True),
    "forward": Spec(mounts=(RoBind("/usr"),), forward=((8080, 80), (9000, "/run/app.sock")),
                    env=(("A", "b"),), network="none"),
    "overlay": Spec(mounts=(Overlay("/", ["/srv/l0", "/srv/l1"], size=1 << 20), Overlay("/ro", ["/srv/l0"],
                            writable=False), Overlay("/kept", ["/srv/l1"], upper="/srv/keep"), Proc())),
}


def plan(name: str) -> Plan:
    return compile_plan(SPECS[name], HOST)


def blob(name: str) -> bytes:
    return wire.serialize(plan(name), NEWROOT)


def check(data: bytes) -> int:
    """sbx_check_blob on a private, 8-aligned copy of `data`."""
    buf = ffi.new("uint64_t[]", max(1, (len(data) + 7) // 8))
    ffi.memmove(buf, data, len(data))
    return lib.sbx_check_blob(buf, len(data))


def with_header(data: bytes, **fields: int) -> bytes:
    h = wire.header(data)
    for name, value in fields.items():
        setattr(h, name, value)
    return bytes(ffi.buffer(h)) + data[wire.HEADER_SIZE:]


def string_at(data: bytes, offset: int) -> bytes:
    return data[offset:data.index(b"\0", offset)]


def u32s(data: bytes, offset: int, n: int) -> list[int]:
    return list(ffi.cast("uint32_t *", ffi.from_buffer(data))[offset // 4:offset // 4 + n])


def ops(data: bytes) -> list[object]:
    h = wire.header(data)
    array = ffi.new("struct sbx_op[]", max(1, h.n_ops))
    ffi.memmove(array, data[h.ops_off:h.ops_off + h.n_ops * wire.OP_SIZE], h.n_ops * wire.OP_SIZE)
    # each op copied into memory it owns: the items of `array` would point into it after it is freed
    return [ffi.new("struct sbx_op *", array[i]) for i in range(h.n_ops)]


@pytest.fixture(params=sorted(SPECS))
def name(request: pytest.FixtureRequest) -> str:
    return request.param


# ---------------------------------------------------------------- what Python writes, C accepts and reads back


def test_the_c_validator_accepts_every_plan(name: str) -> None:
    assert check(blob(name)) == 0


def test_the_header_read_by_name_matches_the_plan(name: str) -> None:
    p, data = plan(name), blob(name)
    h = wire.header(data)
    assert (h.magic, h.abi, h.size) == (lib.SBX_MAGIC, lib.SBX_ABI_VERSION, len(data))
    assert (h.host_uid, h.host_gid, h.uid, h.gid) == (p.host_uid, p.host_gid, p.uid, p.gid)
    assert (h.n_ops, h.n_cwd, h.n_rlimits, h.n_landlock, h.n_probe, h.n_listen) == (
        len(p.ops), len(p.cwd_candidates), len(p.rlimits), len(p.landlock_rules), len(p.probe_paths), len(p.forward))
    assert h.ns == sum(bit for attr, bit in wire.NS_BITS if getattr(p, attr))
    assert h.opts == sum(bit for attr, bit in wire.OPT_BITS if getattr(p, attr))
    assert h.keep_caps == p.keep_caps
    assert string_at(data, h.newroot) == NEWROOT.encode()
    assert string_at(data, h.path) == p.path.encode()
    assert (string_at(data, h.hostname).decode() if h.hostname else None) == p.hostname
    assert [string_at(data, o).decode() for o in u32s(data, h.cwd_off, h.n_cwd)] == list(p.cwd_candidates)
    assert [string_at(data, o).decode() for o in u32s(data, h.probe_off, h.n_probe)] == list(p.probe_paths)
    assert u32s(data, h.listen_off, h.n_listen) == [port for port, _ in p.forward]
    assert data[h.seccomp_off:h.seccomp_off + h.seccomp_len] == p.seccomp
    assert h.seccomp_off == 0 if not p.seccomp else h.seccomp_off % 8 == 0


def test_ops_read_by_name_match_the_plan(name: str) -> None:
    p, data = plan(name), blob(name)
    for op, raw in zip(p.ops, ops(data), strict=True):
        assert (raw.kind, raw.flags, raw.mode, raw.parent_mode, raw.size) == (
            op.kind, op.flags, op.mode, op.parent_mode, op.size)
        assert string_at(data, raw.dest).decode() == op.dest
        assert (string_at(data, raw.src).decode() if raw.src else "") == (op.src or "")
        covers = [(c.value + path).encode() for path, c in op.covers]
        expected = b"".join(c + b"\0" for c in covers) if op.kind is OpKind.PROC else op.data
        if op.kind is OpKind.OVERLAY:
            expected = b"".join(lower.encode() + b"\0" for lower in op.lowers)
        assert data[raw.data:raw.data + raw.data_len] == expected


def test_rlimits_and_landlock_rules_read_by_name() -> None:
    p, data = plan("seccomp"), blob("seccomp")
    h = wire.header(data)
    rl = ffi.cast("struct sbx_rlimit *", ffi.from_buffer(data[h.rlimits_off:]))
    assert [(rl[i].resource, rl[i].value) for i in range(h.n_rlimits)] == list(p.rlimits)
    assert (resource.RLIMIT_FSIZE, 4096) in p.rlimits
    p, data = plan("landlock"), blob("landlock")
    h = wire.header(data)
    ll = ffi.cast("struct sbx_landlock *", ffi.from_buffer(data[h.landlock_off:]))
    got = [(string_at(data, ll[i].path).decode(), bool(ll[i].flags & lib.SBX_LL_WRITE)) for i in range(h.n_landlock)]
    assert got == list(p.landlock_rules) and got


def test_every_struct_size_comes_from_the_cdef() -> None:
    assert wire.HEADER_SIZE == ffi.sizeof("struct sbx_header") == 28 * 4 + 6 * 4 + 8  # ..., the sync fds, keep_caps
    assert wire.OP_SIZE == ffi.sizeof("struct sbx_op")


# ---------------------------------------------------------------- what C refuses


def test_every_truncation_is_refused(name: str) -> None:
    data = blob(name)
    for n in range(len(data)):
        assert check(data[:n]) < 0, n
        if n >= wire.HEADER_SIZE:  # even when the header claims the shorter size
            assert check(with_header(data[:n], size=n)) < 0, n


def test_a_wrong_magic_abi_or_size_is_refused(name: str) -> None:
    data = blob(name)
    for field, value in (("magic", 0), ("abi", lib.SBX_ABI_VERSION + 1), ("size", len(data) + 1),
                         ("size", len(data) - 1)):
        assert check(with_header(data, **{field: value})) < 0, field
    assert check(data + b"\0" * 8) < 0


ARRAYS = {  # count field, offset field, element size, alignment
    "ops": ("n_ops", "ops_off", wire.OP_SIZE, 8),
    "cwd": ("n_cwd", "cwd_off", 4, 4),
    "rlimits": ("n_rlimits", "rlimits_off", wire.RLIMIT_SIZE, 8),
    "landlock": ("n_landlock", "landlock_off", wire.LANDLOCK_SIZE, 4),
    "probe": ("n_probe", "probe_off", 4, 4),
    "listen": ("n_listen", "listen_off", 4, 4),
}


def bad_arrays(data: bytes) -> Iterator[tuple[str, dict[str, int]]]:
    """Header changes that put an array out of the blob, into the header, or out of alignment."""
    h = wire.header(data)
    size = len(data)
    for n_field, off_field, elem, align in ARRAYS.values():
        n, off = getattr(h, n_field), getattr(h, off_field)
        yield f"{off_field} past the end", {off_field: size + align}
        yield f"{off_field} = 2**32-1", {off_field: 0xFFFFFFFF}
        yield f"{n_field} = 2**32-1", {n_field: 0xFFFFFFFF}
        yield f"{n_field} one past the end", {n_field: (size - off) // elem + 1}
        yield f"{n_field} in the header", {n_field: max(n, 1), off_field: 0}
        if n:
            yield f"{off_field} ends past the blob", {off_field: wire._align(size - n * elem + 1, align)}
            yield f"{off_field} misaligned", {off_field: off + align // 2}
    yield "seccomp_off past the end", {"seccomp_off": size + 8, "seccomp_len": 8}
    yield "seccomp_len past the end", {"seccomp_off": h.seccomp_off or 120, "seccomp_len": size * 8}
    yield "seccomp_len not whole instructions", {"seccomp_len": h.seccomp_len + 4}
    yield "seccomp_len above BPF_MAXINSNS", {"seccomp_len": 4097 * 8}
    yield "seccomp in the header", {"seccomp_off": 0, "seccomp_len": 8}
    yield "seccomp_off misaligned", {"seccomp_off": h.seccomp_off + 4, "seccomp_len": 8}


def bad_strings(data: bytes) -> Iterator[tuple[str, dict[str, int]]]:
    size = len(data)
    for field in ("hostname", "path", "newroot"):
        yield f"{field} past the end", {field: size}
        yield f"{field} = 2**32-1", {field: 0xFFFFFFFF}
        yield f"{field} in the header", {field: 4}
    yield "no newroot", {"newroot": 0}


@pytest.mark.parametrize("kind", ["arrays", "strings"])
def test_every_out_of_range_header_field_is_refused(name: str, kind: str) -> None:
    data = blob(name)
    cases = list(bad_arrays(data) if kind == "arrays" else bad_strings(data))
    assert cases
    for what, fields in cases:
        assert check(with_header(data, **fields)) < 0, what


def with_op(data: bytes, index: int, /, **fields: int) -> bytes:
    h = wire.header(data)
    op = ops(data)[index]
    for field, value in fields.items():
        setattr(op, field, value)
    at = h.ops_off + index * wire.OP_SIZE
    return data[:at] + bytes(ffi.buffer(op, wire.OP_SIZE)) + data[at + wire.OP_SIZE:]


def test_every_out_of_range_op_field_is_refused() -> None:
    data = blob("files")
    size = len(data)
    assert check(with_op(data, 0)) == 0  # the rewrite itself is faithful
    relative = next(i for i, op in enumerate(ops(data)) if op.kind == lib.SBX_OP_SYMLINK)
    with_data = next(i for i, op in enumerate(ops(data)) if op.data_len)
    cases = [
        (0, {"kind": 0}), (0, {"kind": lib.SBX_OP_MQUEUE + 1}), (0, {"kind": 0xFFFFFFFF}),
        (0, {"dest": 0}), (0, {"dest": size}), (0, {"dest": 0xFFFFFFFF}), (0, {"dest": 8}),
        (relative, {"src": 0}), (relative, {"src": size}), (relative, {"src": 16}),
        (with_data, {"data": size}), (with_data, {"data": size - 1}), (with_data, {"data": 0xFFFFFFFF}),
        (with_data, {"data_len": size}), (with_data, {"data_len": 0xFFFFFFFF}), (with_data, {"data": 0}),
        (with_data, {"data_len": 0}),
    ]
    # a destination must be absolute: point one at a relative link target
    cases.append((0, {"dest": ops(data)[relative].src}))
    for index, fields in cases:
        assert check(with_op(data, index, **fields)) < 0, (index, fields)


def test_a_bind_without_source_and_a_malformed_string_are_refused() -> None:
    data = blob("binds")
    bind = next(i for i, op in enumerate(ops(data)) if op.kind == lib.SBX_OP_BIND)
    assert check(with_op(data, bind, src=0)) < 0
    # a string whose NUL is missing: the last byte of the blob is a NUL; drop it
    h = wire.header(data)
    assert check(with_header(data[:-1] + b"x", size=h.size)) < 0


def test_an_unaligned_or_null_blob_is_refused() -> None:
    data = blob("empty")
    buf = ffi.new("char[]", len(data) + 8)
    ffi.memmove(buf + 1, data, len(data))
    assert lib.sbx_check_blob(buf + 1, len(data)) < 0
    assert lib.sbx_check_blob(ffi.NULL, 0) < 0


def test_blobs_are_cached_per_plan() -> None:
    p = plan("binds")
    assert wire.blob_for(p) is wire.blob_for(p)
    equal = dataclasses.replace(p)  # another object, equal: found by the lru cache, not by identity
    assert equal is not p and wire.blob_for(equal) is wire.blob_for(p)
    other = dataclasses.replace(p, hostname="other")
    assert wire.blob_for(other) != wire.blob_for(p)
    assert wire.blob_for(other) == wire.serialize(other, wire.newroot_dir())
    assert check(wire.blob_for(p)) == 0
    assert string_at(wire.blob_for(p), wire.header(wire.blob_for(p)).newroot).decode() == wire.newroot_dir()
    assert os.path.isdir(wire.newroot_dir())


def test_lock_files_read_by_name() -> None:
    """bwrap's --lock-file paths (sync.lock_files), for sandbox-init: only with its reaper."""
    from sandbox.sync import Sync

    p = compile_plan(Spec(namespaces=Namespaces(pid=True)), HOST, Sync(lock_files=("/run/a", "/b")))
    data = wire.serialize(p, NEWROOT)
    h = wire.header(data)
    paths = ffi.cast("uint32_t *", ffi.from_buffer(data[h.lock_off:]))
    assert [string_at(data, paths[i]).decode() for i in range(h.n_lock)] == ["/run/a", "/b"]
    assert check(data) == 0
    assert check(with_header(data, opts=h.opts & ~lib.SBX_OPT_REAPER)) != 0  # only pid 1 takes them
    assert check(with_header(data, n_lock=lib.SBX_MAX_LOCK_FILES + 1)) != 0
