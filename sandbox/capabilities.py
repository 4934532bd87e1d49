"""What an executor of a Plan can do, declared by the executor itself.

Each executor (the native backend, bwrap, the Template, the WorkerPool)
declares a `Traits`: its name, how messages call it, and the capabilities it
has. Planning and refusal (sandbox.plan, sandbox.refusal) read the traits a
HostInfo carries and decide by capability, never by an executor's name, so a
new executor is described by its own declaration and nothing else.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ALL", "Capability", "Traits"]


class Capability(enum.Enum):
    """One thing an executor can do for a Plan; its value says it in words."""

    WITHOUT_USER_NS = "runs a sandbox without a user namespace"
    WITHOUT_MOUNT_NS = "runs a sandbox without a mount namespace"
    WITHOUT_PID_NS = "runs a sandbox without a pid namespace"
    HANDED_NAMESPACES = "creates its namespaces inside a user or pid namespace it is handed (sync.userns_fd)"
    JOIN_POOLED_NETNS = "joins a network namespace leased from the process-wide pool"
    FORWARD = "forwards ports into the sandbox and checks its network namespace"
    FD_SOURCE = "binds a file the caller passes as an fd"
    KEEP_SYS_ADMIN = "lets the command keep CAP_SYS_ADMIN"
    TMPFS_ROOT = "makes a Tmpfs at /"
    LANDLOCK = "applies a Landlock ruleset"
    RDONLY_DEV_BIND = "binds read-only with device access"
    SELF_CONTAINED_SETUP = "applies limits, probes, forwards and checks without the compiled core's outside helpers"
    CGROUPS = "places each sandbox in a cgroup of its own"
    OVERLAY = "mounts an overlayfs of host directories (an Overlay mount; an image root)"
    SYNC_FDS = "reports to and waits on the caller's sync fds (sandbox.sync: info, status, block fds, lock files)"
    COMMAND_AS_PID_1 = "runs the command as its sandbox's pid 1, with no reaper above it (as_pid_1)"
    KEEP_CAPS = "lets the command keep a capability (cap_add)"


ALL = frozenset(Capability)


@dataclass(frozen=True)
class Traits:
    """An executor's declaration: `name` (as `backend=` spells it and results
    report it), `title` (how a message names it: "a Template"), its
    `capabilities`, and `because`: for a capability it lacks, why (said after
    the refusal, e.g. "its sandboxes are cloned by an unprivileged process")."""

    name: str
    title: str
    capabilities: frozenset[Capability]
    because: Mapping[Capability, str] = field(default_factory=dict, compare=False)

    def can(self, capability: Capability) -> bool:
        """Whether this executor has `capability`."""
        return capability in self.capabilities

    def why_not(self, capability: Capability) -> str:
        """" (why)" for a capability it lacks, when the executor says why; else ""."""
        reason = self.because.get(capability)
        return f" ({reason})" if reason else ""
