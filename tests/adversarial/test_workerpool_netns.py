"""Attack: WorkerPool tasks share pooled network namespaces, one tenant at a time.

A WorkerPool's tasks run in loopback-only network namespaces leased from the
pool's own supply (sandbox/workerpool/slots.py, nsfactory.py): the namespace a
task ran in is checked when its sandbox has ended and leased again only if
nothing of the task is left (a socket in any state, a counter moved). Task N
plants what a namespace can keep (a TCP listener, a TIME_WAIT, a bound UDP
port, an abstract Unix socket) or tries to change it (lo's flags, a route, a
sysctl, rejoining it or its owner); the tasks after it find none of it. Each
test also shows that clean namespaces are reused (the same one comes back),
so that a dirty one coming back would be caught. A namespace is named by
its cookie (SO_NETNS_COOKIE, never reused; its nsfs inode number is, once
it is destroyed).
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import pytest

import sandbox

from .attack import make_base_spec

pytestmark = pytest.mark.integration

ROUNDS = 12  # tasks after the planter: enough for the supply (max_workers + 2 spares + 2 + ...) to come round


@pytest.fixture(autouse=True)
def native() -> None:
    if not sandbox.probe().native:
        pytest.skip("WorkerPool needs the native backend")


# ---------------------------------------------------------------- the tenants, as task functions

def cookie() -> int:
    """This task's network namespace's cookie."""
    import socket

    so_netns_cookie = 71
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, so_netns_cookie, 8), "little")


def where() -> tuple[int, int, int]:
    """(this task's netns cookie, the inode of the user namespace owning it, its own user namespace's inode);
    the owner is -EPERM when it lies outside this task's user namespace (NS_GET_USERNS refuses it then)."""
    import fcntl
    import os as _os

    ns_get_userns = 0xB701
    fd = _os.open("/proc/self/ns/net", _os.O_RDONLY)
    try:
        try:
            owner = fcntl.ioctl(fd, ns_get_userns)
        except PermissionError as e:
            return cookie(), -(e.errno or 0), _os.stat("/proc/self/ns/user").st_ino
        try:
            return cookie(), _os.fstat(owner).st_ino, _os.stat("/proc/self/ns/user").st_ino
        finally:
            _os.close(owner)
    finally:
        _os.close(fd)


def plant(port: int, name: str) -> int:
    """Leave a listener, a TIME_WAIT, a bound UDP port and an abstract socket; the netns cookie."""
    import builtins
    import socket

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    client = socket.create_connection(("127.0.0.1", port))
    server, _ = listener.accept()
    client.close()  # the side that closes first keeps the connection in TIME_WAIT
    server.close()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", port))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind("\0" + name)
    abstract.listen()
    builtins.__dict__["_kept"] = (listener, udp, abstract)  # open until the task ends
    return cookie()


def look(port: int, name: str) -> tuple[int, list[str]]:
    """(this task's netns cookie, what of plant(port, name) it finds)."""
    import socket

    found = []
    hexport = f":{port:04X} "
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            with open(f"/proc/self/net/{table}") as f:
                found += [f"{table}: {line.strip()}" for line in f if hexport in line]
        except FileNotFoundError:
            pass
    with open("/proc/self/net/unix") as f:
        found += [f"unix: {line.strip()}" for line in f if name in line]
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        s = socket.socket(socket.AF_INET, kind)
        try:
            s.bind(("127.0.0.1", port))  # a listener, a TIME_WAIT or a bound port would refuse it
        except OSError as e:
            found.append(f"bind {kind}: {e}")
        finally:
            s.close()
    return cookie(), found


def tamper() -> dict[str, str]:
    """Try to change the leased namespace or get back into it: what each attempt got (an errno name, or "done")."""
    import ctypes
    import errno
    import fcntl
    import os as _os
    import socket
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, str] = {}

    def attempt(what: str, fn: Any) -> None:
        try:
            fn()
            out[what] = "done"
        except OSError as e:
            out[what] = errno.errorcode.get(e.errno or 0, str(e.errno))

    def setns(fd: int, kind: int) -> None:
        if libc.setns(fd, kind) != 0:
            raise OSError(ctypes.get_errno(), "setns")

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ifreq_down = struct.pack("16sH22x", b"lo", 0)  # lo's flags: none (down)
    attempt("lo down", lambda: fcntl.ioctl(sock, 0x8914, ifreq_down))  # SIOCSIFFLAGS
    sin = struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton("127.0.0.2"))
    attempt("lo address", lambda: fcntl.ioctl(sock, 0x8916, struct.pack("16s", b"lo") + sin))  # SIOCSIFADDR
    dst = struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton("10.99.0.0"))
    zero = struct.pack("HH4s8x", socket.AF_INET, 0, bytes(4))
    mask = struct.pack("HH4s8x", socket.AF_INET, 0, socket.inet_aton("255.255.0.0"))
    dev = ctypes.create_string_buffer(b"lo")
    # struct rtentry, native alignment: pad1, dst, gateway, genmask, flags (RTF_UP), pad2, pad3, pad4, metric,
    # dev, mtu, window, irtt
    rtentry = struct.pack("@L16s16s16sHhLPhPLLH", 0, dst, zero, mask, 0x0001, 0, 0, 0, 0,
                          ctypes.addressof(dev), 0, 0, 0)
    attempt("route", lambda: fcntl.ioctl(sock, 0x890B, rtentry))  # SIOCADDRT
    sock.close()

    def sysctl() -> None:
        with open("/proc/sys/net/ipv4/ip_default_ttl", "w") as f:
            f.write("7\n")

    attempt("sysctl", sysctl)
    net = _os.open("/proc/self/ns/net", _os.O_RDONLY)
    attempt("rejoin netns", lambda: setns(net, 0x40000000))
    user = _os.open("/proc/self/ns/user", _os.O_RDONLY)
    try:
        owner = fcntl.ioctl(user, 0xB702)  # NS_GET_PARENT: the user namespace owning the leased netns
        attempt("join owner", lambda: setns(owner, 0x10000000))
    except OSError as e:
        out["join owner"] = errno.errorcode.get(e.errno or 0, str(e.errno))
    return out


