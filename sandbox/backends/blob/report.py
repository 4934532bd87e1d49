"""What sandbox-launch reports through `--report-fd`: its sandbox's start, or the typed error of its setup.

    caller (blob.launch)                         sandbox-launch (csrc/client/launcher.c)
    pipe2(O_CLOEXEC): r, w
    posix_spawn(..., --report-fd w) ---------->  fcntl(w, FD_CLOEXEC); sbx_spawn(plan)
    close(w)                                       |  setup child: steps, exec
    read(r) <----------- struct sbx_result -----  write(w, result); close(w)
    EOF without a record: the launcher failed      waits for the command, exits like it
      itself ("sandbox: ..." on stderr, 125)

The record is the C core's own `struct sbx_result` (csrc/core/sandbox.h),
read by field name: step 0 is a start (the sandbox's first process, its
CLOCK_MONOTONIC stamps, the Landlock ABI applied), any other step the
failure the native backend raises in the same words (sandbox._core.report).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from ..._core.binding import STAMP_NAMES, ffi
from ..._core.report import setup_error
from ...errors import SetupError

__all__ = ["RECORD_SIZE", "Started", "read_record", "started"]

RECORD_SIZE = ffi.sizeof("struct sbx_result")

Started = tuple[int, dict[str, float], int]  # (the sandbox's first process, timings in µs, Landlock ABI)


def read_record(fd: int) -> bytes:
    """Everything written to the pipe `fd` until its end (one record, or nothing)."""
    chunks = []
    while chunk := os.read(fd, RECORD_SIZE):
        chunks.append(chunk)
    return b"".join(chunks)


def started(data: bytes, pid: int, blob: bytes, argv: list[str], since_ns: int, name: str) -> Started:
    """The start that `data` (read_record's) reports for launcher `pid`, timed from `since_ns` (the
    caller's CLOCK_MONOTONIC before it spawned the launcher); raises the setup's typed error (the
    launcher reaped first) if it reports a failure, or none."""
    if len(data) != RECORD_SIZE:
        status = _reap(pid)
        said = " (its \"sandbox: ...\" line went to the command's stderr)" if status == 125 << 8 else ""
        raise SetupError(f"{name} ended ({_ended(status)}) before it started the sandbox{said}", step="launch",
                         backend="blob")
    res: Any = ffi.from_buffer("struct sbx_result *", data)
    if res.step != 0:
        _reap(pid)
        raise setup_error(res, blob, argv, backend="blob")
    timings = {STAMP_NAMES[i]: (ns - since_ns) / 1000.0 for i, ns in enumerate(res.t_ns) if ns}
    timings["exec"] = timings.get("done", 0.0)  # the launcher saw the command exec'd
    timings["launcher"] = timings.pop("start", 0.0)  # its own start: the exec of sandbox-launch
    timings["start"] = 0.0
    return int(res.pid), timings, int(res.landlock_abi)


def _reap(pid: int) -> int | None:
    """The launcher's wait status: it exits once it has written a failure (or none)."""
    with contextlib.suppress(ChildProcessError):
        return os.waitpid(pid, 0)[1]
    return None


def _ended(status: int | None) -> str:
    if status is None:
        return "reaped elsewhere"
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"
