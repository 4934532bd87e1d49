"""One pooled namespace (`_Netns`: the fds that keep it alive, its baseline)
and the lease a tenant holds on it (`Lease`, `ReleaseResult`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import NetnsPoolError
from ._factory_main import COUNTER_FILES
from .baseline import _diff, _snapshot, _State
from .rtnetlink import NETLINK_DROP_MEMBERSHIP, NS_GET_USERNS, SIOCGSKNS, SOL_NETLINK, _Netlink, _sockets

if TYPE_CHECKING:
    from .pool import NetnsPool


# ---------------------------------------------------------------- namespaces

def _inode(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _ioctl_inode(fd: int, request: int) -> tuple[int, int]:
    """(dev, inode) of the namespace fd an nsfs/socket ioctl returns."""
    ns = fcntl.ioctl(fd, request)
    try:
        return _inode(ns)
    finally:
        os.close(ns)


@dataclass(eq=False)
class _Netns:
    """One pooled namespace: the fds that keep it alive and its baseline."""

    netns_fd: int
    userns_fd: int | None
    rtnl: _Netlink
    diag: _Netlink
    ident: tuple[int, int] = (0, 0)
    counters: dict[str, int] = field(default_factory=dict)  # counter or sockstat file name -> fd opened inside
    baseline: _State | None = None
    counters_baseline: dict[str, bytes] = field(default_factory=dict)
    sockstat_baseline: dict[str, int] = field(default_factory=dict)
    closed: bool = False
    _closing: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def destroy(self) -> None:
        """Close every reference we hold; the kernel tears the namespace down
        (asynchronously, in its cleanup_net work) once none is left. Safe to
        call from several threads: only the first closes (a second close of
        a reused fd number would close someone else's file)."""
        with self._closing:
            if self.closed:
                return
            self.closed = True
        self.rtnl.close()
        self.diag.close()
        os.close(self.netns_fd)
        if self.userns_fd is not None:
            os.close(self.userns_fd)
        for fd in self.counters.values():
            os.close(fd)

    def dup(self, with_userns: bool = True) -> tuple[int, int | None]:
        """Copies of (netns fd, userns fd or None), close-on-exec, taken
        where destroy() cannot run meanwhile; NetnsPoolError once it has."""
        with self._closing:
            if self.closed:
                raise NetnsPoolError("the pool was closed")
            netns = fcntl.fcntl(self.netns_fd, fcntl.F_DUPFD_CLOEXEC, 3)
            try:
                userns = None
                if with_userns and self.userns_fd is not None:
                    userns = fcntl.fcntl(self.userns_fd, fcntl.F_DUPFD_CLOEXEC, 3)
            except BaseException:
                os.close(netns)
                raise
        return netns, userns

    def read_counters(self) -> dict[str, bytes]:
        """The namespace's counter files (_factory_main.COUNTER_FILES), now."""
        return {name: _read_all(fd) for name, fd in self.counters.items() if name in COUNTER_FILES}

    def read_sockstat(self) -> dict[str, int]:
        """The namespace's own socket counts from /proc/net/sockstat and sockstat6, now."""
        out: dict[str, int] = {}
        for name, fd in self.counters.items():
            if name not in COUNTER_FILES:
                out.update(_sockstat(_read_all(fd)))
        return out

    def inspect(self, unprivileged_tenant: bool = False) -> list[tuple[str, str]]:
        """(reason, detail) for each leftover; empty if the namespace is as made.

        A tenant that held no capability over the namespace's owning user
        namespace cannot have changed its links, addresses, routes or rules
        (each needs CAP_NET_ADMIN there): for it, `unprivileged_tenant`
        skips those dumps, and the socket counts of sockstat stand in for the
        sock_diag dumps, which run only to name the leftovers they count.
        """
        assert self.baseline is not None
        try:
            problems = [] if unprivileged_tenant else _diff(self.baseline, _snapshot(self.rtnl))
            quiet = unprivileged_tenant and self.sockstat_baseline and self.read_sockstat() == self.sockstat_baseline
            sockets = [] if quiet else _sockets(self.diag)
            if unprivileged_tenant and not quiet and not sockets:
                sockets = ["counted in /proc/net/sockstat, not found by sock_diag"]
            moved = [name for name, text in self.read_counters().items() if text != self.counters_baseline[name]]
        except Exception as e:  # whatever went wrong, an unchecked namespace is not reused
            return [("error", f"check failed: {e!r}")]
        if sockets:
            problems.append(("sockets", f"sockets: {sockets[:5]}{' ...' if len(sockets) > 5 else ''}"))
        if moved:
            # No counter of a namespace can be reset (the MIBs are per-cpu sums
            # the kernel only adds to; a device's stats likewise): a namespace
            # whose counters moved would show the next tenant what this one did.
            problems.append(("counters", f"counters moved: {', '.join('/proc/net/' + n for n in moved)}"))
        return problems


# sockstat figures that are host-wide, not the namespace's: orphaned and
# allocated TCP sockets and the protocols' memory (pages) in use.
_HOST_WIDE = {"TCP:orphan", "TCP:alloc", "TCP:mem", "UDP:mem"}


def _sockstat(text: bytes) -> dict[str, int]:
    """{"TCP:inuse": 0, "sockets:used": 2, ...} from a sockstat file, without the host-wide figures."""
    out = {}
    for line in text.decode().splitlines():
        proto, _, rest = line.partition(":")
        words = rest.split()
        for key, value in zip(words[::2], words[1::2], strict=False):
            name = f"{proto}:{key}"
            if name not in _HOST_WIDE:
                out[name] = int(value)
    return out


def _read_all(fd: int) -> bytes:
    """All of a /proc seq file, from the start (each read from offset 0 regenerates it)."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _check_identity(ns: _Netns, owner_ident: tuple[int, int], own_netns: tuple[int, int]) -> list[str]:
    """The sockets belong to the namespace, the namespace to the expected
    user namespace, and it is not our own."""
    problems = []
    if ns.ident == own_netns:
        problems.append("the namespace is the caller's own")
    for what, nl in (("route", ns.rtnl), ("sock_diag", ns.diag)):
        if _ioctl_inode(nl.sock.fileno(), SIOCGSKNS) != ns.ident:
            problems.append(f"the {what} netlink socket belongs to another namespace")
    if _ioctl_inode(ns.netns_fd, NS_GET_USERNS) != owner_ident:
        problems.append("the namespace has an unexpected owning user namespace")
    return problems


# ---------------------------------------------------------------- leases

@dataclass(frozen=True)
class ReleaseResult:
    """What release() did: `recycled` back into the pool, or destroyed for `reasons`."""

    recycled: bool
    reasons: tuple[str, ...] = ()
    details: tuple[str, ...] = ()


class Lease:
    """Exclusive use of one verified network namespace until release().

    `netns_fd` (and, for user-namespace pools, `userns_fd`) stay owned by the
    pool: do not close them; they are valid until release. `fresh` is true
    when the pool was empty and the namespace was made on the spot.
    `result` is what release did, once known.
    """

    def __init__(self, pool: NetnsPool, ns: _Netns, fresh: bool) -> None:
        self._pool = pool
        self._ns = ns
        self.fresh = fresh
        self.netns_inode = ns.ident[1]
        self.result: ReleaseResult | None = None
        self._released = False
        self._netlink: Any = None

    def _live(self) -> _Netns:
        if self._released:
            raise NetnsPoolError("the lease was released")
        if self._ns.closed:
            raise NetnsPoolError("the pool was closed")
        return self._ns

    @property
    def released(self) -> bool:
        return self._released

    @property
    def netns_fd(self) -> int:
        """O_RDONLY|O_CLOEXEC fd of the namespace's nsfs file: setns(fd, CLONE_NEWNET)."""
        return self._live().netns_fd

    @property
    def userns_fd(self) -> int | None:
        """fd of the owning user namespace (None when the caller's own owns it):
        setns(fd, CLONE_NEWUSER) before setns(netns_fd, CLONE_NEWNET)."""
        return self._live().userns_fd

    def dup_fds(self) -> tuple[int, int | None]:
        """Copies of (netns_fd, userns_fd), the caller's to close: unlike the
        pool's own numbers, they stay valid if the pool is closed meanwhile
        (a spawn in another thread), so they never come to name another file."""
        if self._released:
            raise NetnsPoolError("the lease was released")
        return self._ns.dup()

    def dup_netns_fd(self) -> int:
        """A copy of netns_fd alone (see dup_fds), the caller's to close."""
        if self._released:
            raise NetnsPoolError("the lease was released")
        return self._ns.dup(with_userns=False)[0]

    @property
    def netlink(self) -> Any:
        """A pyroute2 IPRoute bound to the namespace (made on first use, closed on release).

        Use it from one thread: pyroute2 0.9 keeps per-thread socket state.
        """
        ns = self._live()
        if self._netlink is None:
            from pyroute2 import IPRoute  # slow import, only when wanted

            self._netlink = IPRoute(fileno=os.dup(ns.rtnl.sock.fileno()))
        return self._netlink

    def _close_netlink(self) -> None:
        """Close the pyroute2 handle and undo multicast subscriptions it may
        have made on the shared socket (events would pile up in it)."""
        if self._netlink is None:
            return
        with contextlib.suppress(Exception):
            self._netlink.close()
        self._netlink = None
        for group in range(1, 33):
            with contextlib.suppress(OSError):
                self._ns.rtnl.sock.setsockopt(SOL_NETLINK, NETLINK_DROP_MEMBERSHIP, group)

    def release(self, recycle: bool = True, *, wait: bool = True,
                unprivileged_tenant: bool = False) -> ReleaseResult | None:
        """Give the namespace back: recycled if clean, destroyed if not. Idempotent.

        `wait=False` returns at once (None) and leaves the check (~150 µs) to
        the refill thread, off the caller's path; `result` is set when it is
        done: within ~50 ms while the pool has namespaces to spare (releases
        gather, to be checked in one wake-up), at once when it runs low. The
        namespace is not leased again before. Without a refill thread the
        check runs here regardless.

        `recycle=False` destroys it unchecked (reason "discarded"): for a
        tenant that had capabilities over the namespace (CAP_NET_ADMIN over
        its owning user namespace), which could change state these checks
        do not cover (sysctls, netfilter, qdiscs, ...).

        `unprivileged_tenant=True` says that no process using the namespace
        held a capability over its owning user namespace (a sandbox in a
        user namespace of its own, as sandbox.spawn makes): its configuration
        cannot have changed, and only sockets and counters are checked
        (~100 µs instead of ~350). The lease's own `netlink` was used by the
        caller, who may: using it makes the full check run.
        """
        if not self._released:
            self._released = True
            unprivileged_tenant = unprivileged_tenant and self._netlink is None
            self._close_netlink()
            if wait or not self._pool._defer(self, recycle, unprivileged_tenant):
                self.result = self._pool._release(self._ns, recycle, unprivileged_tenant)
        return self.result

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<Lease netns inode {self.netns_inode} {state}{' fresh' if self.fresh else ''}>"
