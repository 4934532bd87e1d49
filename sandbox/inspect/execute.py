"""One `exec` of Inspect's contract over a Session: stdin fed, each output stream capped, a timeout.

The command starts with `Session.astart` and the event loop feeds its stdin
and drains its stdout and stderr (no thread). Each stream keeps at most
Inspect's `SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE` bytes
(`INSPECT_SANDBOX_MAX_EXEC_OUTPUT_SIZE`, 10 MiB by default): past it the
command's whole process tree is killed and `OutputLimitExceededError` raised,
carrying what was read (the contract allows this or keeping the tail; raising
keeps a runaway command from filling memory). A timeout kills the tree and
raises `TimeoutError`; so does cancelling the awaiting task, which then goes on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import IO, Any

from inspect_ai.util import ExecResult, OutputLimitExceededError, SandboxEnvironmentLimits

from ..aio import readable
from ..process import DEVNULL, PIPE
from ..session import AsyncProcess, Session

CHUNK = 65536


class _Overflow(Exception):
    """A stream passed the limit: which one, and what was read of both."""


async def start(session: Session, argv: Sequence[str], *, stdin: bool, cwd: str | None,
                env: Mapping[str, str] | None, user: Mapping[str, str]) -> AsyncProcess:
    """`Session.astart` with stdout and stderr piped, stdin piped or /dev/null, and the
    users.user_option keyword (typed loosely: Session.astart takes `user` only once it can)."""
    astart: Any = session.astart
    proc: AsyncProcess = await astart(argv, stdin=PIPE if stdin else DEVNULL, stdout=PIPE, stderr=PIPE, cwd=cwd,
                                      env=env, **user)
    return proc


async def run(session: Session, argv: Sequence[str], *, input: bytes | None, cwd: str | None,
              env: Mapping[str, str] | None, timeout: float | None, user: Mapping[str, str]) -> ExecResult[str]:
    """Run `argv` in `session` and wait: Inspect's ExecResult (output decoded as UTF-8, errors replaced)."""
    limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
    proc = await start(session, argv, stdin=input is not None, cwd=cwd, env=env, user=user)
    out = bytearray()
    err = bytearray()
    try:
        async with asyncio.timeout(timeout):
            await asyncio.gather(_feed(proc.stdin, input), _drain(proc.stdout, out, limit),
                                 _drain(proc.stderr, err, limit))
            code = await proc.wait()
    except TimeoutError:
        await _end(proc)
        raise TimeoutError(f"the command {list(argv)[:1]} timed out after {timeout} s: its processes were "
                           "killed") from None
    except _Overflow:
        await _end(proc)
        raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                                       _text(out) + _text(err)) from None
    except BaseException:
        proc.kill()
        raise
    finally:
        _close(proc)
    return ExecResult(success=code == 0, returncode=_exit_status(code), stdout=_text(out), stderr=_text(err))


def wake(future: asyncio.Future[None]) -> None:
    """Resolve `future` once (a loop's reader or writer callback)."""
    if not future.done():
        future.set_result(None)


def _exit_status(code: int) -> int:
    """A signal's end as a shell reports it (128 + N), as `docker exec` does."""
    return 128 - code if code < 0 else code


def _text(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", errors="replace")


async def _end(proc: AsyncProcess) -> None:
    """Kill the command's tree and reap it, whatever cancels us meanwhile."""
    proc.kill()
    await asyncio.shield(proc.wait())


def _close(proc: AsyncProcess) -> None:
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None and not f.closed:
            f.close()


async def _feed(f: IO[bytes] | None, data: bytes | None) -> None:
    if f is None:
        return
    fd = f.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data or b"")
    loop = asyncio.get_running_loop()
    try:
        while view:
            try:
                view = view[os.write(fd, view[:CHUNK]):]
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(fd, wake, ready)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)
            except BrokenPipeError:
                break
    finally:
        f.close()


async def _drain(f: IO[bytes] | None, into: bytearray, limit: int) -> None:
    if f is None:
        return
    fd = f.fileno()
    os.set_blocking(fd, False)
    while True:
        try:
            block = os.read(fd, CHUNK)
        except BlockingIOError:
            await readable(fd)
            continue
        if not block:
            return
        into += block
        if len(into) > limit:
            del into[limit:]
            raise _Overflow
