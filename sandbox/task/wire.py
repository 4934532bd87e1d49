"""The broker's wire: JSON messages with file descriptors over SOCK_SEQPACKET connections.

A request is one connection to the broker's listening socket (inside the
sandbox at the path SANDBOX_TASK_BROKER names); the rest of the
conversation (the answer, signals, the exit) goes over that connection.
One message is one datagram (SEQPACKET keeps the boundaries, and a message
and its fds arrive together or not at all). The listening socket has
SO_PASSCRED and SO_PASSPIDFD set, which its connections inherit, so the
kernel attaches the sender's pid, uid and gid to each message (translated
into the broker's namespaces: the host's pid and the outer uid of a process
inside a sandbox), which the sender cannot forge, and a pidfd of the sender,
which names it even after its pid is reused (_core/peer.py). Errors cross
as their class and fields and are raised again on the other side.

What arrives is untrusted: a message is bounded in size (MAX_MESSAGE, a
longer one arrives cut short and is refused) and in nesting depth
(MAX_DEPTH, counted by a scan of the bytes before any parsing: the JSON
parser recurses, and a deep enough array exhausts its stack), and must be
UTF-8 text holding one JSON object; anything else raises MessageError,
whose text names the problem.
"""

from __future__ import annotations

import json
import os
import re
import socket
from typing import Any

from .. import errors as E
from .._core.fdpass import SO_PASSPIDFD, attaches_pidfds, recv_with_credentials, send_fds
from .._core.peer import Peer

BROKER_ENV = "SANDBOX_TASK_BROKER"  # inside a task sandbox: the path of its broker's socket
MAX_MESSAGE = 1 << 20  # bytes of one message
MAX_DEPTH = 16  # nesting of arrays and objects in one message (a request needs 4)
MAX_FDS = 8
# A JSON string, to its closing quote or to the end of the text (so never scanned twice).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_OPEN = frozenset(b"[{")


class MessageError(ValueError):
    """A message that is not one bounded JSON object; the text says what is wrong with it."""


def listener(path: str) -> socket.socket:
    """A SEQPACKET socket listening at `path` (created: the caller's fresh private directory),
    with SO_PASSCRED and SO_PASSPIDFD (where the kernel has it: 6.5), close-on-exec, mode 0600."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        if attaches_pidfds():  # else (before 6.5) recv opens one from the sender's pid
            sock.setsockopt(socket.SOL_SOCKET, SO_PASSPIDFD, 1)
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return sock


def connect(path: str) -> socket.socket:
    """A connection to the broker listening at `path` (OSError if none listens there)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
        sock.connect(path)
    except BaseException:
        sock.close()
        raise
    return sock


def check_depth(data: bytes) -> None:
    """MessageError if arrays and objects in `data` nest deeper than MAX_DEPTH (brackets in strings aside)."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return
    depth = 0
    for c in _STRING.sub(b"", data).translate(None, _NOT_BRACKETS):
        depth += 1 if c in _OPEN else -1
        if depth > MAX_DEPTH:
            raise MessageError(f"nested deeper than {MAX_DEPTH} levels")


def parse(data: bytes) -> dict[str, Any]:
    """The JSON object `data` holds; MessageError naming what is wrong with it."""
    if len(data) > MAX_MESSAGE:
        raise MessageError(f"larger than {MAX_MESSAGE} bytes")
    check_depth(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MessageError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise MessageError(f"not JSON ({exc})"[:300]) from None
    if not isinstance(value, dict):
        raise MessageError(f"not a JSON object (a {type(value).__name__})")
    return value


def send(sock: socket.socket, data: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send `data` as one message, with `fds` (duplicated into the receiver)."""
    send_fds(sock, json.dumps(data).encode(), fds)


def recv(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int], Peer | None]:
    """(message or None at the end, fds received, its sender or None: no credentials came).
    The caller closes the sender (it holds the sender's pidfd, if one came). A message that was cut
    short, or is not one bounded JSON object, raises MessageError (its fds and the sender's closed)."""
    msg, fds, flags, creds, pidfd = recv_with_credentials(sock, MAX_MESSAGE + 1, MAX_FDS)
    if creds is None:
        if pidfd >= 0:
            os.close(pidfd)
        sender = None
    else:
        sender = Peer.of_sender(creds, pidfd, by_pid=not attaches_pidfds())
    if not msg and not fds:
        return None, [], sender
    try:
        if flags & socket.MSG_TRUNC or len(msg) > MAX_MESSAGE:
            raise MessageError(f"larger than {MAX_MESSAGE} bytes")
        if flags & socket.MSG_CTRUNC:
            raise MessageError(f"carries more than {MAX_FDS} fds" if len(fds) >= MAX_FDS
                               else "came without the room its control data needed (a sender the kernel "
                               "could give no pidfd of: it had ended)")
        value = parse(msg)
    except MessageError:
        for fd in fds:
            os.close(fd)
        if sender is not None:
            sender.close()
        raise
    return value, fds, sender


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
