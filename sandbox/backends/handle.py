"""ProcessHandle: the Handle (contract.Handle) of a sandbox known by its first process.

Every executor starts a sandbox whose first process is either the caller's
child (native spawn, bwrap: waited for with waitpid) or another process's (a
Template's sandbox is its server's: waited for through a pidfd, its status
sent by the server). Its reaper may also send the command's status early,
once every other process of the sandbox has gone (`ended_fd`): the wait ends
there, not at the first process's own exit (the namespaces' teardown), and a
first process that is our child is then reaped in the background
(sandbox.reaper). This class is that logic, once; an executor that reaches
its command differently overrides `signal` (bwrap).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable
from typing import Any

from ..cgroups import Walls
from ..killedby import killed_by as decide_killed_by
from ..reaper import after_exit, reap_later
from .contract import EarlyStatus, Ended, ExitSource

__all__ = ["ProcessHandle", "readable", "readable_count"]

POLLIN = select.POLLIN


def readable(fds: int | list[int], timeout: float | None = 0) -> bool:
    """Whether `fds` (one or several: a pidfd is readable once its process
    has exited) has a readable one within `timeout` seconds (None: wait as
    long as it takes)."""
    poller = select.poll()
    if isinstance(fds, int):
        poller.register(fds, POLLIN)
    else:
        for fd in fds:
            poller.register(fd, POLLIN)
    return bool(poller.poll(None if timeout is None else _ms(timeout) if timeout else 0))


def readable_count(fds: list[int], timeout: float | None) -> int:
    """How many of `fds` are readable (or hung up) within `timeout` seconds
    (None: once one is, however long it takes); 0 after the timeout."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, POLLIN)
    return len(poller.poll(None if timeout is None else _ms(timeout)))


def _ms(timeout: float) -> int:
    """poll()'s timeout: whole milliseconds, rounded up."""
    return max(0, int(timeout * 1000 + 0.999))


