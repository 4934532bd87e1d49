"""Compile a Spec into the ordered operations a backend executes.

This is the one place where sandbox semantics are decided: which parent
directories get which mode, which flags a bind gets, what procfs means with or
without a pid namespace, how the working directory and environment are chosen,
which user-namespace layout is needed. Both backends (native C and bwrap)
interpret the same Plan, so they cannot drift apart. Pure: no I/O; what it
needs to know about the calling process comes in as a HostInfo.
"""

from __future__ import annotations

import enum
import fnmatch
import re
import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from . import spec as S
from .cgroups import CPU_PERIOD_US, CgroupInfo, CgroupLimits
from .errors import SpecError
from .host import HostInfo
from .proc_covers import Cover, proc_covers
from .sync import NO_SYNC, Sync
from .validate import as_text

if TYPE_CHECKING:
    from .seccomp.policy import Seccomp


class OpKind(enum.IntEnum):
    """Operation kinds. The numbers are the C side's `enum sbx_op_kind`."""

    BIND = 1
    TMPFS = 2
    PROC = 3
    DEV = 4
    DIR = 5
    SYMLINK = 6
    FILE = 7
    REMOUNT_RO = 8
    CHMOD = 9
    DEVPTS = 10  # a private devpts (a Template's sandbox, on the template's /dev)
    MQUEUE = 11  # a fresh mqueue filesystem (the sandbox's IPC namespace's queues)
    OVERLAY = 12  # an overlayfs of host directories (data: the lowers; src: a kept upper's directory)


class OpFlag(enum.IntFlag):
    """Per-operation flags; the numbers are the C side's SBX_F_* constants."""

    NONE = 0
    RDONLY = 1  # mount read-only, recursively for binds
    NODEV = 2  # device nodes unusable
    OPTIONAL = 4  # skip if the source is missing (bwrap's -try)
    FRESH = 8  # PROC: a new procfs (pid namespace), else the host's bound; FILE: a private copy bound on dest
    NOSUID = 16  # set-user-ID and file capabilities ignored (every bind, as bwrap's)
    NO_DEVPTS = 32  # DEV: without devpts (a Template's own /dev: each of its sandboxes mounts its own)
    FROM_FD = 64  # BIND: the source tree comes as an fd (cloned by the caller, or by a Template's server)
    FD_SOURCE = 128  # BIND: src is /proc/self/fd/N: what the caller's fd N names (bwrap's --bind-fd)


@dataclass(frozen=True)
class Op:
    """One setup operation, with every attribute decided.

    `dest` is the path inside the sandbox; `src` a host path (BIND) or a link
    target (SYMLINK); `mode` the mode of what is created (for DEV, its tmpfs);
    `shm_mode` the mode of DEV's shm directory; `parent_mode` the mode of any
    missing parent directory; `size` a tmpfs size in bytes (0 = default);
    `covers` (PROC) the entries below it covered right after it is mounted,
    as paths relative to `dest`; `lowers` (OVERLAY) its layers, top first,
    as overlayfs stacks them.
    """

    kind: OpKind
    dest: str
    src: str = ""
    data: bytes = b""
    mode: int = 0
    parent_mode: int = 0o700
    size: int = 0
    flags: OpFlag = OpFlag.NONE
    shm_mode: int = 0
    origin: int = -1  # index of the Spec mount this op came from
    covers: tuple[tuple[str, Cover], ...] = ()
    lowers: tuple[str, ...] = ()


# rlimit resources by Limits field, and the unit each field counts in.
RLIMITS: dict[str, tuple[int, int]] = {
    "cpu_s": (resource.RLIMIT_CPU, 1),
    "address_space_mb": (resource.RLIMIT_AS, 1 << 20),
    "file_mb": (resource.RLIMIT_FSIZE, 1 << 20),
    "nofile": (resource.RLIMIT_NOFILE, 1),
    "file_bytes": (resource.RLIMIT_FSIZE, 1),
}

