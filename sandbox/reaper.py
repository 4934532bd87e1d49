"""Reaping in the background: a sandbox's pid 1 whose status the caller already has.

sandbox-init writes the command's wait status once every other process of
the sandbox has gone, then exits. Its exit is where the kernel tears the
sandbox's namespaces down (a mount namespace's mounts one by one), which the
caller's wait need not sit through; but that pid 1 is the caller's child and
must still be reaped. One daemon thread does it, in turn: each pid it is
given is already on its way out (nothing inside can stop a pid 1), and it
holds no fd meanwhile. A pid 1 another process reaps (a Template's sandbox)
is known by a pidfd: the same thread waits for its exit (`after_exit`) to
run what must wait for it (removing its cgroup), holding that pidfd alone.
"""

from __future__ import annotations

import os
import queue
import select
import threading
from collections.abc import Callable

__all__ = ["after_exit", "reap_later"]

_lock = threading.Lock()
# (pid, then, pidfd): a child to reap (pidfd -1), or a pidfd to wait on (pid -1)
_pids: queue.SimpleQueue[tuple[int, Callable[[], None] | None, int]] = queue.SimpleQueue()
_owner = -1  # the process whose reaper thread runs


def reap_later(pid: int, then: Callable[[], None] | None = None) -> None:
    """Reap our child `pid` (exiting, or exited) without waiting for it here;
    `then()` runs once it is reaped (removes the sandbox's cgroup, say)."""
    if not _thread_running():  # the interpreter is exiting: no thread can start, so wait here
        _reap(pid, then)
        return
    try:
        reaped = os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:  # reaped already (a SIGCHLD handler's waitpid(-1), say)
        reaped = True
    if reaped:
        if then is not None:
            then()
        return
    _pids.put((pid, then, -1))


def after_exit(pidfd: int, then: Callable[[], None]) -> None:
    """Run `then()` once the process of `pidfd` (exiting; not necessarily our
    child) has exited, without waiting here; `pidfd` is ours to close."""
    if not _thread_running():
        _reap(-1, then, pidfd)
        return
    _pids.put((-1, then, pidfd))


def _thread_running() -> bool:
    """Start the thread once per process: the first call does, whether or not it has a pid to
    wait for, so that a process's threads are the same after its first sandbox as after the rest."""
    global _owner
    with _lock:
        if _owner != os.getpid():
            try:
                threading.Thread(target=_loop, name="sandbox-reaper", daemon=True).start()
            except RuntimeError:
                return False
            _owner = os.getpid()
    return True


def _loop() -> None:
    while True:
        _reap(*_pids.get())


def _reap(pid: int, then: Callable[[], None] | None = None, pidfd: int = -1) -> None:
    if pidfd >= 0:
        try:
            while not select.select([pidfd], [], [], 5.0)[0]:
                pass  # a pid 1 whose sandbox is on its way out: it cannot stay
        finally:
            os.close(pidfd)
    else:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped elsewhere
            pass
    if then is not None:
        try:
            then()
        except Exception:  # a cleanup that failed leaves its leftovers to the next sweep
            pass


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads, nor its children: start afresh."""
    global _lock, _pids, _owner
    _lock, _pids, _owner = threading.Lock(), queue.SimpleQueue(), -1


os.register_at_fork(after_in_child=_after_fork_in_child)
