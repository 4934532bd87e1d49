"""`python -m sandbox`: the command line (see sandbox.cli).

Run from a source checkout's root, `python -m` imports the checkout's
`sandbox/` (the current directory comes first on sys.path), which is the
source without its compiled core: every sandbox would quietly run through
the bwrap fallback. When that is so and the package is installed elsewhere,
the command runs again as `python -P -m sandbox ...` (-P: the current
directory is not put on sys.path), so it is always the installed package
that runs. A checkout built in place (`pip install -e .`) runs as it is.
"""

from __future__ import annotations

import importlib.util
import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the import (type checkers read the name)
if TYPE_CHECKING:
    import importlib.machinery


def _shadowing_an_installed_copy() -> bool:
    """Whether this is an uncompiled checkout, imported from the current directory,
    that hides an installed `sandbox`."""
    here = os.path.dirname(os.path.realpath(__file__))  # os.path, not pathlib: a run imports no pathlib
    if sys.flags.safe_path or importlib.util.find_spec(f"{__package__}._native") is not None:
        return False
    if not sys.path or os.path.realpath(sys.path[0] or ".") != os.path.dirname(here):
        return False
    other = _find_elsewhere("sandbox", sys.path[1:])
    return other is not None and other.origin is not None and os.path.dirname(os.path.realpath(other.origin)) != here


def _find_elsewhere(name: str, path: list[str]) -> importlib.machinery.ModuleSpec | None:
    """What the import system would find for `name` with `path` as sys.path (an
    editable install's finder included), ignoring the module already imported."""
    saved = sys.path[:]
    sys.path[:] = path
    try:
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            found: importlib.machinery.ModuleSpec | None = find(name, None) if find is not None else None
            if found is not None:
                return found
        return None
    finally:
        sys.path[:] = saved


if __name__ == "__main__":
    if _shadowing_an_installed_copy():
        os.execv(sys.executable, [sys.executable, "-P", "-m", "sandbox", *sys.argv[1:]])
    from .cli import program

    program()
