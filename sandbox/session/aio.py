"""asyncio for a Session: an awaited start (the AsyncProcess itself, and
run(), are sandbox.aio's, shared with `sandbox.aspawn` and `arun`)."""

from __future__ import annotations

from ..aio import AsyncProcess, readable
from ..stdio import Stdio
from . import call


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

