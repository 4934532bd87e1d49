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
compat/handoff.py: a child of this process; task/broker.py: a descendant of
its sandbox's first process, `Peer.descends_from`).

A message's sender can differ from the socket's (a connection is an fd, and
fds are handed on): a socket with SO_PASSCRED and SO_PASSPIDFD gets, with
each message, its sender's credentials and a pidfd of the same process
(SCM_CREDENTIALS, SCM_PIDFD: Linux 6.5), from which `Peer.of_sender` makes
the same Peer. A sender that has already been reaped comes with a pidfd
that no longer names a process (6.16) or with none (MSG_CTRUNC before), so
it is never confirmed.
"""

from __future__ import annotations

import os
import socket

from .fdpass import UCRED

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from typing import Self

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux 6.5

MAX_ANCESTORS = 4096  # parent links followed at most (a pid namespace nests at most 32 deep; a chain is longer)

__all__ = ["SO_PEERPIDFD", "Peer", "Unverified", "child_pidfd", "credentials", "read_proc", "status_fields"]


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

    @classmethod
    def of_sender(cls, creds: tuple[int, int, int], pidfd: int, by_pid: bool = False) -> Self:
        """The sender of one message from its (pid, uid, gid) and pidfd (SCM_CREDENTIALS, SCM_PIDFD;
        `pidfd` is owned; -1: none came, and the Peer is never confirmed). `by_pid`: the kernel attaches
        no pidfd (before 6.5), so one is opened from the pid now: a sender that ended and whose pid was
        taken by another process in the instant since would be judged as that process (a pid's strength,
        what a receiver had before SCM_PIDFD)."""
        pid, uid, _ = creds
        if pidfd < 0 and by_pid:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                pidfd = -1
        return cls(pid=pid, uid=uid, pidfd=pidfd)

    def check_owner(self) -> None:
        """Unverified unless the peer runs as our uid with a pid in our pid namespace."""
        if self.uid != os.getuid():
            raise Unverified(f"uid {self.uid} (pid {self.pid}) is not the owner, uid {os.getuid()}")
        if self.pid <= 0:
            raise Unverified(f"uid {self.uid}: its pid is outside our pid namespace")

    def confirm(self) -> None:
        """OSError unless the peer is still alive (so /proc/PID read so far was its)."""
        _signal0(self.pidfd)

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
            return _ppid(d)
        finally:
            os.close(d)

    def descends_from(self, ancestor: int, ancestor_pidfd: int) -> bool:
        """Whether the peer is process `ancestor` or descends from it, by parent links read through
        /proc; `ancestor_pidfd` is a pidfd of `ancestor` opened before the peer spoke (so while it
        lives, that pid is the ancestor's). Each process on the way is held by a pidfd while its
        entry is read, and each parent link is read again once the parent's pidfd is open: a parent
        that ended meanwhile has had its children given to another, so a pid reused on the way is
        never followed. Unverified if the peer itself cannot be confirmed (it has ended: its pid may
        name another process now)."""
        if self.pidfd < 0:
            raise Unverified(f"pid {self.pid}: the kernel gave no pidfd of it (Linux 6.5+), so its pid proves nothing")
        try:
            _signal0(self.pidfd)
        except OSError:
            raise Unverified(f"pid {self.pid} has ended: its pid may name another process now") from None
        pid, pidfd = self.pid, self.pidfd
        try:
            for _ in range(MAX_ANCESTORS):
                if pid == ancestor:
                    return _alive(ancestor_pidfd)
                parent, parent_fd = _parent_held(pid, pidfd)
                if pidfd != self.pidfd:
                    os.close(pidfd)
                pid, pidfd = parent, parent_fd
                if pidfd < 0:
                    return False
        except (OSError, ValueError, IndexError):  # ended on the way, or a stat that does not parse
            return False
        finally:
            if pidfd not in (self.pidfd, -1):
                os.close(pidfd)
        return False

    def close(self) -> None:
        """Close the pidfd (idempotent)."""
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1


def _signal0(pidfd: int) -> None:
    """OSError unless the process of `pidfd` has not been reaped (its pid is still its own)."""
    import signal  # on first use: 1.6 ms (it loads enum), -X importtime; every session command line imports this module

    signal.pidfd_send_signal(pidfd, 0)


def _alive(pidfd: int) -> bool:
    try:
        _signal0(pidfd)
    except OSError:
        return False
    return True


def _ppid(proc: int) -> int:
    return int(read_proc(proc, "stat").rsplit(")", 1)[1].split()[1])


def child_pidfd(pid: int, parent: int) -> int:
    """A pidfd of `pid` if it is a child of `parent`, else -1 (it has gone). `parent` is our child, not yet
    reaped, so its pid is its own; a process found with it as parent after the pidfd was opened is the one
    the pidfd names (its pid, once freed, would have to be taken by another child of `parent`)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return -1
    try:
        proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            ppid = _ppid(proc)
        finally:
            os.close(proc)
    except (OSError, ValueError, IndexError):
        ppid = -1
    if ppid != parent:
        os.close(fd)
        return -1
    return fd


def _parent_held(pid: int, pidfd: int) -> tuple[int, int]:
    """(parent pid, a pidfd of it) of the process `pid`, held by `pidfd`: (0, -1) where the chain ends
    (pid 1, a parent outside our pid namespace); OSError if the process has ended."""
    proc = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _signal0(pidfd)  # so `proc` is this process's entry (its reads fail once it is reaped)
        for _ in range(8):  # a parent that ends between the two reads: the new one is read again
            parent = _ppid(proc)
            if parent <= 0:
                return 0, -1
            try:
                parent_fd = os.pidfd_open(parent)
            except ProcessLookupError:
                continue
            # The parent held, the link read again: had that parent ended, this process would have a new one.
            if _ppid(proc) == parent:
                return parent, parent_fd
            os.close(parent_fd)
        return 0, -1
    finally:
        os.close(proc)
