"""What the WorkerPool executor can do (sandbox.capabilities): refusal.py refuses the rest before anything runs."""

from __future__ import annotations

from ..capabilities import ALL, Capability, Traits

TRAITS = Traits("workerpool", "a WorkerPool", ALL - {Capability.HANDED_NAMESPACES, Capability.JOIN_POOLED_NETNS},
                because={Capability.JOIN_POOLED_NETNS: "its tasks lease network namespaces from a supply of its own"})