# The Limits fields a cgroup enforces, by controller (sandbox.cgroups), and
# the rlimit each falls back to where the host has no such cgroup for the
# caller: RLIMIT_DATA counts what a process can write, not what it reserves
# (JIT runtimes still run); RLIMIT_NPROC counts the uid's processes, not the
# sandbox's. cpu_cores has no fallback.
CGROUP_LIMITS: dict[str, str] = {"memory_mb": "memory", "nproc": "pids", "cpu_cores": "cpu"}
FALLBACK_RLIMITS: dict[str, tuple[int, int]] = {
    "memory_mb": (resource.RLIMIT_DATA, 1 << 20),
    "nproc": (resource.RLIMIT_NPROC, 1),
}

Network = Literal["none", "pool", "host"]

# Capabilities checked against the network namespace's owner.
NETWORK_CAPS = frozenset({"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW"})

# What execvp searches when PATH is unset (glibc's default), as under bwrap.
DEFAULT_PATH = "/bin:/usr/bin"

# A minimal /dev (bwrap's --dev): a 0755 tmpfs whose shm directory is
# world-writable and sticky, like the host's /dev/shm, so POSIX shared memory
# works for the sandbox's user.
DEV_MODE = 0o755
DEV_SHM_MODE = 0o1777


@dataclass(frozen=True)
class Plan:
    """Everything a backend needs to set up one sandbox, decided."""

    ops: tuple[Op, ...]
    # namespaces to create
    user_ns: bool
    mount_ns: bool
    pid_ns: bool
    # The network namespace: "none", a fresh loopback-only one of its own;
    # "pool", a loopback-only one leased from the process-wide pool (native
    # only); "host", the caller's.
    network: Network
    recycle_lease: bool  # a leased namespace may be reused after this sandbox (else it is destroyed)
    ipc_ns: bool
    uts_ns: bool
    cgroup_ns: bool
    # identity: the caller's ids (the outside of the id maps), ids seen
    # inside, and whether uid/gid 0 must be mapped during setup (devpts needs
    # it) and the final ids set in a nested userns.
    host_uid: int
    host_gid: int
    uid: int
    gid: int
    map_root_first: bool
    nested_userns: bool  # after setup, enter a user namespace holding only uid/gid
    disable_userns: bool  # ... in which no further user namespace can be created
    hostname: str | None
    env: tuple[str, ...]  # "NAME=value", the complete environment of the command
    path: str  # PATH used to find the command (never empty)
    cwd_candidates: tuple[str, ...]
    cwd_strict: bool  # the first candidate must work (given cwd)
    rlimits: tuple[tuple[int, int], ...]
    keep_caps: int  # bitmask of capabilities kept (cap_add)
    die_with_parent: bool
    new_session: bool
    # The command starts with no signal ignored or blocked (else it keeps the
    # caller's ignored signals and the spawning thread's mask, as across fork
    # and exec). The caller's handlers never reach it either way.
    reset_signals: bool
    reaper: bool  # a C pid 1 reaps orphans and reports the command's status
    seccomp: bytes = b""  # the BPF program installed last, b"" for none
    # A Template's resident pid 1 installs it on itself, before its request,
    # and the command inherits it (seccomp.resident: only when it allows what pid 1 does after)
    seccomp_early: bool = False
    # It refuses the keyring syscalls whatever their arguments (seccomp.resident.refuses_keyrings):
    # a recycled Template sandbox may keep its commands' user namespace, where user keyrings live
    keys_refused: bool = False
    landlock: bool = False
    landlock_best_effort: bool = False
    landlock_rules: tuple[tuple[str, bool], ...] = ()  # (path inside, writable)
    probe_paths: tuple[str, ...] = ()  # must not exist inside (checked before exec)
    forward: tuple[tuple[int, int | str], ...] = ()  # inside port -> host target
    # Host sources of the writable binds, when a target is a Unix socket path:
    # the sandbox can plant links below them, so the relay never follows one
    # there (sandbox.forward.Pin); a target elsewhere is connected by path.
    forward_writable: tuple[str, ...] = ()
    check_network: bool = False  # inspect the network namespace from the host before the command runs
    exec_fd: bool = False  # the command is an executable given as an fd, exec'd as is (a Template's server)
    host_tree: bool = False  # with exec_fd: keep a clone of the host's mount tree open for it (per-call binds)
    # keep_caps is a root caller's own effective set: as bwrap without cap
    # options, no capability set changes but the bounding set of a new user
    # namespace (inheritable and ambient stay the caller's)
    caps_as_caller: bool = False
    sync: Sync = NO_SYNC  # a caller's synchronization fds (bwrap's --block-fd, ...; sandbox.sync)
    # The sandbox's own cgroup and its limits (sandbox.cgroups), None: it gets none.
    cgroup: CgroupLimits | None = None
    # Limits fields that wanted a cgroup this host does not give the caller
    # (they fell back to FALLBACK_RLIMITS, or to nothing), and whether the Spec
    # refuses that (Limits.require_cgroups; sandbox.refusal).
    limits_fallback: tuple[str, ...] = ()
    require_cgroups: bool = False
    limits_mechanism: str = "rlimit"  # "cgroup2", "cgroup1" or "rlimit": what walls memory, processes and CPU
    # The Spec it was compiled from, for the one executor that hands a sandbox to another planner (the
    # brokered one: a task sandbox's broker plans it again from a task description); no part of the decision.
    source: S.Spec | None = field(default=None, compare=False, repr=False)

    @property
    def net_ns(self) -> bool:
        """A network namespace is created for this sandbox (not leased, not the host's)."""
        return self.network == "none"


