"""Waiting for the sandbox a run of the command line started, with the
signals the CLI process receives (SIGINT, SIGTERM, SIGHUP) forwarded to it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from types import FrameType
    from typing import Any

    from .process import SandboxProcess

FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")  # by name: the signal module is imported when they are


class SignalForwarder:
    """Forward SIGINT, SIGTERM and SIGHUP to a sandbox process while waiting for it.

    The handlers only note the signal and wake the waiting loop through a
    pipe; the loop sends it with `proc.send_signal` outside any handler (a
    handler may run while the process object holds its lock). Installed
    before the sandbox starts, so a signal that arrives in between is held
    and delivered once the process exists. Use as a context manager.
    """

    POLL_INTERVAL = 0.05  # seconds, only when pidfds are unavailable

    def __init__(self, signals: Iterable[int] | None = None) -> None:
        import signal

        self.signals = tuple(signals if signals is not None else (getattr(signal, n) for n in FORWARDED_SIGNALS))
        self.pending: list[int] = []
        self.previous: dict[int, Any] = {}
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def __enter__(self) -> SignalForwarder:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def wait(self, proc: SandboxProcess, readers: Mapping[int, Callable[[], bool]] | None = None) -> int:
        """Wait for `proc` to end, forwarding signals to it; return its returncode.
        `readers`: fds to watch meanwhile, each with the function that reads what
        arrives on it (False once the fd is done: it is not watched any more)."""
        import selectors

        pidfd = _pidfd(proc.pid)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self._wake_r, selectors.EVENT_READ)
                if pidfd >= 0:
                    sel.register(pidfd, selectors.EVENT_READ)
                for fd, read in (readers or {}).items():
                    sel.register(fd, selectors.EVENT_READ, read)
                while True:
                    self._forward(proc)
                    returncode = proc.poll()
                    if returncode is not None:
                        return int(returncode)
                    for key, _ in sel.select(None if pidfd >= 0 else self.POLL_INTERVAL):
                        if key.data is not None and not key.data():
                            sel.unregister(key.fd)
                    self._drain()
        finally:
            if pidfd >= 0:
                os.close(pidfd)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)
        try:
            os.write(self._wake_w, b"s")
        except OSError:
            pass  # the pipe is full: the loop is awake anyway

    def _forward(self, proc: SandboxProcess) -> None:
        while self.pending:
            sig = self.pending.pop(0)
            try:
                proc.send_signal(sig)
            except OSError:
                pass  # already gone: its exit status is on its way

    def _drain(self) -> None:
        try:
            while os.read(self._wake_r, 512):
                pass
        except BlockingIOError:
            pass


def _pidfd(pid: int) -> int:
    """A pidfd for `pid` (readable once it has exited), or -1 if unavailable."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1
