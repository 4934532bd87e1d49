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
(csrc/core/child.c: no untrusted code runs outside). When the sandbox ends its
usage is read and the directories removed (after its pid 1 is reaped); a
cgroup whose owner died (SIGKILL) is removed by the next process that makes
one (`sweep`).
"""

from __future__ import annotations

from ..killedby import killed_by
from .hierarchies import (
    CONTROLLERS,
    CPU_PERIOD_US,
    PARENT_ENV,
    PREFIX,
    CgroupInfo,
    CgroupLimits,
    Hierarchy,
    Usage,
    detect,
    host_cgroups,
)
from .walls import SandboxCgroup, Walls, hierarchies_for, leftover, sweep

__all__ = ["CONTROLLERS", "CPU_PERIOD_US", "PARENT_ENV", "PREFIX", "CgroupInfo", "CgroupLimits", "Hierarchy",
           "SandboxCgroup", "Usage", "Walls", "detect", "hierarchies_for", "host_cgroups", "killed_by",
           "leftover", "sweep"]
