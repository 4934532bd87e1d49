"""The Template server's protocol (csrc/sandbox.h, struct sbx_request and
after): one request message per sandbox, and the messages that come back on
its report socket. Sizes are checked against the compiled module at import."""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Sequence

from ...plan import Plan
from ..native import ffi, lib, serialize

REQUEST = struct.Struct("<8I")
FAILURE = struct.Struct("<4i")
STAMPS = struct.Struct("<4i8Q")
STATUS = struct.Struct("<i")
for _name, _st in (("struct sbx_request", REQUEST), ("struct sbx_stamps_report", STAMPS)):
    if ffi.sizeof(_name) != _st.size:  # pragma: no cover - a bug, not a build problem
        raise ImportError(f"sandbox: {_name} is {ffi.sizeof(_name)} bytes in C, {_st.size} in Python")


@functools.lru_cache(maxsize=512)
def sandbox_blob(plan: Plan) -> bytes:
    """A sandbox plan's blob: its ops apply in place, on the copy of the template's root."""
    return serialize(plan, "/")


def request(blob: bytes, argv: Sequence[str], env: tuple[str, ...], targets: Sequence[int], *,
            join_netns: bool, stdio_mask: int) -> bytes:
    """One request message (the fds travel beside it, see csrc/sandbox.h).
    An empty `blob` names the one the server stored."""
    strings = b"".join([*(os.fsencode(s) + b"\0" for s in argv), _environment(env)])
    flags = lib.SBX_REQ_JOIN_NETNS if join_netns else 0
    head = REQUEST.pack(lib.SBX_REQ_MAGIC, len(blob), len(argv), len(env), len(targets), flags, stdio_mask, 0)
    return b"".join((head, blob, b"\0" * (-len(blob) % 8), struct.pack(f"<{len(targets)}I", *targets), strings))


@functools.lru_cache(maxsize=64)
def _environment(env: tuple[str, ...]) -> bytes:
    return b"".join(os.fsencode(s) + b"\0" for s in env)


def parse_report(data: bytes) -> tuple[tuple[int, tuple[int, ...]] | None, tuple[int, int, int, int] | None]:
    """One message of the report socket: ((Landlock ABI, stamps), None) when
    the sandbox is running, (None, (step, op, err, detail)) when it failed."""
    if len(data) == STAMPS.size:
        fields = STAMPS.unpack(data)
        if fields[0] == lib.SBX_STEP_NONE:
            return (fields[1], fields[4:]), None
    if len(data) == FAILURE.size:
        return None, FAILURE.unpack(data)
    return None, (lib.SBX_STEP_CONFIG, -1, 0, 0)  # not a message the protocol has: a bug
