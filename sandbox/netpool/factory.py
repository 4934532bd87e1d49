"""The factory process that makes a pool's namespaces, seen from the pool.

One long-lived factory per pool (plain Python, `-I -S`, stdlib only: the
program is _factory_main.py, started with subprocess and no fork of this
process) makes namespaces on request and passes back their fds (nsfs file,
NETLINK_ROUTE and NETLINK_SOCK_DIAG sockets made inside) over a Unix socket
with SCM_RIGHTS. A netlink socket talks to the namespace it was created in,
forever, whoever uses it, so the caller needs no setns() (which a
multithreaded process cannot do for user namespaces) to configure and
inspect them. For `owner="userns"` the factory's own user namespace owns
every namespace it makes; its fd comes once, with b"ready".
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from .._core.fdpass import recv_fds
from ..errors import NetnsPoolError
from ._factory_main import COUNTER_FILES, SOCKSTAT_FILES

#: Appears in the factory process's command line (tests look for it in /proc).
FACTORY_MARKER = "sandbox-netpool-factory"
#: The factory program, run as a file (not imported) by a fresh interpreter.
FACTORY_PATH = Path(__file__).with_name("_factory_main.py")

_NICE = 10  # the factory and the refill thread yield to everything else
_FACTORY_TIMEOUT = 10.0  # seconds for the factory to start or answer
_TCP_HASH_ENTRIES = 4096  # per-namespace TCP hash size (see _factory_main)


def _recv_fds(chan: socket.socket, maxfds: int) -> tuple[bytes, list[int]]:
    """One message and the fds it carries, received close-on-exec.

    (socket.recv_fds would leave them inheritable until we fix them up, and
    a concurrent spawn could leak namespace fds into a child.)
    """
    msg, fds, flags = recv_fds(chan, 4096, maxfds, socket.MSG_CMSG_CLOEXEC)
    if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
        _close_all(fds)
        raise NetnsPoolError("factory message truncated")
    return msg, fds


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class _Factory:
    """The helper process that creates namespaces (see _factory_main)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.userns_fd: int | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.chan = ours
        ours.settimeout(_FACTORY_TIMEOUT)
        argv = [sys.executable, "-I", "-S", str(FACTORY_PATH), FACTORY_MARKER, str(theirs.fileno()), mode,
                str(_NICE), str(_TCP_HASH_ENTRIES)]
        try:
            self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            self._handshake()
        except BaseException:
            self.close()
            raise

    def _handshake(self) -> None:
        msg, fds = self._receive(1)
        if msg != b"ready" or len(fds) != (1 if self.mode == "userns" else 0):
            _close_all(fds)
            raise NetnsPoolError(f"namespace factory failed to start: {self._why(msg)}")
        self.userns_fd = fds[0] if fds else None

    def _receive(self, maxfds: int) -> tuple[bytes, list[int]]:
        try:
            return _recv_fds(self.chan, maxfds)
        except (TimeoutError, OSError) as e:
            raise NetnsPoolError(f"namespace factory did not answer: {e}") from e

    def _why(self, msg: bytes) -> str:
        """The factory's own error message, or its stderr if it died."""
        if msg:
            return msg.decode(errors="replace")
        with contextlib.suppress(subprocess.TimeoutExpired, OSError, ValueError):
            self.proc.wait(timeout=1.0)
            assert self.proc.stderr is not None
            err = self.proc.stderr.read().decode(errors="replace").strip()
            return f"exited with {self.proc.returncode}: {err[-500:]}"
        return "no answer"

    def new(self) -> tuple[int, int, int, dict[str, int]]:
        """A fresh namespace: (netns fd, NETLINK_ROUTE fd, NETLINK_SOCK_DIAG fd,
        {counter or sockstat file name: fd of it opened inside}), all ours to close."""
        try:
            self.chan.send(b"new")
        except OSError as e:
            raise NetnsPoolError(f"namespace factory is gone: {e}") from e
        msg, fds = self._receive(3 + len(COUNTER_FILES) + len(SOCKSTAT_FILES))
        words = msg.split()
        names = [w.decode() for w in words[1:]]
        if words[:1] != [b"ok"] or len(fds) != 3 + len(names) or not set(names) <= set(COUNTER_FILES + SOCKSTAT_FILES):
            _close_all(fds)
            raise NetnsPoolError(f"namespace factory: {self._why(msg)}")
        return fds[0], fds[1], fds[2], dict(zip(names, fds[3:], strict=True))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """EOF tells the factory to exit; it is killed if it does not."""
        self.chan.close()
        if self.userns_fd is not None:
            os.close(self.userns_fd)
            self.userns_fd = None
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def forget(self) -> None:
        """In a forked child: drop our copies of the fds, leave the process to its parent."""
        self.chan.close()
        if self.userns_fd is not None:
            os.close(self.userns_fd)
            self.userns_fd = None
        if self.proc.stderr is not None:
            self.proc.stderr.close()


class _AdoptedFactory(_Factory):
    """A factory another process started, handed over as its channel: a
    WorkerPool's zygote forks one inside its sandbox (workerpool/zygote.py),
    so that the user namespace owning the namespaces is a child of the
    zygote's, which may then join them without a capability. It speaks the
    same protocol, in "userns" mode; it is not ours to wait for (its parent
    reaps it): EOF on the channel ends it."""

    def __init__(self, chan: socket.socket) -> None:  # (no super().__init__: it would start a process)
        self.mode = "userns"
        self.userns_fd = None
        self.chan = chan
        self.gone = False
        chan.settimeout(_FACTORY_TIMEOUT)
        try:
            self._handshake()
        except BaseException:
            self.close()
            raise

    def _why(self, msg: bytes) -> str:
        return msg.decode(errors="replace") if msg else "it exited"

    def alive(self) -> bool:
        return not self.gone

    def close(self) -> None:
        self.gone = True
        self.forget()

    def forget(self) -> None:
        self.chan.close()
        if self.userns_fd is not None:
            os.close(self.userns_fd)
            self.userns_fd = None


def adopted(chan: socket.socket) -> Callable[[], _Factory]:
    """A NetnsPool's `factory` for the factory at the other end of `chan`:
    it starts once (its handshake, on first use); once it is gone no other
    is started (a factory of our own would make namespaces the adopter's
    tenants cannot join)."""
    taken = False

    def start() -> _Factory:
        nonlocal taken
        if taken:
            raise NetnsPoolError("the adopted namespace factory is gone")
        taken = True
        return _AdoptedFactory(chan)

    return start
