"""asyncio for a Session: an awaited start, an AsyncProcess, and run().

No thread per call: the event loop waits on the call socket (STARTED, then
EXITED: csrc/session_call.c) and on the command's pipes with add_reader and
add_writer. Cancelling a task awaiting wait() or communicate() (or aexec)
ends the command's whole process tree before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable
from typing import IO

from ..api import Stdio, StdioArg, decoded, run_stdio
from ..output import OutputCap, OutputLimitError, limit_error
from ..process import CompletedProcess
from . import call


async def readable(fd: int) -> None:
    """Wait until `fd` is readable (the running loop's add_reader)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, _wake, done)
    try:
        await done
    finally:
        loop.remove_reader(fd)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def started(handle: call.Call, stdio: Stdio, max_output: int | None = None,
                  on_overflow: str = "tail") -> AsyncProcess:
    """The AsyncProcess once the command's first frame (STARTED) has come."""
    try:
        await readable(handle.fileno())
        handle.take_started()
    except BaseException:
        handle.close()
        stdio.abort()
        raise
    return AsyncProcess(handle.argv, handle, stdio.parent, max_output, on_overflow)


class AsyncProcess:
    """A command of a Session, for asyncio: `pid` (host), `returncode`,
    `stdin`/`stdout`/`stderr` (the caller's ends of PIPEs, as files),
    `killed_by` ("timeout", "output", "kill" or None) once it has ended.
    `max_output` and `on_overflow` cap what communicate() keeps of each
    stream, as a SandboxProcess's do (sandbox.output); after it,
    `stdout_dropped` and `stderr_dropped` say how many bytes it left out."""

    def __init__(self, args: list[str], handle: call.Call,
                 pipes: tuple[IO[bytes] | None, IO[bytes] | None, IO[bytes] | None],
                 max_output: int | None = None, on_overflow: str = "tail") -> None:
        self.args = args
        self.pid = handle.pid
        self.returncode: int | None = None
        self.killed_by: str | None = None
        self.stdin, self.stdout, self.stderr = pipes
        self.max_output, self.on_overflow = max_output, on_overflow
        self.stdout_dropped = self.stderr_dropped = 0
        self._handle = handle
        self._caller_end: str | None = None

    def send_signal(self, sig: int) -> None:
        """Pass `sig` to the command; SIGKILL ends its whole process tree."""
        if self.returncode is None:
            if sig == signal.SIGKILL:
                self._caller_end = self._caller_end or "kill"
            self._handle.signal(sig)

    def terminate(self) -> None:
        """SIGTERM to the command."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """End the command's whole process tree."""
        self.send_signal(signal.SIGKILL)

    async def wait(self) -> int:
        """Wait for the command's end: its returncode. Cancelled: the tree is killed."""
        try:
            while self.returncode is None:
                ended = self._handle.reap(self._caller_end)
                if ended is not None:
                    self.returncode, self.killed_by = ended.returncode, ended.killed_by
                    break
                await readable(self._handle.fileno())
        except asyncio.CancelledError:
            self.kill()
            raise
        return self.returncode

    async def communicate(self, input: bytes | None = None) -> tuple[bytes | None, bytes | None]:
        """Send `input`, read stdout and stderr to EOF, wait. Cancelled: the
        tree is killed. Keeps of each stream what the output cap says; under
        "kill" or "raise" the tree is killed at the cap (killed_by
        "output"), and "raise" then raises OutputLimitError with what was kept."""
        caps = [OutputCap(self.max_output, self.on_overflow) for _ in range(2)]
        try:
            _, out, err = await asyncio.gather(self._feed(input), self._drain(self.stdout, caps[0]),
                                               self._drain(self.stderr, caps[1]))
            await self.wait()
        except asyncio.CancelledError:
            self.kill()
            raise
        finally:
            for f in (self.stdin, self.stdout, self.stderr):
                if f is not None and not f.closed:
                    f.close()
        self.stdout_dropped, self.stderr_dropped = caps[0].dropped, caps[1].dropped
        if self._caller_end == "output" and self.on_overflow == "raise":
            raise limit_error(self, out, err)
        return out, err

    async def _feed(self, data: bytes | None) -> None:
        if self.stdin is None:
            return
        fd = self.stdin.fileno()
        view = memoryview(data or b"")
        os.set_blocking(fd, False)
        loop = asyncio.get_running_loop()
        try:
            while view:
                try:
                    view = view[os.write(fd, view[:65536]):]
                except BlockingIOError:
                    ready = loop.create_future()
                    loop.add_writer(fd, _wake, ready)
                    try:
                        await ready
                    finally:
                        loop.remove_writer(fd)
                except BrokenPipeError:
                    break
        finally:
            self.stdin.close()

    async def _drain(self, f: IO[bytes] | None, cap: OutputCap) -> bytes | None:
        if f is None:
            return None
        fd = f.fileno()
        os.set_blocking(fd, False)
        while True:
            try:
                block = os.read(fd, 65536)
            except BlockingIOError:
                await readable(fd)
                continue
            if not block:
                return cap.kept()
            if cap.feed(block):
                self._caller_end = "output"
                self._handle.signal(signal.SIGKILL)


async def run(start: Callable[[StdioArg, StdioArg, StdioArg], Awaitable[AsyncProcess]], *,
              input: bytes | str | None, capture_output: bool, timeout: float | None, check: bool, text: bool,
              stdin: StdioArg, stdout: StdioArg, stderr: StdioArg) -> CompletedProcess:
    """run()'s semantics, awaited, over `start(stdin, stdout, stderr)`."""
    stdin, stdout, stderr, data = run_stdio(input, capture_output, timeout, stdin, stdout, stderr)
    proc = await start(stdin, stdout, stderr)
    try:
        out, err = await asyncio.wait_for(proc.communicate(data), timeout)
    except TimeoutError:
        proc._caller_end = "timeout"
        proc.kill()
        await proc.wait()
        raise subprocess.TimeoutExpired(proc.args, timeout or 0) from None
    except OutputLimitError as exc:
        if text:
            exc.stdout = decoded(exc.stdout, exc.stdout_dropped)
            exc.stderr = decoded(exc.stderr, exc.stderr_dropped)
        raise
    rc = proc.returncode
    assert rc is not None
    result = CompletedProcess(proc.args, rc, decoded(out, proc.stdout_dropped) if text else out,
                              decoded(err, proc.stderr_dropped) if text else err, backend="session",
                              killed_by=proc.killed_by, stdout_dropped=proc.stdout_dropped,
                              stderr_dropped=proc.stderr_dropped)
    if check:
        result.check_returncode()
    return result
