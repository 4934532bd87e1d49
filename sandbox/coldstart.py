"""What a one-shot process of the command line does to start and to end sooner.

Starting: the cyclic garbage collector waits (`pause_gc`) until the
sandbox runs, and standard modules that a run imports but never uses are
deferred.

`dataclasses` imports `inspect` (with `ast`, `dis`, `tokenize` and
`linecache`) only to write a signature into the docstring of a class that
has none, and every dataclass here has one; `subprocess` imports `locale`
only to decode a text-mode pipe. A one-shot run of the command line (a fresh
interpreter that starts one sandbox and exits) therefore puts a deferred
module object in their place before anything imports them: `import inspect`
binds it, and the module's code runs into it at the first access to an
attribute it does not have yet, after which it is the ordinary module. A
path that does use one (a `--dry-run`, a traceback) gets the whole module,
as before; one that does not never pays for it.

(importlib.util.LazyLoader does the same, but on this Python an `import` of
a module it deferred reads the module's `__spec__`, which loads it: the next
module that imports `inspect` would load it at once.)

This is for a process the command line owns, before its other threads start:
two threads that touch a deferred module first at the same moment could see
it half-loaded. Nothing else calls it; `import sandbox` and the Python API
import modules the normal way.
"""

from __future__ import annotations

import os
import sys
import types

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the import (type checkers read the name)
if TYPE_CHECKING:
    from typing import NoReturn

DEFERRED = ("inspect", "locale")  # imported (by dataclasses, subprocess) but not used by a run


class _Deferred(types.ModuleType):
    """A module whose code has not run yet: it runs at the first access to a name it lacks."""

    def __getattr__(self, name: str) -> object:
        spec = self.__spec__
        object.__setattr__(self, "__class__", types.ModuleType)  # from here on an ordinary module (and no recursion)
        assert spec is not None and spec.loader is not None  # as defer_unused_modules made it
        try:
            spec.loader.exec_module(self)
        except BaseException:
            sys.modules.pop(spec.name, None)  # as a failed import leaves it: the next import tries again
            raise
        return getattr(self, name)


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


def defer_unused_modules() -> None:
    """Put a deferred module in place of each module of DEFERRED not imported yet
    (in a process with a single thread; with more, nothing is done)."""
    threading = sys.modules.get("threading")
    if all(name in sys.modules for name in DEFERRED) or (threading is not None and threading.active_count() > 1):
        return
    import importlib.util

    for name in DEFERRED:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _Deferred
        sys.modules[name] = module


def executed(name: str) -> bool:
    """Whether the module `name` is imported and its code has run (not still deferred)."""
    return name in sys.modules and type(sys.modules[name]) is not _Deferred  # type(): no attribute lookup


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
