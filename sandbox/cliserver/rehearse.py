"""What a spare makes ready while it waits: the previous client's command line.

A worker is a fresh fork of the server, and a fresh fork pays for each page
of the server's it writes (copy-on-write), which Python does on every
object it touches (reference counts): parsing a command line and compiling
its plan in a worker took about twice as long as in a warm process. The
spare does that work ahead, in its own memory, for the command line the
previous worker reported (`learned`, from sandbox.cli's PARSED_HOOK): its
pure options (bwrap/memo.py), the client's cwd and environment. A client
that repeats that command line from the same place finds its Spec in the
memo, the plan in sandbox.plan_cache (keyed by the Spec's identity and the
caller's state) and the native blob in its cache; any other client parses
as before. Nothing here runs a sandbox or opens an fd that outlives it.

A client handed over meanwhile does not wait for the rehearsal: the
spare's control socket is O_ASYNC while it runs, and the SIGIO of the
server's message ends it at once (`until_client`): what was not stored yet
is simply missed.
It starts only after REHEARSE_AFTER without a client: a caller that runs
commands back to back comes sooner, and is served without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import struct
import threading
from collections.abc import Callable
from types import FrameType

from .. import backends
from ..bwrap import memo
from ..bwrap.parse import parse_bwrap_args
from ..plan_cache import compiled_plan
from ..refusal import refusal
from .clientstate import F_OWNER_TID, F_SETOWN_EX, client_limits
from .peer import controlling_tty, remember_own, status_fields

REHEARSE_AFTER = 0.01  # seconds without a client before the rehearsal starts
SAMPLE = ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "true"]


class ClientCame(BaseException):
    """A client connected: the rehearsal stops where it is (not an Exception: nothing catches it on the way)."""


def learned(replay: tuple[str, ...]) -> bytes:
    """What a worker tells the server of its command line (the "L" message's body)."""
    return json.dumps({"argv": list(replay), "cwd": os.getcwd(), "env": dict(os.environ)}).encode()


def until_client(listener: socket.socket, work: Callable[[], None]) -> None:
    """Run work() until it ends or `listener` is readable (a client connects to a listening
    socket, or the server hands one over on a control socket), whichever comes first."""
    armed = True

    def came(signum: int, frame: FrameType | None) -> None:
        nonlocal armed
        if armed:
            armed = False
            raise ClientCame

    fd = listener.fileno()
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    previous = signal.signal(signal.SIGIO, came)
    try:
        try:
            fcntl.fcntl(fd, F_SETOWN_EX, struct.pack("ii", F_OWNER_TID, threading.get_native_id()))
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_ASYNC)
            # a caller that runs commands back to back is here within REHEARSE_AFTER: it is served
            # at once (the rehearsal would compete with it for the CPUs); else the work starts
            if not select.select([listener], [], [], REHEARSE_AFTER)[0]:
                work()
        finally:
            armed = False
    except ClientCame:  # raised before the line above ran, or in the work
        pass
    fcntl.fcntl(fd, fcntl.F_SETFL, flags)  # the server's next spare sets it again for itself
    signal.signal(signal.SIGIO, previous)  # no SIGIO comes any more: none was pending (they come at once)


def rehearse(learned: bytes) -> None:
    """Make the command line `learned` describes ready in this process (any failure: the
    client parses as it would have); without one, touch the parser with a sample."""
    remember_own()
    memo.enable()
    pid = os.getpid()  # what taking on a client reads, read once here (the code's first run costs most)
    proc = os.open("/proc/self", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        status_fields(proc)
        client_limits(proc)
    finally:
        os.close(proc)
    controlling_tty(pid)
    if not learned:
        parse_bwrap_args(SAMPLE)
        return
    with contextlib.suppress(Exception):
        told = json.loads(learned)
        argv, cwd, env = list(told["argv"]), str(told["cwd"]), dict(told["env"])
        _prepare(argv, cwd, env)


def _prepare(argv: list[str], cwd: str, env: dict[str, str]) -> None:
    """Parse `argv` and compile its plan as a worker would in `cwd` with `env`. The
    plan reads the cwd from this process (it is the client's meanwhile; the worker
    takes the client's own anyway); it reads the environment only for a Spec that
    inherits it, which a command line's never does (its environment is made explicit)."""
    spec, _, extras = parse_bwrap_args([*argv, "true"], environ=env, cwd=cwd)
    os.chdir(cwd)
    name, _ = backends.choose(extras.backend)
    host = backends.host_for(name)
    plan = compiled_plan(spec, host)
    if refusal(plan, host) is None and name == "native":
        from ..backends.native import blob_for  # lazy: the server runs without the C core (bwrap only)

        blob_for(plan)
