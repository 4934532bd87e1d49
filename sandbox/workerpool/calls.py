"""A call for a task, pickled: what the sandbox cannot import travels by value.

The zygote (and a Ray node's worker) imports only its interpreter's own
modules, cloudpickle and this package (interpreter.importable_inside): a
function of `__main__`, of a script, a test or a checkout's package must be
sent as code. cloudpickle does that for a module once it is registered, for
as long as this process runs; the registry is process-wide, so it is changed
under one lock.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

import cloudpickle

from .interpreter import importable_inside

_by_value_lock = threading.Lock()


def pickle_call(fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[bytes, tuple[str, ...]]:
    """(the pickled (fn, args, kwargs), the names of the modules its objects
    come from: the frames of a remote traceback are looked up there)."""
    sources = []
    with _by_value_lock:
        for obj in (fn, *args, *kwargs.values()):
            module = sys.modules.get(getattr(obj, "__module__", None) or type(obj).__module__)
            if module is None:
                continue
            sources.append(module.__name__)
            if module.__name__ != "__main__" and not importable_inside(module):  # __main__ always goes by value
                cloudpickle.register_pickle_by_value(module)
        return cloudpickle.dumps((fn, args, kwargs)), tuple(dict.fromkeys(sources))
