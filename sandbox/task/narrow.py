"""Nested sandboxes: a description narrowed from its parent's.

The broker (broker.py) checks every nested request with `narrowed(parent,
child)`, and a framework that starts the stricter sandbox itself, as a
sibling, can call it too: the child description is checked to grant
nothing its parent does not (every path it shows lies under a path the
parent shows, writable only where the parent's is; no network the parent
lacks; no port, socket or allowed host beyond the parent's; no variable
beyond the parent's allowlist; no package beyond the parent's `packages`;
no framework package but the parent's), and it inherits what must never loosen: the
parent's hidden modules and probes are added to its own, its limits are the
smaller of the two, and its enforcement, records and `enabled` are the
parent's. SpecError names the first field that would widen.
"""

from __future__ import annotations

import fnmatch

from ..errors import SpecError
from ..paths import is_under
from .description import Limits, Sandbox, check_sandbox


def _parent_grants(parent: Sandbox) -> list[tuple[str, bool]]:
    """(host path, writable) the parent shows, most specific last."""
    grants = [(p, False) for p in parent.read] + [(p, True) for p in parent.write]
    grants += [(b.source, b.writable) for b in parent.binds]
    return sorted(grants, key=lambda g: len(g[0]))


def _allowed(path: str, writable: bool, grants: list[tuple[str, bool]]) -> bool:
    """Whether the parent shows host `path` (writable, if asked): the most specific grant above it decides."""
    deciding = [w for p, w in grants if is_under(path, p)]
    return bool(deciding) and (deciding[-1] or not writable)


def _smaller(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def narrowed(parent: Sandbox, child: Sandbox) -> Sandbox:
    """`child`, checked to be no wider than `parent`, with the parent's hides,
    probes, limits, enforcement and records folded in."""
    check_sandbox(parent, "parent")
    check_sandbox(child, "child")
    grants = _parent_grants(parent)
    wanted = [("read", p, False) for p in child.read] + [("write", p, True) for p in child.write]
    wanted += [("binds", b.source, b.writable) for b in child.binds]
    for field, path, writable in wanted:
        if not _allowed(path, writable, grants):
            how = "writable" if writable else "shown"
            raise SpecError(field, path, f"is not {how} in the parent sandbox: a nested sandbox can only narrow")
    if child.network == "open" and parent.network != "open":
        raise SpecError("network", "open", "the parent's network is isolated")
    extra_ports = sorted(set(child.ports) - set(parent.ports))
    if extra_ports:
        raise SpecError("ports", extra_ports[0], "is not forwarded to the parent")
    if not set(child.sockets) <= set(parent.sockets):
        raise SpecError("sockets", dict(child.sockets), "forwards a socket the parent does not have")
    if child.proxy is not None:
        allowed = set(parent.proxy.allowed_hosts) if parent.proxy is not None else set()
        extra = sorted(set(child.proxy.allowed_hosts) - allowed)
        if extra:
            raise SpecError("proxy.allowed_hosts", extra[0], "is not allowed to the parent")
    for pattern in child.env_allow:
        if not any(fnmatch.fnmatchcase(pattern, p) for p in parent.env_allow):
            raise SpecError("env_allow", pattern, "is not within the parent's env_allow")
    extra_packages = [p for p in child.packages if p not in parent.packages]
    if extra_packages:  # a package beyond the site directories (a checkout, a PYTHONPATH module)
        raise SpecError("packages", extra_packages[0], "is not shown in the parent sandbox")
    if child.framework_package not in (None, parent.framework_package):
        # Another package named here would be covered in place of the parent's, which would show again.
        raise SpecError("framework_package", child.framework_package,
                        f"must be the parent's ({parent.framework_package!r}) or None: a nested sandbox keeps its "
                        "parent's framework package (cover other modules with `hide`)")
    if child.framework and not parent.framework:
        raise SpecError("framework", True, "the parent covers the framework package")
    limits = Limits(**{name: _smaller(getattr(child.limits, name), getattr(parent.limits, name))
                       for name in ("memory_mb", "file_mb", "cpu_s")})
    return child.replace(
        hide=tuple(dict.fromkeys((*parent.hide, *child.hide))),
        probes=tuple(dict.fromkeys((*parent.probes, *child.probes))),
        framework_package=parent.framework_package,
        limits=limits, enforce=parent.enforce, records=parent.records, enabled=parent.enabled,
    )
