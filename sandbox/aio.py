"""asyncio for every sandbox: an AsyncProcess over any executor's Handle,
`aspawn` and `arun` for a fresh sandbox, and the awaited run() a Session's
`aexec` shares.

No thread per call: the event loop waits on the Handle's wait fds (a
native sandbox's pidfd and status socket, a Session call's socket) and on
the command's pipes with add_reader and add_writer. Cancelling a task
awaiting wait() or communicate() (or arun, aexec) ends the command's whole
sandbox or process tree before the cancellation goes on.

    proc = await sandbox.aspawn(["cat"], spec, stdin=sandbox.PIPE, stdout=sandbox.PIPE)
    out, _ = await proc.communicate(b"fed")
    done = await sandbox.arun(["true"], spec, timeout=10)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import IO

from .api import decoded, run_stdio, spawn
from .backends.contract import Handle
from .cgroups import Usage
from .output import DEFAULT_MAX_OUTPUT, OutputCap, OutputLimitError, check_cap, limit_error
from .process import CompletedProcess, HandleSignals
from .spec import Spec
from .stdio import StdioArg
from .sync import NO_SYNC, Sync

CHUNK = 65536  # bytes one read or write of a pipe moves, at most
REAP_AFTER_KILL = 5.0  # seconds a cancelled wait blocks, at most, for a killed sandbox to be reaped


async def readable(fd: int) -> None:
    """Wait until `fd` is readable (the running loop's add_reader)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(fd, _wake, done)
    try:
        await done
    finally:
        loop.remove_reader(fd)


async def chunks(fd: int) -> AsyncIterator[bytes]:
    """What the pipe `fd` (made non-blocking) gives, read by read as it comes, to EOF."""
    os.set_blocking(fd, False)
    while True:
        try:
            block = os.read(fd, CHUNK)
        except BlockingIOError:
            await readable(fd)
            continue
        if not block:
            return
        yield block


async def write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to the pipe `fd` (made non-blocking), waiting while it is full
    (the running loop's add_writer). BrokenPipeError: the reader closed its end."""
    os.set_blocking(fd, False)
    view = memoryview(data)
    loop = asyncio.get_running_loop()
    while view:
        try:
            view = view[os.write(fd, view[:CHUNK]):]
        except BlockingIOError:
            ready = loop.create_future()
            loop.add_writer(fd, _wake, ready)
            try:
                await ready
            finally:
                loop.remove_writer(fd)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _news(fds: list[int]) -> bool:
    """Wait until one of `fds` (a Handle's wait_fds: new fds, closed here) is
    readable; whether all of them are then (reap's `woken`). None to wait on:
    False at once (reap says how it ended)."""
    if not fds:
        return False
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    try:
        for fd in fds:
            loop.add_reader(fd, _wake, ready)
        await ready
        return len(select.select(fds, [], [], 0)[0]) == len(fds)
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)


class AsyncProcess(HandleSignals):
    """A sandboxed command, for asyncio (`aspawn`, `Session.astart`): `pid`
    (host), `returncode`, `stdin`/`stdout`/`stderr` (the caller's ends of
    PIPEs, as files), `backend` (what ran it), and once it has ended
    `killed_by` ("timeout", "output", "kill", a limit or None) and `usage`
    (where the executor counts it).
    `max_output` and `on_overflow` cap what communicate() keeps of each
    stream, as a SandboxProcess's do (sandbox.output); after it,
    `stdout_dropped` and `stderr_dropped` say how many bytes it left out."""

    def __init__(self, args: list[str], handle: Handle,
                 pipes: tuple[IO[bytes] | None, IO[bytes] | None, IO[bytes] | None],
                 max_output: int | None = None, on_overflow: str = "tail", backend: str = "session") -> None:
        self.args = args
        self.pid = handle.pid
        self.backend = backend
        self.returncode: int | None = None
        self.killed_by: str | None = None
        self.usage: Usage | None = None
        self.stdin, self.stdout, self.stderr = pipes
        self.max_output, self.on_overflow = max_output, on_overflow
        self.stdout_dropped = self.stderr_dropped = 0
        self._handle = handle
        self._caller_end: str | None = None
        self._lock = contextlib.nullcontext()  # one event loop reaps and signals it

    async def wait(self) -> int:
        """Wait for the command's end: its returncode. Cancelled: the tree is killed."""
        woken = False
        try:
            while self.returncode is None:
                ended = self._handle.reap(self._caller_end, woken)
                if ended is not None:
                    self.returncode, self.killed_by, self.usage = ended.returncode, ended.killed_by, ended.usage
                    break
                woken = await _news(self._handle.wait_fds())
        except asyncio.CancelledError:
            self._kill_and_reap()
            raise
        return self.returncode

    def _kill_and_reap(self) -> None:
        """Kill, then reap before a cancellation goes on: a killed sandbox goes in moments, and a task
        that waited for it later would itself be cancelled with the loop, leaving it unreaped."""
        self.kill()
        deadline = time.monotonic() + REAP_AFTER_KILL
        woken = False
        while self.returncode is None:
            ended = self._handle.reap(self._caller_end, woken)
            if ended is not None:
                self.returncode, self.killed_by, self.usage = ended.returncode, ended.killed_by, ended.usage
                return
            fds = self._handle.wait_fds()
            left = deadline - time.monotonic()
            if not fds or left <= 0:
                for fd in fds:
                    os.close(fd)
                return
            try:
                woken = len(select.select(fds, [], [], left)[0]) == len(fds)
            finally:
                for fd in fds:
                    os.close(fd)

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
            self._kill_and_reap()
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
        try:
            await write_all(self.stdin.fileno(), data or b"")
        except BrokenPipeError:
            pass  # the command closed its stdin: what it did not read is dropped, as subprocess does
        finally:
            self.stdin.close()

    async def _drain(self, f: IO[bytes] | None, cap: OutputCap) -> bytes | None:
        if f is None:
            return None
        async for block in chunks(f.fileno()):
            if cap.feed(block):
                self._caller_end = "output"
                self._handle.signal(signal.SIGKILL)
        return cap.kept()


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
                              decoded(err, proc.stderr_dropped) if text else err, backend=proc.backend,
                              killed_by=proc.killed_by, stdout_dropped=proc.stdout_dropped,
                              stderr_dropped=proc.stderr_dropped, usage=proc.usage)
    if check:
        result.check_returncode()
    return result


