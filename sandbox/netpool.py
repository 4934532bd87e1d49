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

How a namespace is made: one long-lived factory process per pool (plain
Python, `-I -S`, stdlib only, started with subprocess and no fork of this
process) does, per request, unshare(CLONE_NEWNET), opens the new namespace's
nsfs file and a NETLINK_ROUTE and a NETLINK_SOCK_DIAG socket in it, sends
the three fds back and returns to a private "home" namespace of its own, so
no process stays inside pooled namespaces. For `owner="userns"` it first
unshare(CLONE_NEWUSER)s and maps the caller's uid and gid to 0, so every
namespace it makes is owned by that one user namespace, whose fd it sends
once. The caller then brings lo up over the netlink socket and verifies the
result (only lo, UP, 127.0.0.1/8 and ::1/128, only the kernel's loopback
routes, no sockets) before the namespace enters the pool.

At release the namespace is checked again against that baseline: links,
addresses, routes (all tables) and policy rules must be as made, and
sock_diag must find no TCP or UDP (IPv4, IPv6) or Unix socket in any state
(listening, connected, TIME_WAIT, a taken abstract name). Clean: back to
the pool. Anything else: destroyed, for the reasons recorded in the
ReleaseResult and stats(), and replaced by the refill thread. The check
costs ~150 µs; release(wait=False) leaves it to the refill thread.

The checks use a few raw netlink dumps rather than pyroute2: they run on
every release, and pyroute2 0.9's asyncio machinery costs 0.3-0.7 ms per
dump where a raw dump costs 10-20 µs. `Lease.netlink` still gives a full
pyroute2 `IPRoute` bound to the namespace for callers that want one.

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
setns() back out), and the lower ids of its maps are those of the pool's
user namespace, where the caller is 0.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import errno
import fcntl
import ipaddress
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from .errors import SandboxError

__all__ = ["FACTORY_MARKER", "Lease", "NetnsPool", "NetnsPoolError", "ReleaseResult"]

#: Appears in the factory process's command line (tests look for it in /proc).
FACTORY_MARKER = "sandbox-netpool-factory"

_OWNERS = ("auto", "init", "userns")
_NICE = 10  # the factory and the refill thread yield to everything else
_FACTORY_TIMEOUT = 10.0  # seconds for the factory to start or answer
_NETLINK_TIMEOUT = 5.0  # seconds for the kernel to answer a netlink request
_TCP_HASH_ENTRIES = 4096  # per-namespace TCP hash size (see _FACTORY_CODE)


class NetnsPoolError(SandboxError):
    """A namespace could not be created or verified, or the pool is closed."""


# ---------------------------------------------------------------- the factory
#
# Runs as `python -I -S -c _FACTORY_CODE FACTORY_MARKER <fd> <mode> <nice> <tcp hash>`, single
# threaded, stdlib only. Speaks over a SOCK_SEQPACKET socketpair: it sends
# b"ready" (with the user namespace fd in "userns" mode), then answers each
# b"new" with b"ok" and [netns, rtnl, diag] fds, or b"error: ..." (and exits
# when its own state is broken). EOF (the pool closed, or its process died)
# makes it exit. It never runs anything else.

