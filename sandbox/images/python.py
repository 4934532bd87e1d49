"""A WorkerPool in a root of its own (an image, sandbox.presets.image): its
zygote is then the image's Python, not the caller's. This module names that
Python and holds the probe that shows whether it is compatible; the probe
runs in sandbox.probe (`image_python`), which starts the sandbox.

Compatible means: the image has `python<M>.<m>` (the caller's major.minor:
tasks and results cross between the two interpreters pickled, and the C core
and cffi's backend are built for that ABI) on the Spec's PATH; and, with this
package and cloudpickle bound read-only at their host paths (the zygote puts
them on sys.path), that Python loads the C core, whose glibc symbol versions
the image's C library must have. It is tried for real, once per Spec, in a
sandbox of that Spec, as the zygote would start: a failure is an
UnavailableError naming the cause (no such Python, another version, glibc
older than the C core needs, the package's directory not mountable there).
"""

from __future__ import annotations

import re
import sys

# What the probe prints: its version, its C library, and whether the C core loads as the zygote loads it.
PROBE = r"""
import importlib.util, json, os, sys
out = {"version": list(sys.version_info[:2]), "libc": os.confstr("CS_GNU_LIBC_VERSION") or "", "error": ""}
try:
    for entry in sys.argv[2:]:
        sys.path.append(entry)
    spec = importlib.util.spec_from_file_location("sandbox._native", sys.argv[1])
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


def python_name() -> str:
    """The caller's interpreter by the name an image has it: python3.11."""
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def required_glibc(path: str) -> tuple[int, int]:
    """The newest GLIBC_x.y symbol version the shared object at `path` names
    (its .dynstr lists each version it needs); (0, 0) if none."""
    with open(path, "rb") as f:
        found = re.findall(rb"GLIBC_(\d+)\.(\d+)", f.read())
    return max(((int(a), int(b)) for a, b in found), default=(0, 0))
