"""A Session's wire: the request the caller sends its pid 1, and the frames of a call socket.

Declared once, in the CDEF region of csrc/core/sandbox.h (struct sbx_session_request,
struct sbx_session_frame, enum sbx_session_kind), and read here by name
through cffi. The C side is csrc/session/session.c (requests) and
csrc/session/session_call.c (frames).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from .._core.binding import ffi, lib
from ..errors import SpecError

STARTED = lib.SBX_SESSION_STARTED
FAILED = lib.SBX_SESSION_FAILED
EXITED = lib.SBX_SESSION_EXITED
SIGNAL = lib.SBX_SESSION_SIGNAL
KILL = lib.SBX_SESSION_KILL
FRAME_SIZE = ffi.sizeof("struct sbx_session_frame")
MAX_STRINGS = lib.SBX_SESSION_MAX_STRINGS


@dataclass(frozen=True)
class Frame:
    """One frame of a call socket: `kind` (STARTED, FAILED, EXITED), `value`
    (errno of a failure, the raw wait status of an exit), `pid` (the
    command's, inside the session), `step` (a failure's enum sbx_step)."""

    kind: int
    value: int
    pid: int
    step: int


def request(path: str, cwd: str, argv: Sequence[str], env: Sequence[str], quiet: bool = False,
            ids: tuple[int, int, Sequence[int]] | None = None) -> bytes:
    """The bytes of one request (its fds travel beside its first byte):
    the header, then PATH, cwd, argv and env as NUL-terminated strings.
    `quiet`: no STARTED frame (the caller waits only for the end). `ids`:
    (uid, gid, supplementary groups) the command runs as, ids of the
    session's namespace already checked to be mapped."""
    strings = b"".join(os.fsencode(s) + b"\0" for s in (path, cwd, *argv, *env))
    if len(strings) > MAX_STRINGS:
        raise SpecError("argv", f"{len(strings)} bytes of argv and env",
                        f"must fit in {MAX_STRINGS} bytes for a Session's command")
    head = ffi.new("struct sbx_session_request *")
    head.magic = lib.SBX_SESSION_MAGIC
    head.size = len(strings)
    head.argc = len(argv)
    head.envc = len(env)
    head.flags = lib.SBX_SESSION_QUIET if quiet else 0
    if ids is not None:
        uid, gid, groups = ids
        if len(groups) > lib.SBX_SESSION_MAX_GROUPS:
            raise SpecError("user", f"{len(groups)} groups", f"must be at most {lib.SBX_SESSION_MAX_GROUPS}")
        head.flags |= lib.SBX_SESSION_USER
        head.uid, head.gid, head.n_groups = uid, gid, len(groups)
        head.groups[0:len(groups)] = list(groups)
    return bytes(ffi.buffer(head)) + strings


def frame(kind: int, value: int = 0) -> bytes:
    """A frame from the caller (SIGNAL with its number, KILL)."""
    f = ffi.new("struct sbx_session_frame *")
    f.kind = kind
    f.value = value
    return bytes(ffi.buffer(f))


def parse_frame(data: bytes) -> Frame | None:
    """A frame received whole, or None if `data` is not one."""
    if len(data) != FRAME_SIZE:
        return None
    f = ffi.cast("struct sbx_session_frame *", ffi.from_buffer(data))
    return Frame(f.kind, f.value, f.pid, f.step)
