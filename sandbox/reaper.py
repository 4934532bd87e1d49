"""Reaping in the background: a sandbox's pid 1 whose status the caller already has.

sandbox-init writes the command's wait status once every other process of
the sandbox has gone, then exits. Its exit is where the kernel tears the
sandbox's namespaces down (a mount namespace's mounts one by one), which the
caller's wait need not sit through; but that pid 1 is the caller's child and
must still be reaped. One daemon thread does it, in turn: each pid it is
given is already on its way out (nothing inside can stop a pid 1), and it
holds no fd meanwhile.
"""

from __future__ import annotations

import os
import queue
import threading

__all__ = ["reap_later"]

_lock = threading.Lock()
_pids: queue.SimpleQueue[int] = queue.SimpleQueue()
_owner = -1  # the process whose reaper thread runs (a fork's child starts its own)


def reap_later(pid: int) -> None:
    """Reap our child `pid` (exiting, or exited) without waiting for it here."""
    global _owner
    try:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
    except ChildProcessError:  # reaped already (a SIGCHLD handler's waitpid(-1), say)
        return
    with _lock:
        if _owner != os.getpid():
            _owner = os.getpid()
            threading.Thread(target=_loop, name="sandbox-reaper", daemon=True).start()
    _pids.put(pid)


def _loop() -> None:
    while True:
        pid = _pids.get()
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped elsewhere, or a pid of the process this one forked from
            pass
