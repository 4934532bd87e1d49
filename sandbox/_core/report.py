"""The C core's failure record turned into typed exceptions.

The words (bwrap's wording) and the path a failure concerns come from the C
core (csrc/core/messages.c), which sandbox-launch prints too; this module only
chooses the exception class and names the step.
"""

from __future__ import annotations

import errno as E
import os
from collections.abc import Sequence
from typing import Any

from ..errors import ExecError, IsolationError, SandboxError, SetupError, signal_name
from .binding import OP_KIND_NAMES, STEP_NAMES, ffi, lib
from .blob import op_kind


def describe(res: Any, blob: bytes, command: str | None = None) -> tuple[str, str | None]:
    """(message, path) for the failure record `res` of a sandbox started from `blob`."""
    c_blob = ffi.from_buffer(blob)
    raw = os.fsencode(command) if command is not None else None
    size = 2 * len(blob) + len(raw or b"") + 256
    buf = ffi.new("char[]", size)
    lib.sbx_format_error(res, c_blob, len(blob), raw if raw is not None else ffi.NULL, buf, size)
    path = lib.sbx_error_path(res, c_blob, len(blob))
    return os.fsdecode(ffi.string(buf)), (os.fsdecode(ffi.string(path)) if path != ffi.NULL else None)


def step_name(res: Any, blob: bytes) -> str:
    """SetupError.step: "source", the failing op's kind ("bind", "tmpfs", ...), or the step ("uid_map", ...)."""
    step, index = res.step, res.op
    if step == lib.SBX_STEP_SOURCE:
        return "source"
    if step == lib.SBX_STEP_OP:
        kind = op_kind(blob, index)
        return OP_KIND_NAMES.get(kind, "op") if kind is not None else "op"
    return STEP_NAMES.get(step, f"step {step}")


def setup_error(res: Any, blob: bytes, argv: Sequence[str], backend: str = "native") -> SandboxError:
    """The typed exception for the C core's failure record `res` of a sandbox started from `blob` by
    `backend` (the native core in-process, or sandbox-launch for the blob executor)."""
    step, err = res.step, res.err
    if step == lib.SBX_STEP_EXEC:
        return ExecError.from_errno(err or E.ENOENT, argv[0], backend)
    if step == lib.SBX_STEP_CRASHED:  # .err holds the signal that ended the setup child, not an errno
        return SetupError(f"the sandbox's setup process was killed by {signal_name(err)} before the command ran",
                          step="crashed", backend=backend)
    text, path = describe(res, blob, argv[0] if argv else None)
    if step == lib.SBX_STEP_ISOLATION:
        return IsolationError(text, path=path, errno=err)
    return SetupError(text, step=step_name(res, blob), path=path, errno=err, backend=backend)
