"""The environment a one-shot CLI process was started with, before the interpreter changed it.

CPython coerces a C or POSIX locale (PEP 538): at start-up, before any of
our code runs, it sets LC_CTYPE=C.UTF-8 (or another UTF-8 locale) in its own
environment, which a command then inherits as if its caller had set it;
bwrap, and the CLI server's worker (which takes its client's environment as
sent), pass on exactly the caller's. The kernel keeps the environment the
process was exec'd with in its own memory (/proc/self/environ: setenv never
writes there), so the variable is put back as it came.
"""

from __future__ import annotations

import os

COERCED = "LC_CTYPE"  # the one variable the interpreter's start sets (Python/pylifecycle.c)


def undo_locale_coercion() -> None:
    """Put LC_CTYPE back in os.environ as this process's exec left it (unset, or its value)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:  # no procfs: nothing to compare with
        return
    name = COERCED.encode()
    original = None
    for entry in entries:
        key, sep, value = entry.partition(b"=")
        if sep and key == name:
            original = value  # the first, as getenv finds it
            break
    if os.environb.get(name) == original:
        return
    if original is None:
        os.environb.pop(name, None)
    else:
        os.environb[name] = original
