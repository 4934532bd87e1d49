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
from collections.abc import Mapping, Sequence
from typing import Any

from inspect_ai.util import ExecResult, OutputLimitExceededError, SandboxEnvironmentLimits

from ..output import OutputLimitError
from ..process import DEVNULL, PIPE
from ..session import AsyncProcess, Session


async def start(session: Session, argv: Sequence[str], *, stdin: bool, cwd: str | None,
                env: Mapping[str, str] | None, user: Mapping[str, str], max_output: int | None = None) -> AsyncProcess:
    """`Session.astart` with stdout and stderr piped, stdin piped or /dev/null, and the
    users.user_option keyword (typed loosely: Session.astart takes `user` only once it can).
    With `max_output`, communicate() kills the tree past it and raises OutputLimitError."""
    astart: Any = session.astart
    proc: AsyncProcess = await astart(argv, stdin=PIPE if stdin else DEVNULL, stdout=PIPE, stderr=PIPE, cwd=cwd,
                                      env=env, max_output=max_output, on_overflow="raise", **user)
    return proc


async def run(session: Session, argv: Sequence[str], *, input: bytes | None, cwd: str | None,
              env: Mapping[str, str] | None, timeout: float | None, user: Mapping[str, str]) -> ExecResult[str]:
    """Run `argv` in `session` and wait: Inspect's ExecResult (output decoded as UTF-8, errors replaced).
    A timeout or a cancellation kills the tree and reaps it (AsyncProcess.communicate) before going on."""
    proc = await start(session, argv, stdin=input is not None, cwd=cwd, env=env, user=user,
                       max_output=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate(input)
    except TimeoutError:
        raise TimeoutError(f"the command {list(argv)[:1]} timed out after {timeout} s: its processes were "
                           "killed") from None
    except OutputLimitError as exc:
        raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
                                       _text(exc.stdout) + _text(exc.stderr)) from None
    code = proc.returncode
    assert code is not None
    return ExecResult(success=code == 0, returncode=_exit_status(code), stdout=_text(out), stderr=_text(err))


def _exit_status(code: int) -> int:
    """A signal's end as a shell reports it (128 + N), as `docker exec` does."""
    return 128 - code if code < 0 else code


def _text(data: bytes | str | None) -> str:
    """Output as text (OutputLimitError's fields are typed for text mode too; communicate gives bytes)."""
    return data if isinstance(data, str) else (data or b"").decode("utf-8", errors="replace")
