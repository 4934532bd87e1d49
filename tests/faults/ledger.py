"""What a process holds that a sandbox start could leak: fds, threads,
children, mounts (its own: under its own directories), namespace fds,
network namespace pool leases, memory.

`Ledger.take()` counts them; `Ledger.leaks(before, after)` says what grew.
Used by the fault-injection helper (tests/faults/inject.py) and by the soak
benchmark (benchmarks/soak.py), which imports this file by path.

Pools keep namespaces (and their fds) across sandboxes by design; the
ledger waits for the shared pool to be full and idle before counting, so a
recycle or refill in flight is not taken for a leak, and reports the
pool's own books (size, idle, leased) next to the fd counts.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any


def _children() -> list[int]:
    """This process's live children (every thread's), zombies included."""
    out: list[int] = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return sorted(out)


def _fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return out


def _mounts() -> list[str]:
    """This process's mounts at or below its own directories (`_own`), without their ids."""
    with open("/proc/self/mountinfo") as f:
        lines = [line.split(" ", 2)[2] for line in f]
    return sorted(line for line in lines if _own(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)),
                                                         line.split(" ")[2])))


def _own(path: str) -> bool:
    """Whether a mount at `path` can be this process's doing: in this pytest session's basetemp
    (tests/leakcheck.py's OWN_ROOTS, when it is loaded) or in a folder the package or the tests
    make in the temporary directory. Never the host's whole table: another job's mounts come and go."""
    leakcheck = sys.modules.get("leakcheck")
    roots = list(getattr(leakcheck, "OWN_ROOTS", ()))
    if any(path == root or path.startswith(root + "/") for root in roots):
        return True
    tmp = tempfile.gettempdir().rstrip("/") + "/"
    return path.startswith(tmp) and path[len(tmp):].startswith(("sandbox-", "sbx"))


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _long_lived(pid: int) -> bool:
    """A helper that lives as long as what keeps it, by design: the pool's
    factory, or a template kept for `spawn(..., backend="template")`."""
    from sandbox.backends.template import KEPT_MARKER
    from sandbox.netpool import FACTORY_MARKER

    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return FACTORY_MARKER.encode() in argv or argv[0] == KEPT_MARKER.encode()


def pool_books() -> dict[str, Any]:
    """The shared pool's size, idle and in-use counts (empty when there is none)."""
    from sandbox import netpool

    pool = netpool.shared_pool()
    if pool is None:
        return {}
    stats = pool.stats()
    return {k: stats[k] for k in ("size", "reserved", "idle", "in_use", "unchecked") if k in stats}


def settle(timeout: float = 15.0) -> None:
    """Wait until the shared pool is full and idle and no child is left but its factory."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        books = pool_books()
        # leased only to long holders: kept Templates' standbys (NetnsPool.reserve)
        pool_ok = not books or (books["idle"] == books["size"] and books["in_use"] == books.get("reserved", 0)
                                and books.get("unchecked", 0) == 0)
        kids = [p for p in _children() if not _long_lived(p)]
        if pool_ok and not kids:
            return
        time.sleep(0.02)


@dataclass
class Ledger:
    """One count of what this process holds."""

    fds: dict[int, str]
    threads: int
    children: list[int]
    mounts: list[str]
    pool: dict[str, Any]
    rss_kb: int
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def take(cls, wait: bool = True) -> Ledger:
        """Count now (after `settle()` unless `wait` is false)."""
        if wait:
            settle()
        kids = [p for p in _children() if not _long_lived(p)]
        return cls(_fds(), len(os.listdir("/proc/self/task")), kids, _mounts(), pool_books(), _rss_kb())

    def namespaces(self) -> set[str]:
        """The namespace fds among `fds` ("net:[4026...]")."""
        return {t for t in self.fds.values()
                if t.endswith("]") and ":[" in t and not t.startswith(("socket:", "pipe:", "anon_inode:"))}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def leaks(before: Ledger, after: Ledger, rss_bound_kb: int | None = None) -> list[str]:
    """What `after` holds that `before` did not, in words (empty: nothing leaked).

    The pool's own namespace fds are accounted by its books (size, idle):
    a pool that kept its size and has nothing leased holds no tenant's
    namespace, whichever namespaces it now holds.
    """
    out = []
    pool_fds = len(after.namespaces()) - len(before.namespaces())
    fd_growth = len(after.fds) - len(before.fds)
    if before.pool and after.pool and after.pool.get("size") == before.pool.get("size"):
        fd_growth -= pool_fds  # a recycled namespace may hold other fd numbers; the count is what matters
    elif pool_fds > 0:
        out.append(f"namespace fds grew by {pool_fds}")
    if fd_growth > 0:
        new = {fd: t for fd, t in after.fds.items() if before.fds.get(fd) != t}
        out.append(f"fds grew by {fd_growth}: {sorted(new.items())[:10]}")
    if after.threads > before.threads:
        out.append(f"threads grew from {before.threads} to {after.threads}")
    extra_kids = sorted(set(after.children) - set(before.children))
    if extra_kids:
        out.append(f"child processes left: {extra_kids}")
    new_mounts = sorted(set(after.mounts) - set(before.mounts))
    if new_mounts:
        out.append(f"mounts left: {new_mounts[:5]}")
    if before.pool != after.pool:
        out.append(f"pool books changed: {before.pool} -> {after.pool}")
    if rss_bound_kb is not None and after.rss_kb - before.rss_kb > rss_bound_kb:
        out.append(f"RSS grew by {after.rss_kb - before.rss_kb} kB (bound {rss_bound_kb} kB)")
    return out
