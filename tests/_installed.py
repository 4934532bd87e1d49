"""Make the tests import the installed `sandbox`, not the checkout's uncompiled source.

`python -m pytest` run from a checkout puts the checkout first on sys.path,
where `sandbox/` is the source without its compiled core: every test would
then run the fallback, or fail. Imported by conftest.py before anything
imports `sandbox`, this takes the checkout off sys.path when an installed
copy exists elsewhere (`pip install .`), keeps it when the checkout is what
is installed (`pip install -e .` builds the core in place), and sets
PYTHONSAFEPATH=1 so the tests' `python -c`/`-m` subprocesses, whose cwd may
be the checkout, do not put it first either.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def _use_the_installed_package() -> None:
    """Take the checkout off sys.path where it would shadow an installed `sandbox`."""
    checkout = CHECKOUT
    if not (checkout / "sandbox").is_dir():
        return  # a staged copy of the tests (run-tests.sh): nothing to shadow
    shadowing = [p for p in sys.path if Path(p or ".").resolve() == checkout]
    if not shadowing:
        return
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if p not in shadowing]
    found = importlib.util.find_spec("sandbox")
    if found is None or found.origin is None or Path(found.origin).resolve().parents[1] == checkout:
        sys.path[:] = saved  # only the checkout has it (e.g. `pip install -e .`): test that
        if found is None and not any((checkout / "sandbox").glob("_native*.so")):
            raise ImportError(f"{checkout}/sandbox is not built and no installed `sandbox` was found: "
                              "install it first (`pip install -e '.[test]'` or `pip install '.[test]'`)")
        return
    os.environ["PYTHONSAFEPATH"] = "1"


_use_the_installed_package()

