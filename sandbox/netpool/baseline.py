"""What "loopback-only" means for a network namespace, as pure functions of a snapshot.

A `_State` is what a namespace's configuration looks like, in comparable
rows (sandbox.netpool.rtnetlink); `_snapshot` reads one over a netlink
socket, and sandbox.isolation builds one from what pyroute2 reads.

`_verify_fresh` is the definition, for a namespace just made (the pool,
before a namespace enters it) and for a sandbox's before its command runs
(sandbox.isolation): only lo, a loopback device and up; only 127.0.0.1/8
and (if the kernel has IPv6) ::1/128 on it; only the routes the kernel
makes for lo, in any table (`_route_ok`); only the default policy rules
(`_rule_ok`); and no socket. `_diff` tells what changed since a baseline
(the pool, at release).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from .rtnetlink import (
    FR_ACT_TO_TBL,
    IFF_LOOPBACK,
    IFF_UP,
    RT_TABLE_DEFAULT,
    RT_TABLE_LOCAL,
    RT_TABLE_MAIN,
    RTN_BROADCAST,
    RTN_LOCAL,
    RTN_UNICAST,
    Addr,
    Link,
    Route,
    Rule,
    _addrs,
    _links,
    _Netlink,
    _routes,
    _rules,
)

RT_SCOPE_HOST = 254
_LOOPBACK_V4 = ipaddress.IPv4Network("127.0.0.0/8")


@dataclass(frozen=True)
class _State:
    """What a namespace's configuration looks like, in comparable form."""

    links: frozenset[Link]
    addrs: frozenset[Addr]
    routes: frozenset[Route]  # every table, every family
    rules: frozenset[Rule]


def _snapshot(nl: _Netlink) -> _State:
    """The namespace of netlink socket `nl`, now."""
    return _State(_links(nl), _addrs(nl), _routes(nl), _rules(nl))


def _diff(before: _State, after: _State) -> list[tuple[str, str]]:
    """(reason, detail) for each part of the configuration that changed."""
    problems = []
    for reason, old, new in (("links", before.links, after.links), ("addresses", before.addrs, after.addrs),
                             ("routes", before.routes, after.routes), ("rules", before.rules, after.rules)):
        if old != new:
            added, removed = sorted(map(str, new - old)), sorted(map(str, old - new))
            problems.append((reason, f"{reason}: added {added[:5]}, removed {removed[:5]}"))
    return problems


def _expected_addrs(lo: int) -> set[Addr]:
    """127.0.0.1/8 and (if the kernel has IPv6) ::1/128 on lo, host scope.

    The kernel adds both itself when lo goes up (the inet and inet6
    NETDEV_UP handlers), together with their local routes.
    """
    out = {Addr(socket.AF_INET, lo, "127.0.0.1", 8, RT_SCOPE_HOST)}
    if os.path.isdir("/proc/sys/net/ipv6"):
        out.add(Addr(socket.AF_INET6, lo, "::1", 128, RT_SCOPE_HOST))
    return out


def _route_ok(route: Route, lo: int) -> bool:
    """A route the kernel makes for lo: local/broadcast/unicast, through lo,
    no gateway, inside 127.0.0.0/8 or exactly ::1, in the local or main table."""
    if route.oif != lo or route.gateway or route.extra or route.kind not in (RTN_UNICAST, RTN_LOCAL, RTN_BROADCAST):
        return False
    if route.table not in (RT_TABLE_LOCAL, RT_TABLE_MAIN) or route.dst is None:
        return False
    if route.family == socket.AF_INET:
        return route.dst_len >= 8 and \
            ipaddress.IPv4Network(f"{route.dst}/{route.dst_len}", strict=False).subnet_of(_LOOPBACK_V4)
    return route.family == socket.AF_INET6 and route.dst == "::1" and route.dst_len == 128


def _rule_ok(rule: Rule) -> bool:
    """A default policy rule: plain lookup of the local, main or default table."""
    return (rule.action == FR_ACT_TO_TBL and rule.dst_len == rule.src_len == 0
            and rule.table in (RT_TABLE_LOCAL, RT_TABLE_MAIN, RT_TABLE_DEFAULT))


def _verify_fresh(state: _State, sockets: Sequence[str] = ()) -> list[str]:
    """What is wrong with a namespace that should be loopback-only (empty list: nothing).

    `sockets` are the namespace's sockets (rtnetlink._sockets), for a
    caller that can see them: any is wrong.
    """
    problems = []
    if len(state.links) != 1:
        problems.append(f"expected only lo, found links {sorted(state.links)}")
    lo_link = next(iter(state.links)) if state.links else Link(0, "", 0, 0, 0)
    if lo_link.name != "lo" or not lo_link.flags & IFF_LOOPBACK or not lo_link.flags & IFF_UP:
        problems.append(f"lo is not a loopback device that is up: {lo_link}")
    expected = _expected_addrs(lo_link.ifindex)
    if set(state.addrs) != expected:
        problems.append(f"addresses {sorted(state.addrs)} != {sorted(expected)}")
    bad_routes = [r for r in state.routes if not _route_ok(r, lo_link.ifindex)]
    if bad_routes or not any(r.kind == RTN_LOCAL and r.dst == "127.0.0.1" for r in state.routes):
        problems.append(f"unexpected routes {sorted(map(str, bad_routes))} (all: {len(state.routes)})")
    bad_rules = [r.raw.hex() for r in state.rules if not _rule_ok(r)]
    if bad_rules:
        problems.append(f"unexpected policy rules {bad_rules}")
    return problems + [f"sockets: {s}" for s in sockets]
