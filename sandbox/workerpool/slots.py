"""The cgroups and network namespaces of a WorkerPool's sandboxes, one per slot (see workerpool.engine).

Every sandbox the zygote forks enters a cgroup this side made and runs in a
network namespace leased from the pool's own supply: a slot, known to the
zygote by its number and the fds it was sent (cgroup.procs files; the
namespace's and its owner's). A SPAWN brings one; spares take those offered
ahead (SLOT). When a sandbox has ended its cgroup's usage and the limit
that ended it are read, the cgroup is removed, and the namespace goes back
to the supply, which checks it (a task holds no capability over it, so
sockets and counters are what it could have left) and leases it again only
if it is as made.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import cgroups
from ..cgroups.walls import ended_usage
from ..errors import NetnsPoolError, SetupError
from ..netpool.factory import adopted
from . import control
from .task import Task

if TYPE_CHECKING:
    from ..netpool import Lease, NetnsPool


class CgroupSlots:
    """Slot number -> the cgroup not yet removed and the namespace not yet
    given back; `make` makes a cgroup with the pool's limits (None: the
    tasks are limited by rlimits alone); `netns`: the pool's supply of
    network namespaces (None: each task makes a fresh one)."""

    def __init__(self, make: Callable[[], cgroups.SandboxCgroup] | None,
                 made: dict[int, cgroups.SandboxCgroup] | None, mechanism: str, cpu_s: int | None) -> None:
        self.make = make
        self.netns: NetnsPool | None = None
        self.leases: dict[int, Lease] = {}
        self.held: dict[int, cgroups.SandboxCgroup] = dict(made or {})
        self.next = max(self.held, default=0) + 1
        self.mechanism = mechanism  # of the tasks' limits: "cgroup2", "cgroup1" or "rlimit"
        self.cpu_s = cpu_s  # the tasks' RLIMIT_CPU, to tell its SIGKILL
        self.lock = threading.Lock()

    def adopt(self, factory: socket.socket, size: int) -> None:
        """Lease from a NetnsPool of `size` whose factory is at the other end of `factory` (the zygote's)."""
        from ..netpool.pool import NetnsPool  # lazy: a pool of network namespaces only when adopted: 3 ms

        self.netns = NetnsPool(size, factory=adopted(factory))

    @property
    def on(self) -> bool:
        """Whether every fork takes a slot."""
        return self.make is not None or self.netns is not None

    def new(self, fds: list[int], body: dict[str, int]) -> int:
        """Make a cgroup and lease a namespace; append the cgroup.procs fds,
        then the namespace's owner's and its own, to `fds` (which the caller
        closes once sent), and set `body`'s slot and n_ns (how many namespace
        fds: 0 when the supply has none to give, then the task makes one);
        the slot number."""
        cgroup = self.make() if self.make is not None else None
        if cgroup is not None:
            fds += cgroup.procs_fds
            cgroup.procs_fds = []
        lease = self._lease(fds)
        with self.lock:
            slot, self.next = self.next, self.next + 1
            if cgroup is not None:
                self.held[slot] = cgroup
            if lease is not None:
                self.leases[slot] = lease
        body["slot"], body["n_ns"] = slot, 2 if lease is not None else 0
        return slot

    def _lease(self, fds: list[int]) -> Lease | None:
        """A namespace of the supply, its (owner, netns) fds appended to `fds`; None if it has none."""
        if self.netns is None:
            return None
        try:
            lease = self.netns.lease()
            netns_fd, userns_fd = lease.dup_fds()
        except (NetnsPoolError, OSError):
            return None
        if userns_fd is None:  # an adopted factory's namespaces always have an owner of their own
            os.close(netns_fd)
            lease.release(recycle=False)
            return None
        fds += [userns_fd, netns_fd]
        return lease

    def offer(self, ctl: socket.socket) -> None:
        """A slot for the zygote's next spare (SLOT on `ctl`); none if it cannot be made."""
        fds: list[int] = []
        body: dict[str, int] = {}
        try:
            self.new(fds, body)
            control.send(ctl, control.SLOT, fds, **body)
        except (OSError, SetupError):
            pass  # no more spares meanwhile: tasks are forked with a slot of their own
        finally:
            for fd in fds:
                os.close(fd)

    def end(self, task: Task | None, slot: int | None) -> None:
        """The sandbox in `slot` has ended: its task's usage and the limit that
        ended it, read from its cgroup, which is then removed."""
        with self.lock:
            cgroup = self.held.pop(slot, None) if slot is not None else None
            lease = self.leases.pop(slot, None) if slot is not None else None
        if lease is not None:  # every process of the sandbox is gone: checked off this thread
            lease.release(wait=False, unprivileged_tenant=True)
        if task is not None and task.status is not None:
            usage = ended_usage(cgroup, self.mechanism, task.rusage)
            by_caller = task.caller_end
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
            leases = list(self.leases.values())
            self.leases.clear()
        for lease in leases:
            lease.release(recycle=False)
        if self.netns is not None:
            self.netns.close()
        for cgroup in left:
            if not cgroup.remove(attempts=40):
                cgroups.leftover(cgroup)
