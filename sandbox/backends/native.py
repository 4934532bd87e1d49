"""The native backend: serialize a Plan into the C core's blob and spawn it in-process.

The blob layout is `struct sbx_header` of csrc/sandbox.h followed by the op
array, the cwd candidates, the rlimits, the seccomp program and a string
area; every reference is a byte offset from the start. The layout is checked
against the compiled module's struct sizes at import.
"""

from __future__ import annotations

import dataclasses
import errno as E
import functools
import os
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ExecError, IsolationError, SandboxError, SetupError
from ..plan import OpKind, Plan
from ..spec import Spec

try:
    from .._native import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        f"sandbox: the compiled core (sandbox._native) is missing ({exc}); build it with `pip install .` "
        "or `pip install -e .` from the source tree"
    ) from exc

ABI_VERSION = 8
if lib.SBX_ABI_VERSION != ABI_VERSION:  # pragma: no cover - depends on the build
    raise ImportError(
        f"sandbox: the compiled core has ABI {lib.SBX_ABI_VERSION}, this Python code expects {ABI_VERSION}; "
        "rebuild it with `pip install .` (or `pip install -e .`) from the same source tree"
    )

HEADER = struct.Struct("<26IQ")
OP = struct.Struct("<4IQ4I")
RLIMIT = struct.Struct("<IIQ")
LANDLOCK = struct.Struct("<II")
for _name, _st in (("struct sbx_header", HEADER), ("struct sbx_op", OP), ("struct sbx_rlimit", RLIMIT),
                   ("struct sbx_landlock", LANDLOCK)):
    if ffi.sizeof(_name) != _st.size:  # pragma: no cover - a bug, not a build problem
        raise ImportError(f"sandbox: {_name} is {ffi.sizeof(_name)} bytes in C, {_st.size} in Python")

BIN_DIR = Path(__file__).resolve().parent.parent / "_bin"
INIT_PATH = BIN_DIR / "sandbox-init"

STEP_NAMES = {getattr(lib, n): n[len("SBX_STEP_"):].lower() for n in dir(lib) if n.startswith("SBX_STEP_")}
STAMP_NAMES = {getattr(lib, n): n[len("SBX_T_"):].lower() for n in dir(lib) if n.startswith("SBX_T_")}

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
    ("landlock_best_effort", lib.SBX_OPT_LANDLOCK_BEST_EFFORT),
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
                strings.add(op.data, terminate=False) if op.data else 0, len(op.data))
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


_init_fd_lock = __import__("threading").Lock()
_init_fd: int | None = None


def init_fd() -> int:
    """An O_PATH fd of sandbox-init, opened once per process."""
    global _init_fd
    with _init_fd_lock:
        if _init_fd is None:
            try:
                _init_fd = os.open(INIT_PATH, os.O_PATH | os.O_CLOEXEC)
            except OSError as exc:
                raise SandboxError(
                    f"sandbox-init is missing at {INIT_PATH} ({exc.strerror}); reinstall the package"
                ) from None
        return _init_fd


def cstrings(items: Sequence[str | bytes]) -> tuple[object, list[object]]:
    """A NULL-terminated `char *[]` for `items`, and the buffers it points into."""
    keep = [ffi.new("char[]", os.fsencode(s) if isinstance(s, str) else s) for s in items]
    return ffi.new("char *[]", [*keep, ffi.NULL]), keep


@functools.lru_cache(maxsize=512)
def blob_for(plan: Plan) -> bytes:
    """The serialized plan, cached: equal plans share one blob."""
    return serialize(plan, newroot_dir())


