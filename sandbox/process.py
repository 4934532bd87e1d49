"""SandboxProcess and CompletedProcess: a subprocess-shaped handle on a running sandbox."""

from __future__ import annotations

import os
import select
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from .backends.contract import Launched
from .cgroups import Usage
from .reaper import reap_later

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


def _readable(fds: int | list[int], timeout: float | None) -> bool:
    """Whether `fds` (one or several: a pidfd is readable once its process
    has exited) has a readable one within `timeout` seconds (None: wait as
    long as it takes)."""
    poller = select.poll()
    for fd in [fds] if isinstance(fds, int) else fds:
        poller.register(fd, select.POLLIN)
    ms = None if timeout is None else max(0, int(timeout * 1000 + 0.999))
    return bool(poller.poll(ms))


class CompletedProcess(subprocess.CompletedProcess[Any]):
    """subprocess.CompletedProcess plus which backend ran and setup timings (µs),
    the sandbox's resource `usage` (sandbox.cgroups.Usage, or None) and
    `killed_by`: the limit that ended it ("memory", "pids", "cpu",
    "timeout") or None."""

    def __init__(self, args: Any, returncode: int, stdout: Any = None, stderr: Any = None, *,
                 backend: str = "native", backend_reason: str = "", timings: dict[str, float] | None = None,
                 network: str = "none", isolation: dict[str, Any] | None = None, usage: Usage | None = None,
                 killed_by: str | None = None) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.usage = usage
        self.killed_by = killed_by
        self.backend = backend
        self.backend_reason = backend_reason
        self.timings = timings or {}
        self.network = network  # the network namespace it ran in: "none" (its own), "pool" (leased) or "host"
        self.isolation = isolation or {}  # what the isolation checks established