_FACTORY_CODE = r"""
import ctypes, os, signal, socket, sys
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
NETLINK_ROUTE, NETLINK_SOCK_DIAG = 0, 4
libc = ctypes.CDLL(None, use_errno=True)
chan = socket.socket(fileno=int(sys.argv[2]))

def call(rc, what):
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, what + ": " + os.strerror(err))

def write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)

def nsfd(kind):
    return os.open("/proc/self/ns/" + kind, os.O_RDONLY | os.O_CLOEXEC)

def enter_userns():
    # Own user namespace: uid/gid 0 inside = the caller outside. A process
    # may write its own maps if they name only its own ids, and setgroups
    # must be denied first for the gid map. After unshare the process holds
    # every capability in the new namespace (none outside it).
    uid, gid = os.geteuid(), os.getegid()
    call(libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    write("/proc/self/setgroups", "deny")
    write("/proc/self/uid_map", "0 %d 1" % uid)
    write("/proc/self/gid_map", "0 %d 1" % gid)
    return nsfd("user")

def make(home):
    call(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    try:
        net = nsfd("net")
        rtnl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_ROUTE)
        diag = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    finally:
        call(libc.setns(home, CLONE_NEWNET), "setns(home network namespace)")
    try:
        socket.send_fds(chan, [b"ok"], [net, rtnl.fileno(), diag.fileno()])
    finally:
        os.close(net)
        rtnl.close()
        diag.close()

def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is for the caller; EOF ends us
    try:
        os.nice(int(sys.argv[4]))
        fds = [enter_userns()] if sys.argv[3] == "userns" else []
        call(libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET) for the home namespace")
        home = nsfd("net")
    except OSError as e:
        chan.send(("error: %s" % e).encode())
        return 1
    try:
        # Namespaces made from here get a TCP hash table of their own (Linux
        # 6.1+) instead of sharing the host's: sock_diag walks every bucket.
        write("/proc/sys/net/ipv4/tcp_child_ehash_entries", sys.argv[5])
    except OSError:
        pass
    socket.send_fds(chan, [b"ready"], fds)
    for fd in fds:
        os.close(fd)
    while chan.recv(16):
        try:
            make(home)
        except OSError as e:
            chan.send(("error: %s" % e).encode())
            if "setns" in str(e):
                return 1
    return 0

sys.exit(main())
"""


def _recv_fds(chan: socket.socket, maxfds: int) -> tuple[bytes, list[int]]:
    """One message and the fds it carries, received close-on-exec.

    (socket.recv_fds would leave them inheritable until we fix them up, and
    a concurrent spawn could leak namespace fds into a child.)
    """
    msg, ancdata, flags, _ = chan.recvmsg(4096, socket.CMSG_SPACE(maxfds * 4), socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4]))
    if flags & (socket.MSG_CTRUNC | socket.MSG_TRUNC):
        _close_all(fds)
        raise NetnsPoolError("factory message truncated")
    return msg, fds


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class _Factory:
    """The helper process that creates namespaces (see _FACTORY_CODE)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.userns_fd: int | None = None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.chan = ours
        ours.settimeout(_FACTORY_TIMEOUT)
        argv = [sys.executable, "-I", "-S", "-c", _FACTORY_CODE, FACTORY_MARKER, str(theirs.fileno()), mode,
                str(_NICE), str(_TCP_HASH_ENTRIES)]
        try:
            self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd="/")
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            self._handshake()
        except BaseException:
            self.close()
            raise

    def _handshake(self) -> None:
        msg, fds = self._receive(1)
        if msg != b"ready" or len(fds) != (1 if self.mode == "userns" else 0):
            _close_all(fds)
            raise NetnsPoolError(f"namespace factory failed to start: {self._why(msg)}")
        self.userns_fd = fds[0] if fds else None

    def _receive(self, maxfds: int) -> tuple[bytes, list[int]]:
        try:
            return _recv_fds(self.chan, maxfds)
        except (TimeoutError, OSError) as e:
            raise NetnsPoolError(f"namespace factory did not answer: {e}") from e

    def _why(self, msg: bytes) -> str:
        """The factory's own error message, or its stderr if it died."""
        if msg:
            return msg.decode(errors="replace")
        with contextlib.suppress(subprocess.TimeoutExpired, OSError, ValueError):
            self.proc.wait(timeout=1.0)
            assert self.proc.stderr is not None
            err = self.proc.stderr.read().decode(errors="replace").strip()
            return f"exited with {self.proc.returncode}: {err[-500:]}"
        return "no answer"

    def new(self) -> tuple[int, int, int]:
        """A fresh namespace: (netns fd, NETLINK_ROUTE fd, NETLINK_SOCK_DIAG fd), all ours to close."""
        try:
            self.chan.send(b"new")
        except OSError as e:
            raise NetnsPoolError(f"namespace factory is gone: {e}") from e
        msg, fds = self._receive(3)
        if msg != b"ok" or len(fds) != 3:
            _close_all(fds)
            raise NetnsPoolError(f"namespace factory: {self._why(msg)}")
        return fds[0], fds[1], fds[2]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """EOF tells the factory to exit; it is killed if it does not."""
        self.chan.close()
        if self.userns_fd is not None:
            os.close(self.userns_fd)
            self.userns_fd = None
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    def forget(self) -> None:
        """In a forked child: drop our copies of the fds, leave the process to its parent."""
        self.chan.close()
        if self.userns_fd is not None:
            os.close(self.userns_fd)
            self.userns_fd = None
        if self.proc.stderr is not None:
            self.proc.stderr.close()


