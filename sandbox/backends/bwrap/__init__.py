"""The bwrap backend: run a Plan with bubblewrap (/usr/bin/bwrap, 0.8.0 or newer).

How it drives bwrap is in driver.py; what still differs from the native backend is in README's "Backends".
"""

from __future__ import annotations

import errno as E
import os
from typing import Any

from ...errors import SetupError, UnavailableError
from ...plan import Plan
from ...probe import probe
from ...spec import Spec
from .driver import _Run

# ---------------------------------------------------------------- entry point

def launch(plan: Plan, spec: Spec, argv: list[str], stdio: tuple[int, int, int],
           pass_fds: tuple[int, ...]) -> dict[str, Any]:
    """Start `argv` under `plan` with bwrap; return SandboxProcess keyword arguments.

    Returns once the command has been exec'd. Raises SetupError if the
    sandbox could not be set up, ExecError if the command could not be
    executed, UnavailableError if bwrap is missing.
    """
    bwrap = probe().bwrap
    if not bwrap:
        raise UnavailableError(f"bwrap backend unavailable: {probe().bwrap_reason}")
    _refuse_like_native(plan)
    if plan.landlock and not plan.landlock_best_effort:
        raise UnavailableError("landlock=True needs the native backend (bwrap has no Landlock support); "
                               "use landlock='best-effort' to run without it under bwrap")
    run = _Run(bwrap, plan, argv)
    return run.start(stdio, pass_fds)


def _refuse_like_native(plan: Plan) -> None:
    """Without a user namespace only root can make namespaces; bwrap would
    quietly add one for everybody else, the native backend fails."""
    others = plan.mount_ns or plan.pid_ns or plan.net_ns or plan.ipc_ns or plan.uts_ns or plan.cgroup_ns
    if not plan.user_ns and others and os.geteuid() != 0:
        raise SetupError("Creating new namespace failed: Operation not permitted (no user namespace requested)",
                         step="clone", errno=E.EPERM, backend="bwrap")


