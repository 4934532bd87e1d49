"""A cgroup per sandbox: how this host walls a sandbox's memory, processes and CPU.

The one place that decides the mechanism (`host_cgroups()`, once per process
and parent setting), the best this host allows the caller:

- ``cgroup2``: a cgroup v2 parent the caller may write, with the memory, pids
  and cpu controllers enabled for its children (root; a delegated subtree,
  systemd's ``Delegate=yes``);
- ``cgroup1``: v1 hierarchies of those controllers with a parent the caller
  may write, and v1's cpuacct for CPU time (this is also the hybrid layout:
  v1 controllers, and a v2 hierarchy beside them without controllers, which
  is left out: see `_decide`);
- ``none``: no writable cgroup; `Limits.memory_mb` falls back to RLIMIT_DATA,
  `nproc` to RLIMIT_NPROC, `cpu_cores` to nothing (sandbox.plan decides that
  from `CgroupInfo.controllers`), and `Limits.require_cgroups` refuses with
  `CgroupInfo.reason`.

Where the sandboxes' cgroups go: the directories listed in
$SANDBOX_CGROUP_PARENT (``:``-separated, one per hierarchy; a directory must
lie in a mounted cgroup hierarchy, e.g.
``/sys/fs/cgroup/unified/box:/sys/fs/cgroup/memory/box``), else the caller's
own cgroup in each hierarchy (as /proc/self/cgroup names it), so a sandbox
stays inside whatever bounds its caller has. An unprivileged caller is given
such a directory by whoever may (systemd's ``Delegate=yes``, or root); on v2
the caller must itself live below it (the kernel's delegation rule).

A sandbox's cgroup (`SandboxCgroup`) is made in the caller before the clone:
a directory per hierarchy, named ``sbx-<pid>-<start time>-<n>`` after its
owner, its limits written, and each ``cgroup.procs`` opened, so that the
sandbox's first process only writes "0" to those fds before any other step
(csrc/child.c: no untrusted code runs outside). When the sandbox ends its
usage is read and the directories removed (after its pid 1 is reaped); a
cgroup whose owner died (SIGKILL) is removed by the next process that makes
one (`sweep`).
"""

from __future__ import annotations

import atexit
import errno as E
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .forksafe import fresh_in_child
from .paths import is_under

__all__ = ["PARENT_ENV", "CONTROLLERS", "CgroupInfo", "CgroupLimits", "Hierarchy", "SandboxCgroup", "Usage",
           "Walls", "host_cgroups", "killed_by", "sweep"]

PARENT_ENV = "SANDBOX_CGROUP_PARENT"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
PREFIX = "sbx-"
# The file a sandbox's first process writes "0" to, to enter a cgroup. On v1, `tasks` moves
# only the writing thread (its only one: the process), and the kernel takes no global lock
# for a thread that moves itself; `cgroup.procs` takes the threadgroup lock for writing,
# which waits for an RCU grace period (ms) when no migration happened just before. v2 has
# no such file across domain cgroups: there, clone3's CLONE_INTO_CGROUP is the cheap way.
_ENTRY = {1: "tasks", 2: "cgroup.procs"}


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


def _read(path: str) -> str:
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
    enabled = set(_read(os.path.join(parent, "cgroup.subtree_control")).split())
    offered = set(_read(os.path.join(parent, "cgroup.controllers")).split())
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


# ---------------------------------------------------------------- one sandbox

_counter = itertools.count()
_live_lock = threading.Lock()
_live: set[str] = set()  # directories made by this process and not yet removed
_last_sweep: dict[str, float] = {}
fresh_in_child(globals(), "_live_lock")
SWEEP_EVERY_S = 1.0


def _start_time(pid: int) -> str | None:
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    return stat.rpartition(")")[2].split()[19]


_me: tuple[int, str] | None = None


