"""Driving one bwrap process: from rendering to "the command was exec'd".

The Plan is rendered to bwrap options (`render.render_plan`)
passed through an `--args` memfd, so neither the options nor the
environment's values show in `ps`. bwrap is started with
`subprocess.Popen(close_fds=True)` (no Python runs between fork and exec) and
`launch()` returns only once the command has been exec'd, raising SetupError,
ExecError or UnavailableError otherwise, like the native backend. How:

- `--json-status-fd`: bwrap writes `{"child-pid": N, ...}` once its sandbox
  child exists, and `{"exit-code": N}` only if the command was exec'd.
- `--block-fd`: the sandbox child reads it after setup (the byte is there
  already) and closes it; when every copy of the pipe's read end is closed,
  setup is over.
- rlimits: with limits, `--seccomp` reads from a pipe the parent has not
  written yet, so bwrap waits right after setup; the parent applies the
  plan's rlimits to the child with prlimit(2) (so they bind the command and
  its reaper, nothing of the setup, as in the native backend), then writes
  the program.
- signals: bwrap passes on the dispositions and mask it starts with, so where
  the plan resets them it is started through `sandbox-init
  --exec-default-signals` (Popen itself resets only SIGPIPE and SIGXFSZ).
- environment: bwrap starts with an empty one (`BWRAP_ENVIRONMENT`), so
  nothing of the caller's is readable inside through /proc/1/environ.
- destinations inside bound host trees are checked, and the writes there
  done, before bwrap starts; the mounts bwrap makes there are verified after
  setup (dests.py).
- exec: the command's process (the child, or its first child under bwrap's
  pid-1 reaper) is watched until its /proc cmdline is no longer bwrap's. If
  bwrap exits first without an exit-code record, setup or exec failed, and
  bwrap's message says which.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import cgroups
from ...bwrap.argv import BwrapArgv, data_fd
from ...errors import SetupError, UnavailableError, signal_name
from ...plan import Plan
from ...seccomp.bpf import ALLOW_ALL
from ..handle import ProcessHandle
from ..walls import walls_for
from . import dests
from .messages import _Diagnose, _error_from, _StderrTap, decode_exit_code
from .outside import _isolate, _Isolated
from .procfs import _close, _first_child, _kill_orphans, _read, _readable, _std
from .render import handed_fds, render_plan

MAX_POLL_S = 0.002
# bwrap's own environment. The kernel keeps the environment a program was
# exec'd with in its memory (/proc/PID/environ reads it, whatever setenv or
# clearenv did later), and bwrap's sandbox child is the sandbox's pid 1: so
# bwrap gets none of the caller's. The command's environment is the plan's,
# set with --clearenv/--setenv.
BWRAP_ENVIRONMENT: dict[str, str] = {}
SIGNAL_RESETTER = Path(__file__).resolve().parents[2] / "_bin" / "sandbox-init"
ENTER_FAILED = 124  # sandbox-init --enter-cgroups: a cgroup could not be entered


@dataclass
class _Pipes:
    """The pipes between the parent and bwrap: status (bwrap writes JSON),
    block (setup is over when its read ends are all closed) and, with rlimits,
    seccomp (bwrap blocks reading it right after setup)."""

    status_r: int
    status_w: int
    block_r: int
    block_w: int
    seccomp_r: int = -1
    seccomp_w: int = -1

    @classmethod
    def make(cls, barrier: bool) -> _Pipes:
        fds: list[int] = []
        try:
            for _ in range(3 if barrier else 2):
                fds += os.pipe2(os.O_CLOEXEC)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return cls(*fds)

    def child_started(self) -> None:
        """bwrap holds its ends now: close ours."""
        for name in ("status_w", "block_r", "seccomp_r"):
            self.close_one(name)

    def close_one(self, name: str) -> None:
        _close(getattr(self, name))
        setattr(self, name, -1)

    def close(self) -> None:
        for name in ("status_r", "status_w", "block_r", "block_w", "seccomp_r", "seccomp_w"):
            self.close_one(name)


@dataclass
class _Status:
    """The JSON status records bwrap writes, read as they come."""

    fd: int
    buffer: bytes = b""
    eof: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)

    def read_available(self) -> None:
        """Read what is there without blocking."""
        while not self.eof and _readable([self.fd], 0):
            self._read_once()

    def read_until(self, key: str, pidfd: int) -> bool:
        """Block until a record with `key` arrives (True) or bwrap exits (False)."""
        while self.find(key) is None:
            if self.eof:
                return False
            ready = _readable([self.fd, pidfd], None)
            if self.fd in ready:
                self._read_once()
            elif pidfd in ready:
                self.read_available()
                return self.find(key) is not None
        return True

    def _read_once(self) -> None:
        chunk = os.read(self.fd, 4096)
        if not chunk:
            self.eof = True
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if line.strip():
                self.records.append(_json_record(line))

    def find(self, key: str) -> Any:
        """The value of `key` in the records so far, or None."""
        for rec in self.records:
            if key in rec:
                return rec[key]
        return None


def _json_record(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Run:
    """One bwrap invocation, from rendering to "the command was exec'd"."""

    def __init__(self, bwrap: str, plan: Plan, argv: list[str]) -> None:
        self.bwrap, self.plan, self.argv = bwrap, plan, argv
        self.t0 = time.monotonic()
        self.timings: dict[str, float] = {}
        self.isolated: _Isolated | None = None
        self.guard = dests.Guard()
        self.command_pid = -1
        self.child_pid: int | None = None
        # a pidfd of bwrap's child (the sandbox's first process inside), opened while it waits on our block
        # pipe, so the pid cannot have been reused; the handle owns it once the command runs
        self.child_pidfd = -1
        self.walls = cgroups.Walls(None, "rlimit")

    def _stamp(self, name: str) -> None:
        self.timings[name] = (time.monotonic() - self.t0) * 1e6

    def start(self, stdio: tuple[int, int, int], pass_fds: tuple[int, ...]) -> ProcessHandle:
        plan = self.plan
        # destinations inside bound trees: checked, and the writes there done, before bwrap runs
        self.guard = dests.prepare(plan)
        # bwrap is started in it (sandbox-init --enter-cgroups): its monitor, outside the sandbox, counts there too
        self.walls = walls_for(plan, "bwrap", outside_tasks=1)
        try:
            return self._start(stdio, pass_fds)
        except BaseException:
            if self.walls.cgroup is not None:
                self.walls.cgroup.close_fds()
            self.walls.remove()  # bwrap has been reaped: whatever it left inside is killed
            raise

    def _start(self, stdio: tuple[int, int, int], pass_fds: tuple[int, ...]) -> ProcessHandle:
        plan = self.plan
        tap = _StderrTap(stdio[2])
        # a pause after setup, before exec: bwrap waits there for its seccomp program
        try:
            pipes = _Pipes.make(barrier=bool(plan.rlimits or plan.forward or plan.check_network or plan.probe_paths
                                             or self.guard.verify or dests.fd_sources(plan)))
        except OSError as exc:  # the native core's SBX_STEP_PIPE
            raise SetupError(f"Can't set up the sandbox (pipe): {exc.strerror}", step="pipe", errno=exc.errno or 0,
                             backend="bwrap") from exc
        try:
            with render_plan(plan, pipes.seccomp_r if pipes.seccomp_r >= 0 else None, self.guard.done) as opts:
                try:
                    popen = self._spawn(opts, pipes, stdio, pass_fds)
                except OSError as exc:  # bwrap itself could not be started (fork, stdio, exec)
                    raise SetupError(f"Can't start bwrap ({self.bwrap}): {exc.strerror}", step="exec_init",
                                     path=exc.filename, errno=exc.errno or 0, backend="bwrap") from exc
            pipes.child_started()
            return self._follow(popen, pipes, tap)
        except BaseException:
            pipes.close()
            raise

    def _spawn(self, opts: BwrapArgv, pipes: _Pipes, stdio: tuple[int, int, int],
               pass_fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
        opts = BwrapArgv([*opts, "--json-status-fd", str(pipes.status_w), "--block-fd", str(pipes.block_r)],
                         opts.fds)
        args_fd = data_fd(b"".join(os.fsencode(a) + b"\0" for a in opts))
        try:
            bwrap = self.bwrap if "/" in self.bwrap else shutil.which(self.bwrap) or self.bwrap
            self.command_line = [bwrap, "--args", str(args_fd), "--", *self.argv]
            keep = ({fd for fd in pass_fds if fd > 2} | {args_fd, pipes.status_w, pipes.block_r, *opts.fds}
                    | set(handed_fds(self.plan)))
            if pipes.seccomp_r >= 0:
                keep.add(pipes.seccomp_r)
            cgroup = self.walls.cgroup
            keep |= set(cgroup.procs_fds if cgroup is not None else ())
            popen = subprocess.Popen(
                self._exec_line(), stdin=_std(stdio[0]), stdout=_std(stdio[1]), stderr=_std(stdio[2]),
                pass_fds=sorted(keep), close_fds=True, start_new_session=False,
                restore_signals=self.plan.reset_signals, env=BWRAP_ENVIRONMENT)
        finally:
            os.close(args_fd)
            if self.walls.cgroup is not None:
                self.walls.cgroup.close_fds()  # bwrap's first process has written them, or never will
        self._stamp("spawned")
        return popen

    def _exec_line(self) -> list[str]:
        """What Popen runs. bwrap passes on the dispositions and mask it starts
        with, and Popen resets only SIGPIPE and SIGXFSZ: where the plan resets
        signals, bwrap is started through sandbox-init, which resets them all.
        With a cgroup, sandbox-init first writes itself into it, so bwrap and
        every process of the sandbox are born inside: a process moving itself
        takes no global lock on cgroup v1, where moving bwrap's child by its
        pid waited for an RCU grace period (+6 ms per sandbox under load)."""
        line = ["--exec-default-signals", *self.command_line] if self.plan.reset_signals else self.command_line
        cgroup = self.walls.cgroup
        if cgroup is not None and cgroup.procs_fds:
            line = ["--enter-cgroups", ",".join(map(str, cgroup.procs_fds)), *line]
        if line is self.command_line:
            return line
        if not os.access(SIGNAL_RESETTER, os.X_OK):
            raise UnavailableError(f"sandbox-init is missing at {SIGNAL_RESETTER}; reinstall the package")
        return [str(SIGNAL_RESETTER), *line]

    def _follow(self, popen: subprocess.Popen[bytes], pipes: _Pipes, tap: _StderrTap) -> ProcessHandle:
        """Drive bwrap to the exec of the command; raise if it fails first.
        Whatever interrupts this (even KeyboardInterrupt) kills bwrap first."""
        status = _Status(pipes.status_r)
        pidfd = os.pidfd_open(popen.pid)
        try:
            if self._drive(popen, pipes, status, pidfd):
                return self._started(popen, pipes, status)
            self._wait_exit(popen.pid)
            status.read_available()
            if status.find("exit-code") is not None:  # ran and ended already
                return self._started(popen, pipes, status)
            popen.wait()
            self._kill_orphans()
            if popen.returncode == ENTER_FAILED and self.walls.cgroup is not None and self.child_pid is None:
                raise SetupError("Can't move the sandbox into its cgroup (sandbox-init could not write its entry "
                                 "files)", step="cgroup", backend="bwrap")
            raise self._failure(tap, setup_done="ready" in self.timings, returncode=popen.returncode)
        except BaseException:
            if popen.returncode is None:
                popen.kill()
                popen.wait()
                self._kill_orphans()
            if self.isolated is not None:  # no handle took its relay: stop it here
                self.isolated.close()
                self.isolated = None
            raise
        finally:
            os.close(pidfd)
            _close(self.child_pidfd)  # -1 once the handle took it
            self.child_pidfd = -1

    def _kill_orphans(self) -> None:
        """After bwrap is gone without running the command: kill what it left
        (see procfs._kill_orphans)."""
        _kill_orphans(b"".join(os.fsencode(a) + b"\0" for a in self.command_line))

    def _drive(self, popen: subprocess.Popen[bytes], pipes: _Pipes, status: _Status, pidfd: int) -> bool:
        """True once the command is seen exec'd; False if bwrap exits first."""
        if not status.read_until("child-pid", pidfd):
            return False
        child = int(status.find("child-pid"))
        self.child_pid = child
        self.child_pidfd = _pidfd(child)
        self._stamp("child")
        if not self._sync_started(child, pidfd):
            return False
        try:
            os.write(pipes.block_w, b"x")
        except BrokenPipeError:
            return False
        if self._wait_setup(pipes.block_w, pidfd):
            self._stamp("ready")
            self._resume_after_setup(popen, child, pipes)
        if not self._wait_exec(child, pidfd):
            return False
        self._stamp("exec")
        return True

    def _sync_started(self, child: int, pidfd: int) -> bool:
        """The plan's sync: report the sandbox's pid on started_fd; then wait
        on block_fd as bwrap would (its own block fd is ours, which setup
        reads before the exec: it gets its byte once the caller's came).
        False if bwrap exits meanwhile."""
        sync = self.plan.sync
        if sync.started_fd >= 0:
            with contextlib.suppress(BrokenPipeError):
                os.write(sync.started_fd, f"{child}\n".encode())
        if sync.block_fd < 0:
            return True
        if pidfd in _readable([sync.block_fd, pidfd], None) and not _readable([sync.block_fd], 0):
            return False
        with contextlib.suppress(OSError):
            os.read(sync.block_fd, 1)  # one byte or EOF, as bwrap reads it
        return True

    def _resume_after_setup(self, popen: subprocess.Popen[bytes], child: int, pipes: _Pipes) -> None:
        """Setup is over; with rlimits bwrap now waits for its seccomp program:
        set the limits on it, then hand the program over."""
        if pipes.seccomp_w < 0:
            return
        self._verify_mounts(popen, child)
        self.isolated = _isolate(self.plan, popen, child)
        if self._apply_rlimits(popen, child):
            try:
                os.write(pipes.seccomp_w, self.plan.seccomp or ALLOW_ALL)
            except BrokenPipeError:
                pass  # bwrap died; the caller finds out how
        pipes.close_one("seccomp_w")

    def _started(self, popen: subprocess.Popen[bytes], pipes: _Pipes, status: _Status) -> ProcessHandle:
        _close(pipes.block_w)
        pipes.block_w = -1
        pipes.status_r = -1  # owned by the decoder from now on
        isolated = self.isolated
        timings = {"start": 0.0, **self.timings}
        decoder = _Decoder(popen, status, self.command_pid)
        handle = _BwrapHandle(popen.pid, decoder, timings, isolation=isolated.findings if isolated else {},
                              on_exit=isolated.close if isolated else None, sandbox_pid=self.child_pid,
                              walls=self.walls, first_pidfd=self.child_pidfd)
        self.child_pidfd = -1  # the handle's now
        return handle

    # ------------------------------------------------------------ steps

    def _verify_mounts(self, popen: subprocess.Popen[bytes], child: int) -> None:
        """The mounts below bound trees are where the plan put them; else kill bwrap and raise."""
        try:
            dests.verify(self.guard, child)
            dests.verify_fd_sources(self.plan, child)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)  # first: it must not go on to read a closed seccomp pipe
            popen.kill()
            popen.wait()
            raise

    def _apply_rlimits(self, popen: subprocess.Popen[bytes], child: int) -> bool:
        """Set the plan's rlimits on bwrap's sandbox child, as they are (False if it is gone)."""
        for res, value in self.plan.rlimits:
            try:
                resource.prlimit(child, res, (value, value))
            except ProcessLookupError:
                return False
            except OSError as exc:
                popen.kill()
                popen.wait()
                raise SetupError(f"Can't set resource limit {res}: {exc.strerror}", step="rlimit",
                                 errno=exc.errno or 0, backend="bwrap") from None
        return True

    @staticmethod
    def _wait_setup(block_w: int, pidfd: int) -> bool:
        """Wait until every read end of the block pipe is closed (setup done, or bwrap died)."""
        poller = select.poll()
        poller.register(block_w, 0)
        poller.register(pidfd, select.POLLIN)
        while True:
            for fd, _ev in poller.poll():
                if fd == block_w:
                    return True
                if fd == pidfd:
                    return False

    def _wait_exec(self, child: int, pidfd: int) -> bool:
        """Poll the command's process until it is no longer bwrap (True) or bwrap exits (False)."""
        mine = b"".join(os.fsencode(a) + b"\0" for a in self.command_line)
        reaper = self.plan.pid_ns and self.plan.reaper
        delay = 0.00005
        while True:
            pid = _first_child(child) if reaper else child
            if pid is not None:
                cmdline = _read(f"/proc/{pid}/cmdline")
                if cmdline and cmdline != mine:
                    self.command_pid = pid
                    return True
            if _readable([pidfd], 0):
                return False
            time.sleep(delay)  # sub-millisecond: poll(2) counts in milliseconds
            delay = min(delay * 2, MAX_POLL_S)

    @staticmethod
    def _wait_exit(pid: int) -> None:
        """Wait for bwrap to exit, leaving it to be reaped."""
        while True:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                return
            except ChildProcessError:
                return
            except InterruptedError:
                continue

    def _failure(self, tap: _StderrTap, setup_done: bool, returncode: int) -> Exception:
        """The exception for a bwrap that exited without running the command."""
        message = tap.read()
        if message is None:
            message = _Diagnose(self.bwrap, self.plan, self.argv, setup_done, self.guard.done).message()
        error = _error_from(message, self.plan, self.argv, setup_done)
        signum = -decode_exit_code(returncode)  # bwrap exits 128+N when a signal N ended its child
        if isinstance(error, SetupError) and error.step == "setup" and signum > 0:
            return SetupError(f"the sandbox's setup process was killed by {signal_name(signum)} before the "
                              f"command ran ({message})", step="crashed", backend="bwrap")
        return error


