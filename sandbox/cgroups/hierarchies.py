"""The host's cgroup hierarchies and the mechanism a sandbox gets (see sandbox.cgroups)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..forksafe import fresh_in_child
from ..paths import is_under

PARENT_ENV = "SANDBOX_CGROUP_PARENT"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
PREFIX = "sbx-"
# The file a sandbox's first process writes "0" to, to enter a cgroup. On v1, `tasks` moves
# only the writing thread (its only one: the process), and the kernel takes no global lock
# for a thread that moves itself; `cgroup.procs` takes the threadgroup lock for writing,
# which waits for an RCU grace period (ms) when no migration happened just before. v2 has
# no such file across domain cgroups: there, clone3's CLONE_INTO_CGROUP is the cheap way.
ENTRY_FILE = {1: "tasks", 2: "cgroup.procs"}


@dataclass(frozen=True)
class Hierarchy:
    """One mounted hierarchy the caller may make cgroups in."""

    version: int  # 1 or 2
    parent: str  # the directory the sandboxes' cgroups go in
    controllers: frozenset[str]  # which of CONTROLLERS its cgroups limit (v2: enabled for the parent's children)


@dataclass(frozen=True)
class CgroupInfo:
    """What this host offers the caller: the mechanism, the controllers that
    are real, where each sandbox's cgroup is made, and why anything is missing."""

    mechanism: str = "none"  # "cgroup2", "cgroup1" or "none"
    controllers: frozenset[str] = frozenset()  # of CONTROLLERS, those a sandbox's cgroup enforces
    hierarchies: tuple[Hierarchy, ...] = ()  # where a sandbox's cgroup is made (a v2 one may limit nothing)
    reason: str = "no cgroup hierarchy is mounted"  # what is missing, and how to get it
    swap: bool = False  # the memory limit counts swap too (v1 memsw, v2 memory.swap.max)

    def missing(self, wanted: Iterable[str]) -> list[str]:
        """The controllers of `wanted` this host cannot enforce."""
        return [c for c in wanted if c not in self.controllers]


@dataclass(frozen=True)
class CgroupLimits:
    """The limits a sandbox's cgroup carries (None: not limited)."""

    memory_bytes: int | None = None
    pids: int | None = None
    cpu_quota_us: int | None = None  # per CPU_PERIOD_US


@dataclass(frozen=True)
class Usage:
    """A sandbox's resource usage, as its mechanism tells it (None: it does not)."""

    mechanism: str  # "cgroup2", "cgroup1" or "rlimit"
    cpu_s: float | None = None
    memory_peak_mb: float | None = None
    pids_peak: int | None = None
    events: dict[str, int] = field(default_factory=dict)  # limit hits: oom_kill, pids_max
    # what counted the figures: "cgroup2"/"cgroup1" (the sandbox's cgroup), "rusage" (the kernel's
    # rusage of its processes, wait4's: CPU time and peak RSS, no pids), None (nothing)
    counted_by: str | None = None


# ---------------------------------------------------------------- the host

def _mounts() -> list[tuple[int, str, str, frozenset[str]]]:
    """(version, mount point, root inside the hierarchy, v1 controllers) of each cgroup mount."""
    out: list[tuple[int, str, str, frozenset[str]]] = []
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 5 or len(rparts) < 3 or rparts[0] not in ("cgroup", "cgroup2"):
            continue
        point = parts[4].replace("\\040", " ")
        if rparts[0] == "cgroup2":
            out.append((2, point, parts[3], frozenset()))
        else:
            opts = set(rparts[2].split(","))
            out.append((1, point, parts[3], frozenset(c for c in CONTROLLERS if c in opts) | (
                {"cpuacct"} if "cpuacct" in opts else set())))
    return out


def _own_paths() -> dict[str, str]:
    """The caller's cgroup by hierarchy key: "" for v2, else its controllers ("cpu,cpuacct", "memory")."""
    out = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _id, ctrls, path = line.rstrip("\n").split(":", 2)
                out[ctrls] = path
    except (OSError, ValueError):
        pass
    return out


