"""What this host allows: a report of every backend's availability, and the facts that take a sandbox to learn
(whether an overlayfs mounts in one here, an image's Python). Each is tried once and cached per process.

`sandbox.probe` is this module, and calling it calls `probe()`:
`sandbox.probe()` and `sandbox.probe.probe()` are the same, and
`import sandbox.probe` gives the module (with `ProbeResult`).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, backends
from .api import run
from .backends import bwrap as bwrap_backend
from .capabilities import Capability
from .cgroups import host_cgroups
from .errors import ExecNotFoundError, SandboxError, SetupError, UnavailableError
from .forksafe import fresh_in_child
from .host import BWRAP_ENV, DISABLE_NATIVE_ENV, userns_sysctls
from .images.python import PROBE, python_name, required_glibc
from .plan import CGROUP_LIMITS, FALLBACK_RLIMITS
from .spec import Overlay, Spec
from .subids import host_words

__all__ = ["BWRAP_ENV", "DISABLE_NATIVE_ENV", "ProbeResult", "image_python", "overlay_works", "probe"]


@dataclass(frozen=True)
class ProbeResult:
    """Which backends this host can run, and why not where it cannot."""

    native: bool
    native_reason: str
    bwrap: str | None
    bwrap_reason: str
    kernel: str
    uid: int
    sysctls: dict[str, str] = field(default_factory=dict)
    package: str = ""  # the directory the running `sandbox` package was imported from
    version: str = ""
    limits: str = ""  # which Limits are real here (sandbox.cgroups), and why
    ids: str = ""  # what a Session's user namespace maps here: "range N (how)" or "one id" (session/ids.py)

    def choose(self, backend: str) -> tuple[str, str]:
        """(backend name, reason) for a request of `backend`: `sandbox.backends.choose`."""
        return backends.choose(backend)

    def __str__(self) -> str:
        lines = [
            f"kernel: {self.kernel}",
            f"uid: {self.uid}",
            f"native backend: {'yes' if self.native else 'no'} ({self.native_reason})",
            f"bwrap backend: {self.bwrap or 'no'} ({self.bwrap_reason})",
        ]
        lines += [f"sysctl {k} = {v}" for k, v in sorted(self.sysctls.items())]
        if self.limits:
            lines.append(f"limits: {self.limits}")
        if self.ids:
            lines.append(f"ids: {self.ids}")
        if self.package:
            lines.append(f"package: sandbox {self.version} in {self.package}")
        return "\n".join(lines)


_lock = threading.Lock()
_cached: ProbeResult | None = None
fresh_in_child(globals(), "_lock")


def probe(refresh: bool = False) -> ProbeResult:
    """What this host allows (cached per process; `refresh=True` probes again)."""
    global _cached
    with _lock:
        if refresh or _cached is None:
            _cached = _report(refresh)
        return _cached


def _report(refresh: bool) -> ProbeResult:
    native_ok, native_reason = backends.availability("native", refresh=refresh)
    bwrap_ok, bwrap_reason = backends.availability("bwrap", refresh=refresh)
    return ProbeResult(native=native_ok, native_reason=native_reason,
                       bwrap=bwrap_backend.bwrap_path() if bwrap_ok else None, bwrap_reason=bwrap_reason,
                       kernel=os.uname().release, uid=os.getuid(), sysctls=userns_sysctls(),
                       package=str(Path(__file__).resolve().parent), version=_version(), limits=limits_report(),
                       ids=ids_report())


def limits_report() -> str:
    """Which of Limits' memory_mb, nproc and cpu_cores a cgroup enforces here, and what falls back."""
    info = host_cgroups()
    real = [name for name, ctrl in CGROUP_LIMITS.items() if ctrl in info.controllers]
    fake = [name for name in CGROUP_LIMITS if name not in real]
    text = f"{info.mechanism}: " + (f"{', '.join(real)} by cgroup" if real else "no cgroup")
    if "memory_mb" in real:  # with swap accounting the limit holds memory and swap together
        text += (" (memory_mb holds memory and swap together)" if info.swap
                 else " (memory_mb holds memory only: swap is not accounted here, a sandbox may swap past it)")
    if fake:
        text += "; " + ", ".join(f"{name} by {'RLIMIT_' + ('DATA' if name == 'memory_mb' else 'NPROC')}"
                                 if name in FALLBACK_RLIMITS else f"{name} not enforced" for name in fake)
    where = ", ".join(f"v{h.version} {h.parent}" for h in info.hierarchies)
    without = _executors_without_cgroups()
    return f"{text} ({info.reason}{'; in ' + where if where else ''})" + (
        f"; rlimits only with {' and '.join(without)}" if without else "")