# ---------------------------------------------------------------- netlink
#
# Just enough rtnetlink and sock_diag to snapshot a namespace: send one
# request, collect the answer of the same sequence number, parse attributes.

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR = 0x1, 0x4, 0x300, 0x10
RTM_NEWLINK, RTM_GETLINK, RTM_GETADDR, RTM_GETROUTE, RTM_GETRULE = 16, 18, 22, 26, 34
SOCK_DIAG_BY_FAMILY = 20
IFF_UP, IFF_LOOPBACK = 0x1, 0x8
IFLA_IFNAME, IFLA_MTU = 3, 4
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_MULTIPATH, RTA_TABLE, RTA_VIA = 1, 4, 5, 6, 7, 9, 15, 18
RTN_UNICAST, RTN_LOCAL, RTN_BROADCAST = 1, 2, 3
FR_ACT_TO_TBL = 1
RT_TABLE_DEFAULT, RT_TABLE_MAIN, RT_TABLE_LOCAL = 253, 254, 255
FRA_TABLE = 15
UDIAG_SHOW_NAME = 0x1
_SOL_NETLINK, _NETLINK_DROP_MEMBERSHIP = 270, 2
SIOCGSKNS = 0x894C  # socket ioctl: an fd of the socket's network namespace
NS_GET_USERNS = 0xB701  # nsfs ioctl: an fd of the namespace's owning user namespace

_HDR = struct.Struct("=IHHII")
_IFINFO = struct.Struct("=BxHiII")
_IFADDR = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")
_INET_DIAG_REQ = struct.Struct("=BBBxI48x")  # family, protocol, ext, states, inet_diag_sockid (any)
_INET_DIAG_MSG = struct.Struct("=BBBB2H16s16sI8xIIIII")
_UNIX_DIAG_REQ = struct.Struct("=BBxxIII8x")  # family, protocol, states, ino, show, cookie
_UNIX_DIAG_MSG = struct.Struct("=BBBxI8x")


def _attrs(body: bytes, offset: int) -> dict[int, bytes]:
    """The netlink attributes of a message body, from `offset` (type -> payload)."""
    out: dict[int, bytes] = {}
    while offset + 4 <= len(body):
        length, kind = struct.unpack_from("=HH", body, offset)
        if length < 4:
            break
        out[kind & 0x3FFF] = body[offset + 4: offset + length]
        offset += (length + 3) & ~3
    return out


def _u32(data: bytes | None) -> int | None:
    return None if data is None else struct.unpack("=I", data[:4])[0]


def _ip(family: int, data: bytes | None) -> str | None:
    return None if data is None else socket.inet_ntop(family, data)


class _DumpInterrupted(Exception):
    """The state changed during a dump (NLM_F_DUMP_INTR): dump again."""


