"""The native backend: serialize a Plan into the C core's blob and spawn it in-process."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...errors import SandboxError
from ...plan import Plan
from ...spec import Spec
from .core import BIN_DIR, INIT_PATH, STAMP_NAMES, STEP_NAMES, ffi, lib
from .messages import setup_error
from .wire import blob_for, newroot_dir, serialize

__all__ = ["BIN_DIR", "INIT_PATH", "STEP_NAMES", "Started", "blob_for", "ffi", "lib", "newroot_dir",
           "serialize", "setup_error", "spawn_blob", "spawn_plan"]

_init_fd_lock = threading.Lock()
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


def spawn_plan(plan: Plan, spec: Spec, argv: Sequence[str], stdio: tuple[int, int, int],
               pass_fds: Sequence[int]) -> Started:
    """Start `argv` under `plan` with the native core: in a leased network
    namespace when the plan asks for the pool or for a network check, with its
    forwarded ports relayed, and everything given back when it ends."""
    from ... import isolation, netpool

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
    from ... import forward

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