class _Decoder:
    """bwrap's wait status to the command's returncode: bwrap's JSON exit-code
    record when there is one (an ExitSource of sandbox.backends)."""

    def __init__(self, popen: subprocess.Popen[bytes], status: _Status, command_pid: int) -> None:
        self.popen = popen  # kept so subprocess never reaps bwrap behind SandboxProcess's back
        self.status = status
        self.command = _pidfd(command_pid)

    def signal(self, sig: int) -> None:
        """Send `sig` to the command itself: bwrap passes no signal on (its
        monitor would die of a SIGTERM and leave the command running, as
        real bwrap does). SIGKILL also goes to bwrap, which ends the rest.
        A pidfd, so a pid reused after the command has gone is never hit."""
        if self.command >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.command, sig)
        if sig == signal.SIGKILL or self.command < 0:
            os.kill(self.popen.pid, sig)

    def returncode(self, raw_status: int) -> int:
        """The command's returncode, -N if signal N killed it."""
        code = os.waitstatus_to_exitcode(raw_status)
        self.status.read_available()
        exit_code = self.status.find("exit-code")
        self.close()
        self.popen.returncode = code  # reaped by SandboxProcess
        if os.WIFSIGNALED(raw_status) or exit_code is None:
            return code
        return decode_exit_code(int(exit_code))

    def close(self) -> None:
        """Close the status pipe and the command's pidfd (idempotent)."""
        _close(self.status.fd)
        self.status.fd = -1
        self.status.eof = True
        _close(self.command)
        self.command = -1

    def __del__(self) -> None:
        if self.status.fd >= 0 or self.command >= 0:
            self.close()


class _BwrapHandle(ProcessHandle):
    """The handle of a bwrap sandbox: `pid` is bwrap (our child, whose exit
    ends the sandbox); signals go to the command itself (_Decoder.signal).
    bwrap's child, the sandbox's init, is its `first_pidfd`: it outlives the
    command while anything else runs in the sandbox, and would die only of
    its parent-death signal (never without --die-with-parent)."""

    exit: _Decoder
    # bwrap's monitor exits with the command's status, not after reaping its child (the sandbox's pid 1):
    # its rusage is bwrap's own, not the sandbox's
    counts_rusage = False

    def signal(self, sig: int) -> None:
        """Pass `sig` on to the command (bwrap passes none on itself); SIGKILL
        also reaches every process of the sandbox's cgroup, if it has one, and
        the sandbox's first process."""
        if sig == signal.SIGKILL and self.walls is not None:
            self.walls.kill()
        self.exit.signal(sig)
        if sig == signal.SIGKILL:
            self.end_first()


def _pidfd(pid: int) -> int:
    """A pidfd for `pid`, or -1 (no pid, or it has exited and been reaped)."""
    if pid <= 0:
        return -1
    try:
        return os.pidfd_open(pid)
    except OSError:
        return -1
