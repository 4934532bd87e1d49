"""The isolation check: what a sandbox's network namespace holds, seen from the host.

With `Spec(check=True)` (and always when ports are forwarded) the sandbox runs
in a leased namespace (sandbox.netpool), which is inspected with pyroute2
through a netlink socket bound to it before the command starts: exactly `lo`,
up, with 127.0.0.1/8 and ::1/128, and no route in the main table. Anything
else fails the start with IsolationError naming it. Probe paths are checked
inside by the setup child (see Spec.probe_paths). The findings are part of the
result (`.isolation`).
"""

from __future__ import annotations

from typing import Any

from .errors import IsolationError
from .plan import Plan

IFF_UP = 0x1
EXPECTED_ADDRESSES = {"127.0.0.1/8", "::1/128"}
MAIN_TABLE = 254


def check_netns(ipr: Any) -> dict[str, Any]:
    """Inspect a network namespace through `ipr` (a pyroute2 IPRoute bound to
    it); raise IsolationError naming what should not be there."""
    links = [(link.get_attr("IFLA_IFNAME"), bool(link["flags"] & IFF_UP)) for link in ipr.get_links()]
    addresses = sorted(f"{a.get_attr('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr())
    routes = [r for r in ipr.get_routes(table=MAIN_TABLE) if r.get("table", MAIN_TABLE) == MAIN_TABLE]
    problems = []
    if links != [("lo", True)]:
        problems.append(f"interfaces {links} (expected only lo, up)")
    if set(addresses) != EXPECTED_ADDRESSES:
        problems.append(f"addresses {addresses} (expected {sorted(EXPECTED_ADDRESSES)})")
    if routes:
        problems.append(f"{len(routes)} route(s) in the main table (expected none: nothing may lead out)")
    if problems:
        raise IsolationError("isolation check failed: the network namespace has " + "; ".join(problems))
    return {"interfaces": [name for name, _ in links], "addresses": addresses, "routes": 0}


def findings(plan: Plan, network: dict[str, Any] | None) -> dict[str, Any]:
    """What the checks established, for the result."""
    out: dict[str, Any] = {}
    if network is not None:
        out["network"] = network
    if plan.probe_paths:
        out["probe_paths_absent"] = list(plan.probe_paths)
    if plan.forward:
        out["forwarded"] = {port: target for port, target in plan.forward}
    return out
