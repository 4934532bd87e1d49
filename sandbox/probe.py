"""What this host allows: a report of every backend's availability. Cached per process.

`sandbox.probe` is this module, and calling it calls `probe()`:
`sandbox.probe()` and `sandbox.probe.probe()` are the same, and
`import sandbox.probe` gives the module (with `ProbeResult`).
"""

from __future__ import annotations

import os
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path

from . import backends
from .backends import bwrap as bwrap_backend
from .forksafe import fresh_in_child
from .host import BWRAP_ENV, DISABLE_NATIVE_ENV, userns_sysctls

__all__ = ["BWRAP_ENV", "DISABLE_NATIVE_ENV", "ProbeResult", "probe"]


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
    from .cgroups import host_cgroups
    from .plan import CGROUP_LIMITS, FALLBACK_RLIMITS

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
    from .subids import host_words

    return host_words(os.getuid(), os.getgid())


def _executors_without_cgroups() -> list[str]:
    """How messages name the executors that do not place their sandboxes in cgroups (their traits say)."""
    from . import backends
    from .capabilities import Capability
    from .workerpool.pool import TRAITS as WORKERPOOL

    declared = [backends.get(name).traits for name in (*backends.NAMES, *backends.EXPLICIT)] + [WORKERPOOL]
    return [traits.title for traits in declared if not traits.can(Capability.CGROUPS)]


def _version() -> str:
    from . import __version__

    return __version__


class _CallableModule(types.ModuleType):
    """This module's type: calling the module calls `probe()` (so `sandbox.probe()` keeps working)."""

    def __call__(self, refresh: bool = False) -> ProbeResult:
        return probe(refresh)


sys.modules[__name__].__class__ = _CallableModule
