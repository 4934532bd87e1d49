"""Issue 11, item 7: a recycled pooled namespace must not carry its previous tenant's counters.

Tenant A moves every per-namespace counter it can without leaving state
behind: UDP and TCP to closed ports on lo (lo's packets and bytes, the IP,
UDP and TCP MIBs), ping-less ICMP replies (port unreachable), and a send to
an address with no route (IpOutNoRoutes, which moves nothing on lo). Tenant
B, leasing from the same pool of one namespace, must read exactly what an
untouched namespace shows. Native backend only: the bwrap backend never
leases. Root and unprivileged (owner "init" and "userns" pools).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from sandbox import netpool

from .attack import require, run_py, run_sh

pytestmark = pytest.mark.integration

COUNTERS = "readlink /proc/self/ns/net; cat /proc/net/snmp /proc/net/netstat /proc/net/dev; " \
           "cat /proc/net/snmp6 2>/dev/null; true"

NOISE = """
import socket
for _ in range(5):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"x" * 100, ("127.0.0.1", 9))          # lo, ICMP port unreachable back
    u.close()
    t = socket.socket()
    try:
        t.connect(("127.0.0.1", 9))                 # SYN, RST: TCP AttemptFails, OutRsts
    except OSError:
        pass
    t.close()
    n = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        n.sendto(b"x", ("10.255.0.1", 9))           # no route: IpOutNoRoutes only
    except OSError:
        pass
    n.close()
print("sent")
"""


@contextlib.contextmanager
def pool_of_one() -> Iterator[netpool.NetnsPool]:
    """A process-wide pool of one namespace for network="pool", the default again after."""
    netpool.disable()
    pool = netpool.enable(size=1, for_network_none=False)
    try:
        assert pool.wait_filled(10)
        yield pool
    finally:
        netpool.disable()
        netpool.restore_default()


def _split(out: str) -> tuple[str, str]:
    ns, _, counters = out.partition("\n")
    return ns, counters


def test_the_next_tenant_sees_no_counter_the_previous_one_moved(base_spec) -> None:
    require("native")
    spec = base_spec(network="pool")
    with pool_of_one() as pool:
        before = run_sh("native", COUNTERS, spec)
        ns_before, untouched = _split(before.stdout)
        assert " 0 " in untouched and before.returncode == 0, before.stderr
        assert pool.wait_filled(10)
        reread = run_sh("native", COUNTERS, spec)
        assert _split(reread.stdout) == (ns_before, untouched)  # reading moves nothing: recycled
        assert pool.wait_filled(10)
        noise = run_py("native", NOISE + "import os; print(os.readlink('/proc/self/ns/net'))", spec)
        assert noise.stdout.split()[0] == "sent", noise.stderr
        ns_noisy = noise.stdout.split()[1]
        assert ns_noisy == ns_before  # A had the recycled namespace
        assert pool.wait_filled(10)
        after = run_sh("native", COUNTERS, spec)
        ns_after, seen = _split(after.stdout)
        assert seen == untouched, "tenant B sees counters tenant A moved"
        assert ns_after != ns_noisy
        assert pool.stats()["destroyed_by_reason"].get("counters", 0) >= 1
