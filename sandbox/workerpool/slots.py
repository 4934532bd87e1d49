"""The cgroups of a WorkerPool's sandboxes, one per slot (see workerpool.engine).

Every sandbox the zygote forks enters a cgroup this side made: a slot, known
to the zygote by its number and the cgroup.procs fds it was sent. A SPAWN
brings one; spares take those offered ahead (CGROUP). When a sandbox has
ended its cgroup's usage and the limit that ended it are read, and it is
removed.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable

from .. import cgroups
from ..errors import SetupError
from . import channel as ch
from .task import Task


class CgroupSlots:
    """Slot number -> the cgroup not yet removed; `make` makes one with the
    pool's limits (None: the tasks are limited by rlimits alone)."""

    def __init__(self, make: Callable[[], cgroups.SandboxCgroup] | None,
                 made: dict[int, cgroups.SandboxCgroup] | None, mechanism: str, cpu_s: int | None) -> None:
        self.make = make
        self.held: dict[int, cgroups.SandboxCgroup] = dict(made or {})
        self.next = max(self.held, default=0) + 1
        self.mechanism = mechanism  # of the tasks' limits: "cgroup2", "cgroup1" or "rlimit"
        self.cpu_s = cpu_s  # the tasks' RLIMIT_CPU, to tell its SIGKILL
        self.lock = threading.Lock()

    def new(self, fds: list[int]) -> int:
        """Make a cgroup and append its cgroup.procs fds to `fds` (which the
        caller closes once sent); its slot number."""
        assert self.make is not None
        cgroup = self.make()
        fds += cgroup.procs_fds
        cgroup.procs_fds = []
        with self.lock:
            slot, self.next = self.next, self.next + 1
            self.held[slot] = cgroup
        return slot

    def offer(self, ctl: socket.socket) -> None:
        """A cgroup for the zygote's next spare (CGROUP on `ctl`); none if it cannot be made."""
        fds: list[int] = []
        try:
            slot = self.new(fds)
            ch.send(ctl, ch.CGROUP, {"slot": slot}, fds)
        except (OSError, SetupError):
            pass  # no more spares meanwhile: tasks are forked with a cgroup of their own
        finally:
            for fd in fds:
                os.close(fd)

    def end(self, task: Task | None, slot: int | None) -> None:
        """The sandbox in `slot` has ended: its task's usage and the limit that
        ended it, read from its cgroup, which is then removed."""
        with self.lock:
            cgroup = self.held.pop(slot, None) if slot is not None else None
        if task is not None and task.status is not None:
            usage = cgroup.usage() if cgroup is not None else cgroups.Usage(mechanism=self.mechanism)
            by_caller = "timeout" if task.timed_out else "kill" if task.failure is not None else None
            task.usage = usage
            task.killed_by = cgroups.killed_by(task.returncode(), usage, self.cpu_s, by_caller)
        if task is not None:
            task.end.set(task.usage, task.killed_by)
        if cgroup is not None and not cgroup.remove(attempts=1):
            cgroups.leftover(cgroup)

    def remove_all(self) -> None:
        """Remove every cgroup still held (the zygote, pid 1 of all the
        sandboxes, is reaped: whatever is left inside is killed)."""
        with self.lock:
            left = list(self.held.values())
            self.held.clear()
        for cgroup in left:
            if not cgroup.remove(attempts=40):
                cgroups.leftover(cgroup)