def _owner_tag() -> str:
    global _me
    pid = os.getpid()
    if _me is None or _me[0] != pid:
        _me = (pid, _start_time(pid) or "0")
    return f"{_me[0]}-{_me[1]}"


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class SandboxCgroup:
    """The cgroups of one sandbox: made with its limits, entered by its first
    process through `procs_fds`, read and removed once it has ended."""

    def __init__(self, info: CgroupInfo, limits: CgroupLimits) -> None:
        self.info = info
        self.limits = limits
        self.dirs: list[tuple[Hierarchy, str]] = []
        self.procs_fds: list[int] = []
        name = f"{PREFIX}{_owner_tag()}-{next(_counter)}"
        try:
            for h in info.hierarchies:
                _maybe_sweep(h.parent)
                path = os.path.join(h.parent, name)
                os.mkdir(path)
                with _live_lock:
                    _live.add(path)
                self.dirs.append((h, path))
                self._set_limits(h, path)
                self.procs_fds.append(os.open(os.path.join(path, _ENTRY[h.version]), os.O_WRONLY | os.O_CLOEXEC))
        except BaseException:
            self.close_fds()
            self.remove()
            raise

    def _set_limits(self, h: Hierarchy, path: str) -> None:
        lim = self.limits
        j = os.path.join
        if "memory" in h.controllers and lim.memory_bytes is not None:
            if h.version == 2:
                _write(j(path, "memory.max"), str(lim.memory_bytes))
                if self.info.swap:
                    _write(j(path, "memory.swap.max"), "0")
                _write(j(path, "memory.oom.group"), "1")
            else:
                _write(j(path, "memory.limit_in_bytes"), str(lim.memory_bytes))
                if self.info.swap:
                    _write(j(path, "memory.memsw.limit_in_bytes"), str(lim.memory_bytes))
        if "pids" in h.controllers and lim.pids is not None:
            _write(j(path, "pids.max"), str(lim.pids))
        if "cpu" in h.controllers and lim.cpu_quota_us is not None:
            if h.version == 2:
                _write(j(path, "cpu.max"), f"{lim.cpu_quota_us} {CPU_PERIOD_US}")
            else:
                _write(j(path, "cpu.cfs_quota_us"), str(lim.cpu_quota_us))  # the period is 100 ms by default

    def close_fds(self) -> None:
        """Close the cgroup.procs fds (the sandbox's first process has written them, or never will)."""
        for fd in self.procs_fds:
            os.close(fd)
        self.procs_fds = []

    def usage(self) -> Usage:
        """What the cgroups counted (read before `remove`)."""
        cpu_s = mem = None
        pids = None
        events: dict[str, int] = {}
        for h, path in self.dirs:
            j = os.path.join
            if h.version == 2:
                stat = _keyed(_read(j(path, "cpu.stat")))
                if "usage_usec" in stat:
                    cpu_s = stat["usage_usec"] / 1e6
                if "memory" in h.controllers:
                    mem = _number(_read(j(path, "memory.peak")), mem)
                    ev = _keyed(_read(j(path, "memory.events")))
                    events["oom_kill"] = ev.get("oom_kill", 0) + ev.get("oom_group_kill", 0)
                    events["memory_max"] = ev.get("max", 0)
                if "pids" in h.controllers:
                    pids = _int(_read(j(path, "pids.peak")), pids)
                    events["pids_max"] = _keyed(_read(j(path, "pids.events"))).get("max", 0)
            else:
                if "memory" in h.controllers:
                    mem = _number(_read(j(path, "memory.max_usage_in_bytes")), mem)
                    events["oom_kill"] = _keyed(_read(j(path, "memory.oom_control"))).get("oom_kill", 0)
                    events["memory_max"] = _int(_read(j(path, "memory.failcnt")), 0) or 0
                if "pids" in h.controllers:
                    pids = _int(_read(j(path, "pids.peak")), pids)
                    events["pids_max"] = _keyed(_read(j(path, "pids.events"))).get("max", 0)
                if cpu_s is None and "cpuacct" in h.controllers:
                    ns = _int(_read(j(path, "cpuacct.usage")), None)
                    cpu_s = None if ns is None else ns / 1e9
        return Usage(mechanism=self.info.mechanism, cpu_s=cpu_s,
                     memory_peak_mb=None if mem is None else mem / (1 << 20), pids_peak=pids, events=events)

    def kill(self) -> None:
        """SIGKILL every process in the sandbox's cgroups (cgroup.kill where there is one)."""
        for h, path in self.dirs:
            _kill_all(path, h.version)

    def remove(self, attempts: int = 1) -> bool:
        """rmdir the cgroups; True once none is left. Processes still inside are killed first
        when a removal fails (the sandbox has ended: they are its stragglers)."""
        left = []
        for h, path in self.dirs:
            if not _rmdir(path, h.version, attempts):
                left.append((h, path))
        self.dirs = left
        return not left


def _keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        try:
            out[k] = int(v)
        except ValueError:
            pass
    return out


def _int(text: str, default: int | None) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return default


def _number(text: str, default: float | None) -> float | None:
    value = _int(text, None)
    return default if value is None else float(value)


def _kill_all(path: str, version: int) -> None:
    if version == 2 and os.path.exists(os.path.join(path, "cgroup.kill")):
        try:
            _write(os.path.join(path, "cgroup.kill"), "1")
            return
        except OSError:
            pass
    for pid in _read(os.path.join(path, "cgroup.procs")).split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def _rmdir(path: str, version: int, attempts: int) -> bool:
    for i in range(max(1, attempts)):
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno != E.EBUSY:
                return False
            _kill_all(path, version)
            if i + 1 < attempts:
                time.sleep(min(0.001 * (2 ** i), 0.05))
            continue
        with _live_lock:
            _live.discard(path)
        return True
    return False