# A bind source that names an open fd of the caller (bwrap's --bind-fd spells
# its source so): the fd's file is found again by the path it was opened
# at, in the sandbox's mount namespace (a mount of the caller's own
# namespace cannot be cloned from another), and must be the same file.
FD_SOURCE = re.compile(r"/proc/self/fd/[0-9]+")


def parent_mode_for(perms: int | None) -> int:
    """Mode for missing parent directories, bwrap's rule: 0755 narrowed by the
    op's perms (group/other keep r-x only if the op grants them anything);
    ops without perms (binds, links, proc, dev) make 0700 parents."""
    if perms is None:
        return 0o700
    mode = 0o700
    if perms & 0o070:
        mode |= 0o050
    if perms & 0o007:
        mode |= 0o005
    return mode


def compile_mount(i: int, m: S.Mount, pid_ns: bool, covers: tuple[tuple[str, Cover], ...] = ()) -> Op:
    """Turn one Spec mount into its Op."""
    if isinstance(m, S.Bind):
        flags = OpFlag.NOSUID
        if m.readonly:
            flags |= OpFlag.RDONLY
        if not m.devices:
            flags |= OpFlag.NODEV
        if m.optional:
            flags |= OpFlag.OPTIONAL
        if FD_SOURCE.fullmatch(m.src):
            flags |= OpFlag.FD_SOURCE
        return Op(OpKind.BIND, m.dest_path(), src=m.src, flags=flags, origin=i)
    if isinstance(m, S.Tmpfs):
        return Op(OpKind.TMPFS, m.dest, mode=m.perms, size=m.size or 0,
                  parent_mode=parent_mode_for(m.perms), flags=OpFlag.NODEV, origin=i)
    if isinstance(m, S.Proc):
        return Op(OpKind.PROC, m.dest, flags=OpFlag.FRESH if pid_ns else OpFlag.NONE, origin=i, covers=covers)
    if isinstance(m, S.Dev):
        return Op(OpKind.DEV, m.dest, mode=DEV_MODE, shm_mode=DEV_SHM_MODE, origin=i)
    if isinstance(m, S.Mqueue):  # bwrap mounts it without flags, as mount(8) would
        return Op(OpKind.MQUEUE, m.dest, origin=i)
    if isinstance(m, S.Dir):
        return Op(OpKind.DIR, m.dest, mode=m.perms, parent_mode=parent_mode_for(m.perms), origin=i)
    if isinstance(m, S.Symlink):
        return Op(OpKind.SYMLINK, m.dest, src=m.target_path, origin=i)
    if isinstance(m, S.File):
        return Op(OpKind.FILE, m.dest, data=m.data, mode=m.perms, parent_mode=parent_mode_for(m.perms),
                  flags=OpFlag.RDONLY if m.readonly else OpFlag.NONE, origin=i)
    if isinstance(m, S.RemountRo):
        return Op(OpKind.REMOUNT_RO, m.dest, flags=OpFlag.RDONLY | OpFlag.NODEV | OpFlag.NOSUID, origin=i)
    if isinstance(m, S.Chmod):
        return Op(OpKind.CHMOD, m.path, mode=m.perms, origin=i)
    if isinstance(m, S.Overlay):  # no upper: read-only; a tmpfs upper unless one is kept
        flags = OpFlag.NOSUID | OpFlag.NODEV | (OpFlag.NONE if m.writable else OpFlag.RDONLY)
        return Op(OpKind.OVERLAY, m.dest, src=m.upper or "", size=m.size or 0, flags=flags,
                  lowers=tuple(reversed(m.lowers)), origin=i)
    raise SpecError(f"mounts[{i}]", m, "unsupported mount operation")


