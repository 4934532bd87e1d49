"""A sandbox's cgroup, as the executors that place sandboxes in one make it (sandbox.cgroups)."""

from __future__ import annotations

import dataclasses
import functools
import resource

from .. import cgroups
from ..errors import SetupError
from ..plan import Plan


def walls_for(plan: Plan, backend: str, outside_tasks: int = 0) -> cgroups.Walls:
    """The sandbox's cgroup, made with its limits before anything of the
    sandbox runs (None in the Walls when the plan has none: rlimits only).
    `outside_tasks`: processes of the executor's own that live in the cgroup
    too (bwrap's monitor), allowed beyond the process limit and not counted
    in the usage. SetupError, naming `backend`, when it cannot be made."""
    cpu_s = _cpu_s(plan.rlimits)
    if plan.cgroup is None:
        return _rlimits_only(cpu_s)
    limits = plan.cgroup
    if outside_tasks and limits.pids is not None:
        limits = dataclasses.replace(limits, pids=limits.pids + outside_tasks)
    return cgroups.Walls(new_cgroup(limits, backend), plan.limits_mechanism, cpu_s, outside_tasks)


@functools.lru_cache(maxsize=64)
def _rlimits_only(cpu_s: int | None) -> cgroups.Walls:
    """The walls of a sandbox without a cgroup: they hold nothing (kill and
    remove do nothing, finish only reads), so one serves every such sandbox."""
    return cgroups.Walls(None, "rlimit", cpu_s)


def _cpu_s(rlimits: tuple[tuple[int, int], ...]) -> int | None:
    """The plan's RLIMIT_CPU, if it sets one."""
    for which, value in rlimits:
        if which == resource.RLIMIT_CPU:
            return value
    return None


def walls_in(cgroup: cgroups.SandboxCgroup, plan: Plan) -> cgroups.Walls:
    """The walls of a sandbox of `plan` in `cgroup`, made ahead (a Template's placed standbys)."""
    return cgroups.Walls(cgroup, plan.limits_mechanism, _cpu_s(plan.rlimits))


def new_cgroup(limits: cgroups.CgroupLimits, backend: str,
               info: cgroups.CgroupInfo | None = None) -> cgroups.SandboxCgroup:
    """A sandbox's cgroup with `limits`, where `info` (default: this host's
    now) puts them; SetupError, naming `backend`, when it cannot be made."""
    try:
        return cgroups.SandboxCgroup(info or cgroups.host_cgroups(), limits)
    except OSError as exc:
        raise SetupError(f"Can't make the sandbox's cgroup: {exc}", step="cgroup", errno=exc.errno or 0,
                         path=exc.filename, backend=backend) from None
