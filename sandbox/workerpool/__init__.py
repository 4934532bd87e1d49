"""WorkerPool: Python functions, each in a fresh sandbox forked from a warm interpreter (see pool.py)."""

from __future__ import annotations

from .pool import WorkerPool
from .results import (
    BrokenWorkerPool,
    RemoteError,
    RemoteTraceback,
    TaskError,
    TaskExit,
    TaskFuture,
    TaskLimitError,
    TaskTimeoutError,
    UnsafeResultError,
)

__all__ = ["BrokenWorkerPool", "RemoteError", "RemoteTraceback", "TaskError", "TaskExit", "TaskFuture",
           "TaskLimitError", "TaskTimeoutError",
           "UnsafeResultError", "WorkerPool"]
