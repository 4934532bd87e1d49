"""The bwrap backend: run a Plan with bubblewrap (/usr/bin/bwrap, 0.8.0 or newer).

How it drives bwrap is in driver.py; what still differs from the native backend is in docs/backends.md.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from ...capabilities import ALL, Capability, Traits
from ...errors import UnavailableError
from ...host import BWRAP_ENV
from ...plan import Plan
from ..contract import Handle
from .driver import _Run


@functools.cache
def _find() -> tuple[str | None, str]:
    path = os.environ.get(BWRAP_ENV) or shutil.which("bwrap")
    if not path:
        return None, f"not found on PATH (set {BWRAP_ENV} to its path)"
    if not os.access(path, os.X_OK):
        return None, f"{path} is not executable"
    # bwrap needs the same kernel permissions (unless it is setuid): try it once.
    try:
        done = subprocess.run([path, "--ro-bind", "/", "/", "--", "true"], capture_output=True, timeout=10,
                              env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} does not run: {exc}"
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        return None, f"{path} cannot create a sandbox here: {message[-1] if message else done.returncode}"
    return path, "works"


def bwrap_path() -> str | None:
    """The bwrap binary this backend runs, if it works here (found and tried once per process)."""
    return _find()[0]


def available() -> tuple[bool, str]:
    """Whether bwrap is there and can make a sandbox here; the reason names the binary."""
    _find.cache_clear()
    path, reason = _find()
    return path is not None, reason


def launch(plan: Plan, argv: list[str], stdio: tuple[int, int, int], pass_fds: tuple[int, ...]) -> Handle:
    """Start `argv` under `plan` with bwrap; return once the command has been exec'd.

    Raises SetupError if the sandbox could not be set up, ExecError if the
    command could not be executed, UnavailableError if bwrap is missing.
    """
    path, reason = _find()
    if path is None:
        raise UnavailableError(f"bwrap backend unavailable: {reason}")
    return _Run(path, plan, argv).start(stdio, pass_fds)


# bubblewrap makes its own network namespace, has no Landlock, binds
# read-only only with nodev, and what it lacks (limits, probes, port
# forwarding, checks) is done from outside with the compiled core's helpers;
# bwrap is started inside the sandbox's cgroup (its monitor with it).
# bubblewrap 0.8.0 has no --overlay.
TRAITS = Traits("bwrap", "the bwrap backend", ALL - {
    Capability.JOIN_POOLED_NETNS, Capability.LANDLOCK, Capability.RDONLY_DEV_BIND,
    Capability.SELF_CONTAINED_SETUP, Capability.OVERLAY},
    because={Capability.OVERLAY: "bubblewrap 0.8.0 has no --overlay"})


class _Bwrap:
    """The bwrap backend (the Backend protocol of sandbox.backends)."""

    name = TRAITS.name
    traits = TRAITS
    available = staticmethod(available)
    launch = staticmethod(launch)


BACKEND = _Bwrap()