class SandboxProcess:
    """A running sandbox, shaped like subprocess.Popen.

    `pid` is the host pid of the sandbox's first process (its pid 1, the
    reaper, when there is a pid namespace). `kill()` ends every process of the
    sandbox; `returncode` is the command's exit code, or -N if signal N killed it.
    Once it has ended, `usage` is what its mechanism counted (cpu_s,
    memory_peak_mb, pids_peak; sandbox.cgroups.Usage, None where the executor
    tells nothing) and `killed_by` which limit ended it ("memory", "pids",
    "cpu", "timeout") or None.
    """

    def __init__(self, args: list[str], launched: Launched, *, backend: str, backend_reason: str = "",
                 network: str = "none", pipes: tuple[IO[bytes] | None, IO[bytes] | None, IO[bytes] | None] = (
                     None, None, None)) -> None:
        self.args = args
        self.pid = launched.pid
        self.backend = backend
        self.backend_reason = backend_reason
        self.timings = launched.timings
        self.stdin, self.stdout, self.stderr = pipes
        self.returncode: int | None = None
        self._exit = launched.exit
        self._on_exit = launched.on_exit
        self._pidfd = launched.pidfd  # -1: the first process is our child (waitpid); else poll this pidfd
        self._ended_fd = launched.ended_fd  # readable once the status is in (launched.exit is an EarlyStatus)
        self._signal = launched.signal
        # the host pid of the sandbox's first process, inside its namespaces
        self.sandbox_pid = launched.sandbox_pid if launched.sandbox_pid is not None else launched.pid
        self.network = network  # the network namespace it ran in: "none" (its own), "pool" (leased) or "host"
        self.isolation = launched.isolation
        self._walls = launched.walls
        self.usage: Usage | None = None
        self.killed_by: str | None = None
        self._after_reap: Callable[[], None] | None = None
        self._caller_end: str | None = None  # "timeout" or "kill": the caller ended it, not a limit
        self._lock = threading.Lock()

    # ------------------------------------------------------------ status

    def _finish(self, status: int) -> None:
        """Record the exit of the first process (lock held)."""
        self.returncode = self._exit.returncode(status)
        if self._walls is not None:
            self.usage, self.killed_by = self._walls.finish(self.returncode, self._caller_end)
        elif self._caller_end == "timeout":
            self.killed_by = "timeout"
        self._ended_fd = -1  # the exit source held it, and has closed it
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        if self._on_exit is not None:  # e.g. give a leased network namespace back
            hook, self._on_exit = self._on_exit, None
            hook()

    def _reap(self) -> tuple[int, int]:
        """(pid, status) of the first process if it has ended, else (0, 0).
        With an early status (`ended_fd`), the sandbox has ended once that
        status is in (every other process is gone then; the exit source has
        it, and a SIGKILL status stands in here): the first process, still
        exiting, is reaped in the background if it is our child. Not our
        child (a pidfd): it has ended once the pidfd is readable."""
        if self._ended_fd >= 0 and _readable(self._ended_fd, 0):
            if self._exit.arrived():  # type: ignore[attr-defined]
                if self._pidfd < 0:
                    # reaped in the background; its cgroup goes after that (and after _finish reads it)
                    pid, walls = self.pid, self._walls
                    self._after_reap = lambda: reap_later(pid, walls.remove if walls is not None else None)
                return self.pid, signal.SIGKILL
            self._ended_fd = -1  # gone without a word (killed): wait for the process itself
        if self._pidfd >= 0:
            return (self.pid, signal.SIGKILL) if _readable(self._pidfd, 0) else (0, 0)
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 255 << 8
        if pid and self._walls is not None:
            self._after_reap = self._walls.remove  # the first process is reaped: its cgroup can go
        return pid, status

    def poll(self) -> int | None:
        """The return code if the sandbox has ended, else None."""
        with self._lock:
            if self.returncode is None:
                pid, status = self._reap()
                if pid:
                    self._finish(status)
                    after, self._after_reap = self._after_reap, None
                    if after is not None:
                        after()
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the sandbox to end; raise subprocess.TimeoutExpired after `timeout` seconds.

        No lock is held while blocking, but one is for a moment between
        waits, and a Python signal handler runs in the main thread between
        bytecodes: a handler must not call send_signal() or kill() itself
        (it could wait for its own thread's lock forever); it queues the
        signal for another thread, as sandbox.task's launcher does.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self._wait_ready(remaining):
                raise subprocess.TimeoutExpired(self.args, timeout or 0)  # only a timeout ends a wait unready
            self.poll()  # may still be running: its status socket said only that its reaper has gone
        return self.returncode

    def _wait_ready(self, timeout: float | None) -> bool:
        """Block until the first process has exited (a pidfd becomes
        readable) or its status is in (`ended_fd`); False after `timeout`."""
        with self._lock:
            own = self._pidfd >= 0
            try:
                fds = [os.dup(self._pidfd) if own else os.pidfd_open(self.pid)]
                if self._ended_fd >= 0:
                    fds.append(os.dup(self._ended_fd))
            except (ProcessLookupError, OSError):
                return True  # gone already (or not ours to wait for): poll() says
        try:
            return _readable(fds, timeout)
        finally:
            for fd in fds:
                os.close(fd)

    # ------------------------------------------------------------ signals

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the sandbox (its reaper forwards it to the command).
        SIGKILL also reaches every process of its cgroup, if it has one."""
        with self._lock:
            if self.returncode is None:
                if sig == signal.SIGKILL:
                    self._caller_end = self._caller_end or "kill"
                    if self._walls is not None:
                        self._walls.kill()
                try:
                    if self._signal is not None:
                        self._signal(sig)
                    elif self._pidfd >= 0:
                        signal.pidfd_send_signal(self._pidfd, sig)
                    else:
                        os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass

    def terminate(self) -> None:
        """Ask the command to stop (SIGTERM)."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """End the whole sandbox now (SIGKILL to its pid 1: the kernel kills the rest)."""
        self.send_signal(signal.SIGKILL)

    def _timed_out(self) -> None:
        """The caller's timeout ends it: killed_by says "timeout"."""
        with self._lock:
            self._caller_end = "timeout"
        self.kill()

    # ------------------------------------------------------------ I/O

    def communicate(
        self, input: bytes | None = None, timeout: float | None = None
    ) -> tuple[bytes | None, bytes | None]:
        """Send `input`, read stdout/stderr to EOF, wait; like Popen.communicate."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = _pump(self, input, deadline, timeout)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(remaining)
        return out, err

    def _close_pipes(self) -> None:
        for f in (self.stdin, self.stdout, self.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.kill()
        if self.stdin is not None:
            try:
                self.stdin.close()
            except OSError:
                pass
        self.wait()
        self._close_pipes()

    def __del__(self) -> None:
        if getattr(self, "_pidfd", -1) >= 0:
            os.close(self._pidfd)
            self._pidfd = -1

    def __repr__(self) -> str:
        return f"<SandboxProcess pid={self.pid} backend={self.backend} returncode={self.returncode}>"


def _pump(proc: SandboxProcess, data: bytes | None, deadline: float | None,
          timeout: float | None) -> tuple[bytes | None, bytes | None]:
    """Write `data` to stdin and read stdout/stderr until EOF, with a deadline."""
    view = memoryview(data or b"")
    readers = {f: f.fileno() for f in (proc.stdout, proc.stderr) if f is not None}
    chunks: dict[int, list[bytes]] = {fd: [] for fd in readers.values()}
    with selectors.DefaultSelector() as sel:
        if proc.stdin is not None:
            if view:
                proc.stdin.flush()
                sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, proc.stdin)
            else:
                proc.stdin.close()
        for f, fd in readers.items():
            sel.register(fd, selectors.EVENT_READ, f)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                out, err = _collected(chunks, readers, proc)
                raise subprocess.TimeoutExpired(proc.args, timeout or 0, out, err)
            for key, _ in sel.select(left):
                if key.events & selectors.EVENT_WRITE:
                    view = _write_some(sel, key, view)
                    continue
                block = os.read(key.fd, 65536)
                if block:
                    chunks[key.fd].append(block)
                else:
                    sel.unregister(key.fd)
                    key.data.close()
    return _collected(chunks, readers, proc)


def _collected(chunks: dict[int, list[bytes]], readers: dict[Any, int],
               proc: SandboxProcess) -> tuple[bytes | None, bytes | None]:
    out = b"".join(chunks[readers[proc.stdout]]) if proc.stdout is not None else None
    err = b"".join(chunks[readers[proc.stderr]]) if proc.stderr is not None else None
    return out, err


def _write_some(sel: selectors.BaseSelector, key: selectors.SelectorKey, view: memoryview) -> memoryview:
    try:
        n = os.write(key.fd, view[:65536])
    except BrokenPipeError:
        n = len(view)
    view = view[n:]
    if not view:
        sel.unregister(key.fd)
        key.data.close()
    return view
