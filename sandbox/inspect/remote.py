"""exec_remote without Inspect's in-sandbox tool server: a Session command, streamed by the event loop.

Inspect's own exec_remote installs its `inspect-sandbox-tools` binary in
the sandbox and polls a JSON-RPC server there every few seconds. A Session
can do it directly: `Session.astart` starts the command in the sandbox and
returns once it runs; two reader tasks turn its stdout and stderr into
ExecStdout/ExecStderr events as they come (UTF-8, split characters joined),
then ExecCompleted with the exit status (128+N after signal N). The process
lives, whether or not anyone iterates, until it ends or `kill()` ends its
whole tree; cancelling a task iterating it kills it too. What is read and
not yet taken is bounded by Inspect's exec output limit (the oldest dropped).
"""

from __future__ import annotations

import asyncio
import codecs
import collections
from typing import IO

from inspect_ai.util import ExecCompleted, ExecRemoteProcess, ExecRemoteStreamingOptions, ExecStderr, ExecStdout
from inspect_ai.util import SandboxEnvironmentLimits as Limits
from inspect_ai.util._sandbox.exec_remote import ExecOutput, ExecRemoteCommonOptions

from ..aio import chunks, write_all
from ..session import AsyncProcess
from .execute import _exit_status


class SessionRemoteProcess(ExecRemoteProcess):
    """An ExecRemoteProcess over a Session's AsyncProcess (see the module docstring)."""

    def __init__(self, proc: AsyncProcess, cmd: list[str], options: ExecRemoteCommonOptions) -> None:
        # ExecRemoteProcess.__init__ sets up the JSON-RPC transport this class does not use
        self._cmd = cmd
        self._options = options
        self._proc = proc
        self._pid = proc.pid
        self._killed = False
        self._completed = False
        self._iteration_started = False
        self._pending_events: list[ExecOutput] = []
        self._events: collections.deque[ExecOutput] = collections.deque()
        self._buffered = 0
        self._ready = asyncio.Event()
        self._ended = False
        self._pump = asyncio.ensure_future(self._run())

    @property
    def pid(self) -> int:
        """The command's pid (the host's)."""
        return -1 if self._pid is None else self._pid

    async def start(self, data: str | bytes | None) -> None:
        """Write the initial input; close stdin unless `stdin_open` asked to keep it."""
        if data:
            await self._write(data.encode() if isinstance(data, str) else data)
        if not self._stdin_open():
            self._close_stdin()

    def _stdin_open(self) -> bool:
        return isinstance(self._options, ExecRemoteStreamingOptions) and self._options.stdin_open

    async def _run(self) -> None:
        try:
            await asyncio.gather(self._read(self._proc.stdout, ExecStdout), self._read(self._proc.stderr, ExecStderr))
            code = await self._proc.wait()
            if not self._killed:
                self._push(ExecCompleted(exit_code=_exit_status(code)), 0)
        finally:
            self._ended = True
            self._ready.set()
            self._close_stdin()

    async def _read(self, f: IO[bytes] | None, kind: type[ExecStdout] | type[ExecStderr]) -> None:
        if f is None:
            return
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            async for block in chunks(f.fileno()):
                self._push_text(kind, decoder.decode(block))
            self._push_text(kind, decoder.decode(b"", final=True))
        finally:
            f.close()

    def _push_text(self, kind: type[ExecStdout] | type[ExecStderr], text: str) -> None:
        if text:
            self._push(kind(data=text), len(text))

    def _push(self, event: ExecOutput, size: int) -> None:
        self._events.append(event)
        self._buffered += size
        while self._buffered > Limits.MAX_EXEC_OUTPUT_SIZE and len(self._events) > 1:
            dropped = self._events.popleft()
            self._buffered -= len(getattr(dropped, "data", ""))
        self._ready.set()

    def __aiter__(self) -> SessionRemoteProcess:
        """The process as its own single-use iterator of events."""
        if self._iteration_started:
            raise RuntimeError("ExecRemoteProcess can only be iterated once")
        self._iteration_started = True
        return self

    async def __anext__(self) -> ExecOutput:
        """The next event: output as it comes, then ExecCompleted (none after kill())."""
        try:
            while not self._events:
                if self._ended:
                    self._completed = not self._killed
                    raise StopAsyncIteration
                self._ready.clear()
                await self._ready.wait()
        except asyncio.CancelledError:
            await asyncio.shield(self.kill())
            raise
        event = self._events.popleft()
        self._buffered -= len(getattr(event, "data", ""))
        return event

    async def write_stdin(self, data: str | bytes) -> None:
        """Write to the command's stdin (needs stdin_open=True)."""
        if not self._stdin_open():
            raise RuntimeError("write_stdin() requires stdin_open=True in ExecRemoteStreamingOptions")
        if self._ended or self._killed:
            raise RuntimeError("Cannot write to stdin: process has terminated")
        await self._write(data.encode() if isinstance(data, str) else data)

    async def close_stdin(self) -> None:
        """Close the command's stdin (EOF); idempotent."""
        if not self._stdin_open():
            raise RuntimeError("close_stdin() requires stdin_open=True in ExecRemoteStreamingOptions")
        self._close_stdin()

    def _close_stdin(self) -> None:
        f = self._proc.stdin
        if f is not None and not f.closed:
            f.close()

    async def _write(self, data: bytes) -> None:
        f = self._proc.stdin
        if f is None or f.closed:
            raise RuntimeError("Cannot write to stdin: it is closed")
        try:
            await write_all(f.fileno(), data)
        except BrokenPipeError:
            raise RuntimeError("Cannot write to stdin: the process closed it") from None

    async def kill(self) -> None:
        """End the command's whole process tree; output not yet taken stays to iterate."""
        if self._ended or self._killed:
            return
        self._killed = True
        self._proc.kill()
        await self._pump