class _Netlink:
    """A netlink socket created inside a pooled namespace, for our requests.

    The same socket may be shared with a pyroute2 handle (`Lease.netlink`),
    so every request drains what is left unread and skips answers to
    sequence numbers not its own. The timeout mode also copes with the
    O_NONBLOCK that asyncio sets on the shared open file.
    """

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.settimeout(_NETLINK_TIMEOUT)
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def _drain(self) -> None:
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        while poller.poll(0):
            self.sock.recv(65536)

    def request(self, msg_type: int, flags: int, payload: bytes) -> list[tuple[int, bytes]]:
        """Send one request; return the (type, body) of each answer, or raise OSError."""
        for _ in range(5):
            try:
                return self._request_once(msg_type, flags, payload)
            except _DumpInterrupted:
                continue
        raise OSError(errno.EAGAIN, "netlink dump kept being interrupted")

    def _request_once(self, msg_type: int, flags: int, payload: bytes) -> list[tuple[int, bytes]]:
        self._drain()
        self.seq = self.seq % 0x7FFFFFFF + 1
        self.sock.send(_HDR.pack(_HDR.size + len(payload), msg_type, flags | NLM_F_REQUEST, self.seq, 0) + payload)
        out: list[tuple[int, bytes]] = []
        interrupted = False
        while True:
            data = self.sock.recv(65536)
            offset = 0
            while offset + _HDR.size <= len(data):
                length, kind, mflags, seq, _ = _HDR.unpack_from(data, offset)
                if length < _HDR.size:
                    break
                body = data[offset + _HDR.size: offset + length]
                offset += (length + 3) & ~3
                if seq != self.seq:
                    continue
                interrupted |= bool(mflags & NLM_F_DUMP_INTR)
                if kind in (NLMSG_ERROR, NLMSG_DONE):
                    code = struct.unpack_from("=i", body)[0] if len(body) >= 4 else 0
                    if code < 0:
                        raise OSError(-code, f"netlink request {msg_type}: {os.strerror(-code)}")
                    if interrupted:
                        raise _DumpInterrupted
                    return out
                out.append((kind, body))

    def dump(self, msg_type: int, payload: bytes) -> list[bytes]:
        return [body for _, body in self.request(msg_type, NLM_F_DUMP, payload)]


# ---------------------------------------------------------------- snapshots

@dataclass(frozen=True)
class _State:
    """What a namespace's configuration looks like, in comparable form."""

    links: frozenset[tuple[Any, ...]]  # (index, name, type, flags, mtu)
    addrs: frozenset[tuple[Any, ...]]  # (family, index, address, prefixlen, scope)
    routes: frozenset[tuple[Any, ...]]  # (family, table, type, proto, scope, dst, dst_len, oif, gateway, ...)
    rules: frozenset[bytes]  # raw fib_rule messages: no counters in them


def _links(nl: _Netlink) -> frozenset[tuple[Any, ...]]:
    out = set()
    for body in nl.dump(RTM_GETLINK, _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        _, kind, index, flags, _ = _IFINFO.unpack_from(body)
        attrs = _attrs(body, _IFINFO.size)
        name = attrs.get(IFLA_IFNAME, b"").rstrip(b"\0").decode(errors="replace")
        out.add((index, name, kind, flags, _u32(attrs.get(IFLA_MTU))))
    return frozenset(out)


def _addrs(nl: _Netlink) -> frozenset[tuple[Any, ...]]:
    out = set()
    for body in nl.dump(RTM_GETADDR, _IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0)):
        family, prefixlen, _, scope, index = _IFADDR.unpack_from(body)
        attrs = _attrs(body, _IFADDR.size)
        raw = attrs.get(IFA_LOCAL, attrs.get(IFA_ADDRESS))
        address = _ip(family, raw) if family in (socket.AF_INET, socket.AF_INET6) else (raw or b"").hex()
        out.add((family, index, address, prefixlen, scope))
    return frozenset(out)


