"""Where the processes of one task sandbox reach its broker: a socket inside that sandbox.

The way ssh-agent is reached through SSH_AUTH_SOCK: SANDBOX_TASK_BROKER
names a path inside the sandbox (INSIDE), at which its broker's listening
socket is bound, so any process of the sandbox can ask, whatever fds its
parents closed (Python's subprocess closes every inherited one by default).

The socket is made on the host, in a fresh directory of the caller's own
(mkdtemp: a new random name, mode 0700, so no other user can reach it or
plant anything in it), and bound into the sandbox read-only at INSIDE, in
the sandbox's fresh root before any of its grants (a grant over /run hides
it rather than having a directory made in a host path). Once the sandbox is
set up its host path is removed: the socket is then reached only through
that sandbox's own mount namespace (connect() finds a socket by its inode,
which the mount keeps). Not an abstract socket: those are named per network
namespace, and a sandbox with the host's network (`network="open"`) shares
the host's, where every other sandbox of that kind and every local user
could connect to it.

Whoever connects, the broker serves only processes of its own sandbox (by
the credentials and the pidfd the kernel attaches to each message: wire.py),
and what it starts can only narrow that sandbox (narrow.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile

from . import wire

INSIDE = "/run/sandbox/task-broker"  # the socket's path in every confined task sandbox


class BrokerSocket:
    """A listening socket at `path`, in a private directory of its own, until unlink()."""

    def __init__(self) -> None:
        # A socket's path holds at most 107 bytes: a long TMPDIR falls back to /tmp.
        base = tempfile.gettempdir() if len(tempfile.gettempdir()) <= 60 else "/tmp"
        self._dir: str | None = tempfile.mkdtemp(prefix="sandbox-task-broker-", dir=base)
        self.path = os.path.join(self._dir, "socket")
        try:
            self.sock: socket.socket = wire.listener(self.path)
        except BaseException:
            self.unlink()
            raise

    def unlink(self) -> None:
        """Remove the host path (the socket stays reachable where it is mounted)."""
        if self._dir is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)
        self._dir = None

    def close(self) -> None:
        """Stop listening: connections not yet accepted are refused, with what they carried."""
        self.unlink()
        self.sock.close()
