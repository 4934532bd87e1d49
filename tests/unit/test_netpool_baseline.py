"""The definition of a loopback-only namespace (sandbox.netpool.baseline), fed canned snapshots.

No namespace is made: the rows are what the kernel reports for a fresh
namespace with lo up (as Linux 6.18 does, IPv6 on), built by hand or
decoded from netlink messages packed here.
"""

from __future__ import annotations

import os
import socket
import struct

import pytest

from sandbox.netpool import rtnetlink as rt
from sandbox.netpool.baseline import _diff, _route_ok, _rule_ok, _State, _verify_fresh

V4, V6 = socket.AF_INET, socket.AF_INET6
IPMR, IP6MR = 128, 129  # RTNL_FAMILY_IPMR, RTNL_FAMILY_IP6MR: multicast routing rules
HAS_IPV6 = os.path.isdir("/proc/sys/net/ipv6")
LO = 1
HOST, LINK_SCOPE, UNIVERSE = 254, 253, 0
KERNEL, BOOT = 2, 3  # route protocols
FR_ACT_BLACKHOLE = 6
FRA_PRIORITY, FRA_SUPPRESS_PREFIXLEN, FRA_PROTOCOL = 6, 14, 21
TABLE_OTHER = 100


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def rule(family: int, table: int, priority: int = 0, *, action: int = rt.FR_ACT_TO_TBL, dst_len: int = 0,
         src_len: int = 0) -> rt.Rule:
    """A fib_rule message as the kernel sends it (the table in the header and in rt.FRA_TABLE), decoded."""
    header_table = table if table < 256 else 252  # RT_TABLE_COMPAT: the real one is in rt.FRA_TABLE
    body = rt._RTMSG.pack(family, dst_len, src_len, 0, header_table, 0, 0, action, 0)
    body += attr(rt.FRA_TABLE, struct.pack("=I", table)) + attr(FRA_SUPPRESS_PREFIXLEN, struct.pack("=I", 0xFFFFFFFF))
    body += attr(FRA_PROTOCOL, bytes([KERNEL])) + (attr(FRA_PRIORITY, struct.pack("=I", priority)) if priority else b"")
    return rt._rule_row(body)


def route(family: int, dst: str | None, dst_len: int, *, table: int = rt.RT_TABLE_LOCAL, kind: int = rt.RTN_LOCAL,
          oif: int | None = LO, gateway: str | None = None, scope: int = HOST) -> rt.Route:
    prefsrc = "127.0.0.1" if family == V4 and table == rt.RT_TABLE_LOCAL else None
    return rt.Route(family, table, kind, KERNEL, scope, dst, dst_len, oif, gateway, False,
                 0 if family == V6 else None, prefsrc)


LO_LINK = rt.Link(LO, "lo", 772, rt.IFF_UP | rt.IFF_LOOPBACK | 0x10040, 65536)  # ARPHRD_LOOPBACK; RUNNING, LOWER_UP
FRESH = _State(
    links=frozenset({LO_LINK}),
    addrs=frozenset({rt.Addr(V4, LO, "127.0.0.1", 8, HOST)}
                    | ({rt.Addr(V6, LO, "::1", 128, HOST)} if HAS_IPV6 else set())),
    routes=frozenset({
        route(V4, "127.0.0.0", 8),
        route(V4, "127.0.0.1", 32),
        route(V4, "127.255.255.255", 32, kind=rt.RTN_BROADCAST, scope=LINK_SCOPE),
        *([route(V6, "::1", 128, scope=UNIVERSE)] if HAS_IPV6 else []),
    }),
    rules=frozenset({
        rule(V4, rt.RT_TABLE_LOCAL), rule(V4, rt.RT_TABLE_MAIN, 32766), rule(V4, rt.RT_TABLE_DEFAULT, 32767),
        rule(V6, rt.RT_TABLE_LOCAL), rule(V6, rt.RT_TABLE_MAIN, 32766),
        rule(IPMR, rt.RT_TABLE_DEFAULT, 32767), rule(IP6MR, rt.RT_TABLE_MAIN, 32767),
    }),
)


