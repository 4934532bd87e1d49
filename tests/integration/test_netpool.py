"""The network namespace pool (sandbox.netpool) on the real kernel.

Runs as root (pools owned by the initial user namespace, and by a user
namespace of their own) and unprivileged (user namespace pools only). Every
check from inside a namespace runs in a child process that joins the leased
namespaces the way a sandbox will: setns() into the pool's user namespace
(if any) and the network namespace, then, as a "tenant", unshare a user
namespace of its own. Traffic only ever goes to loopback inside a pooled
namespace; "no route out" is checked by connecting UDP sockets, which looks
a route up without sending anything.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until

from sandbox import isolation, netpool
from sandbox.errors import IsolationError
from sandbox.netpool import FACTORY_MARKER, Lease, NetnsPool, NetnsPoolError
from sandbox.netpool.baseline import _snapshot
from sandbox.netpool.factory import FACTORY_PATH

pytestmark = pytest.mark.integration

OWNERS = ["init", "userns"] if os.geteuid() == 0 else ["userns"]
HAS_IPV6 = os.path.isdir("/proc/sys/net/ipv6")
TIMEOUT = 30.0

# Joins the lease's namespaces, then runs the test's code. argv: userns fd
# (-1: none), netns fd, mode ("tenant": also unshare a user namespace of its
# own, like a sandbox; "admin": stay root of the pool's user namespace).
PRELUDE = f"_FACTORY_MAIN = {str(FACTORY_PATH)!r}\n" + r'''
import errno, importlib.util, json, os, socket, sys, time
# The factory's own helpers (it runs -I -S too, stdlib only): loaded from its file, not run.
_spec = importlib.util.spec_from_file_location("_factory_main", _FACTORY_MAIN)
_fm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fm)

_userns, _netns, _mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if _userns >= 0:
    _fm.call(_fm.libc.setns(_userns, _fm.CLONE_NEWUSER), "setns(CLONE_NEWUSER)")
_fm.call(_fm.libc.setns(_netns, _fm.CLONE_NEWNET), "setns(CLONE_NEWNET)")
if _mode == "tenant":
    _fm.unshare_userns()
for _fd in {_userns, _netns} - {-1}:
    os.close(_fd)

def err_name(exc):
    return errno.errorcode.get(exc.errno, str(exc.errno))
'''

# What the namespace looks like from inside, as JSON.
STATE_CODE = r'''
def lines(name):
    with open("/proc/self/net/" + name) as f:
        return f.read().splitlines()

def local_v4():
    out, last = [], None
    for line in lines("fib_trie"):
        s = line.strip()
        if s.startswith("|-- "):
            last = s[4:]
        elif s == "/32 host LOCAL" and last not in out:
            out.append(last)
    return sorted(out)

def route_out(family, address):
    s = socket.socket(family, socket.SOCK_DGRAM)
    try:
        s.connect((address, 9))  # a route lookup; nothing is sent
        return "connected"
    except OSError as e:
        return err_name(e)
    finally:
        s.close()

def loopback_works():
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    b.sendto(b"ping", a.getsockname())
    a.settimeout(5)
    ok = a.recv(16) == b"ping"
    a.close(); b.close()
    return ok

ipv6_routes = []
for line in lines("ipv6_route"):
    f = line.split()
    ipv6_routes.append([f[0], int(f[1], 16), int(f[8], 16), f[9]])
print(json.dumps({
    "ifaces": sorted(name for _, name in socket.if_nameindex()),
    "dev": sorted(l.split(":")[0].strip() for l in lines("dev")[2:]),
    "v4_local": local_v4(),
    "v6_addrs": sorted((l.split()[0], int(l.split()[2], 16), l.split()[5]) for l in lines("if_inet6")),
    "v4_main_routes": lines("route")[1:],
    "v6_routes": ipv6_routes,
    "route_v4": route_out(socket.AF_INET, "192.0.2.1"),
    "route_v6": route_out(socket.AF_INET6, "2001:db8::1") if os.path.isdir("/proc/sys/net/ipv6") else None,
    "loopback": loopback_works(),
    "sockets": {n: len(lines(n)) - 1 for n in ("tcp", "tcp6", "udp", "udp6", "unix")},
}))
'''


# ---------------------------------------------------------------- helpers

def in_threads(worker: Callable[[], None], n: int) -> None:
    """Run `worker` in `n` threads at once and wait for them all (each within TIMEOUT)."""
    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)


def inside_argv(lease: Lease, code: str, mode: str = "tenant") -> tuple[list[str], tuple[int, ...]]:
    """argv and pass_fds for a child that joins the lease's namespaces and runs `code`."""
    userns = lease.userns_fd if lease.userns_fd is not None else -1
    argv = [sys.executable, "-I", "-S", "-c", PRELUDE + code, str(userns), str(lease.netns_fd), mode]
    return argv, tuple(fd for fd in (userns, lease.netns_fd) if fd >= 0)


