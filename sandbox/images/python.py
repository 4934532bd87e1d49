"""A WorkerPool in a root of its own (an image, sandbox.presets.image): its
zygote is then the image's Python, not the caller's, and this module says
whether that Python is compatible, or why not.

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

import functools
import json
import re
import sys

from .. import spec as S
from ..errors import ExecNotFoundError, SandboxError, SetupError, UnavailableError

# What the probe prints: its version, its C library, and whether the C core loads as the zygote loads it.
_PROBE = r"""
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


@functools.lru_cache(maxsize=16)
def image_python(spec: S.Spec, native: str, paths: tuple[str, ...]) -> str:
    """The image's Python for a WorkerPool's zygote in `spec` (which binds
    `paths`, this package and cloudpickle, read-only), checked by running
    it: its name (found on the Spec's PATH), or UnavailableError saying why
    it is not compatible. `native` is the C core's file the zygote loads."""
    from ..api import run

    want = python_name()
    caller = f"{sys.version_info.major}.{sys.version_info.minor}"
    probe = spec.replace(as_pid_1=False, env={**dict(spec.env), "PYTHONDONTWRITEBYTECODE": "1"})
    try:
        r = run([want, "-I", "-c", _PROBE, native, *paths], probe, capture_output=True, timeout=60)
    except ExecNotFoundError as exc:
        raise UnavailableError(
            f"WorkerPool in this image: it has no {want} on its PATH ({dict(probe.env).get('PATH', '')}), and "
            f"its tasks run in the image's own Python, which must be the caller's {caller}{_other_python(probe)}"
        ) from exc
    except SetupError as exc:
        raise UnavailableError(f"WorkerPool in this image: cannot bind this package and cloudpickle into it "
                               f"({', '.join(paths)}) to start {want}: {exc}") from exc
    except SandboxError as exc:
        raise UnavailableError(f"WorkerPool in this image: starting its {want} failed: {exc}") from exc
    try:
        found = json.loads(r.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise UnavailableError(f"WorkerPool in this image: its {want} did not start (exit {r.returncode}): "
                               f"{r.stderr.decode(errors='replace').strip()[-400:]}") from exc
    if found["error"]:
        need = ".".join(map(str, required_glibc(native)))
        libc = found["libc"] or "no glibc"
        why = f"the C core needs GLIBC_{need}, the image has {libc}" if "GLIBC_" in found["error"] else ""
        raise UnavailableError(f"WorkerPool in this image: its {want} cannot load this package's C core "
                               f"({why or found['error']})")
    return want


def _other_python(spec: S.Spec) -> str:
    """'; its python3 is X.Y' when the image has another python3, else ''."""
    from ..api import run

    try:
        r = run(["python3", "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], spec,
                capture_output=True, timeout=60)
    except SandboxError:
        return ""
    version = r.stdout.decode(errors="replace").strip()
    return f"; its python3 is {version}" if r.returncode == 0 and version else ""
