"""The wire format: a Plan serialized into the C core's blob.

The blob layout is `struct sbx_header` of csrc/core/sandbox.h followed by the op
array, the cwd candidates, the rlimits, the Landlock rules, the probe paths,
the forwarded ports, the seccomp program and a string area; every reference
is a byte offset from the start. Every struct is built through cffi from the
cdef (csrc/core/sandbox.h), field by field by name, so its layout has one source;
csrc/core/wire.c checks the result before anything trusts it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from typing import Any

from ..errors import SandboxError
from ..plan import Op, OpKind, Plan
from .binding import ABI_VERSION, ffi, lib

HEADER_SIZE = ffi.sizeof("struct sbx_header")
OP_SIZE = ffi.sizeof("struct sbx_op")
RLIMIT_SIZE = ffi.sizeof("struct sbx_rlimit")
LANDLOCK_SIZE = ffi.sizeof("struct sbx_landlock")

NS_BITS = (
    ("user_ns", lib.SBX_NS_USER), ("mount_ns", lib.SBX_NS_MOUNT), ("pid_ns", lib.SBX_NS_PID),
    ("net_ns", lib.SBX_NS_NET), ("ipc_ns", lib.SBX_NS_IPC), ("uts_ns", lib.SBX_NS_UTS),
    ("cgroup_ns", lib.SBX_NS_CGROUP),
)
OPT_BITS = (
    ("reaper", lib.SBX_OPT_REAPER), ("die_with_parent", lib.SBX_OPT_DIE_WITH_PARENT),
    ("new_session", lib.SBX_OPT_NEW_SESSION), ("map_root_first", lib.SBX_OPT_MAP_ROOT_FIRST),
    ("cwd_strict", lib.SBX_OPT_CWD_STRICT), ("nested_userns", lib.SBX_OPT_NESTED_USERNS),
    ("disable_userns", lib.SBX_OPT_DISABLE_USERNS), ("landlock", lib.SBX_OPT_LANDLOCK),
    ("landlock_best_effort", lib.SBX_OPT_LANDLOCK_BEST_EFFORT), ("reset_signals", lib.SBX_OPT_RESET_SIGNALS),
    ("exec_fd", lib.SBX_OPT_EXEC_FD), ("host_tree", lib.SBX_OPT_HOST_TREE),
    ("caps_as_caller", lib.SBX_OPT_CAPS_AS_CALLER), ("seccomp_early", lib.SBX_OPT_SECCOMP_EARLY),
    ("keys_refused", lib.SBX_OPT_KEYS_REFUSED),
)
# the header's sync fds, as sandbox.sync names them
SYNC_FDS = ("started_fd", "userns_block_fd", "userns2_fd", "block_fd", "info_fd", "json_status_fd")


class _Strings:
    """The string area: NUL-terminated, deduplicated, offsets from `base`."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.data = bytearray()
        self.seen: dict[bytes, int] = {}

    def add(self, value: str | bytes | None, terminate: bool = True) -> int:
        if value is None:
            return 0
        raw = os.fsencode(value) if isinstance(value, str) else value
        key = raw + (b"\0" if terminate else b"")
        if key not in self.seen:
            self.seen[key] = self.base + len(self.data)
            self.data += key
        return self.seen[key]


def _align(n: int, to: int = 8) -> int:
    return (n + to - 1) // to * to


def _records(ctype: str, rows: list[dict[str, int]]) -> bytes:
    """An array of `ctype` (e.g. "struct sbx_op") with its fields set by name."""
    if not rows:
        return b""
    array = ffi.new(f"{ctype}[]", len(rows))
    for record, row in zip(array, rows, strict=True):
        for name, value in row.items():
            setattr(record, name, value)
    return bytes(ffi.buffer(array))


def _u32s(values: Iterable[int]) -> bytes:
    values = list(values)
    return bytes(ffi.buffer(ffi.new("uint32_t[]", values))) if values else b""


def _op_data(op: Op) -> bytes:
    """An op's data area: a FILE's contents; a PROC's covers, each its tag and
    path, NUL-terminated (csrc/core/mounts.c op_proc reads them in order); an
    OVERLAY's lower directories, top first, each NUL-terminated."""
    if op.kind is OpKind.PROC:
        return b"".join(cover.value.encode() + os.fsencode(path) + b"\0" for path, cover in op.covers)
    if op.kind is OpKind.OVERLAY:
        return b"".join(os.fsencode(path) + b"\0" for path in op.lowers)
    return op.data


def _op_rows(plan: Plan, strings: _Strings) -> list[dict[str, int]]:
    rows: list[dict[str, int]] = []
    for op in plan.ops:
        data = _op_data(op)
        rows.append({"kind": op.kind, "flags": op.flags, "mode": op.mode, "parent_mode": op.parent_mode,
                     "size": op.size, "src": strings.add(op.src or None), "dest": strings.add(op.dest),
                     "data": strings.add(data, terminate=False) if data else 0, "data_len": len(data),
                     "shm_mode": op.shm_mode})
    return rows


