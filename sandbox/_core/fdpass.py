"""File descriptors and credentials over Unix sockets: the one sender and receiver every wire uses.

The kernel carries fds as SCM_RIGHTS control messages: it installs each one
in the receiver as it reads the message, and drops those that do not fit the
room the receiver made (flagging MSG_CTRUNC), so a receiver that makes room
for `maxfds` never holds more. With MSG_CMSG_CLOEXEC they arrive
close-on-exec (Python 3.11's socket.recv_fds ignores the flags it is given,
hence this module). A socket with SO_PASSCRED gets the sender's pid, uid and
gid with each message (SCM_CREDENTIALS, translated into the receiver's
namespaces), which the sender cannot forge; one with SO_PASSPIDFD (Linux
6.5) gets a pidfd of that same process too (SCM_PIDFD, close-on-exec),
which names it even once its pid is reused. workerpool/channel.py keeps a
copy of its own on purpose: the zygote loads it by path.
"""

from __future__ import annotations

import array
import errno
import functools
import socket
import struct

UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
FD_SIZE = array.array("i").itemsize
SO_PASSPIDFD = getattr(socket, "SO_PASSPIDFD", 76)  # Linux 6.5; Python 3.11 does not name them
SCM_PIDFD = getattr(socket, "SCM_PIDFD", 4)

__all__ = ["SCM_PIDFD", "SO_PASSPIDFD", "UCRED", "attaches_pidfds", "recv_fds", "recv_with_credentials",
           "send_fds"]


@functools.cache
def attaches_pidfds() -> bool:
    """Whether this kernel attaches a pidfd of the sender to each message (SO_PASSPIDFD: Linux 6.5)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        a.setsockopt(socket.SOL_SOCKET, SO_PASSPIDFD, 1)
    except OSError as exc:
        if exc.errno != errno.ENOPROTOOPT:
            raise
        return False
    finally:
        a.close()
        b.close()
    return True


def send_fds(sock: socket.socket, data: bytes, fds: list[int] | tuple[int, ...] = (), flags: int = 0) -> int:
    """Send `data` as one message with `fds` (duplicated into the receiver) on its first byte; the bytes sent."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
    return sock.sendmsg([data], ancillary, flags)


def recv_fds(sock: socket.socket, bufsize: int, maxfds: int, flags: int = 0) -> tuple[bytes, list[int], int]:
    """One read of at most `bufsize` bytes with room for `maxfds` fds, `flags` applied (MSG_PEEK,
    MSG_CMSG_CLOEXEC, ...): (data, fds, msg_flags). The caller owns the fds, and checks
    msg_flags for MSG_TRUNC and MSG_CTRUNC (fds beyond `maxfds`, dropped by the kernel)."""
    data, fds, msg_flags, _, _ = recv_with_credentials(sock, bufsize, maxfds, flags, credentials=False)
    return data, fds, msg_flags


def recv_with_credentials(sock: socket.socket, bufsize: int, maxfds: int, flags: int = 0, *, credentials: bool = True
                          ) -> tuple[bytes, list[int], int, tuple[int, int, int] | None, int]:
    """As recv_fds, and the sender's (pid, uid, gid) from SCM_CREDENTIALS (None if none came:
    the socket has no SO_PASSCRED) and a pidfd of it from SCM_PIDFD (owned by the caller; -1 if
    none came: no SO_PASSPIDFD, or a kernel that had none to give for a sender already reaped)."""
    room = socket.CMSG_SPACE(maxfds * FD_SIZE) if maxfds else 0
    if credentials:
        room += socket.CMSG_SPACE(UCRED.size) + socket.CMSG_SPACE(FD_SIZE)
    data, ancillary, msg_flags, _ = sock.recvmsg(bufsize, room, flags)
    fds = array.array("i")
    creds = None
    pidfd = -1
    for level, kind, payload in ancillary:
        if level != socket.SOL_SOCKET:
            continue
        if kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % FD_SIZE])
        elif kind == socket.SCM_CREDENTIALS and len(payload) >= UCRED.size:
            pid, uid, gid = UCRED.unpack(payload[:UCRED.size])
            creds = (pid, uid, gid)
        elif kind == SCM_PIDFD and len(payload) >= FD_SIZE and pidfd < 0:
            pidfd = array.array("i", payload[:FD_SIZE])[0]
    return data, list(fds), msg_flags, creds, pidfd
