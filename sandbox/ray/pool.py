"""RayPool: a concurrent.futures.Executor over one WorkerPool per Ray node."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from concurrent.futures import Future as CFuture
from dataclasses import dataclass
from typing import Any

from .. import spec as S
from ..errors import SpecError
from ..workerpool import BrokenWorkerPool, RemoteTraceback, TaskFuture
from ..workerpool.calls import pickle_call
from ..workerpool.pool import DEFAULT_MAX_OUTPUT, DEFAULT_MAX_REPLY
from .actor import Outcome, PoolActor

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as exc:  # pragma: no cover - depends on the extra being installed
    raise ImportError("sandbox.ray needs Ray: pip install 'sandbox[ray]'") from exc


class RayTaskFuture(TaskFuture[Any]):
    """A RayPool task's future: a WorkerPool TaskFuture (`stdout`, `stderr`,
    `timings`) plus `node_id`, the Ray node whose pool ran it."""

    def __init__(self) -> None:
        super().__init__()
        self.node_id: str | None = None


@dataclass
class _Member:
    """One actor and what the driver knows of it."""

    actor: Any
    node_id: str
    hostname: str
    in_flight: int = 0


class RayPool(Executor):
    """Run Python functions, each in a fresh sandbox of `spec`, on WorkerPools across a Ray cluster.

    `nodes`: the Ray node ids to place pools on (default: every alive node);
    `actors_per_node` pools on each. Each pool is a sandbox.WorkerPool(spec,
    max_workers, preload=..., timeout=..., spares=..., trust_results=...,
    result_types=..., max_reply=..., max_output=...) held by an actor pinned to its node (`actor_options`
    are passed to Ray's `.options()`; by default the actor reserves no CPU,
    since its tasks run in sandboxes outside Ray's accounting). Ray is
    initialised with `ray.init()` if the caller has not done it.

    `submit(fn, *args, **kwargs)` and `submit_task(fn, args, kwargs, timeout=,
    binds=, env=)` return a RayTaskFuture, settled as WorkerPool's would be: the
    value, or the task's exception with its remote traceback as __cause__,
    TaskTimeoutError, TaskError; BrokenWorkerPool if the actor died (its node
    was lost): its tasks in flight fail so, and later tasks go to the
    others. Replies are checked against the allowlist on the node, where
    they are loaded; the actor's answer to the driver is Ray's ordinary
    (trusted) pickle. `map` comes from Executor.

    Raises SpecError, UnavailableError or BrokenWorkerPool (as the first pool
    to fail raised it) when the pools cannot start.
    """

    def __init__(self, spec: S.Spec, max_workers: int | None = None, *, preload: Sequence[str] = (),
                 timeout: float | None = None, spares: int | None = None, trust_results: bool = False,
                 result_types: Iterable[type] = (), nodes: Sequence[str] | None = None, actors_per_node: int = 1,
                 actor_options: Mapping[str, Any] | None = None, startup_timeout: float = 120.0,
                 max_reply: int | None = DEFAULT_MAX_REPLY, max_output: int | None = DEFAULT_MAX_OUTPUT) -> None:
        if not isinstance(spec, S.Spec):
            raise SpecError("spec", spec, "must be a sandbox.Spec")
        if actors_per_node < 1:
            raise ValueError("actors_per_node must be at least 1")
        if not ray.is_initialized():
            ray.init()
        cluster: Callable[[], list[dict[str, Any]]] = ray.nodes  # Ray leaves it unannotated
        node_ids = list(nodes) if nodes is not None else [n["NodeID"] for n in cluster() if n["Alive"]]
        if not node_ids:
            raise ValueError("no Ray node to place a pool on")
        remote: Any = ray.remote(PoolActor)  # Ray's actor handles are typed only in part
        args = (spec, list(preload), max_workers, timeout, spares, trust_results, list(result_types),
                (max_reply, max_output))
        actors: list[Any] = []  # Ray's actor handles: their methods' .remote() is found at run time
        for node_id in node_ids:
            options = {"num_cpus": 0, "max_concurrency": 1000, **(actor_options or {}),
                       "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
            actors += [remote.options(**options).remote(*args) for _ in range(actors_per_node)]
        self._members: list[_Member] = []
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closed = False
        self._turn = itertools.count()
        try:
            infos = ray.get([a.ready.remote() for a in actors], timeout=startup_timeout)
        except BaseException:
            for a in actors:
                ray.kill(a)
            raise
        failed = next((info["error"] for info in infos if info["error"] is not None), None)
        if failed is not None:
            for a in actors:
                ray.kill(a)
            raise failed
        self._members = [_Member(a, info["node_id"], info["hostname"]) for a, info in zip(actors, infos, strict=True)]

    @property
    def actors(self) -> list[dict[str, Any]]:
        """Each pool's node id, host name and tasks in flight now."""
        with self._lock:
            return [{"node_id": m.node_id, "hostname": m.hostname, "in_flight": m.in_flight} for m in self._members]

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> RayTaskFuture:
        """Run `fn(*args, **kwargs)` in a new sandbox on one of the pools (the pools' default timeout)."""
        return self.submit_task(fn, args, kwargs)

    def submit_task(self, fn: Callable[..., Any], /, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
                    *, timeout: float | None = None, binds: Sequence[S.Bind] = (),
                    env: Mapping[str, str] | None = None) -> RayTaskFuture:
        """Run `fn(*args, **kwargs)` in a new sandbox with a `timeout` in seconds
        (default: the pools'), extra `binds` (of the node's paths, as in
        WorkerPool.submit_task) and `env` added to its os.environ."""
        if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise SpecError("env", env, "must map strings to strings")
        for i, bind in enumerate(binds):
            if not isinstance(bind, S.Bind):
                raise SpecError(f"binds[{i}]", bind, "must be a Bind, RoBind or DevBind")
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a RayPool after shutdown")
            member = self._least_busy()
            member.in_flight += 1
        future = RayTaskFuture()
        future.node_id = member.node_id
        future.set_running_or_notify_cancel()
        try:
            call = _pickle(fn, tuple(args), dict(kwargs or {}))
            ref = member.actor.run.remote(call, timeout, list(binds), dict(env) if env else None)
        except BaseException:
            self._done(member)
            raise
        ref.future().add_done_callback(lambda done: self._settle(member, future, done))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Accept no more tasks; with `wait`, wait for those in flight (unless
        `cancel_futures`), then end every pool and its actor."""
        with self._lock:
            self._closed = True
            if wait and not cancel_futures:
                while any(m.in_flight for m in self._members):
                    self._idle.wait()
            members, self._members = self._members, []
        closing = [m.actor.close.remote() for m in members]
        for ref in closing if wait else ():
            try:
                ray.get(ref, timeout=60)
            except (ray.exceptions.RayError, TimeoutError):
                pass  # an actor already gone has nothing left to close; one stuck is killed below
        for m in members:
            ray.kill(m.actor, no_restart=True)

    # ------------------------------------------------------------ helpers

    def _least_busy(self) -> _Member:
        """The member with the fewest tasks in flight; ties go round in turn."""
        if not self._members:
            raise BrokenWorkerPool("the RayPool has no pool left")
        start = next(self._turn) % len(self._members)
        ordered = self._members[start:] + self._members[:start]
        return min(ordered, key=lambda m: m.in_flight)

    def _drop(self, member: _Member) -> None:
        """No more tasks for a dead actor (its node was lost, or it was killed)."""
        with self._lock:
            if member in self._members:
                self._members.remove(member)

    def _done(self, member: _Member) -> None:
        with self._lock:
            member.in_flight -= 1
            self._idle.notify_all()

    def _settle(self, member: _Member, future: RayTaskFuture, done: CFuture[Outcome]) -> None:
        """Give `future` what the actor's Outcome (or Ray's error) says."""
        try:
            outcome: Outcome = done.result()
        except ray.exceptions.RayActorError as exc:
            self._drop(member)
            future.set_exception(BrokenWorkerPool(f"the pool's actor on node {member.node_id} "
                                                  f"({member.hostname}) died: {exc}"))
        except BaseException as exc:  # noqa: BLE001 - Ray's own failure (object lost, cancelled...)
            future.set_exception(exc)
        else:
            future.stdout, future.stderr, future.timings = outcome.stdout, outcome.stderr, outcome.timings
            if outcome.ok:
                future.set_result(outcome.value)
            else:
                if outcome.traceback is not None:
                    outcome.value.__cause__ = RemoteTraceback(outcome.traceback)
                future.set_exception(outcome.value)
        finally:
            self._done(member)


def _pickle(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    """cloudpickle the call, as WorkerPool does: what the nodes' Ray workers
    cannot import either (the caller's scripts, test modules) travels by value."""
    return pickle_call(fn, args, kwargs)[0]
