"""Warm workers for a task description: one WorkerPool task per call, each in a fresh task sandbox.

`worker_pool(sb)` compiles the description as `spawn()` does and starts a
sandbox.WorkerPool on it: each `submit(fn, ...)` then runs in a sandbox of
its own, forked from a warm interpreter in milliseconds, with the same files,
hidden modules, environment and limits. The pool's interpreter paths (its
venv, this package, cloudpickle) are granted read-only among the
description's own binds, so the `hide` covers still lie on top of them.
Forwarding (ports, sockets, the proxy, loopback URLs in the environment) is
not available to WorkerPool tasks: a description that needs it is refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import SpecError
from ..validate import check_mapping
from .compile import compile_task
from .description import Sandbox, check_sandbox
from .facts import Facts


def worker_spec(sb: Sandbox, environ: Mapping[str, str] | None = None) -> Any:
    """The Spec a WorkerPool runs `sb`'s tasks in."""
    from ..workerpool.interpreter import interpreter_paths  # lazy: the WorkerPool only for a pool: 50 ms

    if not check_sandbox(sb).enabled:
        raise SpecError("enabled", False, "a WorkerPool always confines its tasks")
    check_mapping("environ", environ)
    env = dict(os.environ if environ is None else environ)
    wider = sb.replace(read=(*sb.read, *(p for p in interpreter_paths() if not p.startswith("/usr/"))))
    compiled = compile_task(wider, Facts.gather(wider, env), env)
    if compiled.forward:
        raise SpecError("ports", [p for p, _ in compiled.forward], "forwarding is not available to WorkerPool tasks")
    return compiled.spec.replace(check_network=False)


def worker_pool(sb: Sandbox, preload: Sequence[str] = (), max_workers: int | None = None, *,
                environ: Mapping[str, str] | None = None, **options: Any) -> Any:
    """A sandbox.WorkerPool whose every task runs in a fresh sandbox of `sb`
    (`options` as WorkerPool's: timeout, spares, trust_results, ...)."""
    from ..workerpool import WorkerPool  # lazy: the WorkerPool only for a pool: 49 ms

    return WorkerPool(worker_spec(sb, environ), preload=preload, max_workers=max_workers, **options)
