"""Compiled plans, kept per Spec object.

A Spec is immutable and compile_plan is a pure function of the Spec, the
caller's state (HostInfo) and the sync fds, so the plan of one Spec object
for one caller state never changes. A caller that spawns the same Spec again
and again (an agent's shell commands) gets the plan it already compiled, and
the native backend the blob it already serialized for that plan. The key is
the Spec's identity (the entry holds the Spec, so its id cannot be reused
meanwhile), the sync fds, and every field of HostInfo the planner reads: the
caller's ids, cwd, hard limits, capabilities, the backend, the pool's state
(HostInfo.key, hashed once per HostInfo), and the environment itself when the
Spec inherits from it.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from .forksafe import fresh_in_child
from .host import HostInfo
from .plan import Plan, compile_plan
from .spec import Spec
from .sync import NO_SYNC, Sync

__all__ = ["compiled_plan"]

MAX_PLANS = 64

_lock = threading.Lock()
_plans: collections.OrderedDict[tuple[Any, ...], tuple[Spec, Plan]] = collections.OrderedDict()
fresh_in_child(globals(), "_lock")


def compiled_plan(spec: Spec, host: HostInfo, sync: Sync = NO_SYNC) -> Plan:
    """compile_plan(spec, host, sync), compiled once per Spec object and caller state."""
    key = (id(spec), sync, *_caller_state(spec, host))
    with _lock:
        hit = _plans.get(key)
        if hit is not None and hit[0] is spec:
            _plans.move_to_end(key)
            return hit[1]
    plan = compile_plan(spec, host, sync)
    with _lock:
        _plans[key] = (spec, plan)
        if len(_plans) > MAX_PLANS:
            _plans.popitem(last=False)
    return plan


def _caller_state(spec: Spec, host: HostInfo) -> tuple[Any, ...]:
    # host.key: every other field, hashed once per HostInfo (HostInfo.current returns the same
    # object while the facts it reads are unchanged, so a spawn loop hashes none of them again)
    if spec.env_inherit:
        return host.key, tuple(host.environ.items())
    return host.key, ()
