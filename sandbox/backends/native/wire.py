"""The wire format: a Plan serialized into the C core's blob.

The blob layout is `struct sbx_header` of csrc/sandbox.h followed by the op
array, the cwd candidates, the rlimits, the seccomp program and a string
area; every reference is a byte offset from the start. The layout is checked
against the compiled module's struct sizes at import.
"""

from __future__ import annotations

import functools
import os
import struct

from ...errors import SandboxError
from ...plan import Plan
from .core import ABI_VERSION, ffi, lib

HEADER = struct.Struct("<26IQ")
OP = struct.Struct("<4IQ6I")
RLIMIT = struct.Struct("<IIQ")
LANDLOCK = struct.Struct("<II")
for _name, _st in (("struct sbx_header", HEADER), ("struct sbx_op", OP), ("struct sbx_rlimit", RLIMIT),
                   ("struct sbx_landlock", LANDLOCK)):
    if ffi.sizeof(_name) != _st.size:  # pragma: no cover - a bug, not a build problem
        raise ImportError(f"sandbox: {_name} is {ffi.sizeof(_name)} bytes in C, {_st.size} in Python")

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
)


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


def serialize(plan: Plan, newroot: str) -> bytes:
    """The C core's blob for `plan`, building the root at host dir `newroot`."""
    seccomp = plan.seccomp
    n_ops, n_cwd, n_rl, n_ll = len(plan.ops), len(plan.cwd_candidates), len(plan.rlimits), len(plan.landlock_rules)
    ops_off = HEADER.size
    cwd_off = ops_off + n_ops * OP.size
    rl_off = _align(cwd_off + 4 * n_cwd)
    ll_off = rl_off + n_rl * RLIMIT.size
    probe_off = ll_off + n_ll * LANDLOCK.size
    listen_off = probe_off + 4 * len(plan.probe_paths)
    sc_off = _align(listen_off + 4 * len(plan.forward))
    strings = _Strings(_align(sc_off + len(seccomp)))
    ops = b"".join(
        OP.pack(op.kind, op.flags, op.mode, op.parent_mode, op.size,
                strings.add(op.src or None), strings.add(op.dest),
                strings.add(op.data, terminate=False) if op.data else 0, len(op.data), op.shm_mode, 0)
        for op in plan.ops
    )
    cwds = struct.pack(f"<{n_cwd}I", *(strings.add(c) for c in plan.cwd_candidates))
    rls = b"".join(RLIMIT.pack(res, 0, value) for res, value in plan.rlimits)
    lls = b"".join(LANDLOCK.pack(strings.add(path), lib.SBX_LL_WRITE if rw else 0) for path, rw in plan.landlock_rules)
    probes = struct.pack(f"<{len(plan.probe_paths)}I", *(strings.add(p) for p in plan.probe_paths))
    listens = struct.pack(f"<{len(plan.forward)}I", *(port for port, _ in plan.forward))
    ns = sum(bit for name, bit in NS_BITS if getattr(plan, name))
    opts = sum(bit for name, bit in OPT_BITS if getattr(plan, name))
    hostname, path, root = strings.add(plan.hostname), strings.add(plan.path), strings.add(newroot)
    total = strings.base + len(strings.data)
    header = HEADER.pack(
        lib.SBX_MAGIC, ABI_VERSION, total, ns, opts, plan.host_uid, plan.host_gid, plan.uid, plan.gid,
        n_ops, ops_off, n_cwd, cwd_off, n_rl, rl_off, hostname, path, root,
        sc_off if seccomp else 0, len(seccomp), n_ll, ll_off, len(plan.probe_paths), probe_off,
        len(plan.forward), listen_off, plan.keep_caps,
    )
    body = header + ops + cwds
    body += b"\0" * (rl_off - len(body)) + rls + lls + probes + listens
    body += b"\0" * (sc_off - len(body)) + seccomp
    body += b"\0" * (strings.base - len(body)) + strings.data
    assert len(body) == total
    return bytes(body)


@functools.cache
def newroot_dir() -> str:
    """A host directory to build new roots on (inside each sandbox's private
    mount namespace; the host never sees the mount)."""
    for candidate in ("/tmp", "/mnt", "/run", "/var/tmp", "/media", "/srv"):
        if os.path.isdir(candidate) and not os.path.islink(candidate):
            return candidate
    raise SandboxError("no directory to build the sandbox root on (tried /tmp, /mnt, /run, /var/tmp)")


@functools.lru_cache(maxsize=512)
def blob_for(plan: Plan) -> bytes:
    """The serialized plan, cached: equal plans share one blob."""
    return serialize(plan, newroot_dir())