def configuration() -> tuple[int, str, list[str], str]:
    """(netns cookie, lo's flags, its IPv4 routes, ip_default_ttl) as this task sees them."""
    import fcntl
    import socket
    import struct

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flags = struct.unpack_from("16sH", fcntl.ioctl(sock, 0x8913, struct.pack("16s24x", b"lo")))[1]  # SIOCGIFFLAGS
    sock.close()
    with open("/proc/self/net/route") as f:
        routes = f.read().splitlines()[1:]
    with open("/proc/sys/net/ipv4/ip_default_ttl") as f:
        ttl = f.read().strip()
    return cookie(), hex(flags), routes, ttl


# ---------------------------------------------------------------- the attacks

@pytest.mark.parametrize("spares", [0, 2], ids=["zygote-forked", "spares"])
def test_tasks_run_in_leased_namespaces_they_hold_no_capability_over(spares: int) -> None:
    with sandbox.WorkerPool(make_base_spec(), 1, spares=spares) as pool:
        seen = [pool.submit(where).result(timeout=60) for _ in range(ROUNDS)]
    # the pool's first forks (its start's check, with cgroups the first spares) make fresh namespaces
    for _, owner, own in seen[spares + 1:]:
        assert owner != own, "the task's network namespace is its own (a fresh one), not a leased one"
        assert owner == -1, "the namespace's owner is within the task's user namespace"  # -EPERM
    cookies = [netns for netns, _, _ in seen]
    assert len(set(cookies)) < len(cookies), f"no namespace was reused: {cookies}"


@pytest.mark.parametrize("spares", [0, 2], ids=["zygote-forked", "spares"])
def test_a_task_finds_nothing_the_last_tenant_left_in_the_namespace(spares: int) -> None:
    port = 20000 + secrets.randbelow(20000)
    name = "sbx-planted-" + secrets.token_hex(8)
    with sandbox.WorkerPool(make_base_spec(), 1, spares=spares) as pool:
        before = [pool.submit(look, port, name).result(timeout=60) for _ in range(3)]
        planted = pool.submit(plant, port, name).result(timeout=60)
        after = [pool.submit(look, port, name).result(timeout=60) for _ in range(ROUNDS)]
        stats = pool._engine.slots.netns.stats() if pool._engine.slots.netns is not None else {}
    assert all(found == [] for _, found in before), before
    assert [found for _, found in after if found] == [], "a later task found what task N left"
    assert planted not in [netns for netns, _ in after], "the namespace task N left sockets in was leased again"
    cookies = [netns for netns, _ in before + after]
    assert len(set(cookies)) < len(cookies), f"no clean namespace was reused: {cookies}"
    assert stats.get("destroyed", 0) >= 1, stats


@pytest.mark.parametrize("spares", [0, 2], ids=["zygote-forked", "spares"])
def test_a_task_cannot_change_or_rejoin_its_leased_namespace(spares: int) -> None:
    with sandbox.WorkerPool(make_base_spec(), 1, spares=spares) as pool:
        first = pool.submit(configuration).result(timeout=60)
        tried = [pool.submit(tamper).result(timeout=60) for _ in range(3)]
        after = [pool.submit(configuration).result(timeout=60) for _ in range(ROUNDS)]
    for attempts in tried:
        assert set(attempts) == {"lo down", "lo address", "route", "sysctl", "rejoin netns", "join owner"}
        assert "done" not in attempts.values(), attempts
    _, flags, routes, ttl = first
    assert int(flags, 16) & 1, "lo is not up in a leased namespace"
    assert all(state[1:] == (flags, routes, ttl) for state in after), (first, after)
    cookies = [state[0] for state in [first, *after]]
    assert len(set(cookies)) < len(cookies), f"no namespace was reused: {cookies}"


def bind_low_port() -> tuple[int, int, int, str]:
    """where(), and what binding port 80 on lo got (it needs CAP_NET_BIND_SERVICE over the namespace's owner)."""
    import socket

    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 80))
        outcome = "bound"
    except OSError as e:
        outcome = str(e)
    finally:
        s.close()
    return (*where(), outcome)


def test_a_network_capability_gets_a_namespace_of_the_tasks_own() -> None:
    spec = make_base_spec().replace(cap_add=["CAP_NET_BIND_SERVICE"])
    with sandbox.WorkerPool(spec, 1, spares=0) as pool:
        assert pool._engine.slots.netns is None, "a pool whose tasks keep a network capability leases namespaces"
        seen = [pool.submit(bind_low_port).result(timeout=60) for _ in range(4)]
    assert len({netns for netns, *_ in seen}) == len(seen), "a namespace a capable task owned was reused"
    if os.geteuid() == 0:  # (unprivileged, the task's user namespace is nested inside the one owning it)
        for _, owner, own, outcome in seen:
            assert owner == own and outcome == "bound", seen