def spawn_plan(plan: Plan, spec: Spec, argv: Sequence[str], stdio: tuple[int, int, int],
               pass_fds: Sequence[int]) -> Started:
    """Start `argv` under `plan` with the native core: in a leased network
    namespace when the plan asks for the pool or for a network check, with its
    forwarded ports relayed, and everything given back when it ends."""
    from .. import isolation, netpool

    pool = netpool.pool_for("pool" if plan.net_pool else "none") if plan.net_ns else None
    lease = pool.lease() if pool is not None else None
    cleanups: list[Callable[[], None]] = []
    if lease is not None:
        # Recycle only if every process of the tenant is surely gone when pid 1
        # is (a pid namespace) and it never held capabilities over the namespace
        # (its own user namespace is a child of the namespace's owner).
        recycle = plan.pid_ns and plan.user_ns
        cleanups.append(lambda: lease.release(recycle=recycle, wait=False))
    try:
        findings = isolation.check_netns(lease.netlink) if lease is not None and plan.check_network else None
        run_plan = plan_in_lease(plan, lease.userns_fd is not None) if lease is not None else plan
        join = None if lease is None else (-1 if lease.userns_fd is None else lease.userns_fd, lease.netns_fd)
        started = _spawn_forwarding(run_plan, argv, plan.env, stdio, pass_fds, join, cleanups)
    except BaseException:
        _run_all(cleanups)
        raise
    started.isolation = isolation.findings(plan, findings)
    if plan.landlock:
        started.isolation["landlock_abi"] = started.landlock_abi  # 0: best-effort, and the kernel has none
    started.on_exit = lambda: _run_all(cleanups)
    return started


def _spawn_forwarding(plan: Plan, argv: Sequence[str], env: Sequence[str], stdio: tuple[int, int, int],
                      pass_fds: Sequence[int], join: tuple[int, int] | None,
                      cleanups: list[Callable[[], None]]) -> Started:
    """spawn_blob, plus the relay of `plan.forward` when there is one."""
    if not plan.forward:
        return spawn_blob(blob_for(plan), plan, argv, env, stdio, pass_fds, join_ns=join)
    from .. import forward

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with mine, theirs:
        started = spawn_blob(blob_for(plan), plan, argv, env, stdio, pass_fds, join_ns=join,
                             listen_to=theirs.fileno())
        relay = forward.start(mine, plan.forward)
    cleanups.insert(0, relay.close)
    return started


def _run_all(cleanups: list[Callable[[], None]]) -> None:
    for cleanup in cleanups:
        cleanup()
    cleanups.clear()


def plan_in_lease(plan: Plan, pool_userns: bool) -> Plan:
    """The plan as run inside a leased namespace: no network namespace of its
    own (lo is already up), and, in a pool's user namespace, ids relative to it
    (the pool maps the caller to 0)."""
    changes: dict[str, object] = {"net_ns": False}
    if pool_userns:
        changes.update(host_uid=0, host_gid=0)
    return dataclasses.replace(plan, **changes)


@dataclass
class Started:
    """A native sandbox that has exec'd its command."""

    pid: int
    status_fd: int
    timings: dict[str, float]
    landlock_abi: int = 0
    on_exit: Callable[[], None] | None = None
    isolation: dict[str, object] | None = None


def spawn_blob(
    blob: bytes,
    plan: Plan,
    argv: Sequence[str],
    env: Sequence[str],
    stdio: tuple[int, int, int],
    pass_fds: Sequence[int],
    join_ns: tuple[int, int] | None = None,
    listen_to: int = -1,
) -> Started:
    """Start the command; raise SetupError/ExecError if the sandbox failed.

    `join_ns` = (userns fd or -1, netns fd): a leased network namespace to
    run in instead of a new one. `listen_to`: the Unix socket that receives
    the listening sockets of `plan.forward`."""
    c_argv, keep_a = cstrings(argv)
    c_env, keep_e = cstrings(env)
    c_pass = ffi.new("int[]", list(pass_fds) or [0])
    res = ffi.new("struct sbx_result *")
    init = init_fd() if plan.reaper else -1
    join = [-1, -1] if join_ns is None else list(join_ns)
    rc = lib.sbx_spawn(ffi.from_buffer(blob), len(blob), c_argv, c_env, list(stdio), c_pass, len(pass_fds), init,
                       join, listen_to, res)
    del keep_a, keep_e
    if rc != 0:
        raise setup_error(res, plan, argv)
    t = res.t_ns
    base = t[lib.SBX_T_START]
    timings = {STAMP_NAMES[i]: (t[i] - base) / 1000.0 for i in range(lib.SBX_N_STAMPS) if t[i]}
    return Started(pid=res.pid, status_fd=res.status_fd, timings=timings, landlock_abi=res.landlock_abi)


