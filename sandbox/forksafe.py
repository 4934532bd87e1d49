"""Module locks that a forked child can still take.

fork() copies only the thread that calls it. A lock another thread held at
that moment (the pool's refill thread, a thread probing the host or
compiling a plan) stays held forever in the child, whose next call that
needs it would hang. The locks registered here are replaced with fresh ones
in every forked child, before it runs anything else; what they guard holds
whole values (a cached result, a dict the GIL keeps consistent), never a
half-made one.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["fresh_in_child"]


def fresh_in_child(namespace: dict[str, Any], *names: str) -> None:
    """In every forked child, bind each of `names` in `namespace` (a module's
    globals()) to a new threading.Lock."""
    def renew() -> None:
        for name in names:
            namespace[name] = threading.Lock()

    os.register_at_fork(after_in_child=renew)