class ProcessHandle:
    """A started sandbox: `pid` is the host pid of its first process (the one
    to wait for and to signal); `exit` turns that process's wait status into
    the command's returncode; `timings` are µs since the start, with at least
    `start`, `child`, `ready` and `exec`, plus the executor's own stages;
    `isolation` what the isolation checks established; `on_exit` runs once the
    sandbox has ended (gives back a leased namespace, stops a port relay);
    `sandbox_pid` is the host pid of the sandbox's first process inside its
    namespaces where that is not `pid` (bwrap's monitor stands outside).

    `pidfd`, when not -1, is a pidfd of the first process, which is then not
    the caller's child: it is waited for by polling the pidfd and signalled
    through it, and its status comes from `exit` alone (a SIGKILL status if it
    reports none). `ended_fd`, when not -1, becomes readable once the command's
    status is in or its writer has gone: `exit` is then an EarlyStatus.
    `walls`, when set, holds the sandbox's cgroup (its usage, which limit ended
    it; removed once the first process is reaped).

    `first_pidfd`, when not -1, is a pidfd of `sandbox_pid`, the first process
    inside, where `pid` is our child standing outside (bwrap's monitor,
    sandbox-launch) and `sandbox_pid` its child. The sandbox has ended only
    once that process has exited too: as a pid namespace's init it exits only
    after every other process of the namespace has (the kernel kills them and
    waits for them). When `pid` is killed, or exits without it, it is killed
    too, so the sandbox ends with its command, as natively. The handle owns
    the fds."""

    # whether the kernel's rusage of the first process (wait4's) covers every process of the sandbox
    counts_rusage = True

    def __init__(self, pid: int, exit: ExitSource, timings: dict[str, float], *,
                 isolation: dict[str, Any] | None = None, on_exit: Callable[[], None] | None = None,
                 pidfd: int = -1, ended_fd: int = -1, sandbox_pid: int | None = None,
                 walls: Walls | None = None, first_pidfd: int = -1) -> None:
        self.pid = pid
        self.exit = exit
        self.timings = timings
        self.isolation = isolation if isolation is not None else {}
        self.on_exit = on_exit
        self.pidfd = pidfd
        self.ended_fd = ended_fd
        self._early: EarlyStatus = exit  # type: ignore[assignment]  # what it is when there is an ended_fd
        self.sandbox_pid = sandbox_pid if sandbox_pid is not None else pid
        self.walls = walls
        self._rusage: tuple[float, float] | None = None  # (CPU s, peak RSS MiB) of a first process we waited for
        self.first_pidfd = first_pidfd
        self._first_killed = False

    # ------------------------------------------------------------ waiting

    def wait_fds(self) -> list[int]:
        """New fds (the caller closes them) of which one becomes readable once
        reap() may find the sandbox ended; [] if it cannot be waited for any
        more (it has gone: reap() says)."""
        if self.first_pidfd >= 0 and not readable(self.first_pidfd):
            # the first process inside, and `pid` until that one is killed (its exit is the cue)
            first = [os.dup(self.first_pidfd)]
            return first if self._first_killed else first + self._own_wait_fds()
        return self._own_wait_fds()

    def _own_wait_fds(self) -> list[int]:
        try:
            fds = [os.dup(self.pidfd) if self.pidfd >= 0 else os.pidfd_open(self.pid)]
        except OSError:
            return []
        try:
            if self.ended_fd >= 0:
                fds.append(os.dup(self.ended_fd))
        except OSError:
            os.close(fds[0])
            return []
        return fds

    def reap(self, caller_end: str | None = None, woken: bool = False) -> Ended | None:
        """How the sandbox ended, once it has (never blocks); None while it
        runs. `caller_end` is "timeout" or "kill" when the caller ended it;
        `woken`: every fd of the last wait_fds() was just seen readable (so
        is `ended_fd`, of which one was a dup). Once it returns an Ended,
        what the sandbox held is released."""
        if self.first_pidfd >= 0:
            if not readable(self.first_pidfd):
                if not self._first_killed and self._exited():
                    self.end_first()
                return None
            os.close(self.first_pidfd)
            self.first_pidfd = -1
        status, after = self._status(woken)
        if status is None:
            return None
        returncode = self.exit.returncode(status)
        rusage = getattr(self.exit, "rusage", None) or self._rusage
        if self.walls is not None:
            usage, killed_by = self.walls.finish(returncode, caller_end, rusage)
        else:
            usage, killed_by = None, decide_killed_by(returncode, None, None, caller_end)
        self.ended_fd = -1  # the exit source held it, and has closed it
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        if self.on_exit is not None:  # e.g. give a leased network namespace back
            hook, self.on_exit = self.on_exit, None
            hook()
        if after is not None:
            after()
        return Ended(returncode, usage, killed_by)

    def _status(self, woken: bool) -> tuple[int | None, Callable[[], None] | None]:
        """(the first process's wait status, what to do after the status is
        taken) if the sandbox has ended, else (None, None). With an early
        status the sandbox has ended once it is in (a SIGKILL status stands
        in here; the exit source has the real one): the first process, still
        exiting, is reaped in the background if it is our child. `woken`:
        `ended_fd` has just been seen readable (reap)."""
        if self.ended_fd >= 0 and (woken or readable(self.ended_fd)):
            if self._early.arrived():
                if self.pidfd >= 0:
                    return signal.SIGKILL, self._remove_walls_after_exit()
                pid, walls = self.pid, self.walls  # its cgroup goes once it is reaped, after finish() read it
                return signal.SIGKILL, lambda: reap_later(pid, walls.remove if walls is not None else None)
            self.ended_fd = -1  # gone without a word (killed): wait for the process itself
        if self.pidfd >= 0:
            return (signal.SIGKILL, self._remove_walls_after_exit()) if readable(self.pidfd) else (None, None)
        try:
            pid, status, ru = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status, ru = self.pid, 255 << 8, None
        if not pid:
            return None, None
        if ru is not None and self.counts_rusage:  # the kernel's count for it and every descendant reaped
            self._rusage = (ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024)
        return status, self.walls.remove if self.walls is not None else None

    def _exited(self) -> bool:
        """Whether `pid`, our child, has exited (left to be reaped)."""
        try:
            return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            return True

    def end_first(self) -> None:
        """SIGKILL the first process inside (through its pidfd), if there is one: the whole sandbox ends."""
        if self.first_pidfd >= 0:
            self._first_killed = True
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.first_pidfd, signal.SIGKILL)

    def _remove_walls_after_exit(self) -> Callable[[], None] | None:
        """Removing the cgroup of a first process known by its pidfd (not our
        child: another reaps it) once it has exited, which it does right after
        its status is written, in the background: its exit is where the kernel
        tears its namespaces down, which the caller's wait need not sit through
        (a cgroup empties as its last process exits, before it is reaped)."""
        walls = self.walls
        if walls is None or walls.cgroup is None:
            return None
        try:
            pidfd = os.dup(self.pidfd)
        except OSError:
            return walls.remove
        return lambda: after_exit(pidfd, walls.remove)

    # ------------------------------------------------------------ signals and the end

    def signal(self, sig: int) -> None:
        """Send `sig` to the sandbox's first process (its reaper passes it on
        to the command); SIGKILL also reaches every process of its cgroup.
        Nothing once its status is in: the sandbox has ended, and a first
        process known by its pidfd may be serving another request by now (a
        recycled Template sandbox's pid 1)."""
        if self.pidfd >= 0 and self.ended_fd >= 0 and readable(self.ended_fd):
            return
        if sig == signal.SIGKILL and self.walls is not None:
            self.walls.kill()
        if sig == signal.SIGKILL:
            self.end_first()
        try:
            if self.pidfd >= 0:
                signal.pidfd_send_signal(self.pidfd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Release the fds without waiting (the handle is abandoned)."""
        self._close_pidfd()

    def _close_pidfd(self) -> None:
        for name in ("pidfd", "first_pidfd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def __del__(self) -> None:
        if self.pidfd >= 0 or self.first_pidfd >= 0:
            self.close()
