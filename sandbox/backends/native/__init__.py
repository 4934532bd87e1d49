"""The native backend: serialize a Plan into the C core's blob and spawn it in-process."""

from __future__ import annotations

import errno as E
import functools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ... import isolation, netpool
from ..._core.binding import INIT_PATH_STR, STAMP_NAMES, STEP_NAMES, ffi, lib
from ..._core.blob import blob_for
from ..._core.report import setup_error
from ...capabilities import ALL, Capability, Traits
from ...errors import SandboxError
from ...forksafe import fresh_in_child
from ...host import DISABLE_NATIVE_ENV, userns_sysctls
from ...plan import Plan
from ..contract import ExitSource, WaitStatus
from ..handle import ProcessHandle
from ..walls import walls_for

__all__ = ["BACKEND", "TRAITS", "ReaperStatus", "SandboxStatus", "Started", "available", "blob_for", "launch",
           "spawn_blob"]


_init_fd_lock = threading.Lock()
_init_fd: int | None = None
fresh_in_child(globals(), "_init_fd_lock")


def init_fd() -> int:
    """An O_PATH fd of sandbox-init, opened once per process."""
    global _init_fd
    with _init_fd_lock:
        if _init_fd is None:
            try:
                _init_fd = os.open(INIT_PATH_STR, os.O_PATH | os.O_CLOEXEC)
            except OSError as exc:
                raise SandboxError(
                    f"sandbox-init is missing at {INIT_PATH_STR} ({exc.strerror}); reinstall the package"
                ) from None
        return _init_fd


def cstrings(items: Sequence[str | bytes]) -> tuple[object, list[object]]:
    """A NULL-terminated `char *[]` for `items`, and the buffers it points into."""
    keep = [ffi.new("char[]", os.fsencode(s) if isinstance(s, str) else s) for s in items]
    return ffi.new("char *[]", [*keep, ffi.NULL]), keep


def launch(plan: Plan, argv: list[str], stdio: tuple[int, int, int], pass_fds: tuple[int, ...], *,
           exec_fd: int | None = None) -> ProcessHandle:
    """Start `argv` under `plan` with the native core: in a leased network
    namespace when the plan says so (inspected first when it asks for a
    check), with its forwarded ports relayed, and everything given back when
    it ends. `exec_fd`: the executable to run when `plan.exec_fd` (argv[0]
    is then only its name)."""
    cleanups: list[Callable[[], None]] = []
    walls = walls_for(plan, "native")
    lease = _lease(plan, cleanups)
    dups: tuple[int, int | None] | None = None
    try:
        found = isolation.check_netns(lease.netlink) if lease is not None and plan.check_network else None
        dups = lease.dup_fds() if lease is not None else None
        join = None if dups is None else (-1 if dups[1] is None else dups[1], dups[0])
        cg_fds = walls.cgroup.procs_fds if walls.cgroup is not None else []
        started = _spawn_forwarding(plan, argv, stdio, pass_fds, join, cleanups, exec_fd, cg_fds)
    except BaseException as exc:
        if lease is not None and getattr(exc, "step", None) == "join_netns":
            lease.release(recycle=False, wait=False)  # a namespace that could not be joined is not leased again
        _run_all(cleanups)
        walls.remove()  # the failed child has been reaped
        raise
    finally:
        for fd in dups or ():
            if fd is not None:
                os.close(fd)
        if walls.cgroup is not None:
            walls.cgroup.close_fds()  # written by the child (it has exec'd, or failed)
    findings = isolation.findings(plan, found)
    if plan.landlock:
        findings["landlock_abi"] = started.landlock_abi  # 0: best-effort, and the kernel has none
    exit_source: ExitSource = SandboxStatus(started.status_fd) if started.status_fd >= 0 else WaitStatus()
    # sandbox-init writes the status once every other process has gone: the wait ends there, and its
    # own exit (the namespaces' teardown) is reaped in the background (sandbox.process)
    return ProcessHandle(started.pid, exit_source, started.timings, isolation=findings,
                         on_exit=lambda: _run_all(cleanups), ended_fd=started.status_fd, walls=walls)


def _lease(plan: Plan, cleanups: list[Callable[[], None]]) -> netpool.Lease | None:
    """A namespace leased from the shared pool when the plan runs in one."""
    if plan.network != "pool":
        return None
    pool = netpool.pool_for("pool")
    assert pool is not None
    lease = pool.lease()
    # recycled only after a tenant in a user namespace of its own: it held no capability over the lease
    recycle = plan.recycle_lease

    def release() -> None:
        lease.release(recycle=recycle, wait=False, unprivileged_tenant=recycle)

    cleanups.append(release)
    return lease