def _routes(nl: _Netlink) -> frozenset[tuple[Any, ...]]:
    """Every route of every table and family (AF_UNSPEC dumps them all)."""
    out = set()
    for body in nl.dump(RTM_GETROUTE, _RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)):
        family, dst_len, _, _, table, proto, scope, kind, _ = _RTMSG.unpack_from(body)
        attrs = _attrs(body, _RTMSG.size)
        ipfam = family if family in (socket.AF_INET, socket.AF_INET6) else None
        dst = _ip(ipfam, attrs.get(RTA_DST)) if ipfam else attrs.get(RTA_DST, b"").hex()
        gateway = _ip(ipfam, attrs.get(RTA_GATEWAY)) if ipfam else None
        extra = bool(attrs.get(RTA_VIA) or attrs.get(RTA_MULTIPATH))
        out.add((family, _u32(attrs.get(RTA_TABLE)) or table, kind, proto, scope, dst, dst_len,
                 _u32(attrs.get(RTA_OIF)), gateway, extra, _u32(attrs.get(RTA_PRIORITY)),
                 _ip(ipfam, attrs.get(RTA_PREFSRC)) if ipfam else None))
    return frozenset(out)


def _rules(nl: _Netlink) -> frozenset[bytes]:
    return frozenset(nl.dump(RTM_GETRULE, _RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)))


def _snapshot(nl: _Netlink) -> _State:
    return _State(_links(nl), _addrs(nl), _routes(nl), _rules(nl))


def _sockets(diag: _Netlink) -> list[str]:
    """Every TCP, UDP (IPv4 and IPv6) and Unix socket of the namespace, any state.

    sock_diag answers for the namespace the diag socket belongs to. Any
    socket still there after the tenant is gone is a leftover: a listener
    or connection a process outside still holds, TIME_WAIT state, or an
    abstract Unix name the next tenant would find taken.
    """
    found = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for proto, name in ((socket.IPPROTO_TCP, "tcp"), (socket.IPPROTO_UDP, "udp")):
            for body in diag.dump(SOCK_DIAG_BY_FAMILY, _INET_DIAG_REQ.pack(family, proto, 0, _INET_STATES)):
                found.append(_describe_inet(name, body))
    for body in diag.dump(SOCK_DIAG_BY_FAMILY, _UNIX_DIAG_REQ.pack(socket.AF_UNIX, 0, 0xFFFFFFFF, 0,
                                                                   UDIAG_SHOW_NAME)):
        found.append(_describe_unix(body))
    return found


# Every TCP state up to NEW_SYN_RECV (12). Not BOUND_INACTIVE (13, Linux
# 6.10+: bound, neither listening nor connected), whose dump walks the
# host-wide bind hash (+30 µs per family); such a socket exists only while
# some process holds it, and the tenant's processes are gone by release.
_INET_STATES = (1 << 13) - 1
_TCP_STATES = {1: "ESTABLISHED", 2: "SYN-SENT", 3: "SYN-RECV", 4: "FIN-WAIT-1", 5: "FIN-WAIT-2", 6: "TIME-WAIT",
               7: "CLOSE", 8: "CLOSE-WAIT", 9: "LAST-ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW-SYN-RECV"}


def _describe_inet(proto: str, body: bytes) -> str:
    family, state, _, _, sport, dport, src, dst, *_ = _INET_DIAG_MSG.unpack_from(body)
    size = 4 if family == socket.AF_INET else 16
    src_ip, dst_ip = socket.inet_ntop(family, src[:size]), socket.inet_ntop(family, dst[:size])
    sport, dport = socket.ntohs(sport), socket.ntohs(dport)
    return f"{proto}{'6' if size == 16 else ''} {_TCP_STATES.get(state, state)} {src_ip}:{sport} -> {dst_ip}:{dport}"