# ---------------------------------------------------------------- a sandbox's walls, end to end

class Walls:
    """What an executor keeps for one sandbox's limits: its cgroup (or None:
    rlimits only), and how its end is told: `finish` reads the usage and
    which limit ended it, `remove` takes the cgroup away once the sandbox's
    first process is reaped."""

    def __init__(self, cgroup: SandboxCgroup | None, mechanism: str, cpu_s: int | None = None) -> None:
        self.cgroup = cgroup
        self.mechanism = mechanism
        self.cpu_s = cpu_s  # RLIMIT_CPU, to tell its SIGKILL from another

    def kill(self) -> None:
        """Every process of the sandbox, even without a pid namespace."""
        if self.cgroup is not None:
            self.cgroup.kill()

    def finish(self, returncode: int, by_caller: str | None = None) -> tuple[Usage, str | None]:
        """(usage, killed_by) once the command's status is in; `by_caller`:
        "timeout" or "kill" when the caller ended it."""
        usage = self.cgroup.usage() if self.cgroup is not None else Usage(mechanism=self.mechanism)
        return usage, killed_by(returncode, usage, self.cpu_s, by_caller)

    def remove(self) -> None:
        """Remove the cgroup (the sandbox has ended and its first process is reaped)."""
        if self.cgroup is not None and not self.cgroup.remove(attempts=40):
            _leftover(self.cgroup)


def killed_by(returncode: int, usage: Usage, cpu_s: int | None, by_caller: str | None) -> str | None:
    """Which limit ended a sandbox whose command returned `returncode`:
    "memory" (the OOM killer ran in its cgroup), "pids" (a fork was refused
    at the process limit and the command failed), "cpu" (RLIMIT_CPU's
    signal), "timeout" (the caller's), or None."""
    if by_caller == "timeout":
        return "timeout"
    if returncode == 0 or by_caller is not None:
        return None
    if usage.events.get("oom_kill"):
        return "memory"
    if returncode == -signal.SIGXCPU or (cpu_s is not None and returncode == -signal.SIGKILL
                                          and usage.cpu_s is not None and usage.cpu_s >= cpu_s - 0.05):
        return "cpu"
    if cpu_s is not None and returncode == -signal.SIGKILL and usage.cpu_s is None:
        return "cpu"  # rlimits only: nothing else of ours sends it
    if usage.events.get("pids_max"):
        return "pids"
    return None


def _leftover(cgroup: SandboxCgroup) -> None:
    """A cgroup that would not go yet: try again from a thread for a while (the next sweep has it after)."""
    def again() -> None:
        for _ in range(50):
            time.sleep(0.1)
            if cgroup.remove(attempts=1):
                return
    threading.Thread(target=again, name="sandbox-cgroup-rmdir", daemon=True).start()


# ---------------------------------------------------------------- leftovers

def _maybe_sweep(parent: str) -> None:
    now = time.monotonic()
    if now - _last_sweep.get(parent, -SWEEP_EVERY_S) >= SWEEP_EVERY_S:
        _last_sweep[parent] = now
        sweep(parent)


def sweep(parent: str | None = None) -> list[str]:
    """Remove the sandbox cgroups under `parent` (default: every parent of
    `host_cgroups()`) whose owner process is gone (killed before it could);
    the removed paths."""
    parents = [parent] if parent else [h.parent for h in host_cgroups().hierarchies]
    removed = []
    for top in parents:
        try:
            names = [n for n in os.listdir(top) if n.startswith(PREFIX)]
        except OSError:
            continue
        version = 2 if os.path.exists(os.path.join(top, "cgroup.controllers")) else 1
        for name in names:
            parts = name[len(PREFIX):].split("-")
            if len(parts) != 3 or not parts[0].isdigit():
                continue
            if _start_time(int(parts[0])) == parts[1]:
                continue  # its owner lives: the cgroup is in use
            path = os.path.join(top, name)
            if _rmdir(path, version, attempts=20):
                removed.append(path)
    return removed


def _at_exit() -> None:
    """This process's own cgroups, on its way out (a reaper thread may not have got to them)."""
    with _live_lock:
        paths = list(_live)
    for path in paths:
        version = 2 if os.path.exists(os.path.join(os.path.dirname(path), "cgroup.controllers")) else 1
        _rmdir(path, version, attempts=20)


def _after_fork_in_child() -> None:
    global _live
    _live = set()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
