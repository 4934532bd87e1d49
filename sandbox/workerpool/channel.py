"""The WorkerPool's channels: the zygote's start, and the task's side of a task's channel.

Both ends import this: the caller (as sandbox.workerpool.channel) and the
zygote (loaded by path: it imports no part of the `sandbox` package), whose
forked tasks run run_task().

Control socket (AF_UNIX, SOCK_SEQPACKET: one message per packet), while the
zygote starts in Python: a kind byte, a format byte, a u32 length, a body of
that length; fds travel with SCM_RIGHTS. The caller sends marshal (the
zygote trusts it), the zygote JSON, which the caller loads (it trusts
nothing a sandbox says more than JSON can).
    caller -> zygote  INIT  {native, preload, path, spares, cgroups: k, slots, netns}
                                                          fds: [task blob memfd, k cgroup.procs per slot]
    zygote -> caller  READY {pid, netns}                  fds: [the namespace factory's channel]
                      | ERROR {message, failure?}
Once READY, the zygote serves in C, and every message is a struct sbx_zmsg
(csrc/core/sandbox.h has them all; control.py is the caller's end).

Nothing of a task's own passes through the zygote, whose memory every later
task inherits: it sees a task id, fds, and a per-task plan only as a memfd it
maps for the fork and unmaps. The task reads everything else from its
channel (a socket), straight from the caller: a u64 length and its
environment (JSON, a map of strings; empty: none), then a u64 length and
the pickled (fn, args, kwargs). It writes its reply there (a u64 length,
then the pickled (ok, value or exception record)), or, if a signal ends it,
the u64 DIED + the signal's number (sbx_task_death_notes).
"""

from __future__ import annotations

import array
import json
import marshal
import os
import socket
import struct
import sys
from typing import Any, NoReturn

INIT, READY, ERROR = b"I", b"R", b"E"
_HEADER = struct.Struct("<ccI")
MARSHAL, JSON = b"m", b"j"  # the body's format
LENGTH = struct.Struct("<Q")  # the length prefix on a task's result socket
DIED = 0xFFFF_FFFF_FFFF_FF00  # a "length" of DIED + N: the task died of signal N
MAX_MESSAGE = 60 * 1024
MAX_FDS = 64


def _json(value: Any) -> str:
    """The JSON of a control message's value (None, bool, int, float, str,
    list, dict with keys that need no escaping: the names in this module),
    without the json module but for a str (an error message: rare)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is int or kind is float:
        return repr(value)
    if kind is dict:
        return "{" + ",".join([f'"{k}":{_json(v)}' for k, v in value.items()]) + "}"
    if kind is list or kind is tuple:
        return "[" + ",".join([_json(v) for v in value]) + "]"
    return json.dumps(value)


def send(sock: socket.socket, kind: bytes, body: dict[str, Any], fds: list[int] | tuple[int, ...] = (), *,
         to_caller: bool = False) -> None:
    """Send one control message (its fds with SCM_RIGHTS): marshal, or JSON
    `to_caller` (the zygote's messages)."""
    fmt = JSON if to_caller else MARSHAL
    data = _json(body).encode() if to_caller else marshal.dumps(body)
    packet = _HEADER.pack(kind, fmt, len(data)) + data
    if len(packet) > MAX_MESSAGE:
        raise ValueError(f"control message of {len(packet)} bytes is too large (at most {MAX_MESSAGE})")
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([packet], ancillary)


def recv(sock: socket.socket, *, from_caller: bool = False) -> tuple[bytes, dict[str, Any], list[int]] | None:
    """Receive one control message: (kind, body, fds), or None at EOF. Its
    body must be marshal `from_caller` (in the zygote and a spare), else
    JSON (in the caller: a body in another format is refused)."""
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * 4))
    fds = array.array("i")
    for level, type_, payload in ancillary:
        if level == socket.SOL_SOCKET and type_ == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(data) < _HEADER.size:
        raise ValueError("truncated control message")
    kind, fmt, size = _HEADER.unpack_from(data)
    expected = MARSHAL if from_caller else JSON
    if fmt != expected:
        raise ValueError(f"control message in format {fmt!r}, expected {expected!r}")
    body = data[_HEADER.size:_HEADER.size + size]
    return kind, marshal.loads(body) if from_caller else json.loads(body), list(fds)


