"""sandbox.ray: WorkerPools across a Ray cluster (`pip install 'sandbox[ray]'`).

    import ray, sandbox
    from sandbox.ray import RayPool

    ray.init()                                  # or ray.init(address="auto") on a cluster
    with RayPool(sandbox.presets.minimal_system(), 8, preload=["json"]) as pool:
        futures = [pool.submit(score, rollout) for rollout in rollouts]
        print([f.result() for f in futures])

One sandbox.WorkerPool per node (or `actors_per_node` of them), each held by
a Ray actor pinned to its node; the driver sends every task to the actor with
the fewest tasks in flight. Each task runs in a fresh sandbox forked from that
node's warm interpreter, exactly as in a WorkerPool: results, exceptions (with
the remote traceback as `__cause__`), per-task timeouts (TaskTimeoutError, the
task's sandbox killed), stdout and stderr come back on the future. docs/ray.md
says how to run it on a real cluster and what the sandbox does not cover there.
"""

from __future__ import annotations

from .pool import RayPool, RayTaskFuture

__all__ = ["RayPool", "RayTaskFuture"]
