"""One sandbox's cgroup: made with its limits, entered, read and removed (see sandbox.cgroups)."""

from __future__ import annotations

import atexit
import dataclasses
import errno as E
import itertools
import os
import signal
import threading
import time

from ..forksafe import fresh_in_child
from ..killedby import killed_by
from .hierarchies import (
    CPU_PERIOD_US,
    ENTRY_FILE,
    PREFIX,
    CgroupInfo,
    CgroupLimits,
    Hierarchy,
    Usage,
    host_cgroups,
    read_file,
)

# ---------------------------------------------------------------- one sandbox

_counter = itertools.count()
_live_lock = threading.Lock()
_live: set[str] = set()  # directories made by this process and not yet removed
_last_sweep: dict[str, float] = {}
fresh_in_child(globals(), "_live_lock")
SWEEP_EVERY_S = 1.0


def _start_time(pid: int) -> str | None:
    stat = read_file(f"/proc/{pid}/stat")
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


def hierarchies_for(info: CgroupInfo, limits: CgroupLimits) -> list[Hierarchy]:
    """The hierarchies a sandbox with `limits` gets a cgroup in: all of
    `info`'s but a v1 hierarchy of the cpu controller alone (without
    cpuacct, which counts the CPU time) when there is no CPU limit: it would
    only cost the sandbox its entry, the slowest of all (the scheduler moves
    the process into a task group of its own, up to ~1 ms at the 90th
    percentile under load), for nothing."""
    return [h for h in info.hierarchies
            if not (h.version == 1 and h.controllers == {"cpu"} and limits.cpu_quota_us is None)]


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
            for h in hierarchies_for(info, limits):
                _maybe_sweep(h.parent)
                path = os.path.join(h.parent, name)
                os.mkdir(path)
                with _live_lock:
                    _live.add(path)
                self.dirs.append((h, path))
                self._set_limits(h, path)
                self.procs_fds.append(os.open(os.path.join(path, ENTRY_FILE[h.version]), os.O_WRONLY | os.O_CLOEXEC))
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

    def place(self, pid: int) -> None:
        """Move process `pid`, single-threaded (on v1 the entry file is `tasks`,
        which moves one thread), into every cgroup of the sandbox, through the
        entry fds; then close them. The processes it forks after this start there."""
        try:
            for fd in self.procs_fds:
                os.write(fd, str(pid).encode())
        finally:
            self.close_fds()

    def close_fds(self) -> None:
        """Close the cgroup.procs fds (the sandbox's first process has written them, or never will)."""
        for fd in self.procs_fds:
            os.close(fd)
        self.procs_fds = []

    def usage(self, events: bool = True) -> Usage:
        """What the cgroups counted (read before `remove`); without `events`,
        not the limit hits (a command that exited 0 was ended by none)."""
        cpu_s = mem = None
        pids = None
        hits: dict[str, int] = {}
        for h, path in self.dirs:
            j = os.path.join
            if h.version == 2:
                stat = _keyed(read_file(j(path, "cpu.stat")))
                if "usage_usec" in stat:
                    cpu_s = stat["usage_usec"] / 1e6
                if "memory" in h.controllers:
                    mem = _number(read_file(j(path, "memory.peak")), mem)
                    if events:
                        ev = _keyed(read_file(j(path, "memory.events")))
                        hits["oom_kill"] = ev.get("oom_kill", 0) + ev.get("oom_group_kill", 0)
                        hits["memory_max"] = ev.get("max", 0)
                if "pids" in h.controllers:
                    pids = _int(read_file(j(path, "pids.peak")), pids)
                    if events:
                        hits["pids_max"] = _keyed(read_file(j(path, "pids.events"))).get("max", 0)
            else:
                if "memory" in h.controllers:
                    mem = _number(read_file(j(path, "memory.max_usage_in_bytes")), mem)
                    if events:
                        hits["oom_kill"] = _keyed(read_file(j(path, "memory.oom_control"))).get("oom_kill", 0)
                        hits["memory_max"] = _int(read_file(j(path, "memory.failcnt")), 0) or 0
                if "pids" in h.controllers:
                    pids = _int(read_file(j(path, "pids.peak")), pids)
                    if events:
                        hits["pids_max"] = _keyed(read_file(j(path, "pids.events"))).get("max", 0)
                if cpu_s is None and "cpuacct" in h.controllers:
                    ns = _int(read_file(j(path, "cpuacct.usage")), None)
                    cpu_s = None if ns is None else ns / 1e9
        return Usage(mechanism=self.info.mechanism, cpu_s=cpu_s,
                     memory_peak_mb=None if mem is None else mem / (1 << 20), pids_peak=pids, events=hits,
                     counted_by=self.info.mechanism)

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
    for pid in read_file(os.path.join(path, "cgroup.procs")).split():
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

    def __init__(self, cgroup: SandboxCgroup | None, mechanism: str, cpu_s: int | None = None,
                 outside_tasks: int = 0) -> None:
        self.cgroup = cgroup
        self.mechanism = mechanism
        self.cpu_s = cpu_s  # RLIMIT_CPU, to tell its SIGKILL from another
        self.outside_tasks = outside_tasks  # the executor's own processes in the cgroup (bwrap's monitor)

    def kill(self) -> None:
        """Every process of the sandbox, even without a pid namespace."""
        if self.cgroup is not None:
            self.cgroup.kill()

    def finish(self, returncode: int, by_caller: str | None = None,
               rusage: tuple[float, float] | None = None) -> tuple[Usage, str | None]:
        """(usage, killed_by) once the command's status is in; `by_caller`:
        "timeout", "output" or "kill" when the caller ended it; `rusage`: the
        kernel's (CPU seconds, peak RSS MiB) for the sandbox's processes, the
        usage of a sandbox without a cgroup. The limit hits are read whatever
        the status (sandbox.killedby)."""
        usage = ended_usage(self.cgroup, self.mechanism, rusage)
        if self.outside_tasks and usage.pids_peak is not None:
            usage = dataclasses.replace(usage, pids_peak=max(0, usage.pids_peak - self.outside_tasks))
        return usage, killed_by(returncode, usage, self.cpu_s, by_caller)

    def remove(self) -> None:
        """Remove the cgroup (the sandbox has ended and its first process is reaped)."""
        if self.cgroup is not None and not self.cgroup.remove(attempts=40):
            leftover(self.cgroup)


def ended_usage(cgroup: SandboxCgroup | None, mechanism: str, rusage: tuple[float, float] | None) -> Usage:
    """A sandbox's usage once it has ended: its cgroup's counts, else the
    kernel's rusage of its processes ((CPU seconds, peak RSS MiB), from its
    pid 1's reaper), else nothing (`mechanism`: of its limits)."""
    if cgroup is not None:
        return cgroup.usage()
    if rusage is not None:
        return Usage(mechanism=mechanism, cpu_s=rusage[0], memory_peak_mb=rusage[1], counted_by="rusage")
    return Usage(mechanism=mechanism)


def leftover(cgroup: SandboxCgroup) -> None:
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
