"""The benchmarks: `python -m benchmarks` runs them all into a dated report (see report.py).

Each script here also runs on its own (`python benchmarks/latency.py`). Run
as a package from a checkout, the checkout is first on sys.path, where its
uncompiled `sandbox/` would shadow the installed package (and every number
would be the fallback's): it is taken off sys.path here, as tests/_installed.py
does for the tests, unless the checkout is what is installed (`pip install -e .`).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def _use_the_installed_package() -> None:
    shadowing = [p for p in sys.path if Path(p or ".").resolve() == CHECKOUT]
    if not shadowing or "sandbox" in sys.modules:
        return
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if p not in shadowing]
    found = importlib.util.find_spec("sandbox")
    if found is None or found.origin is None or Path(found.origin).resolve().parents[1] == CHECKOUT:
        sys.path[:] = saved  # only the checkout has it (an editable install): use that
        return
    os.environ["PYTHONSAFEPATH"] = "1"  # nor in the Python subprocesses the benchmarks start


_use_the_installed_package()