def run_inside(lease: Lease, code: str, mode: str = "tenant", **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run `code` inside the lease's namespaces; fail the test if it fails."""
    argv, fds = inside_argv(lease, code, mode)
    kwargs.setdefault("pass_fds", fds)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, **kwargs)
    assert done.returncode == 0, f"inside code failed ({done.returncode}):\n{done.stderr}"
    return done


def state_inside(lease: Lease) -> dict[str, Any]:
    return json.loads(run_inside(lease, STATE_CODE).stdout)


def assert_pristine_inside(state: dict[str, Any]) -> None:
    """Only lo, 127.0.0.1 and ::1, no route anywhere else, no sockets."""
    assert state["ifaces"] == ["lo"] and state["dev"] == ["lo"], state
    assert state["v4_local"] == ["127.0.0.1"], state
    assert state["v4_main_routes"] == [], state  # no default route, nothing in main
    assert state["route_v4"] == "ENETUNREACH", state
    assert state["loopback"] is True
    assert set(state["sockets"].values()) == {0}, state
    if HAS_IPV6:
        assert state["v6_addrs"] == [["00000000000000000000000000000001", 128, "lo"]], state
        assert state["route_v6"] == "ENETUNREACH", state
        for dest, dest_len, flags, dev in state["v6_routes"]:
            assert dev == "lo", state
            # ::1/128, or the kernel's reject sentinels (RTF_REJECT, ::/0)
            assert (dest, dest_len) == ("0" * 31 + "1", 128) or (flags & 0x200 and dest_len == 0), state


def pyroute2_view(lease: Lease) -> dict[str, Any]:
    """The namespace through the lease's pyroute2 handle."""
    ipr = lease.netlink
    links = [(link["index"], link.get("ifname"), link["flags"]) for link in ipr.link("dump")]
    addrs = sorted((a.get("address"), a["prefixlen"], a["index"]) for a in ipr.addr("dump"))
    routes = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for r in ipr.route("dump", family=family):  # every table
            routes.append((family, r.get("dst"), r["dst_len"], r.get("oif"), r.get("gateway"), r.get("table")))
    return {"links": links, "addrs": addrs, "routes": routes}


def assert_pristine_netlink(lease: Lease) -> None:
    view = pyroute2_view(lease)
    assert len(view["links"]) == 1, view
    index, name, flags = view["links"][0]
    assert name == "lo" and flags & 0x1 and flags & 0x8, view  # IFF_UP, IFF_LOOPBACK
    expected = [("127.0.0.1", 8, index)] + ([("::1", 128, index)] if HAS_IPV6 else [])
    assert view["addrs"] == sorted(expected), view
    assert view["routes"], view
    for family, dst, dst_len, oif, gateway, _ in view["routes"]:
        assert oif == index and gateway is None and dst_len > 0, view
        assert dst.startswith("127.") if family == socket.AF_INET else dst == "::1", view