async def aspawn(argv: Sequence[str], spec: Spec, *, stdin: StdioArg = None, stdout: StdioArg = None,
                 stderr: StdioArg = None, pass_fds: Iterable[int] = (), backend: str = "auto",
                 cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
                 sync: Sync = NO_SYNC, max_output: int | None = None, on_overflow: str = "tail") -> AsyncProcess:
    """`sandbox.spawn`, for asyncio: the same arguments, the same sandbox, an
    AsyncProcess (await wait(), communicate()). The start itself takes the
    milliseconds spawn takes, in the calling thread; waiting takes none."""
    proc = spawn(argv, spec, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds, backend=backend,
                 cwd=cwd, env=env, sync=sync, max_output=max_output, on_overflow=on_overflow)
    return AsyncProcess(proc.args, proc._handle, (proc.stdin, proc.stdout, proc.stderr), max_output, on_overflow,
                        backend=proc.backend)


async def arun(argv: Sequence[str], spec: Spec, *, input: bytes | str | None = None, capture_output: bool = False,
               timeout: float | None = None, check: bool = False, text: bool = False, stdin: StdioArg = None,
               stdout: StdioArg = None, stderr: StdioArg = None, pass_fds: Iterable[int] = (),
               backend: str = "auto", cwd: str | os.PathLike[str] | None = None,
               env: Mapping[str, str] | None = None, max_output: int | None = DEFAULT_MAX_OUTPUT,
               on_overflow: str = "tail") -> CompletedProcess:
    """`sandbox.run`, awaited: the same arguments and result. A timeout kills
    the whole sandbox and raises subprocess.TimeoutExpired; cancelling the
    awaiting task kills it too."""
    check_cap(max_output, on_overflow)

    async def begin(i: StdioArg, o: StdioArg, e: StdioArg) -> AsyncProcess:
        return await aspawn(argv, spec, stdin=i, stdout=o, stderr=e, pass_fds=pass_fds, backend=backend, cwd=cwd,
                            env=env, max_output=max_output, on_overflow=on_overflow)

    return await run(begin, input=input, capture_output=capture_output, timeout=timeout, check=check, text=text,
                     stdin=stdin, stdout=stdout, stderr=stderr)
