"""Starting a Session's sandbox: the Spec's plan, its refusals, and the native
spawn of that plan with sandbox-session as its pid 1.

Nothing is decided here: the plan is compile_plan's (through plan_cache),
refused as any spawn's would be (refusal.py), and run by the native
executor. The one difference from `sandbox.spawn` is the executable the
setup child execs last: sandbox-session (csrc/session.c) in sandbox-init's
place, with sandbox-init's argv. By then the child has taken every step of
the plan, so the session's pid 1, and every command it forks, lives under
exactly the confinement a fresh sandbox of the Spec gives its command.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from .. import backends
from ..backends.native.core import BIN_DIR_STR
from ..errors import SpecError, UnavailableError
from ..host import HostInfo
from ..plan import Plan
from ..plan_cache import compiled_plan
from ..process import SandboxProcess
from ..refusal import refusal
from ..spec import Spec

SESSION_PATH = os.path.join(BIN_DIR_STR, "sandbox-session")


@dataclass
class Launched:
    """A started session: its pid 1 (`proc`), the caller's end of its control
    socket, the plan it runs and the host it was planned for."""

    proc: SandboxProcess
    control: socket.socket
    plan: Plan
    host: HostInfo


def plan_for(spec: Spec) -> tuple[Plan, HostInfo]:
    """The Spec's plan for the native executor, refused as a spawn's would be."""
    if not isinstance(spec, Spec):
        raise SpecError("spec", spec, "must be a sandbox.Spec")
    name, _ = backends.choose("native")
    host = backends.host_for(name)
    plan = compiled_plan(spec, host)
    refused = refusal(plan, host)
    if refused is not None:
        raise refused
    if not plan.reaper:
        field = "as_pid_1" if spec.as_pid_1 else "namespaces"
        raise SpecError(field, getattr(spec, field),
                        "a Session needs a pid namespace whose pid 1 is the library's (as_pid_1=False)")
    return plan, host


def launch(spec: Spec) -> Launched:
    """Start the session's sandbox; return once its pid 1 takes requests."""
    plan, host = plan_for(spec)
    try:
        exe = os.open(SESSION_PATH, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise UnavailableError(f"sandbox-session is missing at {SESSION_PATH} ({exc.strerror}); "
                               "reinstall the package") from None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    null = -1
    try:
        from ..backends import native

        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        fd = theirs.fileno()
        handle = native.launch(plan, ["sandbox-session", str(fd)], (null, null, null), (fd,), exec_fd=exe)
    except BaseException:
        ours.close()
        raise
    finally:
        os.close(exe)
        theirs.close()
        if null >= 0:
            os.close(null)
    proc = SandboxProcess(["sandbox-session"], handle, backend="native", backend_reason="a Session",
                          network=plan.network)
    return Launched(proc, ours, plan, host)
