"""The brokered executor's handle: a request to a task sandbox's broker, and the nested sandbox it started.

The conversation (sandbox.task.wire, the broker's side in sandbox.task.broker): the request carries the
kind, the description, the command, the environment and the child's three stdio fds; the reply the child's
host pid and its record so far; then the socket stays open, as the handle: signals go to the broker as
messages, and the broker sends the exit and the final record there (or closes it when its own sandbox is
taken down).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import UnavailableError
from ...killedby import killed_by
from ...stdio import handed_fds
from ...task import wire
from ..contract import Ended
from . import BROKER_ENV


def ask(path: str, body: Mapping[str, Any], argv: Sequence[str], stdio: Sequence[int],
        environ: Mapping[str, str] | None = None) -> NestedHandle:
    """Ask the broker listening at `path` for a nested sandbox (`body`: the kind and the description) running
    `argv` with the child's stdio fds `stdio` (-1: this process's own, if a command would inherit it), in
    `environ` (default os.environ); the handle on it once the broker has started it."""
    try:
        chan = wire.connect(path)
    except OSError as exc:
        raise UnavailableError(f"no sandbox.task broker answers at {BROKER_ENV}={path}: "
                               f"{exc.strerror or exc}") from None
    try:
        env = dict(os.environ if environ is None else environ)
        with handed_fds(stdio) as fds:
            wire.send(chan, {**body, "argv": list(argv), "environ": env}, fds)
        reply, extra, _ = wire.recv(chan)
        for fd in extra:
            os.close(fd)
    except BaseException:
        chan.close()
        raise
    if reply is None:
        chan.close()
        raise UnavailableError("the sandbox.task broker ended the request without an answer")
    if "error" in reply:
        chan.close()
        wire.raise_error(reply)
    return NestedHandle(chan, reply)


class NestedHandle:
    """A nested sandbox as a contract.Handle: the request's socket is what is
    waited on (the broker sends the exit there, or closes it when its own
    sandbox is taken down), signals go to the broker as messages, and the
    broker's record comes with the exit. `pid` is the child's pid on the host."""

    def __init__(self, chan: socket.socket, reply: Mapping[str, Any]) -> None:
        self.pid = self.sandbox_pid = int(reply.get("pid", 0))
        self.timings: dict[str, float] = {}  # measured beside this sandbox, not in it
        self.isolation: dict[str, Any] = {}
        self.record: dict[str, Any] = dict(reply.get("record") or {})
        self.record_path: str | None = None
        self._chan: socket.socket | None = chan

    def wait_fds(self) -> list[int]:
        """A copy of the request's socket, readable once the exit (or the broker's end) is there."""
        return [os.dup(self._chan.fileno())] if self._chan is not None else []

    def reap(self, caller_end: str | None = None, woken: bool = False) -> Ended | None:
        """The exit the broker sent, once it is there (never blocks)."""
        if self._chan is None:
            return None
        if not woken and not select.select([self._chan], [], [], 0)[0]:
            return None
        try:
            msg, fds, _ = wire.recv(self._chan)
            for fd in fds:
                os.close(fd)
        except (OSError, ValueError):
            msg = None
        if msg is not None and isinstance(msg.get("exit"), int):
            self.record = dict(msg.get("record") or self.record)
            self.record_path = msg.get("record_path")
            returncode = int(msg["exit"])
        else:  # the broker went away without a word: its sandbox was taken down
            returncode = -signal.SIGKILL
        self.close()
        return Ended(returncode, None, killed_by(returncode, None, None, caller_end))

    def signal(self, sig: int) -> None:
        """`sig` to the nested command; SIGKILL ends the whole nested sandbox."""
        if self._chan is not None:
            with contextlib.suppress(OSError):
                wire.send(self._chan, {"kill": True} if sig == signal.SIGKILL else {"signal": int(sig)})

    def close(self) -> None:
        """Close the request's socket (the broker then ends the nested sandbox if it still runs)."""
        if self._chan is not None:
            self._chan.close()
            self._chan = None
