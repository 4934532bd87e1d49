"""The command line of sessions: `sandbox session start|list|stop` and `sandbox exec`.

`session start` checks the Spec, starts a holder (holder.py) detached from
the caller and prints the id it answers with once its session takes
requests; `exec` hands the holder a command with the caller's own stdin,
stdout and stderr (SCM_RIGHTS: a terminal stays a terminal), passes it
SIGINT, SIGTERM and SIGHUP, and exits with the command's status. The
socket, its messages and the checks of the peer are clisock.py's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from . import clisock
from .clisock import EXIT_SETUP, Refused

# lazy imports: each subcommand loads what it uses: `sandbox exec`, `session list` and `stop` load no Spec
# (28 ms, import timed, median of 7) and no holder (7 ms); only `session start` and the holder process (`_hold`) do

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from typing import Any

SESSION_USAGE = """\
usage: sandbox session start --spec FILE [--name NAME] [--idle-timeout SECONDS]
       sandbox session list
       sandbox session stop ID
       sandbox exec [--cwd DIR] [--env NAME=VALUE]... [--user USER] ID [--] COMMAND [ARGS...]

A session is one sandbox that stays up across command lines (sandbox.Session):
`start` prints its id once it takes commands (FILE: a Spec's JSON, as
`sandbox run --spec` takes it); `exec` runs COMMAND inside it with this
terminal or these fds as its stdin, stdout and stderr and exits with its
status (128+N for signal N), passing SIGINT, SIGTERM, SIGHUP (and SIGWINCH) to it;
`stop` ends every process of it. Only its owner (this uid, outside any
sandbox) reaches it. Errors exit 125 (126, 127: COMMAND cannot be run).
"""


def session_command(args: Sequence[str]) -> int:
    """`session start|list|stop ...` (and `_hold`, the holder itself)."""
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(SESSION_USAGE) if args else sys.stderr.write(SESSION_USAGE)
        return 0 if args else EXIT_SETUP
    sub, rest = args[0], list(args[1:])
    if sub == "_hold":
        from .holdermain import main

        return main(rest)
    commands = {"start": start, "list": list_sessions, "stop": stop}
    if sub not in commands:
        return fail(f"session: unknown command {sub!r} (start, list, stop; try --help)")
    try:
        return commands[sub](rest)
    except Refused as exc:
        return fail(f"session {sub}: {exc}")
    except OSError as exc:
        return fail(f"session {sub}: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))


def fail(text: str, status: int = EXIT_SETUP) -> int:
    """Say `text` as the CLI says its errors; return `status`."""
    sys.stderr.write(f"sandbox: {' '.join(text.splitlines())}\n")
    sys.stderr.flush()
    return status


def options(args: list[str], names: dict[str, bool]) -> tuple[dict[str, list[str]], list[str]]:
    """Leading options (`names`: name -> takes a value; `--name=value` too) and the rest."""
    found: dict[str, list[str]] = {}
    while args and args[0].startswith("--") and args[0] != "--":
        name, eq, value = args.pop(0).partition("=")
        if name not in names:
            raise Refused(f"unknown option {name} (try --help)")
        if names[name] and not eq:
            if not args:
                raise Refused(f"{name} needs a value")
            value = args.pop(0)
        found.setdefault(name, []).append(value)
    return found, args


# ---------------------------------------------------------------- start


def start(args: list[str]) -> int:
    """`session start --spec FILE [--name NAME] [--idle-timeout S]`."""
    opts, rest = options(args, {"--spec": True, "--name": True, "--idle-timeout": True})
    if rest or "--spec" not in opts:
        raise Refused("usage: sandbox session start --spec FILE [--name NAME] [--idle-timeout SECONDS]")
    text = _spec_text(opts["--spec"][-1])
    hold = ["--spec-fd", "", "--status-fd", ""]
    if "--name" in opts:
        hold += ["--name", clisock.check_id(opts["--name"][-1])]
    if "--idle-timeout" in opts:
        hold += ["--idle-timeout", str(_seconds(opts["--idle-timeout"][-1]))]
    answer = _hold(text, hold)
    if "error" in answer:
        return fail(f"session start: {answer['error']}")
    print(answer["id"])
    return 0


def _spec_text(arg: str) -> bytes:
    """The Spec's JSON (a file, or the text itself as `run --spec` takes it), checked: SpecError's
    words (naming the field) as Refused."""
    from ..errors import SpecError
    from ..spec import Spec

    try:
        if arg.lstrip().startswith("{"):
            data = arg.encode()
        else:
            with open(arg, "rb") as f:
                data = f.read(clisock.MAX_MESSAGE + 1)
        if len(data) > clisock.MAX_MESSAGE:
            raise Refused(f"the Spec {arg} is more than {clisock.MAX_MESSAGE} bytes")
        return Spec.from_json(data).to_json().encode()
    except SpecError as exc:
        raise Refused(f"bad Spec: {exc}") from None
    except OSError as exc:
        raise Refused(f"can't read the Spec {arg}: {exc.strerror}") from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e9:
        raise Refused(f"--idle-timeout: {text!r} is not a positive number of seconds")
    return value


def _hold(spec: bytes, hold: list[str]) -> dict[str, Any]:
    """Start the holder detached (a session of its own, stdio on /dev/null), send it the Spec,
    and return what it answers once its session takes requests, or fails to."""
    import json
    import subprocess

    spec_r, spec_w = os.pipe2(os.O_CLOEXEC)
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    hold[1], hold[3] = str(spec_r), str(status_w)
    try:
        subprocess.Popen([sys.executable, "-P", "-m", "sandbox", "session", "_hold", *hold],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         pass_fds=(spec_r, status_w), start_new_session=True)
    finally:
        os.close(spec_r)
        os.close(status_w)
    with open(spec_w, "wb") as f, contextlib.suppress(BrokenPipeError):
        f.write(spec)
    with open(status_r, "rb") as f:
        line = f.read(1 << 16)
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        return {"error": "the session's holder ended before it took requests (its log is in "
                         f"{clisock.session_dir()})"}
    return answer


# ---------------------------------------------------------------- list, stop


def list_sessions(args: list[str]) -> int:
    """`session list`: ID, PID (the holder's), SESSION (its pid 1), AGE, of each live session."""
    import time

    if args:
        raise Refused("list takes no arguments")
    rows = []
    try:
        directory = clisock.open_dir(create=False)
    except FileNotFoundError:  # no session was ever started
        directory = -1
    try:
        for name in sorted(os.listdir(directory)) if directory >= 0 else []:
            if name.startswith("session-") and name.endswith(".sock"):
                info = _info(directory, name[len("session-"):-len(".sock")])
                if info is not None:
                    rows.append(info)
    finally:
        if directory >= 0:
            os.close(directory)
    print(f"{'ID':<20} {'PID':>8} {'SESSION':>8} {'AGE':>9}")
    for info in rows:
        age = int(time.time() - float(info.get("started", 0)))
        print(f"{info.get('id', '?'):<20} {info.get('pid', '?'):>8} {info.get('session_pid', '?'):>8} "
              f"{age // 3600:>3}:{age // 60 % 60:02}:{age % 60:02}")
    return 0


def _info(directory: int, ident: str) -> dict[str, Any] | None:
    """What the holder of `ident` says of itself (None: not a live session of ours)."""
    try:
        sock, peer = clisock.connect(directory, ident)
    except (OSError, Refused):
        return None
    try:
        sock.settimeout(5)
        clisock.ask(sock, {"op": "info"})
        answer, _ = clisock.receive(sock)
        return answer if answer and "id" in answer else None
    except (OSError, Refused):
        return None
    finally:
        sock.close()
        peer.close()


def stop(args: list[str]) -> int:
    """`session stop ID`: the session closed (every process gone), its holder ended."""
    import select

    if len(args) != 1:
        raise Refused("usage: sandbox session stop ID")
    directory = _existing_dir(args[0])
    try:
        try:
            sock, peer = clisock.connect(directory, args[0])
        except FileNotFoundError:
            raise Refused(f"no session {args[0]!r}") from None
        except ConnectionRefusedError:  # its holder died (killed): only its socket is left
            os.unlink(clisock.socket_name(args[0]), dir_fd=directory)
            return fail(f"session stop: session {args[0]!r} had ended already (its socket is removed)")
    finally:
        os.close(directory)
    try:
        clisock.ask(sock, {"op": "stop"})
        answer, _ = clisock.receive(sock)
        if not answer or not answer.get("stopped"):
            raise Refused(str((answer or {}).get("error", "the holder ended without saying it stopped")))
        select.select([peer.pidfd], [], [], 10)  # the holder's own end: readable once it has exited
    finally:
        sock.close()
        peer.close()
    return 0


def _existing_dir(ident: str) -> int:
    """The sessions' directory, checked; Refused naming `ident` if there is none yet."""
    try:
        return clisock.open_dir(create=False)
    except FileNotFoundError:
        raise Refused(f"no session {ident!r} (no session was started: {clisock.session_dir()} is missing)") from None


# ---------------------------------------------------------------- exec


def exec_command(args: Sequence[str]) -> int:
    """`exec [--cwd DIR] [--env NAME=VALUE]... [--user USER] ID [--] COMMAND [ARGS...]`."""
    rest = list(args)
    if rest[:1] in (["-h"], ["--help"]):
        sys.stdout.write(SESSION_USAGE)
        return 0
    try:
        request, ident = exec_request(rest)
        return Exec(ident, request).run()
    except Refused as exc:
        return fail(f"exec: {exc}")
    except OSError as exc:
        return fail(f"exec: {exc.strerror or exc}")


def exec_request(args: list[str]) -> tuple[dict[str, Any], str]:
    """The request of an exec command line, and the session's id."""
    opts, rest = options(args, {"--cwd": True, "--env": True, "--user": True})
    if not rest:
        raise Refused("usage: sandbox exec [--cwd DIR] [--env NAME=VALUE]... [--user USER] ID [--] COMMAND...")
    ident = clisock.check_id(rest.pop(0))
    if rest[:1] == ["--"]:
        rest.pop(0)
    if not rest:
        raise Refused("no COMMAND to run")
    request: dict[str, Any] = {"op": "exec", "argv": rest}
    if "--cwd" in opts:
        request["cwd"] = opts["--cwd"][-1]
    env = {}
    for item in opts.get("--env", []):
        name, eq, value = item.partition("=")
        if not name or not eq:
            raise Refused(f"--env {item!r}: not NAME=VALUE")
        env[name] = value
    if env:
        request["env"] = env
    if "--user" in opts:
        request["user"] = opts["--user"][-1]
    return request, ident


def _stdio() -> tuple[int, int, int]:
    """This process's fds 0, 1 and 2, each closed one opened on /dev/null (as a shell's `<&-`
    leaves it: the command reads EOF or writes nowhere). Called before this process opens
    anything else, so that none of its own fds (the socket to the holder) takes the number."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    return 0, 1, 2


class Exec:
    """One `sandbox exec`: connect, send the request with fds 0-2, relay signals, wait."""

    SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGWINCH")  # WINCH: a terminal's new size, to a full-screen program

    def __init__(self, ident: str, request: dict[str, Any]) -> None:
        self.ident, self.request = ident, request

    def run(self) -> int:
        """The command's exit status (128+N for signal N), or 125/126/127 and a message."""
        import signal

        stdio = _stdio()  # first: a closed 0-2 is filled before any fd of ours could land there
        directory = _existing_dir(self.ident)
        try:
            sock, peer = clisock.connect(directory, self.ident)
        except FileNotFoundError:
            raise Refused(f"no session {self.ident!r} (see `sandbox session list`)") from None
        except ConnectionRefusedError:
            raise Refused(f"session {self.ident!r} has ended (its holder is gone)") from None
        finally:
            os.close(directory)
        peer.close()
        wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        sigs = [getattr(signal, name) for name in self.SIGNALS]
        previous = {sig: signal.signal(sig, lambda *_: None) for sig in sigs}
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            clisock.ask(sock, self.request, stdio)
            return self._wait(sock, wake_r)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            sock.close()
            os.close(wake_r)
            os.close(wake_w)

    def _wait(self, sock: Any, wake_r: int) -> int:
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ)
            sel.register(wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fd == wake_r:
                        for sig in os.read(wake_r, 64):
                            with contextlib.suppress(OSError):  # the holder gone: its EOF says so next
                                clisock.send(sock, {"signal": sig})
                        continue
                    answer, _ = clisock.receive(sock)
                    if answer is None:
                        return fail("exec: the session's holder went away before the command ended")
                    if "error" in answer:
                        status = answer.get("status")
                        return fail(f"exec: {answer['error']}", status if status in (125, 126, 127) else EXIT_SETUP)
                    if "exit" in answer:
                        code = int(answer["exit"])
                        return code if code >= 0 else 128 - code
