"""SandboxProcess and CompletedProcess: a subprocess-shaped handle on a running sandbox."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import threading
import time
from contextlib import AbstractContextManager
from typing import IO, Any

from .backends.contract import Handle
from .backends.handle import readable_count
from .cgroups import Usage
from .output import OutputCap, limit_error

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
STDOUT = subprocess.STDOUT


class CompletedProcess(subprocess.CompletedProcess[Any]):
    """subprocess.CompletedProcess plus which backend ran and setup timings (µs),
    the sandbox's resource `usage` (sandbox.cgroups.Usage, or None),
    `killed_by`: the limit that ended it ("memory", "pids", "cpu",
    "timeout", "output") or None, and `stdout_dropped`/`stderr_dropped`:
    the bytes of each stream left out by the output cap (sandbox.output)."""

    def __init__(self, args: Any, returncode: int, stdout: Any = None, stderr: Any = None, *,
                 backend: str = "native", backend_reason: str = "", timings: dict[str, float] | None = None,
                 network: str = "none", isolation: dict[str, Any] | None = None, usage: Usage | None = None,
                 killed_by: str | None = None, stdout_dropped: int = 0, stderr_dropped: int = 0) -> None:
        super().__init__(args, returncode, stdout, stderr)
        self.usage = usage
        self.killed_by = killed_by
        self.stdout_dropped = stdout_dropped
        self.stderr_dropped = stderr_dropped
        self.backend = backend
        self.backend_reason = backend_reason
        self.timings = timings or {}
        self.network = network  # the network namespace it ran in: "none" (its own), "pool" (leased) or "host"
        self.isolation = isolation or {}  # what the isolation checks established


class HandleSignals:
    """Popen's send_signal, terminate and kill over a contract.Handle, once for
    every process class over one (SandboxProcess, aio.AsyncProcess): a SIGKILL
    the caller sends is remembered as its end ("kill", unless a timeout or the
    output cap ended it first), and nothing is sent once the sandbox has ended
    (its pid may be another process's by then). `_lock` serializes it with the
    reaping of the class that uses it."""

    returncode: int | None
    _caller_end: str | None
    _handle: Handle
    _lock: AbstractContextManager[object]

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the sandbox (its reaper forwards it to the command).
        SIGKILL ends every process of the sandbox."""
        with self._lock:
            if self.returncode is None:
                if sig == signal.SIGKILL:
                    self._caller_end = self._caller_end or "kill"
                self._handle.signal(sig)

    def terminate(self) -> None:
        """Ask the command to stop (SIGTERM)."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """End the whole sandbox now (SIGKILL to its pid 1: the kernel kills the rest)."""
        self.send_signal(signal.SIGKILL)


class SandboxProcess(HandleSignals):
    """A running sandbox, shaped like subprocess.Popen.

    `pid` is the host pid of the sandbox's first process (its pid 1, the
    reaper, when there is a pid namespace). `kill()` ends every process of the
    sandbox; `returncode` is the command's exit code, or -N if signal N killed it.
    Once it has ended, `usage` is what its mechanism counted (cpu_s,
    memory_peak_mb, pids_peak; sandbox.cgroups.Usage, None where the executor
    tells nothing) and `killed_by` which limit ended it ("memory", "pids",
    "cpu", "timeout", "output") or None.

    `max_output` and `on_overflow` cap what communicate() keeps of each
    stream (sandbox.output; None: no cap); after it, `stdout_dropped` and
    `stderr_dropped` say how many bytes it left out.
    """

    # class defaults, for a subclass that starts its process otherwise (a brokered one)
    max_output: int | None = None
    on_overflow = "tail"
    stdout_dropped = 0
    stderr_dropped = 0

    def __init__(self, args: list[str], handle: Handle, *, backend: str, backend_reason: str = "",
                 network: str = "none", pipes: tuple[IO[bytes] | None, IO[bytes] | None, IO[bytes] | None] = (
                     None, None, None), max_output: int | None = None, on_overflow: str = "tail") -> None:
        self.args = args
        self.pid = handle.pid
        self.backend = backend
        self.backend_reason = backend_reason
        self.timings = handle.timings
        self.stdin, self.stdout, self.stderr = pipes
        self.returncode: int | None = None
        self._handle = handle
        # the host pid of the sandbox's first process, inside its namespaces
        self.sandbox_pid = handle.sandbox_pid
        self.network = network  # the network namespace it ran in: "none" (its own), "pool" (leased) or "host"
        self.isolation = handle.isolation
        self.usage: Usage | None = None
        self.killed_by: str | None = None
        self._caller_end: str | None = None  # "timeout", "output" or "kill": the caller ended it
        self.max_output = max_output  # checked by the caller before the launch (output.check_cap)
        self.on_overflow = on_overflow
        self.stdout_dropped = self.stderr_dropped = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ status

    def poll(self) -> int | None:
        """The return code if the sandbox has ended, else None."""
        return self._reap(False)

    def _reap(self, woken: bool) -> int | None:
        """poll(), told whether the fds of the handle's last wait_fds() were all just seen readable."""
        with self._lock:
            if self.returncode is None:
                ended = self._handle.reap(self._caller_end, woken)
                if ended is not None:
                    self.usage, self.killed_by = ended.usage, ended.killed_by
                    self.returncode = ended.returncode
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
            woken = self._wait_ready(remaining)
            if woken is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)  # only a timeout ends a wait unready
            self._reap(woken)  # may still be running: its status socket said only that its reaper has gone
        return self.returncode

    def _wait_ready(self, timeout: float | None) -> bool | None:
        """Block until the handle may have news: whether every fd it gave to
        wait on is readable then (None after `timeout`)."""
        with self._lock:
            fds = self._handle.wait_fds() if self.returncode is None else []
        if not fds:
            return False  # nothing left to wait for: poll() says
        try:
            n = readable_count(fds, timeout)
        finally:
            for fd in fds:
                os.close(fd)
        return None if n == 0 else n == len(fds)

    def _timed_out(self) -> None:
        """The caller's timeout ends it: killed_by says "timeout"."""
        self._ended_by("timeout")

    def _ended_by(self, limit: str) -> None:
        """A limit the caller enforces ("timeout", "output") ends it: killed_by names it."""
        with self._lock:
            if self._caller_end is None or self._caller_end == "kill":
                self._caller_end = limit
        self.kill()

    # ------------------------------------------------------------ I/O

    def communicate(
        self, input: bytes | None = None, timeout: float | None = None
    ) -> tuple[bytes | None, bytes | None]:
        """Send `input`, read stdout/stderr to EOF, wait; like Popen.communicate.

        Keeps of each stream what the process's output cap says (`max_output`,
        `on_overflow`: sandbox.output) and sets `stdout_dropped` and
        `stderr_dropped`; under "kill" or "raise" the sandbox is killed at the
        cap (killed_by "output"), and "raise" then raises OutputLimitError
        carrying what was kept."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out, err = _pump(self, input, deadline, timeout)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        self.wait(remaining)
        if self._caller_end == "output" and self.on_overflow == "raise":
            raise limit_error(self, out, err)
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

    def __repr__(self) -> str:
        return f"<SandboxProcess pid={self.pid} backend={self.backend} returncode={self.returncode}>"


def _pump(proc: SandboxProcess, data: bytes | None, deadline: float | None,
          timeout: float | None) -> tuple[bytes | None, bytes | None]:
    """Write `data` to stdin and read stdout/stderr until EOF, with a
    deadline, keeping of each what the process's output cap allows. What a
    communicate() read before its TimeoutExpired is kept for the next one
    (as subprocess does): the caps live on the process."""
    view = memoryview(data or b"")
    caps: dict[Any, OutputCap] = proc.__dict__.setdefault(
        "_caps", {f: OutputCap(proc.max_output, proc.on_overflow)
                  for f in (proc.stdout, proc.stderr) if f is not None})
    with selectors.DefaultSelector() as sel:
        if proc.stdin is not None:
            if view:
                proc.stdin.flush()
                sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, proc.stdin)
            else:
                proc.stdin.close()
        for f in caps:
            if not f.closed:
                sel.register(f.fileno(), selectors.EVENT_READ, f)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                out, err = _collected(caps, proc)
                raise subprocess.TimeoutExpired(proc.args, timeout or 0, out, err)
            for key, _ in sel.select(left):
                if key.events & selectors.EVENT_WRITE:
                    view = _write_some(sel, key, view)
                    continue
                block = os.read(key.fd, 65536)
                if not block:
                    sel.unregister(key.fd)
                    key.data.close()
                elif caps[key.data].feed(block):
                    proc._ended_by("output")
    return _collected(caps, proc)


def _collected(caps: dict[Any, OutputCap], proc: SandboxProcess) -> tuple[bytes | None, bytes | None]:
    out_cap = caps.get(proc.stdout)
    err_cap = caps.get(proc.stderr)
    proc.stdout_dropped = out_cap.dropped if out_cap is not None else 0
    proc.stderr_dropped = err_cap.dropped if err_cap is not None else 0
    return (out_cap.kept() if out_cap is not None else None,
            err_cap.kept() if err_cap is not None else None)


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