def _describe_unix(body: bytes) -> str:
    _, kind, state, ino = _UNIX_DIAG_MSG.unpack_from(body)
    raw = _attrs(body, _UNIX_DIAG_MSG.size).get(0)  # UNIX_DIAG_NAME
    name = "" if raw is None else ("@" + raw[1:].decode(errors="replace") if raw[:1] == b"\0" else raw.decode())
    kinds = {socket.SOCK_STREAM: "stream", socket.SOCK_DGRAM: "dgram", socket.SOCK_SEQPACKET: "seqpacket"}
    return f"unix {kinds.get(kind, kind)} {_TCP_STATES.get(state, state)} ino={ino} {name}".rstrip()


def _diff(before: _State, after: _State) -> list[tuple[str, str]]:
    """(reason, detail) for each part of the configuration that changed."""
    problems = []
    for reason, old, new in (("links", before.links, after.links), ("addresses", before.addrs, after.addrs),
                             ("routes", before.routes, after.routes), ("rules", before.rules, after.rules)):
        if old != new:
            added, removed = sorted(map(str, new - old)), sorted(map(str, old - new))
            problems.append((reason, f"{reason}: added {added[:5]}, removed {removed[:5]}"))
    return problems


def _expected_addrs(lo: int) -> set[tuple[Any, ...]]:
    """127.0.0.1/8 and (if the kernel has IPv6) ::1/128 on lo, host scope (254).

    The kernel adds both itself when lo goes up (the inet and inet6
    NETDEV_UP handlers), together with their local routes.
    """
    out = {(socket.AF_INET, lo, "127.0.0.1", 8, 254)}
    if os.path.isdir("/proc/sys/net/ipv6"):
        out.add((socket.AF_INET6, lo, "::1", 128, 254))
    return out


_LOOPBACK_V4 = ipaddress.ip_network("127.0.0.0/8")


def _route_ok(route: tuple[Any, ...], lo: int) -> bool:
    """A route the kernel makes for lo: local/broadcast/unicast, through lo,
    no gateway, inside 127.0.0.0/8 or exactly ::1, in the local or main table."""
    family, table, kind, _, _, dst, dst_len, oif, gateway, extra, _, _ = route
    if oif != lo or gateway or extra or kind not in (RTN_UNICAST, RTN_LOCAL, RTN_BROADCAST):
        return False
    if table not in (RT_TABLE_LOCAL, RT_TABLE_MAIN) or dst is None:
        return False
    if family == socket.AF_INET:
        return dst_len >= 8 and ipaddress.ip_network(f"{dst}/{dst_len}", strict=False).subnet_of(_LOOPBACK_V4)
    return family == socket.AF_INET6 and dst == "::1" and dst_len == 128


def _rule_ok(raw: bytes) -> bool:
    """A default policy rule: plain lookup of the local, main or default table."""
    family, dst_len, src_len, _, table, _, _, action, _ = _RTMSG.unpack_from(raw)
    table = _u32(_attrs(raw, _RTMSG.size).get(FRA_TABLE)) or table
    return (action == FR_ACT_TO_TBL and dst_len == src_len == 0
            and table in (RT_TABLE_LOCAL, RT_TABLE_MAIN, RT_TABLE_DEFAULT))


