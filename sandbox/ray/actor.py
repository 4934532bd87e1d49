"""The Ray actor that holds one node's WorkerPool.

It is a plain class here; pool.py makes it a Ray actor class (async: one
event loop awaits every task's future, so `max_workers` tasks run at once
without a thread each). Whatever a task ends with is sent back as an Outcome,
never raised: the driver then rebuilds what WorkerPool.submit's future would
have held, including the remote traceback, which pickling an exception drops.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from .. import spec as S
from ..workerpool import RemoteError, RemoteTraceback, WorkerPool


@dataclass
class Outcome:
    """How one task ended, as the actor saw it."""

    ok: bool
    value: Any  # the result, or the exception
    traceback: str | None = None  # the remote traceback of an exception raised in the task
    stdout: bytes = b""
    stderr: bytes = b""
    timings: dict[str, float] = field(default_factory=dict)


class PoolActor:
    """Holds a WorkerPool on the node it was placed on; runs tasks in it."""

    def __init__(self, spec: S.Spec, preload: Sequence[str], max_workers: int | None, timeout: float | None,
                 spares: int | None, trust_results: bool, result_types: Iterable[type],
                 caps: tuple[int | None, int | None]) -> None:
        self.error: BaseException | None = None
        self.pool: WorkerPool | None = None
        try:
            self.pool = WorkerPool(spec, max_workers, preload=preload, timeout=timeout, spares=spares,
                                   trust_results=trust_results, result_types=result_types, max_reply=caps[0],
                                   max_output=caps[1])
        except Exception as exc:  # noqa: BLE001 - reported by ready(), where the driver raises it
            self.error = exc

    def ready(self) -> dict[str, Any]:
        """Where this pool runs, or the error that kept it from starting."""
        import ray

        return {"error": self.error, "node_id": ray.get_runtime_context().get_node_id(),
                "hostname": socket.gethostname(), "pid": os.getpid(),
                "zygote_pid": self.pool.pid if self.pool is not None else None}

    async def run(self, call: bytes, timeout: float | None, binds: Sequence[S.Bind],
                  env: Mapping[str, str] | None) -> Outcome:
        """Run the pickled (fn, args, kwargs) in a fresh sandbox of the pool; never raises."""
        if self.pool is None:
            return Outcome(False, self.error or RuntimeError("the pool did not start"))
        try:
            fn, args, kwargs = cloudpickle.loads(call)  # the driver's pickle (trusted, as Ray's own)
            future = self.pool.submit_task(fn, args, kwargs, timeout=timeout, binds=binds, env=env)
        except Exception as exc:  # noqa: BLE001 - a refused task (bad env, unpicklable call) fails its future
            return Outcome(False, _sendable(exc))
        try:
            value = await asyncio.wrap_future(future)
        except Exception as exc:  # noqa: BLE001 - the task's own exception, or TaskError
            cause = exc.__cause__
            tb = cause.tb if isinstance(cause, RemoteTraceback) else None
            return Outcome(False, _sendable(exc), tb, future.stdout, future.stderr, future.timings)
        return Outcome(True, value, None, future.stdout, future.stderr, future.timings)

    def close(self) -> None:
        """Shut the pool down: every running task ends, the zygote exits."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _sendable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling on its way to the driver, else a RemoteError naming it."""
    try:
        cloudpickle.loads(cloudpickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any failure to travel
        return RemoteError(f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc))
    return exc
