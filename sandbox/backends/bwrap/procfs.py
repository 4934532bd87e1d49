"""Small helpers over /proc and fds for driving bwrap from outside."""

from __future__ import annotations

import os
import select
import signal


def _readable(fds: list[int], timeout: float | None) -> set[int]:
    """Which of `fds` are readable (or hung up) within `timeout` seconds (None: wait)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    ms = None if timeout is None else max(0, int(timeout * 1000))
    return {fd for fd, _ in poller.poll(ms)}


def _std(fd: int) -> int | None:
    return None if fd < 0 else fd


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _first_child(pid: int) -> int | None:
    """The oldest child of `pid` (bwrap's reaper forks the command once)."""
    path = f"/proc/{pid}/task/{pid}/children"
    if os.path.exists(path) or not os.path.exists(f"/proc/{pid}"):
        text = _read(path).split()
        return int(text[0]) if text else None
    return _child_by_scan(pid)  # a kernel without CONFIG_PROC_CHILDREN


def _child_by_scan(parent: int) -> int | None:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat_text = _read(f"/proc/{name}/stat")
            fields = stat_text[stat_text.rfind(b")") + 2:].split()
            if len(fields) > 1 and int(fields[1]) == parent:
                found.append(int(name))
    return min(found) if found else None


def _parent(pid: int) -> int | None:
    """The parent pid of `pid` (None when it is gone)."""
    stat_text = _read(f"/proc/{pid}/stat")
    fields = stat_text[stat_text.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None


def _kill_orphans(cmdline: bytes) -> int:
    """SIGKILL the processes left running `cmdline` (bwrap's, NUL-separated) whose
    bwrap is gone: their parent is neither this process nor a process running it.

    bwrap's sandbox child waits for its parent's go-ahead (an eventfd) before it
    sets its parent-death signal; a bwrap that dies before then (a failed
    capset or prctl in its monitor) leaves it waiting forever, reparented to
    init. Returns how many were killed.
    """
    me, killed = os.getpid(), 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or _read(f"/proc/{name}/cmdline") != cmdline:
            continue
        pid = int(name)
        parent = _parent(pid)
        if parent is None or parent == me or _read(f"/proc/{parent}/cmdline") == cmdline:
            continue
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if _read(f"/proc/{pid}/cmdline") == cmdline:  # still it, now pinned by the pidfd
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return killed