# ---------------------------------------------------------------- errors

_FS_NAMES = {OpKind.TMPFS: "tmpfs", OpKind.PROC: "proc", OpKind.DEV: "dev"}
_WHAT = {OpKind.DIR: "directory", OpKind.SYMLINK: "symlink", OpKind.FILE: "file"}


def _op_message(plan: Plan, index: int, detail: int) -> tuple[str, str | None]:
    """bwrap-like wording for a failed op, and the path it concerns."""
    if not 0 <= index < len(plan.ops):
        return "Can't apply a mount operation", None
    op = plan.ops[index]
    dest = op.dest
    if detail == lib.SBX_D_SOURCE:
        return (f"Can't find source path {op.src}" if op.kind is OpKind.BIND else f"Can't open {dest}"), op.src or dest
    if detail == lib.SBX_D_PARENTS:
        return f"Can't mkdir parents for {dest}", dest
    if detail == lib.SBX_D_EXISTS:
        return f"Can't make symlink at {dest}: existing destination is not {op.src}", dest
    if detail == lib.SBX_D_CREATE:
        return f"Can't create {_WHAT.get(op.kind, 'mount point')} at {dest}", dest
    if detail == lib.SBX_D_RESOLVE:
        return f"Can't open {dest} inside the sandbox", dest
    if detail == lib.SBX_D_WRITE:
        return f"Can't write file at {dest}", dest
    if detail == lib.SBX_D_CHMOD:
        return f"Can't chmod {op.mode:o} {dest}", dest
    if detail == lib.SBX_D_ATTR:
        if op.kind is OpKind.REMOUNT_RO:
            return f"Can't remount readonly on {dest}", dest
        return f"Can't set mount flags on {dest}", dest
    if op.kind is OpKind.BIND:
        return f"Can't bind mount {op.src} on {dest}", dest
    return f"Can't mount {_FS_NAMES.get(op.kind, op.kind.name.lower())} on {dest}", dest


def setup_error(res: object, plan: Plan, argv: Sequence[str]) -> SandboxError:
    """Turn the C core's failure record into a typed exception."""
    step, err, index, detail = res.step, res.err, res.op, res.detail  # type: ignore[attr-defined]
    reason = os.strerror(err) if err else "unknown error"
    name = STEP_NAMES.get(step, f"step {step}")
    path: str | None = None
    if step == lib.SBX_STEP_EXEC:
        return ExecError.from_errno(err or E.ENOENT, argv[0])
    if step == lib.SBX_STEP_ISOLATION:
        probe = plan.probe_paths[index] if 0 <= index < len(plan.probe_paths) else "?"
        what = "is visible inside the sandbox" if err == E.EEXIST else f"cannot be proven absent ({reason})"
        return IsolationError(f"isolation check failed: probe path {probe} {what}", path=probe, errno=err)
    if step in (lib.SBX_STEP_SOURCE, lib.SBX_STEP_OP):
        name = "source" if step == lib.SBX_STEP_SOURCE else plan.ops[index].kind.name.lower() if index >= 0 else "op"
        text, path = _op_message(plan, index, detail)
    elif step == lib.SBX_STEP_CWD:
        path = plan.cwd_candidates[0] if plan.cwd_strict else None
        text = f"Can't chdir to {path}" if path else "Can't chdir to any of " + ", ".join(plan.cwd_candidates)
    elif step in (lib.SBX_STEP_UID_MAP, lib.SBX_STEP_GID_MAP, lib.SBX_STEP_SETGROUPS):
        text = f"setting up {name.replace('_', ' ')}"
    elif step == lib.SBX_STEP_CLONE:
        text = "Creating new namespace failed"
        if err in (E.EPERM, E.ENOSPC, E.EACCES):
            text += " (user namespaces blocked? see `python -m sandbox probe`)"
    elif step == lib.SBX_STEP_CONFIG:
        text = "The serialized plan is malformed"
    else:
        text = f"Can't set up the sandbox ({name.replace('_', ' ')})"
    return SetupError(f"{text}: {reason}", step=name, path=path, errno=err, backend="native")
