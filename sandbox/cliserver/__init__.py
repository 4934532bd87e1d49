"""The per-user CLI server: `sandbox run` and `bwrap` without the interpreter's start.

The installed `sandbox` command (and `bwrap`, when installed under that
name) is a small static client (csrc/client/cliclient.c). For a `run` it connects
to this server, which has the Python side imported and warm, and hands it
the command line with its fds, working directory and environment. The
server answers most command lines with the plan it compiled, which the
client runs itself (csrc/client/cliplan.c); for the others it forks a worker that
runs `sandbox.cli` as the client's own Python CLI would have, and sends
back its exit status. Without a server (first use) the client starts one
and runs the command line directly; the server exits when idle. docs/cli.md has the whole story: where the socket lives,
what is handed off and what runs directly, and SANDBOX_CLI_SERVER=0 to
turn it off.

- `start.py`: the server's lock, warm-up and life; `server.py`: its loop (single-threaded): it
  checks each client, answers it with a plan, or hands it to a worker;
- `fastpath.py`: the one decision (a plan, or a worker, and why), and the plan answer;
- `peer.py`: what must be equal between a client and the server;
- `spare.py`, `worker.py`: the worker forked ahead that becomes a client's Python CLI;
  `rehearse.py`: what it makes ready while it waits.
The wire (the request, the plan and the frames, read from csrc/client/cliwire.h through cffi) is
`sandbox/_core/cliwire.py`, shared with sandbox-launch's handoff (sandbox/compat/handoff.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from .owndir import own_dir


class CommandLine(Protocol):
    """What the workers use of the command line they run (sandbox.cli, the module): handed to `serve_command` by
    the command line itself, so that this package, below it, never imports it."""

    HIDDEN_FDS: set[int]
    DIE_WITH_PARENT_HOOK: Callable[[], bool] | None
    PARSED_HOOK: Callable[[tuple[str, ...]], None] | None
    WAIT_READERS: dict[int, Callable[[], bool]]

    def run_command_line(self, args: Sequence[str], argv0: str, one_shot: bool) -> int:
        """Run one command line, as `sandbox.cli.run_command_line`."""
        ...


COMMAND_LINE: CommandLine | None = None  # set by serve_command: what the workers run

SERVE_HELP = """\
usage: sandbox-py serve [--socket PATH] [--client DEV:INO:MTIME] [--idle SECONDS] [--log FILE]
                       [--after PIDFD]

Serve `run` command lines handed over by the installed `sandbox` command
(csrc/client/cliclient.c) at the socket PATH (default: this installation's, see
socket_path), until no client came for SECONDS (default 120). --client is
the identity of the client executable served; a request from another one is
handed back and the server exits. --log notes each client's outcome (handed
off, or run directly and why) in FILE. --after: warm up only once the process
of this pidfd has ended (or AFTER_SECONDS passed): the client that starts the
server runs its own command line meanwhile, and needs the CPUs. The client
starts this itself.
"""


def socket_dir() -> str:
    """The directory of this user's sockets (as the client computes it: csrc/client/clipeer.c): in the
    user's runtime directory, else root's in /run (never in the shared temporary directory, where
    a sandbox given a bind of it would reach root's server's files), else /tmp/sandbox-cli-UID."""
    uid = os.getuid()
    base = f"/run/user/{uid}"
    if own_dir(base):
        return f"{base}/sandbox-cli"
    return "/run/sandbox-cli-0" if uid == 0 else f"/tmp/sandbox-cli-{uid}"


def socket_path(client_dir: str) -> str:
    """The socket of the installation whose client executable is in
    `client_dir` (as the client computes it: csrc/client/clipeer.c)."""
    directory = socket_dir()
    h = 0xCBF29CE484222325
    for byte in os.fsencode(client_dir):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{directory}/cli-{h:016x}.sock"


def serve_command(args: Sequence[str], cli: CommandLine) -> int:
    """`serve [--socket PATH] [--client DEV:INO:MTIME] [--idle SECONDS] [--log FILE] [--after PIDFD]`; the
    workers run the command line `cli` (sandbox.cli)."""
    global COMMAND_LINE
    COMMAND_LINE = cli
    # lazy: `sandbox session`/`exec` import this package (socket_dir), no server: 115 ms (import timed, median of 7)
    from .server import IDLE_SECONDS
    from .start import run_server

    opts = {"--socket": "", "--client": "", "--idle": str(IDLE_SECONDS), "--log": "", "--after": ""}
    rest = list(args)
    while rest:
        name = rest.pop(0)
        if name in ("-h", "--help"):
            sys.stdout.write(SERVE_HELP)
            return 0
        if name not in opts or not rest:
            sys.stderr.write(f"sandbox: serve: bad argument {name!r} (try --help)\n")
            return 125
        opts[name] = rest.pop(0)
    if opts["--after"]:
        _await_end(opts["--after"])
    path = opts["--socket"] or socket_path(os.path.dirname(os.path.realpath(sys.argv[0])))
    client = None
    if opts["--client"]:
        dev, ino, mtime = (int(v) for v in opts["--client"].split(":"))
        client = (dev, ino, mtime)
    try:
        with contextlib.suppress(FileExistsError):  # its parent must be there: only the last component is made
            os.mkdir(os.path.dirname(path), 0o700)
        return run_server(path, client, float(opts["--idle"]), opts["--log"])
    except OSError as exc:
        sys.stderr.write(f"sandbox: serve: {exc}\n")
        return 125


AFTER_SECONDS = 2.0


def _await_end(text: str) -> None:
    """Wait until the process of pidfd `text` has ended (a pidfd reads as ready then), at most
    AFTER_SECONDS; the fd is closed. A bad fd waits for nothing."""
    import select

    try:
        fd = int(text)
        select.select([fd], [], [], AFTER_SECONDS)
        os.close(fd)
    except (ValueError, OSError):
        pass