def factory_pids() -> list[int]:
    """Pids of live netns factory processes that are children of this process,
    except the process-wide pool's (sandboxes of other tests lease from it)."""
    shared = netpool.shared_pool()
    spared = shared.factory_pid if shared is not None else None
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if FACTORY_MARKER.encode() in cmdline.split(b"\0") and stat[0] != "Z" and stat[1] == str(os.getpid()):
            out.append(int(name))
    return [pid for pid in out if pid != spared]


def pid_alive(pid: int) -> bool:
    """A factory process, not (yet) a zombie. An exiting process has an
    empty cmdline for a moment: still alive."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return state not in ("Z", "X") and (not cmdline or FACTORY_MARKER.encode() in cmdline)


def open_fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        with_target = Path(f"/proc/self/fd/{name}")
        try:
            out[int(name)] = os.readlink(with_target)
        except OSError:
            pass
    return out


# ---------------------------------------------------------------- fixtures

@pytest.fixture(params=OWNERS)
def owner(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def make_pool(owner: str) -> Iterator[Callable[..., NetnsPool]]:
    """`make_pool(size, **kwargs)`: a pool of the test's owner kind, closed afterwards."""
    pools: list[NetnsPool] = []

    def make(size: int = 2, **kwargs: Any) -> NetnsPool:
        kwargs.setdefault("owner", owner)
        pool = NetnsPool(size, **kwargs)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


@pytest.fixture(autouse=True, scope="module")
def no_factory_survives() -> Iterator[None]:
    """No factory process started by this test process outlives the module."""
    yield
    assert not factory_pids(), "factory processes left running"


# ---------------------------------------------------------------- a leased namespace

def test_leased_namespace_is_loopback_only(make_pool: Callable[..., NetnsPool], owner: str) -> None:
    pool = make_pool(2)
    assert pool.wait_filled(TIMEOUT), pool.stats()
    with pool.lease() as lease:
        assert not lease.fresh
        assert (lease.userns_fd is None) == (owner == "init")
        assert_pristine_netlink(lease)
        assert_pristine_inside(state_inside(lease))
        own = os.stat("/proc/self/ns/net").st_ino
        assert lease.netns_inode != own and os.fstat(lease.netns_fd).st_ino == lease.netns_inode



def test_isolation_check_holds_pyroute2_reads_to_the_pool_definition(make_pool: Callable[..., NetnsPool]) -> None:
    """sandbox.isolation reads with pyroute2 the same rows the pool's decoder
    reads, and fails on what the pool would: a route in a table other than main too."""
    pool = make_pool(1, refill=False)
    with pool.lease() as lease:
        assert isolation.read_netns(lease.netlink) == _snapshot(lease._ns.rtnl)
        addresses = ["127.0.0.1/8", "::1/128"] if HAS_IPV6 else ["127.0.0.1/8"]
        assert isolation.check_netns(lease.netlink) == {"interfaces": ["lo"], "addresses": addresses, "routes": 0}
        lease.netlink.route("add", dst="10.98.0.0/16", oif=1, table=100)
        with pytest.raises(IsolationError, match="table=100"):
            isolation.check_netns(lease.netlink)
        assert lease.release().reasons == ("routes",)

def test_tenant_cannot_reconfigure_the_namespace(make_pool: Callable[..., NetnsPool]) -> None:
    """A tenant in its own user namespace (as a sandbox will be) has no
    CAP_NET_ADMIN over the pooled namespace: the pool's user namespace, or
    the initial one, owns it."""
    pool = make_pool(1, refill=False)
    with pool.lease() as lease:
        code = r'''
import fcntl, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
ifreq = struct.pack("16sH22x", b"lo", 0)  # lo with IFF_UP cleared
try:
    fcntl.ioctl(s, 0x8914, ifreq)  # SIOCSIFFLAGS
    print("changed")
except OSError as e:
    print(err_name(e))
'''
        assert run_inside(lease, code).stdout.strip() == "EPERM"
        assert lease.release().recycled


