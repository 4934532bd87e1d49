"""Facts about the calling process and the host that planning depends on.

The planner is pure; everything it needs to know from outside comes in as a
HostInfo, read here and nowhere else.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass, field

from .spec import CAPABILITIES

# The resources a Spec's Limits can set (plan.RLIMITS maps its fields to them).
LIMITED_RESOURCES = (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE,
                     resource.RLIMIT_NPROC)


@dataclass(frozen=True)
class HostInfo:
    """What the planner needs to know about the calling process."""

    uid: int
    gid: int
    cwd: str | None
    environ: Mapping[str, str]
    # finite hard rlimits by resource (a resource not listed has none)
    hard_limits: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def current(cls) -> HostInfo:
        """Read the calling process's ids, cwd, environment and hard limits."""
        try:
            cwd: str | None = os.getcwd()
        except OSError:
            cwd = None
        return cls(uid=os.getuid(), gid=os.getgid(), cwd=cwd, environ=os.environ, hard_limits=hard_limits())


def hard_limits() -> dict[int, int]:
    """This process's finite hard limits of the resources a Spec can limit."""
    out = {}
    for res in LIMITED_RESOURCES:
        hard = resource.getrlimit(res)[1]
        if hard != resource.RLIM_INFINITY:
            out[res] = hard
    return out


def userns_available() -> bool:
    """bwrap's `--unshare-user-try` test: the kernel has user namespaces and they are not disabled."""
    if not os.path.exists("/proc/self/ns/user"):
        return False
    if _read_text("/sys/module/user_namespace/parameters/enable").startswith("N"):
        return False
    return _read_text("/proc/sys/user/max_user_namespaces").strip() != "0"


def effective_caps() -> set[str]:
    """The capability names in this process's effective set (/proc/self/status CapEff)."""
    try:
        with open("/proc/self/status") as f:
            line = next((ln for ln in f if ln.startswith("CapEff:")), "CapEff: 0")
    except OSError:
        return set()
    mask = int(line.split()[1], 16)
    return {name for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1}


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
