"""Who is at the other end of a Unix socket: the one peer check every listener starts from.

The kernel records the connecting process's pid, uid and gid on the socket
(SO_PEERCRED, in the reader's namespaces: pid 0 when the peer's pid
namespace is not ours) and, since Linux 6.5, gives a pidfd of it
(SO_PEERPIDFD). A pid alone can be reused; so anything read of the peer
through /proc/PID is confirmed afterwards through the pidfd (a live process
keeps its pid, so what was read was the peer's). `Peer.check_owner` is the
strength every listener asks at least: our uid, a pid in our pid namespace,
a pidfd; each listener then asks what it needs more (cliserver/peer.py:
confinement equal to the server's; session/clisock.py: the same namespaces;
compat/handoff.py: a child of this process).
"""

from __future__ import annotations

import os
import socket

from .fdpass import UCRED

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from typing import Self

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5

__all__ = ["SO_PEERPIDFD", "Peer", "Unverified", "credentials", "read_proc", "status_fields"]


class Unverified(Exception):
    """The peer could not be shown to be one this side serves; the message says why."""


def credentials(conn: socket.socket) -> tuple[int, int, int]:
    """The (pid, uid, gid) the kernel recorded for the peer of `conn` (SO_PEERCRED)."""
    pid, uid, gid = UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size))
    return pid, uid, gid


def read_proc(d: int, name: str) -> str:
    """The whole file `name` beneath the /proc entry whose fd is `d`."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=d)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="surrogateescape")


def status_fields(proc: int) -> dict[str, str]:
    """The fields of the status file of the /proc entry whose fd is `proc`."""
    return dict(line.split(":", 1) for line in read_proc(proc, "status").splitlines() if ":" in line)


class Peer:
    """The process at the other end of a connection (a plain class: the session commands import
    this module, and dataclasses costs a command line ~15 ms)."""

    def __init__(self, pid: int, uid: int, pidfd: int) -> None:
        self.pid = pid
        self.uid = uid
        self.pidfd = pidfd  # owned: close() it

    @classmethod
    def of(cls, conn: socket.socket) -> Self:
        """The peer of `conn` with its pidfd (Unverified if the kernel does not give one)."""
        pid, uid, _ = credentials(conn)
        try:
            pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError as exc:
            raise Unverified(f"no pidfd for the peer, pid {pid} ({exc.strerror})") from None
        return cls(pid=pid, uid=uid, pidfd=pidfd)

    def check_owner(self) -> None:
        """Unverified unless the peer runs as our uid with a pid in our pid namespace."""
        if self.uid != os.getuid():
            raise Unverified(f"uid {self.uid} (pid {self.pid}) is not the owner, uid {os.getuid()}")
        if self.pid <= 0:
            raise Unverified(f"uid {self.uid}: its pid is outside our pid namespace")

    def confirm(self) -> None:
        """OSError unless the peer is still alive (so /proc/PID read so far was its)."""
        import signal

        signal.pidfd_send_signal(self.pidfd, 0)

    def open_proc(self) -> int:
        """An fd of the peer's /proc entry, pinned: opened, then the peer confirmed alive, so the
        directory is its (a pid reused later is another directory; this one's reads then fail).
        OSError if it cannot be."""
        d = os.open(f"/proc/{self.pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self.confirm()
        except OSError:
            os.close(d)
            raise
        return d

    def parent(self) -> int:
        """The peer's parent pid, read through its pinned /proc entry; OSError if it cannot be."""
        d = self.open_proc()
        try:
            stat = read_proc(d, "stat")
        finally:
            os.close(d)
        return int(stat.rsplit(")", 1)[1].split()[1])

    def close(self) -> None:
        """Close the pidfd (idempotent)."""
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
