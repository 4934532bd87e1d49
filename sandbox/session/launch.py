"""Starting a Session's sandbox: the Spec's plan, its refusals, and the native
spawn of that plan with sandbox-session as its pid 1.

Nothing is decided here: the plan is compile_plan's (through plan_cache),
refused as any spawn's would be (refusal.py), and run by the native
executor. The one difference from `sandbox.spawn` is the executable the
setup child execs last: sandbox-session (csrc/session/session.c) in sandbox-init's
place, with sandbox-init's argv. By then the child has taken every step of
the plan, so the session's pid 1, and every command it forks, lives under
exactly the confinement a fresh sandbox of the Spec gives its command.

With several ids mapped (session/ids.py) the plan also carries a Sync: the
setup child reports its pid and waits while a thread here writes its id
maps; pid 1 then keeps CAP_SETUID, CAP_SETGID and CAP_SETPCAP beyond the
Spec's capabilities, and gets the Spec's set as its last argument: each of
its call processes drops to that set before its command exists.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import threading
from dataclasses import dataclass

from .. import backends
from .._core.binding import BIN_DIR_STR
from ..backends import native
from ..capabilities import Capability, Traits
from ..errors import SpecError, UnavailableError
from ..host import HostInfo
from ..plan import Plan, compile_plan
from ..plan_cache import compiled_plan
from ..process import SandboxProcess
from ..refusal import refusal
from ..spec import Spec
from ..sync import Sync
from .ids import SessionIds, session_ids, without_pool, write_maps

SESSION_PATH = os.path.join(BIN_DIR_STR, "sandbox-session")
CAP_SETGID, CAP_SETUID, CAP_SETPCAP = 6, 7, 8
SETID_CAPS = 1 << CAP_SETGID | 1 << CAP_SETUID | 1 << CAP_SETPCAP  # pid 1's, with several ids


@dataclass
class Launched:
    """A started session: its pid 1 (`proc`), the caller's end of its control
    socket, the plan it runs, the host it was planned for and the ids its
    user namespace maps."""

    proc: SandboxProcess
    control: socket.socket
    plan: Plan
    host: HostInfo
    ids: SessionIds


def plan_for(spec: Spec) -> tuple[Plan, HostInfo]:
    """The Spec's plan for the native executor, refused as a spawn's would be."""
    if not isinstance(spec, Spec):
        raise SpecError("spec", spec, "must be a sandbox.Spec")
    name, _ = backends.choose("native")
    host = backends.host_for(name)
    plan = compiled_plan(spec, host)
    refused = refusal(plan, dataclasses.replace(host, executor=session_traits(host.executor)))
    if refused is not None:
        raise refused
    return plan, host


def session_traits(native: Traits) -> Traits:
    """A Session's declaration: the native executor's, less running the command as pid 1."""
    return Traits("session", "a Session", native.capabilities - {Capability.COMMAND_AS_PID_1},
                  because={**native.because, Capability.COMMAND_AS_PID_1:
                           "its pid 1 is sandbox-session, which forks every command"})


def launch(spec: Spec) -> Launched:
    """Start the session's sandbox; return once its pid 1 takes requests."""
    plan, host = plan_for(spec)
    plan, ids = without_pool(spec, plan, host, session_ids(plan, host))
    try:
        exe = os.open(SESSION_PATH, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise UnavailableError(f"sandbox-session is missing at {SESSION_PATH} ({exc.strerror}); "
                               "reinstall the package") from None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc, plan = _spawn(spec, plan, host, ids, theirs.fileno(), exe)
    except BaseException:
        ours.close()
        raise
    finally:
        os.close(exe)
        theirs.close()
    return Launched(proc, ours, plan, host, ids)


def _spawn(spec: Spec, plan: Plan, host: HostInfo, ids: SessionIds, fd: int, exe: int) -> tuple[SandboxProcess, Plan]:
    """The native spawn of pid 1 (its control socket `fd`), with its id maps
    written meanwhile when it maps several: its process and the plan run."""
    argv = ["sandbox-session", str(fd)]
    writer = MapWriter(ids) if ids.several else None
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    handle = None
    try:
        if writer is not None:
            argv.append(format(plan.keep_caps, "x"))
            plan = dataclasses.replace(compile_plan(spec, host, writer.sync), network=plan.network,
                                       recycle_lease=plan.recycle_lease, keep_caps=plan.keep_caps | SETID_CAPS)
        handle = native.launch(plan, argv, (null, null, null), (fd,), exec_fd=exe)
    finally:
        os.close(null)
        if writer is not None:
            writer.finish()
            if writer.error is not None and handle is None:
                raise writer.error  # why the spawn failed: the child was killed for it
    proc = SandboxProcess(["sandbox-session"], handle, backend="native", backend_reason="a Session",
                          network=plan.network)
    if writer is not None and writer.error is not None:  # its kill failed: never serve that session
        proc.kill()
        proc.wait()
        raise writer.error
    return proc, plan


class MapWriter:
    """The thread that writes a starting session's id maps: it reads the
    setup child's pid (the Sync's started_fd), writes the maps, and lets the
    child go on (userns_block_fd); if they cannot be written it kills the
    child instead, so nothing runs with ids other than planned."""

    def __init__(self, ids: SessionIds) -> None:
        self.error: BaseException | None = None
        self._started_r, started_w = os.pipe2(os.O_CLOEXEC)
        block_r, self._block_w = os.pipe2(os.O_CLOEXEC)
        self._child_fds = (started_w, block_r)
        self.sync = Sync(started_fd=started_w, userns_block_fd=block_r)
        self._thread = threading.Thread(target=self._run, args=(ids,), name="sandbox-session-idmap", daemon=True)
        self._thread.start()

    def _run(self, ids: SessionIds) -> None:
        pid = -1
        try:
            line = b""
            while not line.endswith(b"\n"):
                chunk = os.read(self._started_r, 32)
                if not chunk:
                    return  # the child never started: launch raises why
                line += chunk
            pid = int(line)
            write_maps(pid, ids)
            os.write(self._block_w, b"m")
        except BaseException as exc:
            self.error = exc
            if pid > 0:
                os.kill(pid, signal.SIGKILL)  # our unreaped child: the pid is still its
        finally:
            os.close(self._block_w)
            os.close(self._started_r)

    def finish(self) -> None:
        """Once the spawn has returned (or raised): close the child's ends, wait for the thread."""
        for fd in self._child_fds:
            os.close(fd)
        self._thread.join()