def changed(links: frozenset[rt.Link] = frozenset(), addrs: frozenset[rt.Addr] = frozenset(),
            routes: frozenset[rt.Route] = frozenset(), rules: frozenset[rt.Rule] = frozenset()) -> _State:
    """FRESH with rows added."""
    return _State(FRESH.links | links, FRESH.addrs | addrs, FRESH.routes | routes, FRESH.rules | rules)


# ---------------------------------------------------------------- a fresh namespace

def test_fresh_namespace_accepted() -> None:
    assert _verify_fresh(FRESH) == []
    assert _verify_fresh(FRESH, sockets=()) == []
    assert _diff(FRESH, FRESH) == []


def test_fresh_routes_and_rules_each_accepted() -> None:
    assert all(_route_ok(r, LO) for r in FRESH.routes)
    assert all(_rule_ok(r) for r in FRESH.rules)
    # the main table may hold lo's own routes (an older kernel puts ::1 there)
    assert _route_ok(route(V6, "::1", 128, table=rt.RT_TABLE_MAIN, kind=rt.RTN_UNICAST, scope=UNIVERSE), LO)


# ---------------------------------------------------------------- each extra rejected

def test_extra_link_rejected() -> None:
    state = changed(links=frozenset({rt.Link(2, "dummy0", 1, rt.IFF_UP, 1500)}))
    assert any("expected only lo" in p for p in _verify_fresh(state))
    assert [reason for reason, _ in _diff(FRESH, state)] == ["links"]


def test_lo_down_rejected() -> None:
    state = _State(frozenset({LO_LINK._replace(flags=rt.IFF_LOOPBACK)}), FRESH.addrs, FRESH.routes, FRESH.rules)
    assert any("not a loopback device that is up" in p for p in _verify_fresh(state))


def test_extra_address_rejected() -> None:
    state = changed(addrs=frozenset({rt.Addr(V4, LO, "10.99.0.1", 32, UNIVERSE)}))
    assert any(p.startswith("addresses") for p in _verify_fresh(state))
    assert [reason for reason, _ in _diff(FRESH, state)] == ["addresses"]


def test_missing_address_rejected() -> None:
    state = _State(FRESH.links, frozenset(), FRESH.routes, FRESH.rules)
    assert any(p.startswith("addresses") for p in _verify_fresh(state))


@pytest.mark.parametrize("table", [rt.RT_TABLE_MAIN, rt.RT_TABLE_LOCAL, rt.RT_TABLE_DEFAULT, TABLE_OTHER])
@pytest.mark.parametrize("extra", [
    route(V4, "10.98.0.0", 16, kind=rt.RTN_UNICAST, scope=LINK_SCOPE),  # a subnet on lo
    route(V4, None, 0, kind=rt.RTN_UNICAST, scope=UNIVERSE),  # a default route
    route(V4, "127.0.0.0", 8, kind=rt.RTN_UNICAST, oif=2),  # loopback range through another link
    route(V4, "127.0.0.0", 8, kind=rt.RTN_UNICAST, gateway="127.0.0.2"),  # through a gateway
    route(V4, "126.0.0.0", 7, kind=rt.RTN_UNICAST),  # wider than 127.0.0.0/8
    route(V6, "2001:db8::", 32, kind=rt.RTN_UNICAST),
    route(V6, "::", 0, kind=rt.RTN_UNICAST, scope=UNIVERSE),
])
def test_route_in_any_table_rejected(extra: rt.Route, table: int) -> None:
    bad = extra._replace(table=table)
    assert not _route_ok(bad, LO)
    state = changed(routes=frozenset({bad}))
    assert any(p.startswith("unexpected routes") for p in _verify_fresh(state))
    assert [reason for reason, _ in _diff(FRESH, state)] == ["routes"]


def test_loopback_route_outside_local_and_main_rejected() -> None:
    """Even lo's own kind of route, in a table lookups do not reach by default."""
    for table in (rt.RT_TABLE_DEFAULT, TABLE_OTHER):
        assert not _route_ok(route(V4, "127.0.0.1", 32, table=table), LO)


