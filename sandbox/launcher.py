"""The native launcher: one executable that runs a serialized plan.

Harnesses that run `subprocess.run(argv, env=...)` themselves get an argv
from `launcher_argv()`: the `sandbox-launch` executable built from csrc/,
the plan as base64, then the command. No Python starts per command; the
command's environment is the launcher's own (the harness's `env=`).
Where the executable is missing, `python -m sandbox run --spec ...` is the
slower fallback.
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Sequence

from . import backends
from .host import HostInfo, hard_limits
from .plan import check_argv, compile_plan
from .spec import Spec

LAUNCHER_NAME = "sandbox-launch"


def launcher_path() -> str:
    """Where the package build put sandbox-launch (it may be missing)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", LAUNCHER_NAME)


def available() -> tuple[bool, str]:
    """(ok, reason): can launcher_argv() produce something that sandboxes here?

    Only the native backend is probed while it works (bwrap only if not).
    """
    from .probe import probe

    if backends.availability("native")[0]:
        if os.access(launcher_path(), os.X_OK):
            return True, f"native launcher {launcher_path()}"
        return True, f"{LAUNCHER_NAME} missing; falling back to `python -m sandbox run` (native)"
    result = probe()
    if result.bwrap:
        return True, f"native refused ({result.native_reason}); `python -m sandbox run` with bwrap"
    return False, f"native: {result.native_reason}; bwrap: {result.bwrap_reason}"


def launcher_argv(spec: Spec, argv: Sequence[str], cwd: str) -> list[str]:
    """The argv that runs `argv` in `spec` (pure: no files, no processes).

    `cwd` stands for the caller's working directory when the plan is made
    (it is the sandbox's cwd unless `spec.cwd` says otherwise).
    """
    from .backends import native

    command = check_argv(argv)
    path = launcher_path()
    if backends.availability("native")[0] and os.access(path, os.X_OK):
        # sandbox-launch makes its own namespaces: it cannot join a pooled one
        host = HostInfo(uid=os.getuid(), gid=os.getgid(), cwd=cwd, environ={}, hard_limits=hard_limits(), pool=None)
        blob = native.blob_for(compile_plan(spec, host))
        return [path, "--plan", base64.b64encode(blob).decode(), "--", *command]
    return [sys.executable, "-m", "sandbox", "run", "--close-fds", "--spec", spec.to_json(), "--", *command]
