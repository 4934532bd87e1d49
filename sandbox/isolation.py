"""The isolation check: what a sandbox's network namespace holds, seen from the host.

With `Spec(check_network=True)` (and always when ports are forwarded) the sandbox runs
in a leased namespace (sandbox.netpool), which is inspected with pyroute2
through a netlink socket bound to it before the command starts. What pyroute2
reads is held to the pool's own definition of loopback-only
(sandbox.netpool.baseline): exactly `lo`, up, with 127.0.0.1/8 and ::1/128,
only the routes the kernel makes for lo, in any table, and only the default
policy rules. Anything else fails the start with IsolationError naming it.
Probe paths are checked inside by the setup child (see Spec.probe_paths). The
findings are part of the result (`.isolation`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import IsolationError
from .plan import Plan

if TYPE_CHECKING:
    from .netpool.baseline import _State


def read_netns(ipr: Any) -> _State:
    """The namespace of `ipr` (a pyroute2 IPRoute bound to it), as the pool's snapshot rows."""
    import socket  # the check's machinery only when a namespace is checked (findings() is on every spawn)

    # lazy: the check's machinery only when a namespace is checked: 5 ms, not on a plain run (test_cold_path)
    from .netpool.baseline import _State
    from .netpool.rtnetlink import addr_from_pyroute2, link_from_pyroute2, route_from_pyroute2, rule_from_pyroute2

    return _State(
        links=frozenset(map(link_from_pyroute2, ipr.link("dump"))),
        addrs=frozenset(map(addr_from_pyroute2, ipr.addr("dump", family=socket.AF_UNSPEC))),
        routes=frozenset(map(route_from_pyroute2, ipr.route("dump", family=socket.AF_UNSPEC))),  # every table
        rules=frozenset(map(rule_from_pyroute2, ipr.rule("dump", family=socket.AF_UNSPEC))),
    )


def check_netns(ipr: Any) -> dict[str, Any]:
    """Inspect a network namespace through `ipr` (a pyroute2 IPRoute bound to
    it); raise IsolationError naming what should not be there."""
    from .netpool.baseline import _verify_fresh  # lazy: as read_netns's: 5 ms, not on a plain run

    state = read_netns(ipr)
    problems = _verify_fresh(state)
    if problems:
        raise IsolationError("isolation check failed: the network namespace is not loopback-only: "
                             + "; ".join(problems))
    return {"interfaces": sorted(link.name for link in state.links),
            "addresses": sorted(f"{a.address}/{a.prefixlen}" for a in state.addrs),
            "routes": 0}  # none leads out


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
