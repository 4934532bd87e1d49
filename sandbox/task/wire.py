"""The broker's wire: JSON messages with file descriptors over a SOCK_SEQPACKET socket pair.

One message is one datagram (SEQPACKET keeps the boundaries, and a message
and its fds arrive together or not at all). The broker's end has SO_PASSCRED
set, so the kernel attaches the sender's pid, uid and gid to each message
(translated into the broker's namespaces: the host's pid and the outer uid
of a process inside a sandbox), which the sender cannot forge. Errors
cross as their class and fields and are raised again on the other side.
"""

from __future__ import annotations

import array
import json
import os
import socket
import struct
from typing import Any

from .. import errors as E

BROKER_ENV = "SANDBOX_TASK_BROKER"  # inside a task sandbox: the fd of its broker's socket
MAX_MESSAGE = 1 << 20
MAX_FDS = 8
_UCRED = struct.Struct("iII")  # pid, uid, gid


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(broker's end, with SO_PASSCRED; the other end)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    for s in (ours, theirs):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
    return ours, theirs


def send(sock: socket.socket, data: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send `data` as one message, with `fds` (duplicated into the receiver)."""
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    sock.sendmsg([json.dumps(data).encode()], anc)


def recv(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int], tuple[int, int, int] | None]:
    """(message or None at the end, fds received, (pid, uid, gid) of the sender or None).
    A message that was cut short, or is not a JSON object, raises ValueError (its fds closed)."""
    space = socket.CMSG_SPACE(MAX_FDS * 4) + socket.CMSG_SPACE(_UCRED.size)
    msg, anc, flags, _ = sock.recvmsg(MAX_MESSAGE, space)
    fds: list[int] = []
    creds = None
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", data[: len(data) - len(data) % 4]).tolist()
        elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            creds = _UCRED.unpack(data[: _UCRED.size])
    if not msg and not fds:
        return None, [], creds
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ValueError("message cut short")
        data = json.loads(msg)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    return data, fds, creds


def error_message(exc: BaseException) -> dict[str, Any]:
    """`exc` as a message (its class, text and the fields a caller acts on)."""
    out: dict[str, Any] = {"error": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, E.SpecError):
        out.update(field=exc.field, value=_jsonable(exc.value), problem=exc.problem)
    for name in ("errno", "filename", "path", "step", "backend"):
        value = getattr(exc, name, None)
        if isinstance(value, (int, str)):
            out[name] = value
    return out


def raise_error(msg: dict[str, Any]) -> None:
    """Raise the error `msg` carries, as its class of sandbox.errors (SandboxError if unknown)."""
    name, text = str(msg.get("error")), str(msg.get("message", ""))
    klass = getattr(E, name, None)
    if name == "SpecError":
        raise E.SpecError(str(msg.get("field")), msg.get("value"), str(msg.get("problem")))
    if isinstance(klass, type) and issubclass(klass, E.ExecError):
        raise E.ExecError.from_errno(int(msg.get("errno") or 0), str(msg.get("filename")), str(msg.get("backend")))
    if klass is E.IsolationError:
        raise E.IsolationError(text, path=msg.get("path"), errno=int(msg.get("errno") or 0))
    if klass is E.SetupError:
        raise E.SetupError(text, step=str(msg.get("step")), path=msg.get("path"), errno=int(msg.get("errno") or 0))
    if isinstance(klass, type) and issubclass(klass, E.SandboxError) and klass is not E.SandboxError:
        try:
            raise klass(text)
        except TypeError:
            pass
    raise E.SandboxError(text)


def _jsonable(value: object) -> object:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