def _verify_fresh(state: _State) -> list[str]:
    """What is wrong with a just-configured namespace (empty list: nothing)."""
    problems = []
    if len(state.links) != 1:
        problems.append(f"expected only lo, found links {sorted(state.links)}")
    lo_link = next(iter(state.links)) if state.links else (0, "", 0, 0, 0)
    lo, name, _, flags, _ = lo_link
    if name != "lo" or not flags & IFF_LOOPBACK or not flags & IFF_UP:
        problems.append(f"lo is not a loopback device that is up: {lo_link}")
    if set(state.addrs) != _expected_addrs(lo):
        problems.append(f"addresses {sorted(state.addrs)} != {sorted(_expected_addrs(lo))}")
    bad_routes = [r for r in state.routes if not _route_ok(r, lo)]
    if bad_routes or not any(r[2] == RTN_LOCAL and r[5] == "127.0.0.1" for r in state.routes):
        problems.append(f"unexpected routes {sorted(map(str, bad_routes))} (all: {len(state.routes)})")
    bad_rules = [r.hex() for r in state.rules if not _rule_ok(r)]
    if bad_rules:
        problems.append(f"unexpected policy rules {bad_rules}")
    return problems


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
    baseline: _State | None = None
    closed: bool = False

    def destroy(self) -> None:
        """Close every reference we hold; the kernel tears the namespace down
        (asynchronously, in its cleanup_net work) once none is left."""
        if self.closed:
            return
        self.closed = True
        self.rtnl.close()
        self.diag.close()
        os.close(self.netns_fd)
        if self.userns_fd is not None:
            os.close(self.userns_fd)

    def inspect(self) -> list[tuple[str, str]]:
        """(reason, detail) for each leftover; empty if the namespace is as made."""
        assert self.baseline is not None
        try:
            problems = _diff(self.baseline, _snapshot(self.rtnl))
            sockets = _sockets(self.diag)
        except Exception as e:  # whatever went wrong, an unchecked namespace is not reused
            return [("error", f"check failed: {e!r}")]
        if sockets:
            problems.append(("sockets", f"sockets: {sockets[:5]}{' ...' if len(sockets) > 5 else ''}"))
        return problems


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


def _bring_lo_up(nl: _Netlink, index: int) -> None:
    """RTM_NEWLINK setting IFF_UP on lo (the socket's namespace, whoever we are)."""
    nl.request(RTM_NEWLINK, NLM_F_ACK, _IFINFO.pack(socket.AF_UNSPEC, 0, index, IFF_UP, IFF_UP))


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
                self._ns.rtnl.sock.setsockopt(_SOL_NETLINK, _NETLINK_DROP_MEMBERSHIP, group)

    def release(self, recycle: bool = True, *, wait: bool = True) -> ReleaseResult | None:
        """Give the namespace back: recycled if clean, destroyed if not. Idempotent.

        `wait=False` returns at once (None) and leaves the check (~150 µs) to
        the refill thread, off the caller's path; `result` is set when it is
        done. Without a refill thread the check runs here regardless.

        `recycle=False` destroys it unchecked (reason "discarded"): for a
        tenant that had capabilities over the namespace (CAP_NET_ADMIN over
        its owning user namespace), which could change state these checks
        do not cover (sysctls, netfilter, qdiscs, ...).
        """
        if not self._released:
            self._released = True
            self._close_netlink()
            if wait or not self._pool._defer(self, recycle):
                self.result = self._pool._release(self._ns, recycle)
        return self.result

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "released" if self.released else "held"
        return f"<Lease netns inode {self.netns_inode} {state}{' fresh' if self.fresh else ''}>"


# ---------------------------------------------------------------- the pool

