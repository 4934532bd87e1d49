"""Small helpers over /proc and fds for driving bwrap from outside."""

from __future__ import annotations

import os
import select


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