def files_over_files(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """A read-only file made where an earlier op made a file (bwrap's `--file X` then
    `--ro-bind-data Y` on one path, as Flatpak sends for /.flatpak-info) is a private copy bound
    over it, as bwrap binds it: the later's content and mode, read-only. A writable one is
    written in place, as bwrap's `--file` (creat: the earlier's mode stays); the Spec allows
    no file over a read-only one (bwrap fails there)."""
    made: set[str] = set()
    out = []
    for op in ops:
        if op.kind is OpKind.FILE and op.dest in made and op.flags & OpFlag.RDONLY:
            op = replace(op, flags=op.flags | OpFlag.FRESH)
        made |= {op.dest} if op.kind is OpKind.FILE else set()
        out.append(op)
    return tuple(out)


def forward_writable(forward: tuple[tuple[int, int | str], ...], ops: tuple[Op, ...]) -> tuple[str, ...]:
    """The host sources of the writable binds, if a forwarded target is a
    Unix socket path (one of them may lie below a source the sandbox can
    write); () otherwise."""
    if not any(isinstance(target, str) for _, target in forward):
        return ()
    return tuple(dict.fromkeys(op.src for op in ops if op.kind is OpKind.BIND and not op.flags & OpFlag.RDONLY))


def landlock_rules(ops: tuple[Op, ...]) -> tuple[tuple[str, bool], ...]:
    """Landlock grants derived from the mounts: read and execute beneath
    read-only binds and proc, everything beneath writable binds, tmpfs, /dev
    and writable files; nothing anywhere else (not even the root itself)."""
    rules: dict[str, bool] = {}
    for op in ops:
        if op.kind in (OpKind.BIND, OpKind.FILE, OpKind.OVERLAY):
            writable = not op.flags & OpFlag.RDONLY
        elif op.kind in (OpKind.TMPFS, OpKind.DEV, OpKind.MQUEUE):
            writable = True
        elif op.kind is OpKind.PROC:
            writable = False
        else:
            continue
        rules[op.dest] = rules.get(op.dest, False) or writable
    return tuple(rules.items())


def resolve_env(spec: S.Spec, environ: Mapping[str, str]) -> dict[str, str]:
    """The command's complete environment: inherited names that match
    `env_inherit`, overridden by the explicit `env`. Nothing else."""
    env: dict[str, str] = {}
    if spec.env_inherit:
        for name, value in environ.items():
            if any(fnmatch.fnmatchcase(name, pat) for pat in spec.env_inherit):
                env[name] = value
    env.update(spec.env)
    return env


def maps_root_first(user_ns: bool, ops: Sequence[Op], uid: int, gid: int) -> bool:
    """Whether a sandbox maps uid and gid 0 during setup and switches to
    `uid`/`gid` in a nested user namespace afterwards: devpts refuses to mount
    in a user namespace without uid and gid 0 mapped, so a /dev needs them."""
    return user_ns and any(op.kind is OpKind.DEV for op in ops) and (uid, gid) != (0, 0)


def command_path(env: Mapping[str, str]) -> str:
    """Where the command is searched, as execvp reads PATH: the environment's,
    else glibc's default. Never empty: an empty PATH is the current directory."""
    path = env.get("PATH")
    if path is None:
        return DEFAULT_PATH
    return path or "."


def cwd_candidates(spec: S.Spec, host: HostInfo, env: Mapping[str, str]) -> tuple[tuple[str, ...], bool]:
    """bwrap's rule: the given cwd (must work), else the caller's cwd if it
    exists inside, else the command's $HOME, else /."""
    if spec.cwd is not None:
        return (spec.cwd,), True
    cands = []
    if host.cwd:
        cands.append(host.cwd)
    home = env.get("HOME")
    if home and home.startswith("/"):
        cands.append(home)
    cands.append("/")
    return tuple(dict.fromkeys(cands)), False


def plan_network(spec: S.Spec, host: HostInfo) -> Network:
    """Which network namespace the sandbox gets. A leased one where the
    executor can join one (host.pool) and the Spec asks for the pool, the pool
    serves network="none", or the namespace is inspected before the command
    runs (the check reads a leased namespace); else a fresh one; or the host's."""
    if spec.network == "host":
        return "host"
    if host.pool is None:
        return "none"
    wants_check = spec.check_network or bool(spec.forward)
    if spec.network == "pool" or wants_check:
        return "pool"
    # A leased namespace is owned by the pool's user namespace, where the
    # sandbox holds no capability: network capabilities it keeps (binding a
    # port below 1024, raw sockets, ...) work only in a namespace of its own.
    if host.pool.serves_none and not NETWORK_CAPS & set(spec.cap_add):
        return "pool"
    return "none"


def plan_rlimits(limits: S.Limits, hard_limits: Mapping[int, int],
                 fallback: Sequence[str] = ()) -> tuple[tuple[int, int], ...]:
    """(resource, value) pairs, sorted: the smallest value asked for each
    resource, capped at the caller's hard limit. Raising a hard limit needs
    privilege in the initial user namespace, and the lower hard limit already
    satisfies the request. Backends set soft and hard to the value as is.
    `fallback`: the cgroup limits this host cannot give, set as their rlimits."""
    rlimits: dict[int, int] = {}
    table = [*RLIMITS.items(), *((name, FALLBACK_RLIMITS[name]) for name in fallback if name in FALLBACK_RLIMITS)]
    for name, (res, unit) in table:
        value = getattr(limits, name)
        if value is not None:
            rlimits[res] = min(value * unit, rlimits.get(res, value * unit), hard_limits.get(res, value * unit))
    return tuple(sorted(rlimits.items()))


def plan_cgroup(limits: S.Limits, cgroups: CgroupInfo) -> tuple[CgroupLimits | None, tuple[str, ...]]:
    """The sandbox's cgroup limits (None: no cgroup), and the Limits fields
    that wanted one this host does not give (`cgroups.controllers`)."""
    wanted = [name for name in CGROUP_LIMITS if getattr(limits, name) is not None]
    real = [name for name in wanted if CGROUP_LIMITS[name] in cgroups.controllers]
    missing = tuple(name for name in wanted if name not in real)
    if not real:
        return None, missing
    mem = limits.memory_mb if "memory_mb" in real else None
    pids = limits.nproc if "nproc" in real else None
    cores = limits.cpu_cores if "cpu_cores" in real else None
    return CgroupLimits(memory_bytes=None if mem is None else mem << 20, pids=pids,
                        cpu_quota_us=None if cores is None else max(1000, round(cores * CPU_PERIOD_US))), missing


def compile_plan(spec: S.Spec, host: HostInfo, sync: Sync = NO_SYNC) -> Plan:
    """Compile `spec` for a caller described by `host`, synchronized with it through `sync`."""
    ns = spec.namespaces
    if sync.lock_files and not (ns.pid and not spec.as_pid_1):
        raise SpecError("sync.lock_files", sync.lock_files, "are held by the sandbox's pid 1: they need a pid "
                        "namespace (namespaces.pid=True), not as_pid_1")
    ops = files_over_files(tuple(compile_mount(i, m, ns.pid, proc_covers(host.uid, host.proc_root_only, m.covers)
                                               if isinstance(m, S.Proc) else ())
                                 for i, m in enumerate(spec.mounts)))
    uid = host.uid if spec.uid is None else spec.uid
    gid = host.gid if spec.gid is None else spec.gid
    env = resolve_env(spec, host.environ)
    cands, strict = cwd_candidates(spec, host, env)
    # With a userns_block_fd the caller writes the maps, and they stay (bwrap's rule).
    map_root = maps_root_first(ns.user, ops, uid, gid) and sync.userns_block_fd < 0
    network = plan_network(spec, host)
    cgroup, fallback = plan_cgroup(spec.limits, host.cgroups)
    keep = 0
    for cap in spec.cap_add:
        keep |= 1 << S.CAPABILITIES.index(cap)
    return Plan(
        ops=ops,
        user_ns=ns.user,
        mount_ns=ns.mount,
        pid_ns=ns.pid,
        network=network,
        # Recycle a leased namespace only if every process of the tenant is
        # surely gone when pid 1 is (a pid namespace) and it never held
        # capabilities over the namespace (its own user namespace is a child
        # of the namespace's owner).
        recycle_lease=network == "pool" and ns.pid and ns.user,
        ipc_ns=ns.ipc,
        uts_ns=ns.uts,
        cgroup_ns=ns.cgroup,
        host_uid=host.uid,
        host_gid=host.gid,
        uid=uid,
        gid=gid,
        map_root_first=map_root,
        nested_userns=map_root or spec.disable_userns,
        disable_userns=spec.disable_userns,
        hostname=spec.hostname,
        env=tuple(f"{k}={v}" for k, v in env.items()),
        path=command_path(env),
        cwd_candidates=cands,
        cwd_strict=strict,
        rlimits=plan_rlimits(spec.limits, host.hard_limits, fallback),
        keep_caps=keep,
        die_with_parent=spec.die_with_parent,
        new_session=spec.new_session,
        # The command starts afresh: a caller that ignores SIGPIPE (as Python
        # does), SIGHUP (nohup) or SIGINT (a script's background job), or
        # blocks signals in its thread, does not pass that on.
        reset_signals=True,
        reaper=ns.pid and not spec.as_pid_1,
        seccomp=_compile_seccomp(spec.seccomp),
        landlock=bool(spec.landlock),
        landlock_best_effort=spec.landlock == "best-effort",
        landlock_rules=landlock_rules(ops) if spec.landlock else (),
        probe_paths=spec.probe_paths,
        forward=spec.forward,
        forward_writable=forward_writable(spec.forward, ops),
        check_network=spec.network != "host" and (spec.check_network or bool(spec.forward)),
        caps_as_caller=host.is_root and keep == host.effective_caps,
        sync=sync,
        cgroup=cgroup,
        limits_fallback=fallback,
        require_cgroups=spec.limits.require_cgroups,
        limits_mechanism=host.cgroups.mechanism if cgroup is not None else "rlimit",
        source=spec,
    )


def _compile_seccomp(policy: Seccomp | None) -> bytes:
    """The BPF program of `policy`, b"" for none (the compiler is imported only for a policy: test_cold_path's
    plain run loads no seccomp module)."""
    if policy is None:
        return b""
    from .seccomp.compile import compile_policy  # lazy: only for a policy (test_cold_path): 3.5 ms

    return compile_policy(policy)


def check_argv(argv: Sequence[str]) -> list[str]:
    """Validate a command line: non-empty, strings without NUL bytes."""
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
        raise SpecError("argv", argv, "must be a list of strings")
    if not argv:
        raise SpecError("argv", argv, "must not be empty")
    out = []
    for i, given in enumerate(argv):
        a = as_text(given)
        if not isinstance(a, str):
            raise SpecError(f"argv[{i}]", a, "must be a string (or an os.PathLike of one)")
        if "\0" in a:
            raise SpecError(f"argv[{i}]", a, "contains a NUL byte")
        out.append(a)
    if not out[0]:
        raise SpecError("argv[0]", out[0], "must not be empty")
    return out

