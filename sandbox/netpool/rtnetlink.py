"""Just enough rtnetlink and sock_diag to snapshot a network namespace.

`_Netlink` sends one request on a netlink socket and collects the answers
of its sequence number. The dumps decode what a namespace holds into rows
(`Link`, `Addr`, `Route`, `Rule`) that compare equal when nothing changed,
and list its sockets. Rows also come from pyroute2 messages
(`*_from_pyroute2`), for readers that hold an IPRoute (sandbox.isolation).

The messages are decoded here with struct, not with pyroute2's message
classes, for speed: a pool checks a namespace at every release (four dumps).
Measured with benchmarks/netlink_decode.py (a fresh pool namespace, the
same bytes decoded into the same rows; pyroute2 0.9.7, Linux 6.18, a
busy 2-core machine), pyroute2's classes cost 50-190 µs more per dump
than this decoder (links 150, addresses 50, routes 190, rules 170): about
610 µs against 50 µs for the four. A decoder of our own was to stay only
if pyroute2 cost over ~50 µs more per dump: it does.

Also here: the kernel numbers the pool and the backends share (nsfs and
socket ioctls, interface flags).
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
from typing import Any, NamedTuple

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
SOL_NETLINK, NETLINK_DROP_MEMBERSHIP = 270, 2
SIOCGSKNS = 0x894C  # socket ioctl: an fd of the socket's network namespace
NS_GET_USERNS = 0xB701  # nsfs ioctl: an fd of the namespace's owning user namespace

_NETLINK_TIMEOUT = 5.0  # seconds for the kernel to answer a netlink request

_HDR = struct.Struct("=IHHII")
_IFINFO = struct.Struct("=BxHiII")
_IFADDR = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")
_INET_DIAG_REQ = struct.Struct("=BBBxI48x")  # family, protocol, ext, states, inet_diag_sockid (any)
_INET_DIAG_MSG = struct.Struct("=BBBB2H16s16sI8xIIIII")
_UNIX_DIAG_REQ = struct.Struct("=BBxxIII8x")  # family, protocol, states, ino, show, cookie
_UNIX_DIAG_MSG = struct.Struct("=BBBxI8x")


# ---------------------------------------------------------------- rows

class Link(NamedTuple):
    """A network interface (RTM_NEWLINK): `kind` is the ARPHRD_* type. (`ifindex`, not
    `index`, which would hide tuple.index.)"""

    ifindex: int
    name: str
    kind: int
    flags: int
    mtu: int | None


class Addr(NamedTuple):
    """An interface address (RTM_NEWADDR): IFA_LOCAL, else IFA_ADDRESS."""

    family: int
    ifindex: int
    address: str | None
    prefixlen: int
    scope: int


class Route(NamedTuple):
    """A route of any table (RTM_NEWROUTE). `extra`: it has RTA_VIA or RTA_MULTIPATH
    (next hops elsewhere than `oif`/`gateway`)."""

    family: int
    table: int
    kind: int
    proto: int
    scope: int
    dst: str | None
    dst_len: int
    oif: int | None
    gateway: str | None
    extra: bool
    priority: int | None
    prefsrc: str | None


class Rule(NamedTuple):
    """A policy routing rule (RTM_NEWRULE). `raw` is the whole fib_rule message
    (it has no counters), so that any change to a rule shows."""

    family: int
    dst_len: int
    src_len: int
    table: int
    action: int
    raw: bytes


# ---------------------------------------------------------------- decoding

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


def _link_row(body: bytes) -> Link:
    _, kind, index, flags, _ = _IFINFO.unpack_from(body)
    attrs = _attrs(body, _IFINFO.size)
    name = attrs.get(IFLA_IFNAME, b"").rstrip(b"\0").decode(errors="replace")
    return Link(index, name, kind, flags, _u32(attrs.get(IFLA_MTU)))


def _addr_row(body: bytes) -> Addr:
    family, prefixlen, _, scope, index = _IFADDR.unpack_from(body)
    attrs = _attrs(body, _IFADDR.size)
    raw = attrs.get(IFA_LOCAL, attrs.get(IFA_ADDRESS))
    address = _ip(family, raw) if family in (socket.AF_INET, socket.AF_INET6) else (raw or b"").hex()
    return Addr(family, index, address, prefixlen, scope)


def _route_row(body: bytes) -> Route:
    family, dst_len, _, _, table, proto, scope, kind, _ = _RTMSG.unpack_from(body)
    attrs = _attrs(body, _RTMSG.size)
    ipfam = family if family in (socket.AF_INET, socket.AF_INET6) else None
    dst = _ip(ipfam, attrs.get(RTA_DST)) if ipfam else attrs.get(RTA_DST, b"").hex()
    gateway = _ip(ipfam, attrs.get(RTA_GATEWAY)) if ipfam else None
    extra = bool(attrs.get(RTA_VIA) or attrs.get(RTA_MULTIPATH))
    return Route(family, _u32(attrs.get(RTA_TABLE)) or table, kind, proto, scope, dst, dst_len,
                 _u32(attrs.get(RTA_OIF)), gateway, extra, _u32(attrs.get(RTA_PRIORITY)),
                 _ip(ipfam, attrs.get(RTA_PREFSRC)) if ipfam else None)


def _rule_row(body: bytes) -> Rule:
    family, dst_len, src_len, _, table, _, _, action, _ = _RTMSG.unpack_from(body)
    table = _u32(_attrs(body, _RTMSG.size).get(FRA_TABLE)) or table
    return Rule(family, dst_len, src_len, table, action, body)


# ---------------------------------------------------------------- the client

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


_UNSPEC_IFINFO = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
_UNSPEC_IFADDR = _IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
_UNSPEC_RTMSG = _RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0, 0)  # every table, every family


def _links(nl: _Netlink) -> frozenset[Link]:
    return frozenset(map(_link_row, nl.dump(RTM_GETLINK, _UNSPEC_IFINFO)))


def _addrs(nl: _Netlink) -> frozenset[Addr]:
    return frozenset(map(_addr_row, nl.dump(RTM_GETADDR, _UNSPEC_IFADDR)))


def _routes(nl: _Netlink) -> frozenset[Route]:
    """Every route of every table and family (AF_UNSPEC dumps them all)."""
    return frozenset(map(_route_row, nl.dump(RTM_GETROUTE, _UNSPEC_RTMSG)))


def _rules(nl: _Netlink) -> frozenset[Rule]:
    return frozenset(map(_rule_row, nl.dump(RTM_GETRULE, _UNSPEC_RTMSG)))


def _bring_lo_up(nl: _Netlink, index: int) -> None:
    """RTM_NEWLINK setting IFF_UP on lo (the socket's namespace, whoever we are)."""
    nl.request(RTM_NEWLINK, NLM_F_ACK, _IFINFO.pack(socket.AF_UNSPEC, 0, index, IFF_UP, IFF_UP))


# ---------------------------------------------------------------- sockets

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


# ---------------------------------------------------------------- from pyroute2

def link_from_pyroute2(msg: Any) -> Link:
    """A Link from a pyroute2 ifinfmsg."""
    return Link(msg["index"], msg.get_attr("IFLA_IFNAME") or "", msg["ifi_type"], msg["flags"],
                msg.get_attr("IFLA_MTU"))


def addr_from_pyroute2(msg: Any) -> Addr:
    """An Addr from a pyroute2 ifaddrmsg."""
    address = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
    return Addr(msg["family"], msg["index"], address, msg["prefixlen"], msg["scope"])


def route_from_pyroute2(msg: Any) -> Route:
    """A Route from a pyroute2 rtmsg."""
    get = msg.get_attr
    return Route(msg["family"], get("RTA_TABLE") or msg["table"], msg["type"], msg["proto"], msg["scope"],
                 get("RTA_DST"), msg["dst_len"], get("RTA_OIF"), get("RTA_GATEWAY"),
                 bool(get("RTA_VIA") or get("RTA_MULTIPATH")), get("RTA_PRIORITY"), get("RTA_PREFSRC"))


def rule_from_pyroute2(msg: Any) -> Rule:
    """A Rule from a pyroute2 fibmsg, `raw` cut from the buffer it was parsed from."""
    start = msg.offset + _HDR.size
    raw = bytes(msg.data[start: msg.offset + msg["header"]["length"]])
    return Rule(msg["family"], msg["dst_len"], msg["src_len"], msg.get_attr("FRA_TABLE") or msg["table"],
                msg["action"], raw)
