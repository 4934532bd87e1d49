"""The native launcher: one executable that runs a serialized plan.

Harnesses that run `subprocess.run(argv, env=...)` themselves get an argv
from `launcher_argv()`: the `sandbox-launch` executable built from csrc/,
the plan as base64, then the command. No Python starts per command; the
command's environment is the launcher's own (the harness's `env=`).
Where the executable is missing, `python -m sandbox run --spec ...` is the
slower fallback.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Sequence

from . import backends
from .backends.blob import LAUNCHER_NAME as LAUNCHER_NAME
from .backends.blob import TRAITS
from .backends.blob import launcher_path as launcher_path
from .forksafe import fresh_in_child
from .host import DISABLE_NATIVE_ENV, HostInfo, effective_caps_mask, hard_limits, read_text, userns_sysctls
from .plan import check_argv
from .plan_cache import compiled_plan
from .refusal import refusal
from .spec import Spec


def available() -> tuple[bool, str]:
    """(ok, reason): can launcher_argv() produce something that sandboxes here?

    Only the native backend is probed while it works (bwrap only if not).
    """
    from .probe import probe  # lazy: only where the native core fails: 47 ms

    if native_ok():
        if os.access(launcher_path(), os.X_OK):
            return True, f"native launcher {launcher_path()}"
        return True, f"{LAUNCHER_NAME} missing; falling back to `python -m sandbox run` (native)"
    result = probe()
    if result.bwrap:
        return True, f"native refused ({result.native_reason}); `python -m sandbox run` with bwrap"
    return False, f"native: {result.native_reason}; bwrap: {result.bwrap_reason}"


# sandbox-launch runs the plan in a process of its own, for the caller it
# replaces: the blob executor (sandbox.backends.blob), whose traits say what it
# cannot do; a plan it must refuse runs as `python -m sandbox run` instead.

def launcher_argv(spec: Spec, argv: Sequence[str], cwd: str) -> list[str]:
    """The argv that runs `argv` in `spec` (pure: no files, no processes).

    `cwd` stands for the caller's working directory when the plan is made
    (it is the sandbox's cwd unless `spec.cwd` says otherwise). The
    sandbox-launch argv where it is installed, the native core works here,
    and the plan is one it runs (sandbox.refusal, with its traits); else
    `python -m sandbox run`, which runs what the Python API runs.
    """
    from .backends import native  # lazy: this module is imported without the C core (launcher_path, available)

    command = check_argv(argv)
    path = launcher_path()
    if native_ok() and os.access(path, os.X_OK):
        # the caller as it is (root may make namespaces without a user namespace), but its cwd and environment:
        # the launcher's own when it runs, not this process's
        host = HostInfo(uid=os.getuid(), gid=os.getgid(), cwd=cwd, environ={}, executor=TRAITS,
                        hard_limits=hard_limits(), pool=None, is_root=os.geteuid() == 0,
                        effective_caps=effective_caps_mask())
        plan = compiled_plan(spec, host)
        if refusal(plan, host) is None:
            blob = native.blob_for(plan)
            return [path, "--plan", base64.b64encode(blob).decode(), "--", *command]
    return [sys.executable, "-m", "sandbox", "run", "--close-fds", "--spec", spec.to_json(), "--", *command]


# ---------------------------------------------------------------- the host probe, cached

_native_ok: bool | None = None
_native_lock = threading.Lock()
fresh_in_child(globals(), "_native_lock")


def native_ok() -> bool:
    """Whether the native backend works here: its probe (a clone with every
    namespace, several ms) is run once per process, and a success is kept in
    the user's cache directory for as long as the facts it depends on stay
    the same: the kernel and its boot, the user, the namespace sysctls, this
    package's build, and the calling process's own confinement (its user,
    mount and pid namespaces, seccomp filters, capabilities, LSM label), so
    a success cached outside a container or a seccomp sandbox is not trusted
    inside one. A success that goes stale anyway (a limit that is reached,
    a fact not in the key) makes the launcher exit 125 with the kernel's reason."""
    global _native_ok
    with _native_lock:
        if _native_ok is None:
            _native_ok = _probe_native()
        return _native_ok


def _probe_native() -> bool:
    if os.environ.get(DISABLE_NATIVE_ENV, "") not in ("", "0"):
        return backends.availability("native")[0]
    path, key = _cache_path(), _cache_key()
    if path is not None and key is not None and _read_cache(path) == key:
        return True
    ok = backends.availability("native")[0]
    if ok and path is not None and key is not None:
        _write_cache(path, key)
    return ok


def _cache_key() -> dict[str, object] | None:
    """What the probe's verdict depends on; None if it cannot be told."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        from ._native import __file__ as core_path  # lazy: this module is imported without the C core

        core = os.stat(core_path)
        exe = os.stat(launcher_path())
    except (OSError, ImportError, AttributeError, TypeError):
        return None
    uname = os.uname()
    return {"boot": boot, "kernel": [uname.release, uname.version], "uid": os.getuid(), "gid": os.getgid(),
            "sysctls": {**userns_sysctls(), **_namespace_limits()}, "process": _confinement(),
            "core": [core_path, core.st_mtime_ns, core.st_size],
            "launcher": [exe.st_mtime_ns, exe.st_size], "python": sys.version}


# What of the calling process's own confinement decides whether it may make
# namespaces: a seccomp filter (a container runtime's, systemd's
# RestrictNamespaces=) can refuse clone, unshare or the mount API; a
# container's user namespace, capabilities and mount namespace (a masked
# /proc refuses a fresh procfs) differ from the host's; an AppArmor or
# SELinux label can refuse user namespaces to one program and not another.
_STATUS_FIELDS = ("Seccomp", "Seccomp_filters", "NoNewPrivs", "CapEff", "CapBnd")
_NAMESPACES = ("user", "mnt", "pid")


def _confinement() -> dict[str, object]:
    """The calling process's confinement, as far as the native probe depends on it."""
    status = {}
    for line in read_text("/proc/self/status").splitlines():
        name, _, value = line.partition(":")
        if name in _STATUS_FIELDS:
            status[name] = value.strip()
    namespaces: dict[str, int | None] = {}
    for name in _NAMESPACES:
        try:
            namespaces[name] = os.stat(f"/proc/self/ns/{name}").st_ino
        except OSError:
            namespaces[name] = None
    return {"status": status, "ns": namespaces, "lsm": read_text("/proc/self/attr/current").strip("\0\n")}


def _namespace_limits() -> dict[str, str]:
    """/proc/sys/user/max_*_namespaces (0 refuses that kind of namespace), by dotted name."""
    out: dict[str, str] = {}
    try:
        names = sorted(n for n in os.listdir("/proc/sys/user") if n.startswith("max_") and n.endswith("_namespaces"))
    except OSError:
        return out
    for name in names:
        out[f"user.{name}"] = read_text(f"/proc/sys/user/{name}").strip()
    return out


def _cache_path() -> str | None:
    """The cache file, in a directory that is ours and writable by no one else."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(base, "sandbox")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.stat(directory)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return os.path.join(directory, f"native-probe-{os.getuid()}.json")


def _read_cache(path: str) -> object:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        return None
    with os.fdopen(fd) as f:
        try:
            return json.load(f)
        except (ValueError, OSError):  # not JSON, not text, unreadable: probe again
            return None


def _write_cache(path: str, key: dict[str, object]) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".native-probe-")
        with os.fdopen(fd, "w") as f:
            json.dump(key, f)
        os.replace(tmp, path)
    except OSError:
        pass  # no cache: the next process probes again
