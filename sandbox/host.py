"""Facts about the calling process and the host that planning depends on.

The planner is pure; everything it needs to know from outside comes in as a
HostInfo, read here and nowhere else.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import resource
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .capabilities import Capability, Traits
from .cgroups import CgroupInfo, host_cgroups
from .spec import CAPABILITIES

# The resources a Spec's Limits can set (plan.RLIMITS maps its fields to them).
LIMITED_RESOURCES = (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE,
                     resource.RLIMIT_NPROC, resource.RLIMIT_DATA)

# A documented switch: set to 1 to refuse the native backend (forces the
# bwrap fallback), e.g. to test the fallback path or work around a kernel bug.
DISABLE_NATIVE_ENV = "SANDBOX_DISABLE_NATIVE"
BWRAP_ENV = "SANDBOX_BWRAP"  # the bwrap binary to use instead of the one on PATH

USERNS_SYSCTLS = (
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)


@functools.cache
def root_only_proc_files() -> tuple[str, ...]:
    """The files at the top of this kernel's /proc that only the host's root may
    read (owned by uid 0, no read bit for group or others), by name.

    Read from the running kernel, once per process, rather than listed: a
    kernel build adds such files (slabinfo, timer_list, program_cpu...), and a
    root caller's sandbox is uid 0 of the host, which the mode bits let in."""
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return ()
    for name in names:
        if name.isdigit():
            continue
        try:
            st = os.lstat("/proc/" + name)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o044:
            found.append(name)
    return tuple(sorted(found))


@dataclass(frozen=True)
class PoolInfo:
    """The process-wide network namespace pool (sandbox.netpool), as planning sees it."""

    serves_none: bool = False  # network="none" leases from it now (on by default once it is filled)

    @classmethod
    def current(cls) -> PoolInfo:
        """Whether the shared pool serves network="none" right now: it does by
        default, once it holds a ready namespace (the first spawns of a
        process do not wait for it to fill). Only reads: starting the pool is
        the executor's (sandbox.backends.host_for)."""
        return _SERVING if _pool_serves_none() else _NOT_SERVING


_SERVING, _NOT_SERVING = PoolInfo(serves_none=True), PoolInfo(serves_none=False)  # immutable: shared


def _no_pool() -> bool:
    return False


# The pool (sandbox.netpool) is a runtime service above these facts: it says how to read it when it is
# imported (read_pool_with), and before that no pool exists in this process, so none serves.
_pool_serves_none: Callable[[], bool] = _no_pool


def read_pool_with(serves_none: Callable[[], bool]) -> None:
    """How PoolInfo.current reads whether the process-wide pool serves network="none" now: set by
    sandbox.netpool when it is imported, so that these facts never import the pool."""
    global _pool_serves_none
    _pool_serves_none = serves_none


@dataclass(frozen=True)
class HostInfo:
    """What the planner needs to know about the calling process and the chosen backend."""

    uid: int
    gid: int
    cwd: str | None
    environ: Mapping[str, str]
    executor: Traits  # the executor that will run the plan: what it can do (sandbox.capabilities)
    # finite hard rlimits by resource (a resource not listed has none)
    hard_limits: Mapping[int, int] = field(default_factory=dict)
    is_root: bool = False  # effective uid 0: may create namespaces without a user namespace
    pool: PoolInfo | None = PoolInfo()  # None: the executor cannot join a pooled namespace
    core_missing: str | None = None  # why the compiled core (sandbox._native) is not there; None if it is
    effective_caps: int = 0  # the caller's effective capability set, a bitmask
    # the top-level /proc files only the host's root may read on this kernel
    proc_root_only: tuple[str, ...] = field(default_factory=root_only_proc_files)
    # the cgroups a sandbox of this executor gets (sandbox.cgroups); none: limits fall back to rlimits
    cgroups: CgroupInfo = CgroupInfo()

    @property
    def backend(self) -> str:
        """The executor's name, as results and errors report it."""
        return self.executor.name

    @functools.cached_property
    def key(self) -> HostKey:
        """Every field the planner reads but the environment (a live mapping,
        sandbox.plan_cache adds it when a Spec inherits from it), as one
        hashable key: computed once per HostInfo, which cannot change."""
        limits = tuple(sorted(self.hard_limits.items()))
        return HostKey((self.uid, self.gid, self.cwd, limits, self.is_root, self.executor, self.pool,
                        self.core_missing, self.effective_caps, self.proc_root_only, self.cgroups))

    @classmethod
    def current(cls, executor: Traits) -> HostInfo:
        """Read the calling process's ids, cwd, environment and hard limits, the
        pool's state and the cgroups, as they are for `executor`. Only reads.

        Every fact that can change while the process runs is read again on
        each call (ids, cwd, hard limits, capabilities, the pool's state, the
        cgroups); when all of them equal the last call's for this executor
        (and os.environ is the same mapping: its contents are the plan
        cache's to compare), that call's HostInfo is returned (it is
        immutable), so its `key` is not built and hashed again.
        """
        try:
            cwd: str | None = os.getcwd()
        except OSError:
            cwd = None
        joins_pool, cgroups = _executor_facts(executor)
        # each read now, none cached: chdir, setuid, setrlimit, capset or a thread's own
        # capabilities, another process's prlimit(2), the pool filling or emptying
        facts = (cwd, os.getuid(), os.getgid(), os.geteuid(), _hard_limit_values(),
                 PoolInfo.current() if joins_pool else None, effective_caps_mask(),
                 host_cgroups() if cgroups is None else cgroups, os.environ)
        last = _last.get(executor.name)
        if last is not None and last[0] is executor and last[1] == facts:
            return last[2]
        host = cls(uid=facts[1], gid=facts[2], cwd=cwd, environ=facts[8], executor=executor,
                   hard_limits=_finite(facts[4]), is_root=facts[3] == 0, pool=facts[5], core_missing=core_missing(),
                   effective_caps=facts[6], cgroups=facts[7])
        _last[executor.name] = (executor, facts, host)
        return host


