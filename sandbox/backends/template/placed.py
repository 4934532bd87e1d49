"""A Template's standbys placed in cgroups made ahead (cgroup mode).

When a Template's sandbox plan has cgroup limits (its Spec fixes them), each
of its standby sandboxes enters a fresh cgroup of its own as its first step,
before any request: made by the caller with those limits already written,
off the request path, and handed to the server with the store request (one
set per standby) and then one with every request, for the standby that
replaces the one taking it (csrc/template/standby.c, SBX_REQ_CGROUP_NEXT). A request
then pays neither the cgroup's making nor the kernel's first move of the
standby into it.

Which cgroup a sandbox lives in comes back in its report: the tag of its
first entry file (the low 32 bits of its inode), which `claim` maps to the
set sent. The sets not yet claimed are this module's to remove when the
Template closes (its server's death has killed everything inside); a
SIGKILLed caller's are removed by the next process that makes a cgroup
(sandbox.cgroups.sweep: they carry its pid in their names).
"""

from __future__ import annotations

import os
import threading
import time

from ... import cgroups
from ...cgroups.hierarchies import read_file
from ..walls import new_cgroup

# Sets made ahead beyond those the server holds: a request takes one at once,
# and the background thread makes its successor once requests pause for QUIET_S
# (or at once when none is left), so that its mkdirs do not compete with the
# sandbox being started for the CPU.
AHEAD = 4
QUIET_S = 0.002
# A standby whose request failed (a failure report names no cgroup) leaves its
# set empty and unclaimed: one seen so at two scans this far apart is removed.
SCAN_EVERY_S = 5.0


def tag_of(cgroup: cgroups.SandboxCgroup) -> int:
    """The tag a sandbox in `cgroup` reports (its entry fds must be open)."""
    return os.fstat(cgroup.procs_fds[0]).st_ino & 0xFFFFFFFF


class PlacedCgroups:
    """The cgroup sets of one server in cgroup mode: made ahead with `limits`,
    sent to the server, and claimed by the sandbox that reports their tag."""

    def __init__(self, limits: cgroups.CgroupLimits) -> None:
        self.info = cgroups.host_cgroups()
        self.limits = limits
        self.count = len(cgroups.hierarchies_for(self.info, limits))  # entry fds per set
        self._ready: list[tuple[int, cgroups.SandboxCgroup]] = []  # (tag, set), made ahead
        self._sent: dict[int, cgroups.SandboxCgroup] = {}
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._thread: threading.Thread | None = None
        self._abandoned: set[int] = set()  # tags seen used and empty at the last scan
        self._last_take = 0.0
        self._removing: list[cgroups.SandboxCgroup] = []  # sets left, to remove

    def make(self) -> tuple[int, cgroups.SandboxCgroup]:
        """A new set with the limits, and its tag (SetupError when it cannot be made)."""
        cgroup = new_cgroup(self.limits, "template", self.info)
        return tag_of(cgroup), cgroup

    def take(self) -> tuple[int, cgroups.SandboxCgroup]:
        """A set made ahead (or made now when none is), its entry fds open,
        and its tag; the background thread makes its successor."""
        with self._cond:
            made = self._ready.pop() if self._ready else None
            self._last_take = time.monotonic()
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._refill, name="sandbox-template-cgroups", daemon=True)
                self._thread.start()
            self._cond.notify()
        return made if made is not None else self.make()

    def sending(self, tag: int, cgroup: cgroups.SandboxCgroup) -> None:
        """`cgroup` goes to the server now: known by its `tag` from here on
        (its entry fds are the caller's to close once sent)."""
        with self._cond:
            self._sent[tag] = cgroup

    def give_back(self, tag: int) -> bool:
        """The set sent as `tag` never reached the server (its entry fds
        still open): made ahead again; whether it was ours."""
        with self._cond:
            cgroup = self._sent.pop(tag, None)
            if cgroup is not None and cgroup.procs_fds and not self._closed:
                self._ready.append((tag, cgroup))
                return True
        self._remove(cgroup)
        return False

    def discard(self, tag: int) -> None:
        """The set `tag` is left (its standby moved into a request's own
        cgroups): removed by the background thread."""
        with self._cond:
            cgroup = self._sent.pop(tag & 0xFFFFFFFF, None)
        self._remove(cgroup)

    def _remove(self, cgroup: cgroups.SandboxCgroup | None) -> None:
        """Have the background thread remove `cgroup` (or remove it now, once closed)."""
        if cgroup is None:
            return
        with self._cond:
            if not self._closed:
                self._removing.append(cgroup)
                self._cond.notify()
                return
        cgroup.close_fds()
        if not cgroup.remove(attempts=1):
            cgroups.leftover(cgroup)

    def claim(self, tag: int) -> cgroups.SandboxCgroup | None:
        """The set a sandbox reported it lives in (None: not one of ours)."""
        with self._cond:
            return self._sent.pop(tag & 0xFFFFFFFF, None)

    def _scan(self) -> None:
        """Remove the sets a failed request left: empty, used (a standby
        lived there: CPU time counted) and unclaimed since the last scan."""
        with self._cond:
            sent = list(self._sent.items())
        seen = set()
        for tag, cgroup in sent:
            path = cgroup.dirs[0][1]
            procs = read_file(os.path.join(path, "cgroup.procs"))
            if procs.strip() or not cgroup.usage().cpu_s:
                continue
            if tag not in self._abandoned:
                seen.add(tag)
                continue
            with self._cond:
                if self._sent.get(tag) is not cgroup:
                    continue
                del self._sent[tag]
            if not cgroup.remove(attempts=1):
                cgroups.leftover(cgroup)
        self._abandoned = seen

    def _refill(self) -> None:
        """Keep AHEAD sets made; scan for abandoned ones every SCAN_EVERY_S."""
        last = time.monotonic()
        while True:
            with self._cond:
                while (not self._closed and len(self._ready) >= AHEAD and not self._removing
                       and time.monotonic() - last < SCAN_EVERY_S):
                    self._cond.wait(SCAN_EVERY_S)
                if self._closed:
                    return
                need = len(self._ready) < AHEAD
                removing, self._removing = self._removing, []
            for cgroup in removing:
                cgroup.close_fds()
                if not cgroup.remove(attempts=1):
                    cgroups.leftover(cgroup)
            if time.monotonic() - last >= SCAN_EVERY_S:
                last = time.monotonic()
                self._scan()
            if not need:
                continue
            quiet = self._last_take + QUIET_S - time.monotonic()
            if quiet > 0 and self._ready:
                time.sleep(quiet)  # a request is being started: after it
                continue
            try:
                made = self.make()
            except Exception:  # the host refuses now: take() makes one on its path, and says why
                time.sleep(0.5)
                continue
            with self._cond:
                if not self._closed:
                    self._ready.append(made)
                    continue
            made[1].close_fds()
            made[1].remove()
            return

    def close(self) -> None:
        """Remove every set not claimed (the server has gone, and with it
        every process that was inside)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            left = [c for _, c in self._ready] + list(self._sent.values()) + self._removing
            self._ready, self._sent, self._removing = [], {}, []
        for cgroup in left:
            cgroup.close_fds()
            if not cgroup.remove(attempts=40):
                cgroups.leftover(cgroup)
