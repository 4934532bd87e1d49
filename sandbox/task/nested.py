"""Inside a task sandbox: nested sandboxes through the broker (see sandbox.task.broker).

When SANDBOX_TASK_BROKER names an fd (set in every confined task sandbox),
`task.spawn`, `task.run`, the launcher `python -m sandbox.task` and
`sandbox.spawn`/`sandbox.run` of a Spec send their request there instead of
making namespaces (which the sandbox's seccomp policy denies): the
description in this sandbox's own paths, the command, this process's
environment and its three stdio fds, with a socket of its own for the rest.
What comes back is shaped as a local start would be: a process object whose
wait() gives the exit status (-N for signal N), whose send_signal(), terminate() and
kill() reach the nested sandbox, and whose `record` is the record written
for it. The child runs beside this sandbox, never inside it; it dies when
this process (the requester) dies, or when the outer sandbox ends.

SANDBOX_TASK_BROKER names a socket inside the sandbox (like SSH_AUTH_SOCK):
any process of the sandbox reaches it, whatever fds its parents closed, as
long as its environment keeps the variable; where it does not, or the
path is not a socket, the error says so.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import stat
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from ..backends.contract import Ended
from ..errors import SpecError, UnavailableError
from ..killedby import killed_by
from ..stdio import inheritable
from . import wire

StdioArg = int | IO[Any] | None


def broker_path() -> str | None:
    """The path of this sandbox's broker socket, None outside a task sandbox; UnavailableError
    when SANDBOX_TASK_BROKER is set but names no socket here."""
    text = os.environ.get(wire.BROKER_ENV)
    if text is None:
        return None
    why = "not an absolute path"
    if text.startswith("/"):
        try:
            why = "not a socket" if not stat.S_ISSOCK(os.stat(text).st_mode) else ""
        except OSError as exc:
            why = exc.strerror or str(exc)
    if why:
        raise UnavailableError(
            f"no sandbox.task broker is reachable: {wire.BROKER_ENV}={text} names no broker socket ({why}; it "
            "names a socket inside a task sandbox: this process is not in one, or the path is covered there)")
    return text


def broker_fds() -> tuple[int, ...]:
    """Kept for programs that pass it on (subprocess's pass_fds): always empty. The broker is
    reached by the path SANDBOX_TASK_BROKER names, from any process of the sandbox, fds or not."""
    return ()


def no_broker_note() -> str:
    """Why there is no broker, for an error about starting a sandbox here."""
    return (f"; nor is a sandbox.task broker reachable ({wire.BROKER_ENV} is not set: this process was not "
            "started in a task sandbox, or its environment was cleared)")


class _Stdio:
    """The three fds the child gets, and our ends of the pipes made for it."""

    def __init__(self, stdin: StdioArg, stdout: StdioArg, stderr: StdioArg) -> None:
        self.child: list[int] = []
        self.ours: list[IO[bytes] | None] = [None, None, None]
        self._made: list[int] = []
        for i, arg in enumerate((stdin, stdout, stderr)):
            self.child.append(self._one(i, arg))

    def _one(self, i: int, arg: StdioArg) -> int:
        if arg is None:
            if inheritable(i):
                return i
            arg = subprocess.DEVNULL  # closed, or close-on-exec (a socket of the caller's, say): not sent
        if arg == subprocess.PIPE:
            r, w = os.pipe2(os.O_CLOEXEC)
            mine, theirs = (w, r) if i == 0 else (r, w)
            self.ours[i] = open(mine, "wb" if i == 0 else "rb")  # noqa: SIM115 (kept open for the caller)
            self._made.append(theirs)
            return theirs
        if arg == subprocess.DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            self._made.append(fd)
            return fd
        if arg == subprocess.STDOUT:
            if i != 2:
                raise SpecError(("stdin", "stdout")[i], "STDOUT", "only stderr may be STDOUT")
            return self.child[1]
        if isinstance(arg, int) and not isinstance(arg, bool) and arg >= 0:
            return arg
        if hasattr(arg, "fileno"):
            return int(arg.fileno())
        raise SpecError(("stdin", "stdout", "stderr")[i], arg, "must be None, PIPE, DEVNULL, STDOUT, an fd or a file")

    def sent(self) -> None:
        for fd in self._made:
            os.close(fd)
        self._made.clear()

    def abort(self) -> None:
        self.sent()
        for f in self.ours:
            if f is not None:
                f.close()


class NestedProcess:
    """A nested sandbox started through the broker, shaped like subprocess.Popen
    (and like sandbox.task.TaskProcess). `pid` is the child's pid on the host,
    not one of this sandbox's namespace."""

    def __init__(self, args: list[str], chan: socket.socket, reply: dict[str, Any], stdio: _Stdio) -> None:
        self.args = args
        self.pid = int(reply.get("pid", 0))
        self._handle = NestedHandle(chan, reply)
        self.record: dict[str, Any] = self._handle.record
        self.record_path: str | None = None
        self.stdin, self.stdout, self.stderr = stdio.ours
        self._rc: int | None = None
        self._ended = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._listen, name="sandbox-task-nested", daemon=True).start()

    def _listen(self) -> None:
        fds = self._handle.wait_fds()
        try:
            select.select(fds, [], [])
        finally:
            for fd in fds:
                os.close(fd)
        with self._lock:
            ended = self._handle.reap(woken=True)
        self.record, self.record_path = self._handle.record, self._handle.record_path
        self._rc = ended.returncode if ended is not None else -signal.SIGKILL
        self._ended.set()

    @property
    def returncode(self) -> int | None:
        """The command's exit code, -N if signal N killed it, None while it runs."""
        return self._rc if self._ended.is_set() else None

    @property
    def confined(self) -> bool:
        """Always: a nested sandbox is never started unconfined."""
        return bool(self.record.get("confined", True))

    # The broker starts the nested sandbox outside and replies only its exit:
    # its cgroup's counts do not come back through the channel.
    usage = None
    killed_by = None

    def poll(self) -> int | None:
        """The return code if it has ended, else None."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end (subprocess.TimeoutExpired after `timeout` seconds)."""
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self._rc is not None
        return self._rc

    def communicate(self, input: bytes | None = None, timeout: float | None = None) -> tuple[Any, Any]:
        """As Popen.communicate."""
        out: dict[int, bytes] = {}

        def feed() -> None:
            assert self.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                if input:
                    self.stdin.write(input)
                self.stdin.close()

        def drain(i: int, f: IO[bytes]) -> None:
            out[i] = f.read()
            f.close()

        threads = [threading.Thread(target=drain, args=(i, f), daemon=True)
                   for i, f in ((1, self.stdout), (2, self.stderr)) if f is not None]
        if self.stdin is not None:
            threads.append(threading.Thread(target=feed, daemon=True))
        for t in threads:
            t.start()
        self.wait(timeout)
        for t in threads:
            t.join(timeout)
        return (out.get(1) if self.stdout is not None else None, out.get(2) if self.stderr is not None else None)

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the nested command (SIGKILL: end the whole nested sandbox)."""
        with self._lock:
            if not self._ended.is_set():
                self._handle.signal(sig)

    def terminate(self) -> None:
        """SIGTERM."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """End the whole nested sandbox now."""
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> NestedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            self.kill()
        for f in (self.stdin, self.stdout, self.stderr):
            if f is not None:
                f.close()
        self.wait()


def request(path: str, body: Mapping[str, Any], argv: Sequence[str], stdin: StdioArg = None,
            stdout: StdioArg = None, stderr: StdioArg = None, pass_fds: Sequence[int] = (),
            environ: Mapping[str, str] | None = None) -> NestedProcess:
    """Ask the broker listening at `path` for a nested sandbox (`body`: the kind and the description)."""
    chan, reply, stdio = ask(path, body, argv, stdin, stdout, stderr, pass_fds, environ)
    return NestedProcess(list(argv), chan, reply, stdio)


def ask(path: str, body: Mapping[str, Any], argv: Sequence[str], stdin: StdioArg = None,
        stdout: StdioArg = None, stderr: StdioArg = None, pass_fds: Sequence[int] = (),
        environ: Mapping[str, str] | None = None) -> tuple[socket.socket, dict[str, Any], _Stdio]:
    """request()'s conversation up to the broker's reply: (the request's socket, the reply, the stdio)."""
    if tuple(pass_fds):
        raise SpecError("pass_fds", tuple(pass_fds), "a nested sandbox gets its stdio only (no other fds)")
    stdio = _Stdio(stdin, stdout, stderr)
    try:
        chan = wire.connect(path)
    except OSError as exc:
        stdio.abort()
        raise UnavailableError(f"no sandbox.task broker answers at {wire.BROKER_ENV}={path}: "
                               f"{exc.strerror or exc}") from None
    try:
        env = dict(os.environ if environ is None else environ)
        wire.send(chan, {**body, "argv": list(argv), "environ": env}, stdio.child)
        stdio.sent()
        reply, fds, _ = wire.recv(chan)
        for extra in fds:
            os.close(extra)
    except BaseException:
        chan.close()
        stdio.abort()
        raise
    if reply is None:
        chan.close()
        stdio.abort()
        raise UnavailableError("the sandbox.task broker ended the request without an answer")
    if "error" in reply:
        chan.close()
        stdio.abort()
        wire.raise_error(reply)
    return chan, reply, stdio


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
