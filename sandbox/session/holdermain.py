"""The holder process's start: `sandbox-py session _hold`, as `sandbox session
start` runs it (climain.py). It binds the session's socket, opens its log,
starts the Session of the Spec its starter sends through a pipe, reports the
id (or the error) on another pipe, and serves with holder.Holder until
stopped. Apart from holder.py so that a Session (which can publish itself
through holder.py) and the holder import each other in one direction only.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..cliserver.owndir import fresh_file
from . import clisock
from .clisock import Refused
from .holder import Holder, Log, bind, owns_name

if TYPE_CHECKING:
    from .session import Session


def main(args: Sequence[str]) -> int:
    """`session _hold --spec-fd N --status-fd N [--name NAME] [--idle-timeout S]`: as
    climain.start runs it. Reads the Spec's JSON from the spec fd, writes one JSON line to the
    status fd once the session takes requests ({"id", "pid", "session_pid"}) or failed
    ({"error"}), then serves until stopped."""
    opts = dict(zip(args[::2], args[1::2], strict=False))
    for sig in (signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    holder = _start(opts, int(opts["--status-fd"]))
    if holder is None:
        return clisock.EXIT_SETUP
    try:
        holder.serve()
    except BaseException as exc:  # the session is closed and the socket removed all the same (serve's finally)
        holder.log(f"the holder failed: {type(exc).__name__}: {exc}")
        raise
    return 0


def _start(opts: dict[str, str], status: int) -> Holder | None:
    """The Holder of a new session, its id reported on fd `status`; None once the error is."""
    try:
        directory = clisock.open_dir(create=True)
        listener, ident, socket_id = bind(directory, opts.get("--name"))
    except (OSError, Refused) as exc:
        _report(status, {"error": str(exc)})
        return None
    log = Log(-1)
    try:
        log = Log(fresh_file(directory, clisock.log_name(ident), os.O_WRONLY | os.O_APPEND))
        session = _session(int(opts["--spec-fd"]))
    except Exception as exc:  # reported to the starter, which exits 125 with it: nothing is left
        if owns_name(directory, ident, socket_id):
            os.unlink(clisock.socket_name(ident), dir_fd=directory)
        if log.fd >= 0:
            os.unlink(clisock.log_name(ident), dir_fd=directory)
        _report(status, {"error": str(exc)})
        return None
    idle = float(opts["--idle-timeout"]) if opts.get("--idle-timeout") else None
    holder = Holder(session, listener, directory, ident, socket_id, log, idle)
    log(f"session {ident} started: its pid 1 is {session.pid}")
    _report(status, {"id": ident, "pid": os.getpid(), "session_pid": session.pid})
    return holder


def _session(spec_fd: int) -> Session:
    # lazy: called inside _start's try, so that a failed import (no C core) is reported to the starter
    from .. import netpool
    from ..spec import Spec
    from .session import Session

    netpool.disable()  # one sandbox in this process's life: a pool of network namespaces would only cost

    with open(spec_fd, "rb") as f:
        text = f.read(clisock.MAX_MESSAGE + 1)
    if len(text) > clisock.MAX_MESSAGE:
        raise Refused(f"the Spec is more than {clisock.MAX_MESSAGE} bytes")
    return Session(Spec.from_json(text))


def _report(fd: int, message: dict[str, Any]) -> None:
    import json

    with contextlib.suppress(OSError), open(fd, "wb") as f:
        f.write(json.dumps(message).encode() + b"\n")
