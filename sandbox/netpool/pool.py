"""The pool: verified, loopback-only network namespaces, leased one tenant at a time.

A `NetnsPool` gets namespaces from its factory (sandbox.netpool.factory),
brings lo up and checks each (sandbox.netpool.baseline) before it enters
the pool, and at release compares it with that baseline, looks for
leftover sockets and rereads its counters (/proc/net/snmp, netstat, snmp6,
dev): clean and untouched, it is leased again; anything else (a tenant that
sent even one packet), it is destroyed and a refill thread makes a
replacement.

Data flow (the factory: SOCK_SEQPACKET, fds by SCM_RIGHTS; leases: in this process):

  factory process (_factory_main.py)     NetnsPool (refill thread)         tenants (sandboxes)
  ----------------------------------     -------------------------         -------------------
  "ready" (+ its userns fd) ---------->
                      <--------------- "new"
  unshare(CLONE_NEWNET), back home
  "ok" + [netns, rtnl, diag] --------->  lo up, baseline taken (rtnl,
                                         diag: no setns needed) -> free
                                         lease() ----------------------->  setns(netns) at start
                                         release() <---------------------  the sandbox ended
                                         unchanged: free again; else
                                         destroyed, "new" for another
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import queue
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import NetnsPoolError
from .baseline import _snapshot, _verify_fresh
from .factory import _NICE, _Factory
from .lease import Lease, ReleaseResult, _check_identity, _inode, _Netns
from .rtnetlink import _bring_lo_up, _links, _Netlink, _sockets

_OWNERS = ("auto", "init", "userns")
# How long the refill thread lets released namespaces gather before it checks them, while the
# pool has namespaces to spare (_spare): one wake-up checks several, and most releases wake nothing.
_GATHER = 0.05
_POOLS: weakref.WeakSet[NetnsPool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    """Safety net: destroy what pools were left open at interpreter exit."""
    for pool in list(_POOLS):
        with contextlib.suppress(Exception):
            pool.close()


def _after_fork_in_child() -> None:
    """A forked child has only the thread that forked: the pools' refill threads are gone, and one
    may have held a pool's lock, or a namespace's, at the fork. Fresh locks let the child close what
    it inherited (netpool's shared pool does on its first use there) instead of waiting forever."""
    for pool in list(_POOLS):
        pool._forget_threads()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _resolve_owner(owner: str) -> str:
    if owner not in _OWNERS:
        raise ValueError(f"owner must be one of {_OWNERS}, not {owner!r}")
    if owner == "auto":
        return "init" if os.geteuid() == 0 else "userns"
    if owner == "init" and os.geteuid() != 0:
        raise ValueError('owner="init" needs root (CAP_SYS_ADMIN in the initial user namespace)')
    return owner


@dataclass
class _Stats:
    created: int = 0
    recycled: int = 0
    leased: int = 0
    fresh_on_empty: int = 0
    create_errors: int = 0
    factory_starts: int = 0
    destroyed: collections.Counter[str] = field(default_factory=collections.Counter)
    last_error: str | None = None


class NetnsPool:
    """A pool of `size` verified, loopback-only network namespaces.

    The pool owns `size` namespaces, idle or leased: a clean one comes back
    at release and is leased again, a dirty one is destroyed and replaced.
    When more than `size` are leased at once, the extra ones are made on the
    spot (`Lease.fresh`) and destroyed at release.

    `owner`: "init" makes namespaces owned by the caller's user namespace
    (needs root), "userns" makes them inside a user namespace the caller
    owns (works unprivileged; also as root), "auto" picks "init" for root.

    `factory`: what starts the factory (factory.adopted: one another process
    started and handed over, in "userns" mode, whose user namespace then
    owns every namespace; `owner` is ignored); default: a process of ours.

    With `refill`, a low-priority background thread makes the namespaces
    (the first ones too: see `wait_filled`) and replaces destroyed ones;
    without it the constructor fills the pool in the calling thread and
    only `fill()` replaces destroyed ones.
    """

    def __init__(self, size: int = 8, *, refill: bool = True, owner: str = "auto",
                 factory: Callable[[], _Factory] | None = None) -> None:
        if size < 0:
            raise ValueError("size must be >= 0")
        self.size = size
        self.owner = "userns" if factory is not None else _resolve_owner(owner)
        self._start_factory = factory or (lambda: _Factory(self.owner))
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        # What wakes the refill thread when it has nothing to do: a namespace released unchecked or
        # destroyed, reserve(), close(). A SimpleQueue's put is one C call, where notify_all() on
        # _cond is a dozen lines of Python on the releasing caller's path; a put before the get
        # is not lost (the get returns at once), and an extra one costs one more look.
        self._kick: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._idle: collections.deque[_Netns] = collections.deque()
        self._leased: set[_Netns] = set()
        self._returned: collections.deque[tuple[Lease, bool, bool]] = collections.deque()  # release(wait=False)
        self._creating = 0
        self._reserved = 0  # namespaces holders keep leased for long (reserve): not counted against size
        self._closed = False
        self._stats = _Stats()
        self._factory: _Factory | None = None
        self._factory_lock = threading.Lock()
        self._own_netns = _inode_of_path("/proc/self/ns/net")
        self._own_userns = _inode_of_path("/proc/self/ns/user")
        self._thread: threading.Thread | None = None
        _POOLS.add(self)
        try:
            if refill:
                self._thread = threading.Thread(target=self._refill_loop, name="netns-pool-refill", daemon=True)
                self._thread.start()
            else:
                self.fill()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ creation

    def _get_factory(self) -> _Factory:
        """The running factory (started, or restarted after it died). Hold _factory_lock."""
        if self._factory is not None and not self._factory.alive():
            self._factory.close()
            self._factory = None
        if self._factory is None:
            self._factory = self._start_factory()
            with self._cond:
                self._stats.factory_starts += 1
        return self._factory

    def _create(self) -> _Netns:
        """Make, configure and verify one namespace, or raise NetnsPoolError."""
        with self._factory_lock:
            for attempt in (1, 2):  # a factory that died since last time is restarted once
                if self._closed:
                    raise NetnsPoolError("the pool is closed")
                factory = self._get_factory()
                try:
                    netns_fd, rtnl_fd, diag_fd, counters = factory.new()
                    break
                except NetnsPoolError:
                    factory.close()
                    self._factory = None
                    if attempt == 2:
                        raise
            userns_fd = os.dup(factory.userns_fd) if factory.userns_fd is not None else None
        ns = _Netns(netns_fd, userns_fd, _Netlink(rtnl_fd), _Netlink(diag_fd), _inode(netns_fd), counters)
        try:
            self._configure(ns, _inode(userns_fd) if userns_fd is not None else self._own_userns)
        except BaseException:
            ns.destroy()
            raise
        with self._cond:
            self._stats.created += 1
        return ns

    def _configure(self, ns: _Netns, owner_ident: tuple[int, int]) -> None:
        """Bring lo up, check everything, record the baseline for later checks."""
        try:
            problems = _check_identity(ns, owner_ident, self._own_netns)
            if not problems:
                links = _links(ns.rtnl)
                if len(links) == 1:
                    _bring_lo_up(ns.rtnl, next(iter(links))[0])
                state = _snapshot(ns.rtnl)
                problems = _verify_fresh(state, _sockets(ns.diag))
                ns.counters_baseline = ns.read_counters()
                ns.sockstat_baseline = ns.read_sockstat()
        except (OSError, ValueError, struct.error) as e:
            raise NetnsPoolError(f"configuring a new network namespace failed: {e}") from e
        if problems:
            raise NetnsPoolError("a new network namespace failed verification: " + "; ".join(problems))
        ns.baseline = state

    def fill(self) -> None:
        """Create namespaces in the calling thread until the pool has `size` (idle or leased)."""
        while True:
            with self._cond:
                self._check_open()
                if self._total() >= self.size:
                    return
                self._creating += 1
            try:
                ns = self._create()
            finally:
                with self._cond:
                    self._creating -= 1
            self._put_idle(ns)

    def _total(self) -> int:
        """Namespaces the pool has: idle, leased and being made, less those
        reserved by long holders. Hold _cond."""
        return len(self._idle) + len(self._leased) + self._creating - self._reserved

    def reserve(self, n: int) -> None:
        """Say that `n` more leases (fewer, if negative) are held for long:
        a sandbox.Template keeps one in each standby sandbox for its life.
        The pool makes as many more, so that other tenants still find `size`."""
        with self._cond:
            self._reserved = max(0, self._reserved + n)
        self._kick.put(None)

    def _put_idle(self, ns: _Netns) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(ns)
                self._cond.notify_all()
                return
        ns.destroy()

    def wait_filled(self, timeout: float | None = None) -> bool:
        """Wait until `size` namespaces are idle; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._closed or len(self._idle) >= self.size, timeout) \
                and not self._closed

    # ------------------------------------------------------------ refill

    def _refill_loop(self) -> None:
        """Keep the pool at `size`: sleep until a namespace comes back
        unchecked (release(wait=False): check it) or is destroyed (or the
        pool is still filling: make one), repeat. Failures back off (up to
        5 s) instead of spinning, and wake lease() waiters so they make
        their own."""
        with contextlib.suppress(OSError):
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + _NICE))
        backoff = 0.0
        gathered = False
        while True:
            with self._cond:
                if self._closed:
                    return
                gathered = gathered and bool(self._returned)
                gather = bool(self._returned) and not gathered and len(self._idle) >= self._spare()
                returned = self._returned.popleft() if self._returned and not gather else None
                full = returned is None and (gather or self._total() >= self.size)
                if not full and returned is None:
                    self._creating += 1
            if gather:
                gathered = True
                with contextlib.suppress(queue.Empty):
                    self._kick.get(timeout=_GATHER)  # cut short by lease() when the idle run low, or close()
                continue
            if full:
                self._kick.get()  # nothing to do until then
                continue
            if returned is not None:
                lease, recycle, unprivileged_tenant = returned
                lease.result = self._release(lease._ns, recycle, unprivileged_tenant)
                continue
            try:
                ns: _Netns | None = self._create()
            except Exception as e:  # recorded; retried after a backoff
                ns = None
                error = str(e)
            with self._cond:
                self._creating -= 1
                if ns is None and self._closed:
                    return
                if ns is None:
                    self._stats.create_errors += 1
                    self._stats.last_error = error
                    self._cond.notify_all()
                    backoff = min(max(0.05, backoff * 2), 5.0)
                    self._cond.wait_for(lambda: self._closed, backoff)
                    continue
                backoff = 0.0
            self._put_idle(ns)

    # ------------------------------------------------------------ leases

    def _check_open(self) -> None:
        if self._closed:
            raise NetnsPoolError("the pool is closed")
        if os.getpid() != self._pid:
            raise NetnsPoolError("the pool belongs to the parent process")

    def lease(self, timeout: float | None = 0.0) -> Lease:
        """Exclusive use of one verified namespace.

        With none idle: `timeout` 0 (the default) makes a fresh one at once,
        in this thread (`Lease.fresh`); a positive `timeout` first waits that
        long for one to come back (refill or release); None waits as long as
        that takes. A failing refill wakes waiters, which then try a fresh
        namespace themselves (raising NetnsPoolError if that fails too).
        """
        if timeout is not None and timeout < 0:
            raise ValueError("timeout must be >= 0 or None")
        idle = None
        with self._cond:
            self._check_open()
            if self._idle:  # the usual case: one lock round trip
                idle = self._idle.popleft()
                self._leased.add(idle)
                self._stats.leased += 1
                low = bool(self._returned) and len(self._idle) < self._spare()
            else:
                low = bool(self._returned)
            if low:
                self._kick.put(None)  # stop gathering: check what came back now
            if idle is not None:
                return Lease(self, idle, False)
            ns = self._take_idle(timeout)
        fresh = ns is None
        if ns is None:
            ns = self._create()
        with self._cond:
            if self._closed:
                ns.destroy()
                raise NetnsPoolError("the pool is closed")
            self._leased.add(ns)
            self._stats.leased += 1
            self._stats.fresh_on_empty += fresh
        return Lease(self, ns, fresh)

    def _take_idle(self, timeout: float | None) -> _Netns | None:
        """Pop an idle namespace, waiting up to `timeout` for one. Hold _cond."""
        deadline = None if timeout is None else time.monotonic() + timeout
        errors = self._stats.create_errors
        while not self._idle:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self._cond.wait(remaining)
            self._check_open()
            if not self._idle and self._stats.create_errors != errors:
                return None  # the refill is failing: try ourselves, and raise
        return self._idle.popleft()

    def _defer(self, lease: Lease, recycle: bool, unprivileged_tenant: bool = False) -> bool:
        """Queue a released namespace for the refill thread to check; False if there is none."""
        with self._cond:
            if self._thread is None or self._closed:
                return False
            self._returned.append((lease, recycle, unprivileged_tenant))
            first = len(self._returned) == 1
        if first:  # the refill thread is idle, or about to look again: those after this one gather
            self._kick.put(None)
        return True

    def _spare(self) -> int:
        """How many idle namespaces let the refill thread gather returns before it checks them."""
        return max(1, self.size // 4)

    def _release(self, ns: _Netns, recycle: bool, unprivileged_tenant: bool = False) -> ReleaseResult:
        """Check a returned namespace; recycle it if clean, destroy it if not."""
        with self._cond:
            if ns.closed:  # close() got it first
                return ReleaseResult(False, ("closed",), ("the pool is closed",))
            closed = self._closed or os.getpid() != self._pid
        if closed:
            problems = [("closed", "the pool is closed")]
        elif not recycle:
            problems = [("discarded", "released with recycle=False")]
        else:
            problems = ns.inspect(unprivileged_tenant)
        with self._cond:
            self._leased.discard(ns)
            if not problems and self._total() >= self.size:
                problems = [("surplus", "the pool is full")]
            if problems:
                self._stats.destroyed[problems[0][0]] += 1
            elif not self._closed:
                self._idle.append(ns)
                self._stats.recycled += 1
                self._cond.notify_all()
                return ReleaseResult(True)
        ns.destroy()
        self._kick.put(None)  # the refill thread makes a replacement
        return ReleaseResult(False, tuple(r for r, _ in problems), tuple(d for _, d in problems))

    # ------------------------------------------------------------ state

    def stats(self) -> dict[str, Any]:
        """Counters: created, recycled, destroyed (total and by_reason), leased,
        fresh_on_empty; idle, in_use and unchecked (released with wait=False,
        not checked yet) now; refill errors and factory starts."""
        with self._cond:
            s = self._stats
            return {
                "size": self.size, "reserved": self._reserved, "owner": self.owner, "idle": len(self._idle),
                "in_use": len(self._leased) - len(self._returned), "unchecked": len(self._returned),
                "created": s.created, "recycled": s.recycled, "destroyed": sum(s.destroyed.values()),
                "destroyed_by_reason": dict(s.destroyed), "leased": s.leased, "fresh_on_empty": s.fresh_on_empty,
                "create_errors": s.create_errors, "last_error": s.last_error, "factory_starts": s.factory_starts,
            }

    @property
    def owner_pid(self) -> int:
        """The process that made the pool (a forked child must not use it)."""
        return self._pid

    def has_idle(self) -> bool:
        """Whether a namespace is ready to lease without waiting (one read of the deque's
        length, atomic under the GIL: no lock round trip; the next moment may differ either way)."""
        return bool(self._idle)

    @property
    def factory_pid(self) -> int | None:
        """Pid of the running factory process, if any."""
        factory = self._factory
        return factory.proc.pid if factory is not None and factory.alive() else None

    @property
    def closed(self) -> bool:
        return self._closed

    def _forget_threads(self) -> None:
        """In a forked child (see _after_fork_in_child): no refill thread, and locks nobody holds."""
        self._cond = threading.Condition(threading.Lock())
        self._kick = queue.SimpleQueue()
        self._factory_lock = threading.Lock()
        self._thread = None
        for ns in (*self._idle, *self._leased):
            ns._closing = threading.Lock()

    def close(self) -> None:
        """Destroy every namespace (leased ones too), end the factory, join the thread."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            doomed = list(self._idle) + list(self._leased)
            self._stats.destroyed["closed"] += len(doomed)
            self._idle.clear()
            self._leased.clear()
            self._returned.clear()
            self._cond.notify_all()
        self._kick.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        for ns in doomed:
            ns.destroy()
        with self._factory_lock:
            if self._factory is not None:
                if os.getpid() == self._pid:
                    self._factory.close()
                else:
                    self._factory.forget()
                self._factory = None
        _POOLS.discard(self)

    def __enter__(self) -> NetnsPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # An unreachable pool has no refill thread (it would reference it)
        # and nobody holds its locks: closing here cannot deadlock.
        if not getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                self.close()

    def __repr__(self) -> str:
        s = self.stats()
        return f"<NetnsPool owner={self.owner} size={self.size} idle={s['idle']} in_use={s['in_use']}>"


def _inode_of_path(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino
