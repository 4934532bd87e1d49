"""What a one-shot process of the command line does to start and to end sooner.

Starting: the cyclic garbage collector waits (`pause_gc`) until the
sandbox runs. Ending: the interpreter's teardown is skipped (`exit_now`).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the import (type checkers read the name)
if TYPE_CHECKING:
    from typing import NoReturn


def pause_gc() -> bool:
    """Turn the cyclic garbage collector off, if it is on; True if it was.

    A run's start allocates little but classes, functions and modules, which
    live until the process ends, and allocates them fast: the collector,
    which counts allocations, walks them again and again for nothing, ~15 ms
    here. The caller turns it back on (gc.enable()) once the sandbox runs:
    the process may then wait for it for a long time."""
    import gc

    if not gc.isenabled():
        return False
    gc.disable()
    return True


def exit_now(status: int) -> NoReturn:
    """End this process with exit status `status` as Python's own exit would,
    less the interpreter's teardown: the atexit callbacks run, stdout and
    stderr are flushed, and the process ends there. Tearing down every module
    and collecting what they hold is ~15 ms of a run here, and nothing in it
    is seen outside: the fds close with the process (whatever this package
    writes to a caller's fd is written with os.write, unbuffered).

    Python's exit is taken instead when a thread that is not a daemon still
    runs (Python waits for it first) or a flush fails (Python reports it and
    exits 120)."""
    threading = sys.modules.get("threading")
    if threading is not None and any(not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        raise SystemExit(status)
    import atexit

    atexit._run_exitfuncs()  # what Python's exit runs first; they are not run again
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BaseException:
        raise SystemExit(status) from None
    os._exit(status)
