"""Inside a task sandbox: nested sandboxes through the broker (see sandbox.task.broker).

When SANDBOX_TASK_BROKER names a socket (set in every confined task
sandbox), `task.spawn`, `task.run`, the launcher `python -m sandbox.task`
and `sandbox.spawn`/`sandbox.run` of a Spec (the brokered executor,
sandbox.backends.brokered) send their request there instead of making
namespaces (which the sandbox's seccomp policy denies): the description in
this sandbox's own paths, the command, this process's environment and its
three stdio fds, with a socket of its own for the rest. What comes back is
a `NestedHandle` (a contract.Handle), under the one process class,
sandbox.SandboxProcess: wait() gives the exit status (-N for signal N),
send_signal(), terminate() and kill() reach the nested sandbox, and the
record written for it comes with its end. The child runs beside this
sandbox, never inside it; it dies when this process (the requester) dies,
or when the outer sandbox ends.

SANDBOX_TASK_BROKER names a socket inside the sandbox (like SSH_AUTH_SOCK):
any process of the sandbox reaches it, whatever fds its parents closed, as
long as its environment keeps the variable; where it does not, or the
path is not a socket, the error says so.
"""

from __future__ import annotations

from ..backends.brokered import BROKER_ENV
from ..backends.brokered import broker_path as broker_path
from ..backends.brokered.handle import NestedHandle as NestedHandle
from ..backends.brokered.handle import ask as ask


def broker_fds() -> tuple[int, ...]:
    """Kept for programs that pass it on (subprocess's pass_fds): always empty. The broker is
    reached by the path SANDBOX_TASK_BROKER names, from any process of the sandbox, fds or not."""
    return ()


def no_broker_note() -> str:
    """Why there is no broker, for an error about starting a sandbox here."""
    return (f"; nor is a sandbox.task broker reachable ({BROKER_ENV} is not set: this process was not "
            "started in a task sandbox, or its environment was cleared)")