def _spawn_forwarding(plan: Plan, argv: Sequence[str], stdio: tuple[int, int, int], pass_fds: Sequence[int],
                      join: tuple[int, int] | None, cleanups: list[Callable[[], None]],
                      exec_fd: int | None = None, cgroup_fds: Sequence[int] = ()) -> Started:
    """spawn_blob, plus the relay of `plan.forward` when there is one."""
    if not plan.forward:
        return spawn_blob(blob_for(plan), plan, argv, stdio, pass_fds, join_ns=join, exec_fd=exec_fd,
                          cgroup_fds=cgroup_fds)
    import socket

    from ... import forward  # lazy: only to forward ports: 2 ms, not on a plain run (test_cold_path)

    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with mine, theirs:
        started = spawn_blob(blob_for(plan), plan, argv, stdio, pass_fds, join_ns=join, listen_to=theirs.fileno(),
                             cgroup_fds=cgroup_fds)
        relay = forward.start(mine, plan.forward, plan.forward_writable)
    cleanups.insert(0, relay.close)
    return started


def _run_all(cleanups: list[Callable[[], None]]) -> None:
    for cleanup in cleanups:
        cleanup()
    cleanups.clear()


END_STATUS_SIZE = ffi.sizeof("struct sbx_end_status")


def end_record(data: bytes) -> tuple[int | None, tuple[float, float] | None]:
    """(raw wait status, (CPU seconds, peak RSS in MiB) or None) of what a
    reaper wrote: a bare 4-byte status, or sandbox-init's struct
    sbx_end_status, which adds what the kernel counted for every process of
    the sandbox."""
    if len(data) < 4:
        return None, None
    status = int.from_bytes(data[:4], "little", signed=True)
    if len(data) < END_STATUS_SIZE:
        return status, None
    end = ffi.from_buffer("struct sbx_end_status *", data)  # read in place: no copy on the reap path
    if end.utime_us < 0:
        return status, None
    return status, ((end.utime_us + end.stime_us) / 1e6, end.maxrss_kb / 1024)


class ReaperStatus:
    """The command's status as sandbox-init reports it: the raw wait status
    written to a pipe before it exits (its own exit code could not say
    "killed by signal N"), with the sandbox's `rusage` (CPU seconds, peak
    RSS in MiB) where the reaper sends it, else None."""

    rusage: tuple[float, float] | None = None

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def returncode(self, raw_status: int) -> int:
        """The reported status if there is one, else the reaper's own."""
        try:
            data = os.read(self.fd, END_STATUS_SIZE) if self.fd >= 0 else b""
        except OSError:
            data = b""
        self.close()
        status, self.rusage = end_record(data)
        if status is not None:
            raw_status = status
        return os.waitstatus_to_exitcode(raw_status)

    def close(self) -> None:
        """Close the pipe (idempotent)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        if self.fd >= 0:
            self.close()


class SandboxStatus(ReaperStatus):
    """The command's wait status, as a reaper writes it once every other
    process of the sandbox has gone (sandbox-init, csrc/init/init.c; a Template's
    resident pid 1, csrc/template/resident.c): the wait may end when it arrives (an
    EarlyStatus), before the reaper's own exit."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.status: int | None = None

    def arrived(self) -> bool:
        """Take the status (its fd is readable): True if it came, False at EOF."""
        try:
            data = os.read(self.fd, END_STATUS_SIZE) if self.fd >= 0 else b""
        except OSError:
            data = b""
        status, rusage = end_record(data)
        if status is not None:
            self.status, self.rusage = status, rusage
        return self.status is not None

    def returncode(self, raw_status: int) -> int:
        """The status that arrived, else what the fd says (else `raw_status`)."""
        if self.status is None:
            return super().returncode(raw_status)
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        return os.waitstatus_to_exitcode(self.status)


@dataclass
class Started:
    """What the C core reports for a sandbox that has exec'd its command."""

    pid: int
    status_fd: int
    timings: dict[str, float]
    landlock_abi: int = 0


N_STAMPS = lib.SBX_N_STAMPS
T_START = lib.SBX_T_START


@functools.lru_cache(maxsize=64)
def _c_env(env: tuple[str, ...]) -> tuple[object, list[object]]:
    """cstrings(env), made once per environment: the C core only reads it (csrc/core/sandbox.h)."""
    return cstrings(env)