def ids_report() -> str:
    """What a Session's user namespace maps for this caller (sandbox.session.ids)."""
    return host_words(os.getuid(), os.getgid())


def _executors_without_cgroups() -> list[str]:
    """How messages name the executors that do not place their sandboxes in cgroups (their traits say), of
    those that serve here (not the brokered one outside a task sandbox)."""
    # lazy: importing sandbox.workerpool loads 42 more modules, 21 ms (cloudpickle, the cffi backend,
    # logging, platform), and this module is imported for overlay_works and image_python without a report
    from .workerpool.traits import TRAITS as WORKERPOOL

    here = [name for name in (*backends.NAMES, *backends.EXPLICIT) if backends.serves_here(name)]
    declared = [backends.get(name).traits for name in here] + [WORKERPOOL]
    return [traits.title for traits in declared if not traits.can(Capability.CGROUPS)]


def _version() -> str:
    return __version__


@functools.cache
def overlay_works(world: Spec) -> bool:
    """Whether an overlayfs of the image store's kind mounts in a sandbox of `world` here: tried once per
    process and world, in a real sandbox (the kernel, its user namespaces, the executor `backend="auto"`
    picks). sandbox.presets.image asks it, with presets.minimal_system() as the world."""
    with tempfile.TemporaryDirectory(prefix="sandbox-overlay-probe.") as tmp:
        lower = os.path.join(tmp, "l")
        os.mkdir(lower)
        spec = world.replace(mounts=(*world.mounts, Overlay("/mnt", [lower])))
        try:
            return run(["true"], spec).returncode == 0
        except SandboxError:
            return False


@functools.lru_cache(maxsize=16)
def image_python(spec: Spec, native: str, paths: tuple[str, ...]) -> str:
    """The image's Python for a WorkerPool's zygote in `spec` (which binds
    `paths`, this package and cloudpickle, read-only), checked by running
    it: its name (found on the Spec's PATH), or UnavailableError saying why
    it is not compatible. `native` is the C core's file the zygote loads."""
    want = python_name()
    caller = f"{sys.version_info.major}.{sys.version_info.minor}"
    trial = spec.replace(as_pid_1=False, env={**dict(spec.env), "PYTHONDONTWRITEBYTECODE": "1"})
    try:
        r = run([want, "-I", "-c", PROBE, native, *paths], trial, capture_output=True, timeout=60)
    except ExecNotFoundError as exc:
        raise UnavailableError(
            f"WorkerPool in this image: it has no {want} on its PATH ({dict(trial.env).get('PATH', '')}), and "
            f"its tasks run in the image's own Python, which must be the caller's {caller}{_other_python(trial)}"
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


def _other_python(spec: Spec) -> str:
    """'; its python3 is X.Y' when the image has another python3, else ''."""
    try:
        r = run(["python3", "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], spec,
                capture_output=True, timeout=60)
    except SandboxError:
        return ""
    version = r.stdout.decode(errors="replace").strip()
    return f"; its python3 is {version}" if r.returncode == 0 and version else ""


class _CallableModule(types.ModuleType):
    """This module's type: calling the module calls `probe()` (so `sandbox.probe()` keeps working)."""

    def __call__(self, refresh: bool = False) -> ProbeResult:
        return probe(refresh)


sys.modules[__name__].__class__ = _CallableModule