def read_file(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        return os.read(fd, 65536).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _v2_controllers(parent: str) -> frozenset[str]:
    """The controllers a v2 parent enables for its children, enabling what it offers if it may."""
    enabled = set(read_file(os.path.join(parent, "cgroup.subtree_control")).split())
    offered = set(read_file(os.path.join(parent, "cgroup.controllers")).split())
    want = [c for c in CONTROLLERS if c in offered and c not in enabled]
    if want:
        try:
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                f.write(" ".join("+" + c for c in want))
            enabled.update(want)
        except OSError:  # the parent holds processes (the no-internal-process rule), or is not ours
            pass
    return frozenset(c for c in CONTROLLERS if c in enabled)


def _writable(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)




def detect(env_value: str | None) -> CgroupInfo:
    """CgroupInfo for this process, with $SANDBOX_CGROUP_PARENT = `env_value`."""
    mounts = _mounts()
    if not mounts:
        return CgroupInfo(reason="no cgroup hierarchy is mounted (mount cgroup2 on /sys/fs/cgroup)")
    own = _own_paths()
    chosen: list[tuple[int, str, frozenset[str], str]] = []  # version, parent, v1 controllers, own dir
    for version, point, root, ctrls in mounts:
        mine = own.get("") if version == 2 else _own_v1(own, ctrls)
        own_dir = ""
        if mine is not None and is_under(mine, root):
            own_dir = os.path.normpath(point + "/" + os.path.relpath(mine, root))
        chosen.append((version, point, ctrls, own_dir))
    given = [d for d in (env_value or "").split(":") if d]
    hierarchies: list[Hierarchy] = []
    problems: list[str] = []
    for version, point, ctrls, own_dir in chosen:
        if given:
            inside = [d for d in given if is_under(os.path.normpath(d), point)]
            if not inside:
                continue
            parent = os.path.normpath(inside[0])
        else:
            if not own_dir:
                continue
            parent = own_dir
        if not _writable(parent):
            problems.append(f"{parent} is not writable by uid {os.geteuid()}")
            continue
        if version == 2:
            if os.geteuid() != 0 and own_dir and not is_under(own_dir, parent):
                problems.append(f"this process lives outside {parent} ({own_dir}): cgroup v2 moves a process only "
                                "within a subtree its owner may write")
                continue
            hierarchies.append(Hierarchy(2, parent, _v2_controllers(parent)))
        elif ctrls & {*CONTROLLERS, "cpuacct"}:
            hierarchies.append(Hierarchy(1, parent, frozenset(ctrls & set(CONTROLLERS)) | (ctrls & {"cpuacct"})))
    return _decide(hierarchies, problems, env_value)


def _own_v1(own: dict[str, str], ctrls: frozenset[str]) -> str | None:
    """The caller's path in the v1 hierarchy of `ctrls` (each controller is in one hierarchy only)."""
    for key, path in own.items():
        if key and set(key.split(",")) & ctrls:
            return path
    return None


def _decide(found: list[Hierarchy], problems: list[str], env_value: str | None) -> CgroupInfo:
    """Each controller from v2 if it offers it, else from v1; the hierarchies that serve one, and
    v1's cpuacct for the CPU time where no hierarchy used counts it. A v2 hierarchy without
    controllers beside v1 ones (the hybrid layout) is left out: entering it is a whole-process
    migration, which takes the kernel's global threadgroup lock and waits for an RCU grace period
    (2-10 ms per sandbox here), for nothing v1 cannot give (kill: its pids cgroup's processes)."""
    v2 = [h for h in found if h.version == 2]
    v1 = [h for h in found if h.version == 1]
    use: list[Hierarchy] = []
    controllers: set[str] = set()
    if v2 and (v2[0].controllers or not any(h.controllers & set(CONTROLLERS) for h in v1)):
        controllers |= v2[0].controllers
        use.append(v2[0])
    from_v1 = False
    for h in v1:
        extra = (h.controllers & set(CONTROLLERS)) - controllers
        if extra:
            controllers |= extra
            use.append(Hierarchy(1, h.parent, frozenset(extra) | (h.controllers & {"cpuacct"})))
            from_v1 = True
    if use and not any(h.version == 2 or "cpuacct" in h.controllers for h in use):
        use += [Hierarchy(1, h.parent, frozenset({"cpuacct"})) for h in v1 if h.controllers == {"cpuacct"}][:1]
    missing = [c for c in CONTROLLERS if c not in controllers]
    where = f"${PARENT_ENV}={env_value}" if env_value else "the caller's own cgroups"
    if not controllers:
        why = "; ".join(problems) or "no hierarchy with the memory, pids or cpu controller"
        return CgroupInfo(reason=f"no cgroup limits for this caller in {where}: {why} (give it a delegated "
                                 f"subtree: systemd's Delegate=yes, or a directory it owns, named by ${PARENT_ENV})")
    swap = False
    for h in use:
        if "memory" in h.controllers:
            swap = os.path.exists(os.path.join(h.parent, "memory.memsw.limit_in_bytes" if h.version == 1
                                               else "memory.swap.max"))
    reason = f"from {where}" + (f"; missing: {', '.join(missing)}" if missing else "")
    return CgroupInfo(mechanism="cgroup1" if from_v1 else "cgroup2", controllers=frozenset(controllers),
                      hierarchies=tuple(use), reason=reason, swap=swap)


_detect_lock = threading.Lock()
_detected: dict[tuple[int, int, str | None], CgroupInfo] = {}
fresh_in_child(globals(), "_detect_lock")


def host_cgroups() -> CgroupInfo:
    """What this process may use, decided once per (pid, euid, $SANDBOX_CGROUP_PARENT)."""
    key = (os.getpid(), os.geteuid(), os.environ.get(PARENT_ENV))
    with _detect_lock:
        info = _detected.get(key)
        if info is None:
            info = _detected[key] = detect(key[2])
        return info
