"""What this host allows, and which backend `backend="auto"` picks. Cached per process."""

from __future__ import annotations

import errno as E
import functools
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UnavailableError

# A documented switch: set to 1 to refuse the native backend (forces the
# bwrap fallback), e.g. to test the fallback path or work around a kernel bug.
DISABLE_NATIVE_ENV = "SANDBOX_DISABLE_NATIVE"
BWRAP_ENV = "SANDBOX_BWRAP"


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

    def choose(self, backend: str) -> tuple[str, str]:
        """(backend name, reason) for a request of `backend`; UnavailableError if none."""
        if backend == "native":
            if not self.native:
                raise UnavailableError(f"native backend unavailable: {self.native_reason}")
            return "native", "requested"
        if backend == "bwrap":
            if not self.bwrap:
                raise UnavailableError(f"bwrap backend unavailable: {self.bwrap_reason}")
            return "bwrap", "requested"
        if backend != "auto":
            raise ValueError(f"backend must be 'auto', 'native' or 'bwrap', not {backend!r}")
        if self.native:
            return "native", "auto: this host allows the native path"
        if self.bwrap:
            return "bwrap", f"auto: native refused ({self.native_reason})"
        raise UnavailableError(f"no sandbox backend: native: {self.native_reason}; bwrap: {self.bwrap_reason}")

    def __str__(self) -> str:
        lines = [
            f"kernel: {self.kernel}",
            f"uid: {self.uid}",
            f"native backend: {'yes' if self.native else 'no'} ({self.native_reason})",
            f"bwrap backend: {self.bwrap or 'no'} ({self.bwrap_reason})",
        ]
        lines += [f"sysctl {k} = {v}" for k, v in sorted(self.sysctls.items())]
        return "\n".join(lines)


SYSCTLS = (
    "/proc/sys/user/max_user_namespaces",
    "/proc/sys/kernel/unprivileged_userns_clone",
    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
)


def _sysctls() -> dict[str, str]:
    out = {}
    for path in SYSCTLS:
        try:
            out[path[len("/proc/sys/"):].replace("/", ".")] = Path(path).read_text().strip()
        except OSError:
            pass
    return out


def _explain_clone(err: int, sysctls: dict[str, str]) -> str:
    text = f"{E.errorcode.get(err, err)} from clone"
    hints = []
    if sysctls.get("user.max_user_namespaces") == "0":
        hints.append("user.max_user_namespaces=0")
    if sysctls.get("kernel.apparmor_restrict_unprivileged_userns") == "1":
        hints.append("kernel.apparmor_restrict_unprivileged_userns=1")
    if sysctls.get("kernel.unprivileged_userns_clone") == "0":
        hints.append("kernel.unprivileged_userns_clone=0")
    if not hints and err in (E.EPERM, E.EACCES):
        hints.append("blocked by a seccomp policy or an LSM?")
    return f"user namespaces: {text}" + (f" ({', '.join(hints)})" if hints else "")


def _probe_native(sysctls: dict[str, str]) -> tuple[bool, str]:
    if os.environ.get(DISABLE_NATIVE_ENV, "") not in ("", "0"):
        return False, f"disabled by {DISABLE_NATIVE_ENV}={os.environ[DISABLE_NATIVE_ENV]}"
    try:
        from .backends import native
    except ImportError as exc:
        return False, str(exc)
    ffi, lib = native.ffi, native.lib
    if not native.INIT_PATH.exists():
        return False, f"sandbox-init missing at {native.INIT_PATH}; reinstall the package"
    res = ffi.new("struct sbx_result *")
    ns = lib.SBX_NS_USER | lib.SBX_NS_MOUNT | lib.SBX_NS_PID | lib.SBX_NS_NET | lib.SBX_NS_IPC | lib.SBX_NS_UTS
    if lib.sbx_probe(ns, res) == 0:
        return True, "user, mount, pid, net, ipc and uts namespaces and the mount API work"
    step = native.STEP_NAMES.get(res.step, str(res.step))
    if res.step == lib.SBX_STEP_CLONE:
        return False, _explain_clone(res.err, sysctls)
    name = E.errorcode.get(res.err, str(res.err))
    return False, f"{step.replace('_', ' ')} failed with {name} (kernel too old or a policy blocks the mount API?)"


def _probe_bwrap() -> tuple[str | None, str]:
    path = os.environ.get(BWRAP_ENV) or shutil.which("bwrap")
    if not path:
        return None, f"not found on PATH (set {BWRAP_ENV} to its path)"
    if not os.access(path, os.X_OK):
        return None, f"{path} is not executable"
    # bwrap needs the same kernel permissions (unless it is setuid): try it once.
    try:
        done = subprocess.run([path, "--ro-bind", "/", "/", "--", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} does not run: {exc}"
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        return None, f"{path} cannot create a sandbox here: {message[-1] if message else done.returncode}"
    return path, "works"


_lock = threading.Lock()


@functools.cache
def _cached() -> ProbeResult:
    sysctls = _sysctls()
    native_ok, native_reason = _probe_native(sysctls)
    bwrap, bwrap_reason = _probe_bwrap()
    return ProbeResult(native=native_ok, native_reason=native_reason, bwrap=bwrap, bwrap_reason=bwrap_reason,
                       kernel=os.uname().release, uid=os.getuid(), sysctls=sysctls)


def probe(refresh: bool = False) -> ProbeResult:
    """What this host allows (cached per process; `refresh=True` probes again)."""
    with _lock:
        if refresh:
            _cached.cache_clear()
        return _cached()
