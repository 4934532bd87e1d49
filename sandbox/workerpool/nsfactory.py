"""The zygote's network namespace factory (see zygote.py and sandbox/netpool).

Loaded by path in the zygote (stdlib only). A WorkerPool's tasks run in
namespaces the caller's NetnsPool leases; the pool's factory is started
here, as a child of the zygote inside its sandbox, so that the user
namespace Q it makes (and which owns every namespace it makes) is a child
of the zygote's user namespace Z, made by the zygote's euid: the zygote,
capability-free in Z, then holds every capability in Q (the kernel's owner
rule) and can join Q and a namespace of it for a fork
(sbx_fork_sandbox_ns), while the task's own user namespace, made inside Q,
holds none over it. The caller gets the factory's channel with READY and
speaks to it as to any factory (sandbox.netpool.factory.adopted).
"""

from __future__ import annotations

import ctypes
import os
import socket
from types import ModuleType

PR_SET_PDEATHSIG = 1
NICE = "10"  # as sandbox.netpool.factory's: it yields to the tasks
TCP_HASH_ENTRIES = "4096"


def start(program: ModuleType) -> tuple[socket.socket, int]:
    """Fork the factory (`program`: netpool/_factory_main.py, loaded by path)
    in "userns" mode: (our end of its channel, its pid). The child keeps no
    fd but its end (the zygote's control socket, a task's fds: none reach
    it), dies with the zygote, and exits at EOF on its channel."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the factory's own process
        code = 1
        try:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 9)  # SIGKILL
            if os.getppid() != zygote:  # it died before the death signal was asked for
                os._exit(1)
            keep = theirs.fileno()
            os.closerange(3, keep)
            os.closerange(keep + 1, 1 << 20)
            code = program.main(["", "", str(keep), "userns", NICE, TCP_HASH_ENTRIES])
        finally:
            os._exit(code)
    theirs.close()
    return mine, pid
