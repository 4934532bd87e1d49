#!/usr/bin/env python3
"""Decoding a namespace's rtnetlink dumps: the pool's hand-written decoder against pyroute2's classes.

The pool snapshots a namespace (links, addresses, routes of every table,
policy rules) on every release, so decoding sits on the release path. This
takes one freshly made pool namespace (what a release finds), records the
raw answer of each dump once over the pool's own netlink socket, then times
turning those bytes into the same rows: with sandbox.netpool.rtnetlink's
struct decoder, and with pyroute2's message classes (`MarshalRtnl.parse`,
then `*_from_pyroute2`). It also times whole dumps over the socket with
each decoder. Both decoders must give equal rows; the run fails otherwise.

Usage: python3 benchmarks/netlink_decode.py [-n 2000]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyroute2.netlink.rtnl.marshal import MarshalRtnl

from sandbox.netpool import NetnsPool
from sandbox.netpool import rtnetlink as R

DUMPS: dict[str, tuple[int, bytes, Callable[[bytes], Any], Callable[[Any], Any]]] = {
    "links": (R.RTM_GETLINK, R._UNSPEC_IFINFO, R._link_row, R.link_from_pyroute2),
    "addresses": (R.RTM_GETADDR, R._UNSPEC_IFADDR, R._addr_row, R.addr_from_pyroute2),
    "routes": (R.RTM_GETROUTE, R._UNSPEC_RTMSG, R._route_row, R.route_from_pyroute2),
    "rules": (R.RTM_GETRULE, R._UNSPEC_RTMSG, R._rule_row, R.rule_from_pyroute2),
}


def raw_dump(sock: socket.socket, seq: int, msg_type: int, payload: bytes) -> list[bytes]:
    """The datagrams the kernel answers a dump request with, up to NLMSG_DONE."""
    sock.send(R._HDR.pack(R._HDR.size + len(payload), msg_type, R.NLM_F_DUMP | R.NLM_F_REQUEST, seq, 0) + payload)
    out = []
    while True:
        data = sock.recv(65536)
        out.append(data)
        offset = 0
        while offset + R._HDR.size <= len(data):
            length, kind = R._HDR.unpack_from(data, offset)[:2]
            if kind in (R.NLMSG_DONE, R.NLMSG_ERROR):
                return out
            offset += (length + 3) & ~3


def hand_decode(datagrams: list[bytes], row: Callable[[bytes], Any]) -> frozenset[Any]:
    """What _Netlink.request and the row decoder do with the datagrams."""
    rows = []
    for data in datagrams:
        offset = 0
        while offset + R._HDR.size <= len(data):
            length, kind = R._HDR.unpack_from(data, offset)[:2]
            if kind not in (R.NLMSG_DONE, R.NLMSG_ERROR):
                rows.append(row(data[offset + R._HDR.size: offset + length]))
            offset += (length + 3) & ~3
    return frozenset(rows)


def pyroute2_decode(datagrams: list[bytes], normalize: Callable[[Any], Any]) -> frozenset[Any]:
    """pyroute2's message classes over the same datagrams, normalized to the same rows."""
    marshal = MarshalRtnl()
    return frozenset(normalize(msg) for data in datagrams for msg in marshal.parse(data)
                     if msg["header"]["type"] not in (R.NLMSG_DONE, R.NLMSG_ERROR))


def per_call_us(fn: Callable[[], object], n: int) -> float:
    """Median over 5 batches of the mean microseconds per call."""
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        batches.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(batches)


def measure(nl: Any, name: str, n: int) -> tuple[int, int, float, float, float, float]:
    """(messages, bytes, hand us, pyroute2 us, whole dump with hand us, whole dump with pyroute2 us)."""
    msg_type, payload, row, normalize = DUMPS[name]
    seq = (1 << 30) + msg_type
    datagrams = raw_dump(nl.sock, seq, msg_type, payload)
    hand = hand_decode(datagrams, row)
    theirs = pyroute2_decode(datagrams, normalize)
    if theirs != hand:
        raise SystemExit(f"{name}: the decoders disagree:\n{sorted(map(str, hand))}\n{sorted(map(str, theirs))}")
    slow = max(1, n // 4)
    return (len(hand), sum(map(len, datagrams)),
            per_call_us(lambda: hand_decode(datagrams, row), n),
            per_call_us(lambda: pyroute2_decode(datagrams, normalize), slow),
            per_call_us(lambda: frozenset(map(row, nl.dump(msg_type, payload))), slow),
            per_call_us(lambda: pyroute2_decode(raw_dump(nl.sock, seq, msg_type, payload), normalize), slow))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="decodes per batch (default 2000)")
    n = parser.parse_args().n
    print(f"kernel {os.uname().release}, median of 5 batches of {n} (whole dumps: {max(1, n // 4)})\n")
    print(f"{'dump':<10} {'msgs':>4} {'bytes':>5} {'hand us':>8} {'pyroute2 us':>11} {'extra us':>8}"
          f" {'dump+hand us':>12} {'dump+pyroute2 us':>16}")
    totals = [0.0, 0.0]
    with NetnsPool(1, refill=False) as pool, pool.lease() as lease:
        for name in DUMPS:
            msgs, size, hand, theirs, whole_hand, whole_theirs = measure(lease._ns.rtnl, name, n)
            totals[0] += hand
            totals[1] += theirs
            print(f"{name:<10} {msgs:>4} {size:>5} {hand:>8.1f} {theirs:>11.1f} {theirs - hand:>8.1f}"
                  f" {whole_hand:>12.1f} {whole_theirs:>16.1f}")
    print(f"{'snapshot':<10} {'':>4} {'':>5} {totals[0]:>8.1f} {totals[1]:>11.1f} {totals[1] - totals[0]:>8.1f}")


if __name__ == "__main__":
    main()
