"""The launcher: `python -m sandbox.task [--backend NAME] SPEC -- CMD...`.

For a program that hands another program a command prefix. SPEC is the
description as JSON text, or `@file`. CMD runs confined, with its forwarders
and proxy in this process; stdio is passed through as is (the same fds, so
nothing is buffered here); SIGTERM, SIGINT, SIGHUP and SIGQUIT are forwarded
to the command; the exit status is the command's (128+N when signal N ended
it). When the launcher is killed outright, the sandbox dies with it (the
sandbox's pid 1 has the launcher's death as its parent-death signal).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence

from ..errors import ExecError, ExecNotFoundError, SandboxError
from .description import Sandbox
from .run import TaskProcess, spawn

USAGE = "usage: python -m sandbox.task [--backend auto|native|bwrap] SPEC -- CMD [ARG...]\n" \
        "SPEC: the description as JSON text, or @FILE"
EXIT_NOEXEC, EXIT_NOTFOUND = 126, 127  # the command is not executable / not found, as under bwrap
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def parse(argv: Sequence[str]) -> tuple[str, str, list[str]]:
    """(backend, SPEC text, command) from the launcher's arguments; ValueError with the usage."""
    args = list(argv)
    backend = "auto"
    if args and args[0].startswith("--backend"):
        if "=" in args[0]:
            backend = args.pop(0).split("=", 1)[1]
        elif len(args) > 1:
            args.pop(0)
            backend = args.pop(0)
    if "--" not in args:
        raise ValueError(USAGE)
    cut = args.index("--")
    if cut != 1 or not args[cut + 1:]:
        raise ValueError(USAGE)
    text = args[0]
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    return backend, text, args[cut + 1:]


def forward_signal(proc: TaskProcess, sig: int) -> None:
    """Pass `sig` on to the command. Each executor's handle knows how it
    reaches the command (the native sandbox's pid 1 forwards what it gets;
    under bwrap, whose monitor and init pass nothing on, the command itself
    is signalled: sandbox.backends.bwrap's handle)."""
    proc.send_signal(sig)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the launcher; return the exit status."""
    try:
        backend, text, command = parse(sys.argv[1:] if argv is None else argv)
        sb = Sandbox.from_json(text)
    except (ValueError, OSError) as exc:
        print(f"sandbox.task: {exc}", file=sys.stderr)
        return 2
    # Block the forwarded signals while starting, so one that arrives then is
    # delivered (and forwarded) once the command exists, never lost or fatal here.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        proc = spawn(command, sb, backend=backend)
    except ExecError as exc:  # as the CLI and bwrap: 127 not found, 126 not executable
        print(f"sandbox.task: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_NOTFOUND if isinstance(exc, ExecNotFoundError) else EXIT_NOEXEC
    except SandboxError as exc:
        print(f"sandbox.task: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 125
    except OSError as exc:
        print(f"sandbox.task: {exc}", file=sys.stderr)
        return 127
    rc = wait_forwarding(proc)
    return rc if rc >= 0 else 128 - rc


def wait_forwarding(proc: TaskProcess) -> int:
    """proc.wait(), with FORWARDED passed on to the command by a thread of its
    own that takes them with sigwait(): they stay blocked in every thread
    (main() blocked them before anything started), so one that comes at any
    moment is pending until that thread takes it. No Python signal handler
    is involved: one runs in the main thread between bytecodes, maybe while
    wait() holds the process's lock for a moment (a handler that signalled
    the process waited for its own lock forever), and one that arrives just
    before a blocking wait runs only once that wait returns."""
    def forward() -> None:
        while True:
            forward_signal(proc, signal.sigwait(FORWARDED))

    threading.Thread(target=forward, name="sandbox-task-signals", daemon=True).start()
    return proc.wait()
