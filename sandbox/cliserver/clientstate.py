"""The client's process state as the CLI server reads it through the client's /proc entry.

Shared by the worker (worker.py: it takes that state on) and by the rehearsal (rehearse.py), which runs
the same reads ahead of time; a `Fallback` hands the command line back to the client.
"""

from __future__ import annotations

import os
import resource

F_SETOWN_EX, F_OWNER_TID = 15, 0  # <asm-generic/fcntl.h>: SIGIO for one thread


class Fallback(Exception):
    """The worker cannot be what the client's Python CLI would be: the client runs it itself."""


LIMITS = {  # /proc/PID/limits' names, and their RLIMIT_* numbers (<asm-generic/resource.h>)
    "Max cpu time": 0, "Max file size": 1, "Max data size": 2, "Max stack size": 3, "Max core file size": 4,
    "Max resident set": 5, "Max processes": 6, "Max open files": 7, "Max locked memory": 8,
    "Max address space": 9, "Max file locks": 10, "Max pending signals": 11, "Max msgqueue size": 12,
    "Max nice priority": 13, "Max realtime priority": 14, "Max realtime timeout": 15,
}


def client_limits(proc: int) -> dict[int, tuple[int, int]]:
    """The rlimits (soft, hard) of the process whose /proc entry's fd is `proc`."""
    out = {}
    for line in read_at(proc, "limits").splitlines()[1:]:
        name = line[:26].strip()
        if name in LIMITS:
            soft, hard = line[26:].split()[:2]
            out[LIMITS[name]] = tuple(resource.RLIM_INFINITY if v == "unlimited" else int(v) for v in (soft, hard))
    if len(out) != len(LIMITS):
        raise Fallback(f"the client's /proc limits list {len(out)} of {len(LIMITS)} limits")
    return out  # type: ignore[return-value]


def read_at(proc: int, name: str) -> str:
    """The file `name` of the /proc entry whose fd is `proc`, as text (at most 64 KiB)."""
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        return os.read(fd, 1 << 16).decode(errors="surrogateescape")
    finally:
        os.close(fd)