def test_concurrent_leases_are_different_and_isolated(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(2)
    assert pool.wait_filled(TIMEOUT)
    name = f"sbx-netpool-test-{secrets.token_hex(6)}"
    with pool.lease() as a, pool.lease() as b, pool.lease() as c:
        assert c.fresh and not a.fresh and not b.fresh
        assert len({a.netns_inode, b.netns_inode, c.netns_inode}) == 3
        # A listener in A: TCP on 127.0.0.1 and an abstract Unix socket.
        listener = r'''
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
t.bind(("127.0.0.1", 0)); t.listen(8)
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
u.bind("\0" + sys.argv[4]); u.listen(8)
print(t.getsockname()[1], flush=True)
sys.stdin.read()
'''
        argv, fds = inside_argv(a, listener)
        with subprocess.Popen(argv + [name], pass_fds=fds, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) as proc:
            assert proc.stdout is not None
            port = int(proc.stdout.readline())
            connect = r'''
def attempt(family, address):
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.connect(address)
        return "connected"
    except OSError as e:
        return err_name(e)
    finally:
        s.close()
print(json.dumps([attempt(socket.AF_INET, ("127.0.0.1", int(sys.argv[4]))),
                  attempt(socket.AF_UNIX, "\0" + sys.argv[5])]))
'''
            results = {}
            for label, lease in (("a", a), ("b", b), ("c", c)):
                argv, fds = inside_argv(lease, connect)
                done = subprocess.run(argv + [str(port), name], pass_fds=fds, capture_output=True, text=True,
                                      timeout=TIMEOUT, check=True)
                results[label] = json.loads(done.stdout)
            assert results["a"] == ["connected", "connected"]
            assert results["b"] == ["ECONNREFUSED", "ECONNREFUSED"]
            assert results["c"] == ["ECONNREFUSED", "ECONNREFUSED"]
            proc.kill()


def test_concurrent_leasing_from_threads(make_pool: Callable[..., NetnsPool]) -> None:
    """Leases held at the same time never share a namespace, under contention."""
    pool = make_pool(3)
    assert pool.wait_filled(TIMEOUT)
    held: set[int] = set()
    lock = threading.Lock()
    errors: list[str] = []

    def worker() -> None:
        try:
            for _ in range(30):
                with pool.lease(timeout=0.01) as lease:
                    with lock:
                        if lease.netns_inode in held:
                            errors.append(f"namespace {lease.netns_inode} leased twice")
                        held.add(lease.netns_inode)
                    time.sleep(0.0005)
                    with lock:
                        held.discard(lease.netns_inode)
        except Exception as e:  # reported below
            errors.append(repr(e))

    in_threads(worker, 4)
    assert not errors
    stats = pool.stats()
    assert stats["leased"] == 120 and stats["in_use"] == 0
    assert stats["recycled"] + stats["destroyed"] == 120, stats
    assert set(stats["destroyed_by_reason"]) <= {"surplus"}, stats


def test_deferred_releases_from_threads_are_each_checked_and_never_lease_twice(
        make_pool: Callable[..., NetnsPool]) -> None:
    """release(wait=False) from several threads at once: every lease's check runs (the refill thread
    is woken for each, none lost), and no namespace is leased again before its check recycled it."""
    pool = make_pool(3)
    assert pool.wait_filled(TIMEOUT)
    held: set[int] = set()
    lock = threading.Lock()
    errors: list[str] = []
    leases: list[Lease] = []

    def worker() -> None:
        try:
            for _ in range(40):
                lease = pool.lease()
                with lock:
                    if lease.netns_inode in held:
                        errors.append(f"namespace {lease.netns_inode} leased twice")
                    held.add(lease.netns_inode)
                    leases.append(lease)
                with lock:
                    held.discard(lease.netns_inode)  # before the release: after it, it may be leased again
                lease.release(wait=False)
        except Exception as e:  # reported below
            errors.append(repr(e))

    in_threads(worker, 4)
    assert not errors
    assert wait_until(lambda: all(lease.result is not None for lease in leases), 10.0), pool.stats()
    stats = pool.stats()
    assert stats["leased"] == 160 and stats["in_use"] == 0 and stats["unchecked"] == 0, stats
    assert stats["recycled"] + stats["destroyed"] == 160, stats
    assert set(stats["destroyed_by_reason"]) <= {"surplus"}, stats
    assert pool.wait_filled(TIMEOUT)


def test_gathered_releases_are_checked_before_they_are_leased_again(make_pool: Callable[..., NetnsPool]) -> None:
    """Releases with wait=False gather for the refill thread while the pool has namespaces to spare;
    one that is leased again was checked first (its result is in), and a pool run dry by leases gets
    its returns checked at once rather than after the gathering time."""
    pool = make_pool(8)
    assert pool.wait_filled(TIMEOUT)
    first = [pool.lease() for _ in range(8)]  # every idle one: the pool has none to spare
    by_inode = {lease.netns_inode: lease for lease in first}
    for lease in first:
        lease.release(wait=False)
    second = [pool.lease(timeout=TIMEOUT) for _ in range(8)]
    for lease in second:
        earlier = by_inode.get(lease.netns_inode)
        if earlier is not None:
            assert earlier.result is not None and earlier.result.recycled
    assert not any(lease.fresh for lease in second)  # each waited for a checked one, none was made
    for lease in second:
        lease.release(wait=False)  # the first of these wakes the thread; the rest gather
    assert wait_until(lambda: all(lease.result is not None for lease in second), 10.0)
    stats = pool.stats()
    assert stats["unchecked"] == 0 and stats["in_use"] == 0 and stats["recycled"] == 16, stats
    assert pool.wait_filled(TIMEOUT)


# ---------------------------------------------------------------- release: recycle or destroy

def test_clean_tenant_is_recycled_and_leaves_no_trace(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(1, refill=False)
    name = f"sbx-netpool-test-{secrets.token_hex(6)}"
    tenant = r'''
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))  # no packet: one would move counters, and the namespace is replaced
t = socket.socket(socket.AF_INET6 if os.path.isdir("/proc/sys/net/ipv6") else socket.AF_INET, socket.SOCK_STREAM)
t.bind(("::1" if t.family == socket.AF_INET6 else "127.0.0.1", 0)); t.listen(1)  # no connection: no TIME_WAIT
a = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
a.bind("\0" + sys.argv[4])
'''
    with pool.lease() as lease:
        first = lease.netns_inode
        argv, fds = inside_argv(lease, tenant)
        subprocess.run(argv + [name], pass_fds=fds, check=True, timeout=TIMEOUT)
        result = lease.release()
    assert result.recycled, result
    with pool.lease() as lease:
        assert lease.netns_inode == first and not lease.fresh
        assert_pristine_inside(state_inside(lease))
        assert_pristine_netlink(lease)
        # the abstract name is free again
        argv, fds = inside_argv(lease, 'socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).bind("\\0" + sys.argv[4])')
        subprocess.run(argv + [name], pass_fds=fds, check=True, timeout=TIMEOUT)
    # the state check inside sent a datagram on lo: counters moved, so this time it is replaced
    assert pool.stats()["recycled"] == 1 and pool.stats()["destroyed_by_reason"] == {"counters": 1}


def dirty_extra_address(lease: Lease) -> None:
    lease.netlink.addr("add", index=1, address="10.99.0.1", prefixlen=32)


def dirty_extra_route(lease: Lease) -> None:
    lease.netlink.route("add", dst="10.98.0.0/16", oif=1)


def dirty_extra_interface(lease: Lease) -> None:
    """A dummy interface, or a veth pair with both ends inside (no dummy driver here)."""
    try:
        lease.netlink.link("add", ifname="extra0", kind="dummy")
    except Exception:  # no dummy driver: a veth pair, both ends in this namespace
        lease.netlink.link("add", ifname="extra0", kind="veth", peer="extra1")


def dirty_lo_down(lease: Lease) -> None:
    lease.netlink.link("set", index=1, state="down")


@pytest.mark.parametrize(("dirty", "reason"), [
    (dirty_extra_address, "addresses"),
    (dirty_extra_route, "routes"),
    (dirty_extra_interface, "links"),
    (dirty_lo_down, "links"),
])
def test_changed_configuration_destroys_the_namespace(make_pool: Callable[..., NetnsPool],
                                                      dirty: Callable[[Lease], None], reason: str) -> None:
    pool = make_pool(1)
    assert pool.wait_filled(TIMEOUT)
    lease = pool.lease()
    dirty(lease)
    result = lease.release()
    assert not result.recycled and reason in result.reasons, result
    assert pool.stats()["destroyed_by_reason"].get(reason) == 1
    # the refill replaces it; the next tenant sees a pristine namespace
    assert pool.wait_filled(TIMEOUT)
    with pool.lease() as lease:
        assert not lease.fresh
        assert_pristine_netlink(lease)
        assert_pristine_inside(state_inside(lease))
    assert pool.stats()["created"] == 2


def test_socket_outliving_the_tenant_destroys_the_namespace(make_pool: Callable[..., NetnsPool]) -> None:
    """A listening socket that a process outside still holds (here: the test,
    which got it over SCM_RIGHTS) is a leftover."""
    pool = make_pool(1, refill=False)
    lease = pool.lease()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    code = r'''
chan = socket.socket(fileno=int(sys.argv[4]))
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
t.bind(("127.0.0.1", 0)); t.listen(1)
socket.send_fds(chan, [b"x"], [t.fileno()])
'''
    argv, fds = inside_argv(lease, code)
    subprocess.run(argv + [str(theirs.fileno())], pass_fds=fds + (theirs.fileno(),), check=True, timeout=TIMEOUT)
    theirs.close()
    _, got, _, _ = socket.recv_fds(ours, 16, 1)
    ours.close()
    listener = socket.socket(fileno=got[0])
    try:
        result = lease.release()
    finally:
        listener.close()
    assert not result.recycled and result.reasons == ("sockets",), result
    assert "LISTEN 127.0.0.1" in result.details[0]


def test_time_wait_leftover_destroys_the_namespace(make_pool: Callable[..., NetnsPool]) -> None:
    """A tenant that closed a TCP connection first leaves TIME_WAIT state
    behind (for 60 s) that the next tenant would see: not recycled."""
    pool = make_pool(1, refill=False)
    lease = pool.lease()
    code = r'''
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
cli = socket.create_connection(srv.getsockname())
conn, _ = srv.accept()
cli.close()  # the active close: cli's side goes to TIME_WAIT
conn.recv(1); conn.close(); srv.close()
'''
    run_inside(lease, code)
    result = lease.release()
    assert not result.recycled and "sockets" in result.reasons, result
    assert "TIME-WAIT" in result.details[result.reasons.index("sockets")]


def test_tenant_process_still_listening_destroys_the_namespace(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(1, refill=False)
    lease = pool.lease()
    argv, fds = inside_argv(lease, 'u = socket.socket(socket.AF_UNIX); u.bind("\\0held"); u.listen(1)\n'
                                   'print("ready", flush=True); sys.stdin.read()')
    with subprocess.Popen(argv, pass_fds=fds, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        result = lease.release()
        proc.kill()
    assert not result.recycled and result.reasons == ("sockets",), result
    assert "@held" in result.details[0]


def test_release_without_recycling(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(1, refill=False)
    result = pool.lease().release(recycle=False)
    assert not result.recycled and result.reasons == ("discarded",)
    assert pool.stats()["destroyed_by_reason"] == {"discarded": 1} and pool.stats()["idle"] == 0
    pool.fill()  # without refill, fill() replaces it
    assert pool.stats()["idle"] == 1 and pool.stats()["created"] == 2


def test_release_without_waiting_checks_in_the_background(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(1)
    assert pool.wait_filled(TIMEOUT)
    lease = pool.lease()
    assert lease.release(wait=False) is None and lease.released
    with pytest.raises(NetnsPoolError):
        lease.netns_fd  # noqa: B018 - released, even if not checked yet
    assert wait_until(lambda: lease.result is not None, 10.0) and lease.result is not None and lease.result.recycled
    lease = pool.lease(timeout=TIMEOUT)
    assert not lease.fresh
    dirty_extra_address(lease)
    lease.release(wait=False)
    assert wait_until(lambda: lease.result is not None, 10.0) and lease.result is not None
    assert lease.result.reasons == ("addresses", "routes")
    assert pool.wait_filled(TIMEOUT)
    with pool.lease() as lease:
        assert_pristine_netlink(lease)
    # without a refill thread the check runs in the caller
    pool = make_pool(1, refill=False)
    result = pool.lease().release(wait=False)
    assert result is not None and result.recycled


def test_lease_netlink_handle_is_closed_on_release(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(1, refill=False)
    with pool.lease() as lease:  # warm up pyroute2's imports and caches
        pyroute2_view(lease)
    before = open_fds()
    with pool.lease() as lease:
        pyroute2_view(lease)
        result = lease.release()
        with pytest.raises(NetnsPoolError):
            lease.netlink  # noqa: B018 - the property raises
        with pytest.raises(NetnsPoolError):
            lease.netns_fd  # noqa: B018
    assert result.recycled
    assert open_fds() == before


# ---------------------------------------------------------------- empty pool, refill

def test_empty_pool_makes_a_fresh_namespace(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(1, refill=False)
    assert pool.stats()["idle"] == 1
    pooled = pool.lease()
    t0 = time.monotonic()
    fresh = pool.lease()
    assert time.monotonic() - t0 < 10
    assert fresh.fresh and not pooled.fresh and fresh.netns_inode != pooled.netns_inode
    assert_pristine_netlink(fresh)
    assert_pristine_inside(state_inside(fresh))
    # the state check inside sent a datagram (counters moved); had it not, "surplus": the pool has its one
    assert fresh.release().reasons == ("counters",)
    assert pooled.release().recycled
    stats = pool.stats()
    assert stats["fresh_on_empty"] == 1 and stats["created"] == 2 and stats["idle"] == 1


def test_size_zero_pool_always_makes_fresh(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(0)
    for _ in range(3):
        with pool.lease(timeout=0) as lease:
            assert lease.fresh
    stats = pool.stats()
    assert stats["fresh_on_empty"] == 3 and stats["destroyed_by_reason"] == {"surplus": 3}


def test_lease_waits_for_the_refill_when_asked(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(2)
    with pool.lease(timeout=TIMEOUT) as a, pool.lease(timeout=None) as b:
        assert not a.fresh and not b.fresh
    assert pool.stats()["fresh_on_empty"] == 0


def test_refill_restores_the_pool(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(3)
    assert pool.wait_filled(TIMEOUT)
    leases = [pool.lease() for _ in range(3)]
    assert pool.stats()["idle"] == 0
    for lease in leases:
        dirty_extra_address(lease)
        assert not lease.release().recycled
    assert pool.wait_filled(TIMEOUT), pool.stats()
    stats = pool.stats()
    assert stats["idle"] == 3 and stats["created"] == 6 and stats["destroyed_by_reason"] == {"addresses": 3}
    time.sleep(0.2)  # and then it rests: nothing more is made
    assert pool.stats()["created"] == 6


def test_failing_refill_does_not_hang_a_waiting_lease(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(1)
    assert pool.wait_filled(TIMEOUT)

    def broken() -> Any:
        raise NetnsPoolError("simulated failure")

    pool._create = broken  # type: ignore[method-assign]
    held = pool.lease()
    dirty_extra_address(held)
    held.release()  # destroyed: the refill now fails over and over
    outcome: list[BaseException | Lease] = []
    t = threading.Thread(target=lambda: outcome.append(_lease_or_error(pool)))
    t.start()
    t.join(TIMEOUT)
    assert not t.is_alive(), "lease(timeout=None) hung"
    assert isinstance(outcome[0], NetnsPoolError)
    assert pool.stats()["create_errors"] >= 1


def _lease_or_error(pool: NetnsPool) -> BaseException | Lease:
    try:
        return pool.lease(timeout=None)
    except BaseException as e:  # returned to the test
        return e


def test_factory_killed_is_restarted(make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(1, refill=False)
    pid = pool.factory_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid), 10.0)
    pooled = pool.lease()
    with pool.lease() as lease:  # needs a new namespace: a new factory makes it
        assert lease.fresh
        assert_pristine_netlink(lease)
    pooled.release()
    assert pool.stats()["factory_starts"] == 2


# ---------------------------------------------------------------- close

def test_close_leaves_nothing(make_pool: Callable[..., NetnsPool]) -> None:
    before = open_fds()
    pool = make_pool(3)
    assert pool.wait_filled(TIMEOUT)
    held = pool.lease()
    pid = pool.factory_pid
    assert pid is not None and pid_alive(pid)
    assert f"net:[{held.netns_inode}]" in open_fds().values()
    pool.close()
    assert pool.closed and pool.stats()["idle"] == 0 and pool.stats()["in_use"] == 0
    assert not pid_alive(pid)
    assert not factory_pids()
    after = open_fds()
    assert after == before, {fd: after.get(fd) for fd in set(after) ^ set(before)}
    assert not any(target.startswith(("net:[", "user:[")) for fd, target in after.items() if fd not in before)
    with pytest.raises(NetnsPoolError):
        held.netns_fd  # noqa: B018 - the lease died with the pool
    assert held.release().reasons == ("closed",)
    with pytest.raises(NetnsPoolError):
        pool.lease()
    pool.close()  # idempotent


@pytest.mark.parametrize("ending", ["atexit", "killed"])
def test_factory_ends_with_its_process(owner: str, ending: str) -> None:
    """Interpreter exit closes forgotten pools (atexit); a killed owner's
    factory sees EOF and exits."""
    code = f'''
import os, sys, time
sys.path[:0] = {sys.path!r}
from sandbox.netpool import NetnsPool
pool = NetnsPool(2, owner={owner!r})
pool.wait_filled(30)
lease = pool.lease()
print(pool.factory_pid, flush=True)
if {ending!r} == "killed":
    time.sleep(60)
'''
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        assert pid_alive(pid)
        if ending == "killed":
            proc.kill()
        assert proc.wait(TIMEOUT) in (0, -signal.SIGKILL)
    assert wait_until(lambda: not pid_alive(pid), 10.0), f"factory {pid} survived its owner"


def test_pool_as_context_manager_and_stats(owner: str) -> None:
    with NetnsPool(2, owner=owner, refill=False) as pool:
        with pool.lease():
            pass
        stats = pool.stats()
    assert pool.closed
    assert stats["owner"] == owner and stats["created"] == 2 and stats["leased"] == 1 and stats["recycled"] == 1
    assert stats["destroyed"] == 0 and stats["fresh_on_empty"] == 0 and stats["create_errors"] == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        NetnsPool(-1)
    with pytest.raises(ValueError):
        NetnsPool(1, owner="nobody")
    if os.geteuid() != 0:
        with pytest.raises(ValueError):
            NetnsPool(1, owner="init")
    with NetnsPool(0) as pool, pytest.raises(ValueError):
        pool.lease(timeout=-1)



def test_namespaces_reserved_for_long_holders_do_not_count_against_the_size(
        make_pool: Callable[..., NetnsPool]) -> None:
    pool = make_pool(1)
    assert pool.wait_filled(10)
    pool.reserve(2)  # what a Template does for its two standbys
    held = [pool.lease(), pool.lease()]
    assert pool.wait_filled(10), pool.stats()  # still one ready for everyone else
    assert pool.stats()["reserved"] == 2 and pool.stats()["in_use"] == 2
    for lease in held:  # recycled, or destroyed as surplus if a refill was under way: either way given back
        lease.release()
    pool.reserve(-2)
    assert pool.stats()["reserved"] == 0 and pool.stats()["in_use"] == 0