_POOLS: weakref.WeakSet[NetnsPool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    """Safety net: destroy what pools were left open at interpreter exit."""
    for pool in list(_POOLS):
        with contextlib.suppress(Exception):
            pool.close()


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

    With `refill`, a low-priority background thread makes the namespaces
    (the first ones too: see `wait_filled`) and replaces destroyed ones;
    without it the constructor fills the pool in the calling thread and
    only `fill()` replaces destroyed ones.
    """

    def __init__(self, size: int = 8, *, refill: bool = True, owner: str = "auto") -> None:
        if size < 0:
            raise ValueError("size must be >= 0")
        self.size = size
        self.owner = _resolve_owner(owner)
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._idle: collections.deque[_Netns] = collections.deque()
        self._leased: set[_Netns] = set()
        self._returned: collections.deque[tuple[Lease, bool]] = collections.deque()  # release(wait=False)
        self._creating = 0
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
            self._factory = _Factory(self.owner)
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
                    netns_fd, rtnl_fd, diag_fd = factory.new()
                    break
                except NetnsPoolError:
                    factory.close()
                    self._factory = None
                    if attempt == 2:
                        raise
            userns_fd = os.dup(factory.userns_fd) if factory.userns_fd is not None else None
        ns = _Netns(netns_fd, userns_fd, _Netlink(rtnl_fd), _Netlink(diag_fd), _inode(netns_fd))
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
                problems = _verify_fresh(state) + [f"sockets: {s}" for s in _sockets(ns.diag)]
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
        """Namespaces the pool has: idle, leased and being made. Hold _cond."""
        return len(self._idle) + len(self._leased) + self._creating

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
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._returned or self._total() < self.size)
                if self._closed:
                    return
                returned = self._returned.popleft() if self._returned else None
                if returned is None:
                    self._creating += 1
            if returned is not None:
                lease, recycle = returned
                lease.result = self._release(lease._ns, recycle)
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
        with self._cond:
            self._check_open()
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

    def _defer(self, lease: Lease, recycle: bool) -> bool:
        """Queue a released namespace for the refill thread to check; False if there is none."""
        with self._cond:
            if self._thread is None or self._closed:
                return False
            self._returned.append((lease, recycle))
            self._cond.notify_all()
            return True

    def _release(self, ns: _Netns, recycle: bool) -> ReleaseResult:
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
            problems = ns.inspect()
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
        with self._cond:
            self._cond.notify_all()  # the refill thread makes a replacement
        return ReleaseResult(False, tuple(r for r, _ in problems), tuple(d for _, d in problems))

    # ------------------------------------------------------------ state

    def stats(self) -> dict[str, Any]:
        """Counters: created, recycled, destroyed (total and by_reason), leased,
        fresh_on_empty; idle, in_use and unchecked (released with wait=False,
        not checked yet) now; refill errors and factory starts."""
        with self._cond:
            s = self._stats
            return {
                "size": self.size, "owner": self.owner, "idle": len(self._idle),
                "in_use": len(self._leased) - len(self._returned), "unchecked": len(self._returned),
                "created": s.created, "recycled": s.recycled, "destroyed": sum(s.destroyed.values()),
                "destroyed_by_reason": dict(s.destroyed), "leased": s.leased, "fresh_on_empty": s.fresh_on_empty,
                "create_errors": s.create_errors, "last_error": s.last_error, "factory_starts": s.factory_starts,
            }

    @property
    def factory_pid(self) -> int | None:
        """Pid of the running factory process, if any."""
        factory = self._factory
        return factory.proc.pid if factory is not None and factory.alive() else None

    @property
    def closed(self) -> bool:
        return self._closed

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


# ---------------------------------------------------------------- the process-wide pool

_default_lock = threading.Lock()
_default: NetnsPool | None = None
_default_for_none = False


def enable(size: int = 8, *, for_network_none: bool = True) -> NetnsPool:
    """Start (or return) the process-wide pool the native backend leases from.

    Sandboxes with `network="pool"` always lease from it (it is started on
    their first use); with `for_network_none`, `network="none"` ones do too
    (they see the same loopback-only namespace either way). Off by default.
    """
    global _default, _default_for_none
    with _default_lock:
        if _default is None or _default.closed:
            _default = NetnsPool(size=size)
        _default_for_none = for_network_none
        return _default


def disable() -> None:
    """Close the process-wide pool; `network="none"` makes fresh namespaces again."""
    global _default, _default_for_none
    with _default_lock:
        pool, _default, _default_for_none = _default, None, False
    if pool is not None:
        pool.close()


def pool_for(network: str) -> NetnsPool | None:
    """The pool a sandbox with this `network` setting should lease from, if any."""
    if network == "pool":
        return _default if _default is not None and not _default.closed else enable(for_network_none=False)
    if network == "none" and _default_for_none and _default is not None and not _default.closed:
        return _default
    return None
