"""The C core's failure record turned into typed exceptions, worded like bwrap."""

from __future__ import annotations

import errno as E
import os
from collections.abc import Sequence

from ...errors import ExecError, IsolationError, SandboxError, SetupError
from ...plan import OpKind, Plan
from .core import STEP_NAMES, lib

_FS_NAMES = {OpKind.TMPFS: "tmpfs", OpKind.PROC: "proc", OpKind.DEV: "dev"}
_WHAT = {OpKind.DIR: "directory", OpKind.SYMLINK: "symlink", OpKind.FILE: "file"}


def _op_message(plan: Plan, index: int, detail: int) -> tuple[str, str | None]:
    """bwrap-like wording for a failed op, and the path it concerns."""
    if not 0 <= index < len(plan.ops):
        return "Can't apply a mount operation", None
    op = plan.ops[index]
    dest = op.dest
    if detail == lib.SBX_D_SOURCE:
        return (f"Can't find source path {op.src}" if op.kind is OpKind.BIND else f"Can't open {dest}"), op.src or dest
    if detail == lib.SBX_D_PARENTS:
        return f"Can't mkdir parents for {dest}", dest
    if detail == lib.SBX_D_EXISTS:
        return f"Can't make symlink at {dest}: existing destination is not {op.src}", dest
    if detail == lib.SBX_D_CREATE:
        return f"Can't create {_WHAT.get(op.kind, 'mount point')} at {dest}", dest
    if detail == lib.SBX_D_RESOLVE:
        return f"Can't open {dest} inside the sandbox", dest
    if detail == lib.SBX_D_WRITE:
        return f"Can't write file at {dest}", dest
    if detail == lib.SBX_D_CHMOD:
        return f"Can't chmod {op.mode:o} {dest}", dest
    if detail == lib.SBX_D_ATTR:
        if op.kind is OpKind.REMOUNT_RO:
            return f"Can't remount readonly on {dest}", dest
        return f"Can't set mount flags on {dest}", dest
    if op.kind is OpKind.BIND:
        return f"Can't bind mount {op.src} on {dest}", dest
    return f"Can't mount {_FS_NAMES.get(op.kind, op.kind.name.lower())} on {dest}", dest


def setup_error(res: object, plan: Plan, argv: Sequence[str]) -> SandboxError:
    """Turn the C core's failure record into a typed exception."""
    step, err, index, detail = res.step, res.err, res.op, res.detail  # type: ignore[attr-defined]
    reason = os.strerror(err) if err else "unknown error"
    name = STEP_NAMES.get(step, f"step {step}")
    path: str | None = None
    if step == lib.SBX_STEP_EXEC:
        return ExecError.from_errno(err or E.ENOENT, argv[0])
    if step == lib.SBX_STEP_ISOLATION:
        probe = plan.probe_paths[index] if 0 <= index < len(plan.probe_paths) else "?"
        what = "is visible inside the sandbox" if err == E.EEXIST else f"cannot be proven absent ({reason})"
        return IsolationError(f"isolation check failed: probe path {probe} {what}", path=probe, errno=err)
    if step in (lib.SBX_STEP_SOURCE, lib.SBX_STEP_OP):
        name = "source" if step == lib.SBX_STEP_SOURCE else plan.ops[index].kind.name.lower() if index >= 0 else "op"
        text, path = _op_message(plan, index, detail)
    elif step == lib.SBX_STEP_CWD:
        path = plan.cwd_candidates[0] if plan.cwd_strict else None
        text = f"Can't chdir to {path}" if path else "Can't chdir to any of " + ", ".join(plan.cwd_candidates)
    elif step in (lib.SBX_STEP_UID_MAP, lib.SBX_STEP_GID_MAP, lib.SBX_STEP_SETGROUPS):
        text = f"setting up {name.replace('_', ' ')}"
    elif step == lib.SBX_STEP_CLONE:
        text = "Creating new namespace failed"
        if err in (E.EPERM, E.ENOSPC, E.EACCES):
            text += " (user namespaces blocked? see `python -m sandbox probe`)"
    elif step == lib.SBX_STEP_CONFIG:
        text = "The serialized plan is malformed"
    else:
        text = f"Can't set up the sandbox ({name.replace('_', ' ')})"
    return SetupError(f"{text}: {reason}", step=name, path=path, errno=err, backend="native")
