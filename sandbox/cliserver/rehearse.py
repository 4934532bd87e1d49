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
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable

from .peer import controlling_tty, remember_own

SAMPLE = ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "true"]


def learned(replay: tuple[str, ...]) -> bytes:
    """What a worker tells the server of its command line (the "L" message's body)."""
    return json.dumps({"argv": list(replay), "cwd": os.getcwd(), "env": dict(os.environ)}).encode()


def rehearse(learned: bytes, waiting: Callable[[], bool]) -> None:
    """Make the command line `learned` describes ready in this process (any failure: the
    client parses as it would have); without one, touch the parser with a sample.
    `waiting()`: a client is waiting; then what is left is not done (it would delay it)."""
    from ..bwrap import memo
    from ..bwrap.parse import parse_bwrap_args
    from .worker import client_limits, status_fields

    remember_own()
    memo.enable()
    pid = os.getpid()  # what taking on a client reads, read once here (the code's first run costs most)
    status_fields(pid)
    client_limits(pid)
    controlling_tty(pid)
    if not learned:
        parse_bwrap_args(SAMPLE)
        return
    with contextlib.suppress(Exception):
        told = json.loads(learned)
        argv, cwd, env = list(told["argv"]), str(told["cwd"]), dict(told["env"])
        _prepare(argv, cwd, env, waiting)


def _prepare(argv: list[str], cwd: str, env: dict[str, str], waiting: Callable[[], bool]) -> None:
    """Parse `argv` and compile its plan as a worker would in `cwd` with `env`
    (HostInfo reads both from the process: they are this one's meanwhile)."""
    from .. import backends
    from ..bwrap.parse import parse_bwrap_args
    from ..plan_cache import compiled_plan
    from ..refusal import refusal

    saved_env = dict(os.environ)
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        spec, _, extras = parse_bwrap_args([*argv, "true"])
        if waiting():
            return
        name, _ = backends.choose(extras.backend)
        host = backends.host_for(name)
        plan = compiled_plan(spec, host)
        if refusal(plan, host) is None and name == "native" and not waiting():
            from ..backends.native import blob_for

            blob_for(plan)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.fchdir(here)
        os.close(here)
