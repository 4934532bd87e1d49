"""A pool of pre-made, loopback-only network namespaces that sandboxes lease.

Creating a network namespace is the most expensive step of a sandbox spawn
(the kernel registers every per-namespace subsystem, and tears it all down
again asynchronously afterwards). A `NetnsPool` makes them ahead of time, off
the caller's path, checks each one, and hands them out one tenant at a time:

    with NetnsPool(size=8) as pool:
        with pool.lease() as lease:
            ...  # the child setns()es into lease.netns_fd (see below)
        # on release the namespace is checked again: recycled if clean,
        # destroyed (and replaced in the background) if not

Kernel background, briefly:

- A namespace lives as long as something references it: a process inside
  it, an open nsfs file (/proc/PID/ns/net opened by anyone), or (for a
  network namespace) a socket created in it. So an O_RDONLY fd of
  /proc/PID/ns/net keeps the namespace alive after every process in it is
  gone; the pool holds such fds, and closing the last reference is what
  destroys a namespace.
- Every namespace is owned by the user namespace its creator was in. The
  capability checks for it (CAP_NET_ADMIN to configure it, CAP_SYS_ADMIN to
  setns() into it) are made against that owning user namespace. A process
  has every capability in a user namespace it owns (its euid created it and
  it sits in the parent): that is how an unprivileged caller administers the
  namespaces of an `owner="userns"` pool.
- A netlink socket talks to the network namespace it was created in,
  forever, whoever uses it. For requests that change something, the kernel
  requires CAP_NET_ADMIN over the namespace's owning user namespace from
  both the task that opened the socket and the task sending the request.
  The pool's sockets are opened inside the namespace by a small factory
  process (which is root there) and passed back over a Unix socket with
  SCM_RIGHTS, so the caller needs no setns() (which a multithreaded process
  cannot do for user namespaces) to configure and inspect them.

How a namespace is made: one long-lived factory process per pool
(`factory`, running `_factory_main.py`) does, per request,
unshare(CLONE_NEWNET), opens the new namespace's nsfs file and a
NETLINK_ROUTE and a NETLINK_SOCK_DIAG socket in it and its counter files
(/proc/self/net/snmp and the like), sends those fds back and returns to a
private "home" namespace of its own, so no process stays inside pooled
namespaces. For `owner="userns"` it first
unshare(CLONE_NEWUSER)s and maps the caller's uid and gid to themselves, so
every namespace it makes is owned by that one user namespace, whose fd it sends
once. The caller then brings lo up over the netlink socket (`rtnetlink`)
and verifies the result (`baseline`: only lo, UP, 127.0.0.1/8 and ::1/128,
only the kernel's loopback routes, no sockets) before the namespace enters
the pool (`pool`, `lease`).

At release the namespace is checked again against that baseline: links,
addresses, routes (all tables) and policy rules must be as made, and
sock_diag must find no TCP or UDP (IPv4, IPv6) or Unix socket in any state
(listening, connected, TIME_WAIT, a taken abstract name), and its
counters must not have moved (no counter can be reset, and the next tenant
would read them). Clean: back to
the pool. Anything else: destroyed, for the reasons recorded in the
ReleaseResult and stats(), and replaced by the refill thread. The check
costs ~350 µs of CPU; release(wait=False) leaves it to the refill thread. A
tenant that held no capability over the namespace's owner (a sandbox in a
user namespace of its own: `release(unprivileged_tenant=True)`) cannot
have changed links, addresses, routes or rules: its check reads only the
counters and /proc/net/sockstat's socket counts (~100 µs), and dumps
sockets with sock_diag only to name those the counts found.

The checks use a few raw netlink dumps (`rtnetlink`) rather than pyroute2's
IPRoute: they run on every release, and pyroute2 0.9's asyncio machinery
costs 0.3-0.7 ms per dump where a raw dump costs 10-20 µs (its message
classes alone cost 50-190 µs more per dump than rtnetlink's decoder).
`Lease.netlink` still gives a full pyroute2 `IPRoute` bound to the
namespace for callers that want one.

Joining a leased namespace from a child process (what the C core does).
setns(CLONE_NEWNET) needs CAP_SYS_ADMIN over the namespace's owner, so it
must happen before the sandbox makes its own user namespace; and that user
namespace must be made inside the pool's (owner="userns"), which only a
single-threaded task can setns() into: a clone(CLONE_VM|CLONE_VFORK) child
of the caller without namespace flags does setns(userns_fd, CLONE_NEWUSER)
(owner="userns" only), then setns(netns_fd, CLONE_NEWNET), then clones the
sandbox with CLONE_PARENT|CLONE_NEWUSER|CLONE_NEWPID|... but not
CLONE_NEWNET. The sandbox's user namespace is then a child of the pool's:
it has no capability over the pooled namespace and cannot change it (nor
setns() back out); the pool's user namespace maps the caller's ids to
themselves, so the sandbox's maps read as they would without the pool.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from ..errors import NetnsPoolError
from ..forksafe import fresh_in_child
from ..host import read_pool_with
from ..lazy import lazy_getattr

if TYPE_CHECKING:
    from .factory import FACTORY_MARKER
    from .lease import Lease, ReleaseResult
    from .pool import NetnsPool

# The pool's machinery is imported when a pool is made or a name is asked for
# (PEP 562): a process that only learns it will use none (serves_network_none,
# disable) does not pay for it.
_EXPORTS = {"FACTORY_MARKER": "factory", "Lease": "lease", "ReleaseResult": "lease", "NetnsPool": "pool"}


__getattr__ = lazy_getattr(__name__, _EXPORTS)

__all__ = [
    "FACTORY_MARKER", "POOL_ENV", "Lease", "NetnsPool", "NetnsPoolError", "ReleaseResult", "disable", "enable",
    "pool_for", "restore_default", "serves_network_none", "shared_pool",
]


# ---------------------------------------------------------------- the process-wide pool

# Set to 0 to keep network="none" sandboxes on fresh namespaces (the shared
# pool is then only started for network="pool").
POOL_ENV = "SANDBOX_NETNS_POOL"
DEFAULT_SIZE = 8

_default_lock = threading.Lock()
_default: NetnsPool | None = None
_for_none: bool | None = None  # None: the default, on unless SANDBOX_NETNS_POOL=0


fresh_in_child(globals(), "_default_lock")


def _shared(size: int = DEFAULT_SIZE) -> NetnsPool:
    """The process-wide pool, started (in the background) if there is none in
    this process. A pool inherited through fork() belongs to the parent: the
    child forgets it and starts its own. Hold _default_lock."""
    global _default
    if _default is not None and (_default.closed or _default.owner_pid != os.getpid()):
        if not _default.closed:
            _default.close()  # in a forked child this only drops the parent's fds
        _default = None
    if _default is None:
        from .pool import NetnsPool  # lazy: only when a pool starts: 12 ms, not on a plain run (test_cold_path)

        _default = NetnsPool(size=size)
    return _default


def enable(size: int = DEFAULT_SIZE, *, for_network_none: bool = True) -> NetnsPool:
    """Start (or return) the process-wide pool the native backend leases from.

    Sandboxes with `network="pool"` always lease from it; with
    `for_network_none`, `network="none"` ones do too (they see the same
    loopback-only namespace either way), which is also the default.
    """
    global _for_none
    with _default_lock:
        _for_none = for_network_none
        return _shared(size)


def disable() -> None:
    """Close the process-wide pool; `network="none"` makes fresh namespaces
    again for the rest of the process (until enable())."""
    global _default, _for_none
    with _default_lock:
        pool, _default, _for_none = _default, None, False
    if pool is not None:
        pool.close()


def restore_default() -> None:
    """Undo enable()/disable(): network="none" follows SANDBOX_NETNS_POOL
    again (the pool is started again on the next use)."""
    global _for_none
    with _default_lock:
        _for_none = None


def shared_pool() -> NetnsPool | None:
    """The process-wide pool if it is running in this process (not starting it)."""
    pool = _default  # one read of a global is atomic: no lock round trip (the lock orders writers)
    return pool if pool is not None and not pool.closed and pool.owner_pid == os.getpid() else None


def serves_network_none() -> bool:
    """Whether network="none" sandboxes lease from the process-wide pool:
    by default yes, unless SANDBOX_NETNS_POOL=0 or disable() said otherwise."""
    if _for_none is not None:
        return _for_none
    return os.environ.get(POOL_ENV, "1") != "0"


def _serves_none_now() -> bool:
    """Whether network="none" leases from the pool right now: it serves it and holds a ready namespace."""
    if not serves_network_none():
        return False
    pool = shared_pool()
    return pool is not None and pool.has_idle()


read_pool_with(_serves_none_now)  # sandbox.host's PoolInfo.current reads the pool through it


def pool_for(network: str) -> NetnsPool | None:
    """The pool a sandbox with this `network` setting should lease from, if
    any; the process-wide pool is started in the background on first use."""
    with _default_lock:
        if network == "pool" or (network == "none" and serves_network_none()):
            return _shared()
    return None