def read_fd(fd: int) -> bytes:
    """The whole content of a memfd (from offset 0), which is then closed."""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the task

# The task's side works on its channel's fd with os.read and os.write, not
# through a socket object: each Python function it runs on the way writes
# pages a copy-on-write fault each (socket.socket's machinery: ~20).

def _read_exact(fd: int, size: int) -> bytes:
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError("the caller closed the task's channel")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _dumps(obj: Any) -> bytes:
    """`obj` pickled: by the C pickler when it can (everything it pickles by
    reference, cloudpickle would too: nothing is registered by value in a
    task), else by cloudpickle (code, dynamic classes, what pickle refuses),
    whose Python pickler writes ~30 pages more per reply."""
    import pickle

    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - whatever pickle refuses, cloudpickle tries (a BaseException is the task's)
        import cloudpickle

        data: bytes = cloudpickle.dumps(obj)
        return data


def _dumps_or_none(obj: Any) -> bytes | None:
    import cloudpickle

    try:
        data: bytes = cloudpickle.dumps(obj)
        return data
    except BaseException:  # noqa: BLE001 - what cannot be pickled (even by raising SystemExit) comes back by name
        return None


def _error_record(exc: BaseException) -> dict[str, Any]:
    """What the caller needs to raise `exc` again: the exception pickled if
    possible, its class's module and name, its args and attributes (to make it
    again from a class the caller has), its message, and the formatted traceback."""
    import traceback

    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - a broken __str__ must not lose the error
        message = "<unprintable>"
    try:
        tb = "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001
        tb = "<the traceback could not be formatted>"
    kind = type(exc)
    return {"module": str(kind.__module__), "qualname": str(kind.__qualname__), "message": message,
            "exception": _dumps_or_none(exc), "args": _dumps_or_none((exc.args, getattr(exc, "__dict__", {}))),
            "traceback": tb}


def _execute(payload: bytes) -> bytes:
    """Run the pickled call; the pickled reply (ok, value or error record).
    Whatever the task's code raises, while running or while its result is
    pickled (SystemExit from a __reduce__ too), becomes an error record."""
    import pickle

    import cloudpickle

    try:
        fn, args, kwargs = pickle.loads(payload)
        reply: tuple[bool, Any] = (True, fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - everything the task raises goes back to the caller
        reply = (False, _error_record(exc))
    try:
        return _dumps(reply)
    except BaseException as exc:  # noqa: BLE001 - an unpicklable result is the task's error
        failure = exc
    try:
        data: bytes = cloudpickle.dumps((False, _error_record(failure)))
        return data
    except BaseException:  # noqa: BLE001 - the record holds only str and bytes: this cannot fail
        return pickle.dumps((False, {"module": "builtins", "qualname": "RuntimeError", "message":
                                     "the task's result and its error could not be pickled", "traceback": ""}))


def _read_environment(fd: int) -> None:
    """The task's own environment, from its channel, into os.environ."""
    (size,) = LENGTH.unpack(_read_exact(fd, LENGTH.size))
    if size:
        env = json.loads(_read_exact(fd, size))
        os.environ.update(env)


def run_task(result_fd: int) -> NoReturn:
    """The task's sandbox, called by the zygote's C loop in it (its death
    notes on `result_fd`, its output on 1 and 2): read its environment
    and its call from `result_fd`, run the call, write the reply there, and
    exit without unwinding into the zygote's code (os._exit: no atexit, no
    finalizers)."""
    code = 0
    try:
        _read_environment(result_fd)
        (size,) = LENGTH.unpack(_read_exact(result_fd, LENGTH.size))
        reply = _execute(_read_exact(result_fd, size))
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001, S110 - a closed stream must not lose the reply
                pass
        # EOF on every channel now, not after the exit has torn down our
        # memory; the output first, so the caller finds all at once
        for fd in (1, 2):
            os.close(fd)
        _write_all(result_fd, LENGTH.pack(len(reply)) + reply)
        os.close(result_fd)
    except BaseException:  # noqa: BLE001 - the channel itself failed: say so on the task's stderr
        code = 70
        try:
            import traceback

            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001, S110
            pass
    os._exit(code)