def spawn_blob(
    blob: bytes,
    plan: Plan,
    argv: Sequence[str],
    stdio: tuple[int, int, int],
    pass_fds: Sequence[int],
    join_ns: tuple[int, int] | None = None,
    listen_to: int = -1,
    exec_fd: int | None = None,
    cgroup_fds: Sequence[int] = (),
) -> Started:
    """Start the command; raise SetupError/ExecError if the sandbox failed.

    `join_ns` = (userns fd or -1, netns fd): a leased network namespace to
    run in instead of a new one. `listen_to`: the Unix socket that receives
    the listening sockets of `plan.forward`. `exec_fd`: what SBX_OPT_EXEC_FD execs.
    `cgroup_fds`: cgroup.procs files the sandbox's first process enters first."""
    c_argv, keep_a = cstrings(argv)
    c_env, keep_e = _c_env(plan.env)
    c_pass = ffi.new("int[]", list(pass_fds) or [0])
    res = ffi.new("struct sbx_result *")
    init = exec_fd if exec_fd is not None else init_fd() if plan.reaper else -1
    join = [-1, -1] if join_ns is None else list(join_ns)
    if cgroup_fds:
        rc = lib.sbx_spawn_cg(ffi.from_buffer(blob), len(blob), c_argv, c_env, list(stdio), c_pass, len(pass_fds),
                              init, join, listen_to, list(cgroup_fds), len(cgroup_fds), res)
    else:
        rc = lib.sbx_spawn(ffi.from_buffer(blob), len(blob), c_argv, c_env, list(stdio), c_pass, len(pass_fds),
                           init, join, listen_to, res)
    del keep_a, keep_e
    if rc != 0:
        raise setup_error(res, blob, argv)
    t = ffi.unpack(res.t_ns, N_STAMPS)
    base = t[T_START]
    timings = {STAMP_NAMES[i]: (ns - base) / 1000.0 for i, ns in enumerate(t) if ns}
    timings["exec"] = timings.get("done", 0.0)  # the parent saw the command exec'd
    return Started(pid=res.pid, status_fd=res.status_fd, timings=timings, landlock_abi=res.landlock_abi)


# ---------------------------------------------------------------- availability

def available() -> tuple[bool, str]:
    """Whether this host lets the native core make its namespaces and use the mount API (tried once)."""
    if os.environ.get(DISABLE_NATIVE_ENV, "") not in ("", "0"):
        return False, f"disabled by {DISABLE_NATIVE_ENV}={os.environ[DISABLE_NATIVE_ENV]}"
    if not os.path.exists(INIT_PATH_STR):
        return False, f"sandbox-init missing at {INIT_PATH_STR}; reinstall the package"
    res = ffi.new("struct sbx_result *")
    ns = lib.SBX_NS_USER | lib.SBX_NS_MOUNT | lib.SBX_NS_PID | lib.SBX_NS_NET | lib.SBX_NS_IPC | lib.SBX_NS_UTS
    if lib.sbx_probe(ns, res) == 0:
        return True, "user, mount, pid, net, ipc and uts namespaces and the mount API work"
    step = STEP_NAMES.get(res.step, str(res.step))
    if res.step == lib.SBX_STEP_CLONE:
        return False, _explain_clone(res.err, userns_sysctls())
    name = E.errorcode.get(res.err, str(res.err))
    return False, f"{step.replace('_', ' ')} failed with {name} (kernel too old or a policy blocks the mount API?)"


def _explain_clone(err: int, sysctls: dict[str, str]) -> str:
    """Why clone(CLONE_NEWUSER|...) failed with `err`, and what to change."""
    text = f"{E.errorcode.get(err, err)} from clone"
    hints = []
    if sysctls.get("user.max_user_namespaces") == "0":
        hints.append("user.max_user_namespaces=0: raise it, e.g. `sysctl -w user.max_user_namespaces=65536`")
    if sysctls.get("kernel.apparmor_restrict_unprivileged_userns") == "1":
        hints.append("kernel.apparmor_restrict_unprivileged_userns=1: set it to 0, or give this interpreter "
                     "an AppArmor profile that allows `userns,`")
    if sysctls.get("kernel.unprivileged_userns_clone") == "0":
        hints.append("kernel.unprivileged_userns_clone=0: set it to 1")
    if not hints and err == E.ENOSPC:
        hints.append("a namespace limit is reached: raise the user.max_*_namespaces sysctl at its limit "
                     "(/proc/sys/user/), or end other sandboxes; nesting stops at 32 levels")
    if not hints and err in (E.EPERM, E.EACCES):
        hints.append("blocked by a seccomp policy or an LSM?")
    return f"user namespaces: {text}" + (f" ({'; '.join(hints)})" if hints else "")


# Everything but being handed namespaces to create its own in: natively the
# caller joins those itself before it starts the sandbox (sandbox.cli).
TRAITS = Traits("native", "the native backend", ALL - {Capability.HANDED_NAMESPACES})


class _Native:
    """The native backend (the Backend protocol of sandbox.backends)."""

    name = TRAITS.name
    traits = TRAITS
    available = staticmethod(available)
    launch = staticmethod(launch)


BACKEND = _Native()