def _header(plan: Plan, offsets: dict[str, int], strings: _Strings, newroot: str) -> Any:
    """The `struct sbx_header` for `plan`, the areas at `offsets`."""
    h = ffi.new("struct sbx_header *")
    h.magic, h.abi = lib.SBX_MAGIC, ABI_VERSION
    h.ns = sum(bit for name, bit in NS_BITS if getattr(plan, name))
    h.opts = sum(bit for name, bit in OPT_BITS if getattr(plan, name))
    for name in SYNC_FDS:
        setattr(h, name, getattr(plan.sync, name))
    if any(getattr(plan.sync, name) >= 0 for name in SYNC_FDS):
        h.opts |= lib.SBX_OPT_SYNC
    h.host_uid, h.host_gid, h.uid, h.gid = plan.host_uid, plan.host_gid, plan.uid, plan.gid
    h.n_ops, h.n_cwd, h.n_rlimits = len(plan.ops), len(plan.cwd_candidates), len(plan.rlimits)
    h.n_landlock, h.n_probe, h.n_listen = len(plan.landlock_rules), len(plan.probe_paths), len(plan.forward)
    h.n_lock = len(plan.sync.lock_files)
    for name, offset in offsets.items():
        setattr(h, name, offset)
    h.seccomp_len = len(plan.seccomp)
    if not plan.seccomp:
        h.seccomp_off = 0
    h.hostname, h.path, h.newroot = strings.add(plan.hostname), strings.add(plan.path), strings.add(newroot)
    h.keep_caps = plan.keep_caps
    return h


def serialize(plan: Plan, newroot: str) -> bytes:
    """The C core's blob for `plan`, building the root at host dir `newroot`."""
    off: dict[str, int] = {"ops_off": HEADER_SIZE}
    off["cwd_off"] = off["ops_off"] + len(plan.ops) * OP_SIZE
    off["rlimits_off"] = _align(off["cwd_off"] + 4 * len(plan.cwd_candidates))
    off["landlock_off"] = off["rlimits_off"] + len(plan.rlimits) * RLIMIT_SIZE
    off["probe_off"] = off["landlock_off"] + len(plan.landlock_rules) * LANDLOCK_SIZE
    off["listen_off"] = off["probe_off"] + 4 * len(plan.probe_paths)
    off["lock_off"] = off["listen_off"] + 4 * len(plan.forward)
    off["seccomp_off"] = _align(off["lock_off"] + 4 * len(plan.sync.lock_files))
    strings = _Strings(_align(off["seccomp_off"] + len(plan.seccomp)))
    areas = {
        "ops_off": _records("struct sbx_op", _op_rows(plan, strings)),
        "cwd_off": _u32s(strings.add(c) for c in plan.cwd_candidates),
        "rlimits_off": _records("struct sbx_rlimit", [{"resource": r, "value": v} for r, v in plan.rlimits]),
        "landlock_off": _records("struct sbx_landlock", [
            {"path": strings.add(path), "flags": lib.SBX_LL_WRITE if rw else 0} for path, rw in plan.landlock_rules]),
        "probe_off": _u32s(strings.add(p) for p in plan.probe_paths),
        "listen_off": _u32s(port for port, _ in plan.forward),
        "lock_off": _u32s(strings.add(p) for p in plan.sync.lock_files),
        "seccomp_off": plan.seccomp,
    }
    h = _header(plan, off, strings, newroot)
    h.size = strings.base + len(strings.data)
    blob = bytearray(h.size)
    for name, data in areas.items():
        blob[off[name]:off[name] + len(data)] = data
    blob[:HEADER_SIZE] = ffi.buffer(h)
    blob[strings.base:] = strings.data
    return bytes(blob)


def header(blob: bytes) -> Any:
    """The `struct sbx_header` of `blob`, read by field name (a copy)."""
    if len(blob) < HEADER_SIZE:
        raise ValueError(f"a blob of {len(blob)} bytes has no header")
    h = ffi.new("struct sbx_header *")
    ffi.memmove(h, blob, HEADER_SIZE)
    return h


def op_kind(blob: bytes, index: int) -> int | None:
    """The kind of op `index` of `blob`, or None where there is no such op."""
    h = header(blob)
    if not 0 <= index < h.n_ops or h.ops_off + (index + 1) * OP_SIZE > len(blob):
        return None
    op = ffi.new("struct sbx_op *")
    ffi.memmove(op, blob[h.ops_off + index * OP_SIZE:], OP_SIZE)
    return int(op.kind)


@functools.cache
def newroot_dir() -> str:
    """A host directory to build new roots on (inside each sandbox's private
    mount namespace; the host never sees the mount)."""
    for candidate in ("/tmp", "/mnt", "/run", "/var/tmp", "/media", "/srv"):
        if os.path.isdir(candidate) and not os.path.islink(candidate):
            return candidate
    raise SandboxError("no directory to build the sandbox root on (tried /tmp, /mnt, /run, /var/tmp)")


def blob_for(plan: Plan) -> bytes:
    """The serialized plan, cached: equal plans share one blob. The same Plan
    object again (sandbox.plan_cache hands back one per Spec and caller state)
    finds its blob by identity, without hashing the plan's ops and covers."""
    hit = _by_identity.get(id(plan))
    if hit is not None and hit[0] is plan:  # the entry holds the plan: its id is not reused meanwhile
        return hit[1]
    blob = _blob_for_equal(plan)
    if len(_by_identity) >= _MAX_BY_IDENTITY:
        _by_identity.clear()
    _by_identity[id(plan)] = (plan, blob)
    return blob


_MAX_BY_IDENTITY = 64  # plan_cache.MAX_PLANS: as many plans as it keeps
_by_identity: dict[int, tuple[Plan, bytes]] = {}  # a plain dict: racing threads store equal entries


@functools.lru_cache(maxsize=512)
def _blob_for_equal(plan: Plan) -> bytes:
    return serialize(plan, newroot_dir())