def test_missing_local_route_rejected() -> None:
    routes = frozenset(r for r in FRESH.routes if r.dst != "127.0.0.1")
    state = _State(FRESH.links, FRESH.addrs, routes, FRESH.rules)
    assert any(p.startswith("unexpected routes") for p in _verify_fresh(state))


@pytest.mark.parametrize("extra", [
    rule(V4, TABLE_OTHER),  # a lookup of another table
    rule(V4, rt.RT_TABLE_MAIN, src_len=8),  # a lookup by source
    rule(V6, rt.RT_TABLE_MAIN, dst_len=64),
    rule(V4, rt.RT_TABLE_MAIN, action=FR_ACT_BLACKHOLE),
])
def test_extra_rule_rejected(extra: rt.Rule) -> None:
    assert not _rule_ok(extra)
    state = changed(rules=frozenset({extra}))
    assert any(p.startswith("unexpected policy rules") for p in _verify_fresh(state))
    assert [reason for reason, _ in _diff(FRESH, state)] == ["rules"]


def test_listening_socket_rejected() -> None:
    listener = "tcp LISTEN 127.0.0.1:8080 -> 0.0.0.0:0"
    assert _verify_fresh(FRESH, [listener]) == [f"sockets: {listener}"]


def test_any_rule_change_shows_in_the_diff() -> None:
    """Rules compare by their whole message: a change the predicate ignores still shows."""
    one, moved = rule(V4, rt.RT_TABLE_MAIN, 32766), rule(V4, rt.RT_TABLE_MAIN, 100)  # same lookup, another priority
    state = _State(FRESH.links, FRESH.addrs, FRESH.routes, (FRESH.rules - {one}) | {moved})
    assert _verify_fresh(state) == []
    assert [reason for reason, _ in _diff(FRESH, state)] == ["rules"]


# ---------------------------------------------------------------- decoding

def test_rows_decoded_from_netlink_messages() -> None:
    link = rt._IFINFO.pack(0, 772, LO, rt.IFF_UP | rt.IFF_LOOPBACK, 0) + attr(rt.IFLA_IFNAME, b"lo\0") + \
        attr(rt.IFLA_MTU, struct.pack("=I", 65536))
    assert rt._link_row(link) == rt.Link(LO, "lo", 772, rt.IFF_UP | rt.IFF_LOOPBACK, 65536)
    body = rt._RTMSG.pack(V4, 16, 0, 0, 252, BOOT, UNIVERSE, rt.RTN_UNICAST, 0) + \
        attr(rt.RTA_TABLE, struct.pack("=I", 1000)) + attr(rt.RTA_DST, socket.inet_aton("10.98.0.0")) + \
        attr(rt.RTA_OIF, struct.pack("=I", 2)) + \
        attr(rt.RTA_GATEWAY, socket.inet_aton("10.98.0.1"))
    got = rt._route_row(body)
    assert (got.table, got.dst, got.dst_len, got.oif, got.gateway) == (1000, "10.98.0.0", 16, 2, "10.98.0.1")
    assert rule(V4, 1000).table == 1000  # rt.FRA_TABLE: tables past 255


def test_sockstat_keeps_the_namespaces_own_counts_and_drops_host_wide_figures() -> None:
    from sandbox.netpool.lease import _sockstat

    text = (b"sockets: used 2\nTCP: inuse 1 orphan 7 tw 3 alloc 90 mem 193\nUDP: inuse 0 mem 12\n"
            b"UDPLITE: inuse 0\nRAW: inuse 0\nFRAG: inuse 0 memory 0\n")
    assert _sockstat(text) == {"sockets:used": 2, "TCP:inuse": 1, "TCP:tw": 3, "UDP:inuse": 0, "UDPLITE:inuse": 0,
                               "RAW:inuse": 0, "FRAG:inuse": 0, "FRAG:memory": 0}
    six = b"TCP6: inuse 0\nUDP6: inuse 1\nUDPLITE6: inuse 0\nRAW6: inuse 0\nFRAG6: inuse 0 memory 0\n"
    assert _sockstat(six)["UDP6:inuse"] == 1
