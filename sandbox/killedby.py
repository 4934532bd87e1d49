"""killed_by: which limit ended a sandbox, decided once for every executor.

Read from what the kernel and the caller say, never guessed from the exit
status alone, and for every exit status (a command that exits 0 after one
of its processes was OOM-killed was still stopped by its memory limit):

- ``"timeout"``, ``"output"``: the caller's timer, or its output cap
  (on_overflow "kill"/"raise"), killed the sandbox;
- ``"memory"``: the cgroup's OOM killer ran (memory.events ``oom_kill``, or
  ``oom_group_kill``; v1's memory.oom_control);
- ``"cpu"``: RLIMIT_CPU. The kernel sends SIGXCPU at the soft limit and
  SIGKILL at the hard one; it checks the process's tick-sampled CPU time,
  which under load may run ahead of the precise figure the cgroup (or
  wait4) gives by a tenth of a second or more. So a SIGKILL counts as the
  CPU limit's when nothing else of ours sent it (not the caller, not the
  OOM killer) and the sandbox used at least CPU_SHARE of the limit: a
  margin proportional to the limit, not a fixed one. A shell's 128+N
  status for such a signal counts too (its child was killed), with the
  same check of the CPU time;
- ``"pids"``: the cgroup refused a fork at its process limit (pids.events
  ``max``);
- None: nothing of the above (also when the caller killed it itself).
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cgroups import Usage

__all__ = ["CPU_SHARE", "CALLER_LIMITS", "killed_by"]

CPU_SHARE = 0.5  # of RLIMIT_CPU a sandbox must have used for a SIGKILL to be the limit's
CALLER_LIMITS = ("timeout", "output")  # limits the caller enforces by killing the sandbox


def killed_by(returncode: int, usage: Usage | None, cpu_s: float | None, by_caller: str | None) -> str | None:
    """Which limit ended a sandbox whose command returned `returncode`
    (-N: signal N), given its `usage` (its `events` are the kernel's limit
    hits; None: nothing counted), its RLIMIT_CPU `cpu_s` (None: none) and
    `by_caller` ("timeout", "output" or "kill" when the caller killed it):
    "timeout", "output", "memory", "cpu", "pids" or None (module docstring)."""
    if by_caller in CALLER_LIMITS:
        return by_caller
    if by_caller is not None:  # the caller's own kill() ended it
        return None
    events = usage.events if usage is not None else {}
    if events.get("oom_kill"):
        return "memory"
    if cpu_s is not None and _cpu_limit(returncode, None if usage is None else usage.cpu_s, cpu_s):
        return "cpu"
    if events.get("pids_max"):
        return "pids"
    return None


def _cpu_limit(returncode: int, used: float | None, cpu_s: float) -> bool:
    """Whether RLIMIT_CPU's signal ended the command (module docstring)."""
    if returncode < 0:
        sig, shell = -returncode, False
    elif 128 < returncode < 128 + 65:
        sig, shell = returncode - 128, True
    else:
        return False
    if sig not in (signal.SIGXCPU, signal.SIGKILL):
        return False
    if used is None:  # nothing counted the CPU time: only the signal of the command itself says it
        return not shell
    return used >= CPU_SHARE * cpu_s