class HostKey:
    """A HostInfo's planning facts as a dict key whose hash is computed once."""

    __slots__ = ("fields", "_hash")

    def __init__(self, fields: tuple[object, ...]) -> None:
        self.fields = fields
        self._hash = hash(fields)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, HostKey) and self._hash == other._hash
                                 and self.fields == other.fields)


# The last HostInfo.current per executor name: (its Traits, the facts read, the HostInfo). A
# plain dict: a thread that races another stores an equally valid entry. core_missing and
# proc_root_only are not among the facts compared: both are read once per process (functools.cache).
_last: dict[str, tuple[Traits, tuple[object, ...], HostInfo]] = {}


@functools.cache
def _executor_facts(executor: Traits) -> tuple[bool, CgroupInfo | None]:
    """What of `executor`'s HostInfo its Traits alone decide (a backend's Traits never change):
    whether it joins a pooled netns, and its cgroups when it places sandboxes in none (None: they
    are the host's, host_cgroups(), read on each call)."""
    fixed = None if executor.can(Capability.CGROUPS) else executor_cgroups(executor)
    return executor.can(Capability.JOIN_POOLED_NETNS), fixed


def executor_cgroups(executor: Traits) -> CgroupInfo:
    """The cgroups `executor`'s sandboxes get on this host, for this caller."""
    if not executor.can(Capability.CGROUPS):
        return CgroupInfo(reason=f"{executor.title} does not place its sandboxes in cgroups")
    return host_cgroups()


@functools.cache
def core_missing() -> str | None:
    """Why this package's compiled core cannot be found (an uncompiled source
    checkout, a build that failed), or None when it is there."""
    package = __package__ or "sandbox"
    if importlib.util.find_spec(f"{package}._native") is None:
        where = os.path.dirname(os.path.abspath(__file__))
        return (f"the compiled core {package}._native is not built in {where} (an uncompiled source checkout "
                "imported instead of the installed package? run from another directory, or `pip install .`)")
    return None


def hard_limits() -> dict[int, int]:
    """This process's finite hard limits of the resources a Spec can limit."""
    return _finite(_hard_limit_values())


def _finite(values: tuple[int, ...]) -> dict[int, int]:
    """{resource: hard limit} of LIMITED_RESOURCES from their `values`, the infinite ones left out."""
    return {res: hard for res, hard in zip(LIMITED_RESOURCES, values, strict=True) if hard != resource.RLIM_INFINITY}


def _hard_limit_values() -> tuple[int, ...]:
    """The hard limit of each of LIMITED_RESOURCES, now: read on every call, as another
    process may lower them (prlimit(2)) and this one raise or lower them (setrlimit)."""
    return tuple([_getrlimit(res)[1] for res in LIMITED_RESOURCES])


_getrlimit = resource.getrlimit


def userns_available() -> bool:
    """bwrap's `--unshare-user-try` test: the kernel has user namespaces and they are not disabled."""
    if not os.path.exists("/proc/self/ns/user"):
        return False
    if read_text("/sys/module/user_namespace/parameters/enable").startswith("N"):
        return False
    return read_text("/proc/sys/user/max_user_namespaces").strip() != "0"


def userns_sysctls() -> dict[str, str]:
    """The sysctls that decide whether unprivileged user namespaces work, by dotted name (those present)."""
    out = {}
    for path in USERNS_SYSCTLS:
        text = read_text(path)
        if text:
            out[path[len("/proc/sys/"):].replace("/", ".")] = text.strip()
    return out


def effective_caps() -> set[str]:
    """The capability names in this process's effective set (/proc/self/status CapEff)."""
    mask = effective_caps_mask()
    return {name for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1}


def effective_caps_mask() -> int:
    """The calling thread's effective capability set as a bitmask (0 if unreadable).

    capget(2) rather than /proc/self/status: it runs before every spawn,
    and generating the status file costs ~80 µs.
    """
    try:
        pair: tuple[ctypes.Array[ctypes.c_uint32], ctypes.Array[ctypes.c_uint32]] = _cap_buffers.pair
    except AttributeError:  # this thread's first call
        pair = _cap_buffers.pair = (_CapHeader(), _CapData())
    header, data = pair
    # pid 0: this thread (each has its own set); the kernel may rewrite the version, so set both
    header[0], header[1] = _CAPABILITY_VERSION_3, 0
    if _capget()(header, data) != 0:  # fills data: {effective, permitted, inheritable} x bits 0-31, 32-63
        return 0
    return data[0] | data[3] << 32


_CAPABILITY_VERSION_3 = 0x20080522
_CapHeader, _CapData = ctypes.c_uint32 * 2, ctypes.c_uint32 * 6
# Each thread's two buffers, made on its first call: making ctypes arrays is most of the call's cost
# when the caches are cold (~18 of ~25 µs right after a spawn); a thread's own, so no lock.
_cap_buffers = threading.local()


@functools.cache
def _capget() -> Callable[[Any, Any], int]:
    """libc's capget, its argument types declared (ctypes then converts nothing by guessing)."""
    capget = ctypes.CDLL(None, use_errno=True).capget
    capget.argtypes, capget.restype = (ctypes.POINTER(_CapHeader), ctypes.POINTER(_CapData)), ctypes.c_int
    return capget


def read_text(path: str) -> str:
    """The text of the file at `path`, or "" if it cannot be read."""
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
