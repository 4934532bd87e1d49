"""The fork bomb of the pids tests: fork sleepers until a fork is refused.

`fork_bomb` is the function (a WorkerPool task sends it by value: its
imports are inside it), `fork_bomb_counted` the same that then counts the
processes it sees, and `FORK_BOMB` a program for `python -c` in a sandbox
that runs fork_bomb and prints how many forks it made. Each child sleeps
30 s, so the forks are still there when the limit is reached.
"""

from __future__ import annotations

import inspect


def fork_bomb(limit: int = 500) -> int:
    """Fork sleepers until `limit` forks or until a fork fails: how many were made."""
    import os
    import time

    n = 0
    while n < limit:
        try:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
        except OSError:
            break
        n += 1
    return n


def fork_bomb_counted(limit: int) -> tuple[int, int]:
    """fork_bomb, then how many processes its pid namespace held (it needs /proc)."""
    import os

    return fork_bomb(limit), len([p for p in os.listdir("/proc") if p.isdigit()])


FORK_BOMB = f"{inspect.getsource(fork_bomb)}\nprint(fork_bomb(), flush=True)\n"
