"""A faithful copy of an agent harness's sandbox interface, plus a `native` mode.

The harness keeps its sandbox layer behind a tiny protocol: a sandbox object
has a `mode` string and a pure `prepare(argv, cwd) -> ExecSpec`, and the
harness runs the command itself::

    spec = sandbox.prepare(argv, cwd)
    subprocess.run(spec.argv, cwd=cwd, env=spec.env, preexec_fn=spec.preexec_fn, timeout=...)

`ExecSpec`, `Sandbox`, `RLimits`, `hermetic_env`, the backends `NoSandbox`,
`HermeticEnv`, `SandboxExec`, `Bwrap` and `Container`, `make_sandbox` and
`SandboxUnavailable` reproduce the harness (two hardenings that only change
absurd inputs: `RLimits.preexec()` also swallows OverflowError, and
`Container` refuses an empty image at construction). `NativeSandbox` (mode
`native`) gives the `Bwrap` world (the system read-only, `cwd` writable at its
own path, a fresh /tmp, /dev and /proc, no network unless allowed) through this
package's launcher executable, which also enforces the limits; its
`preexec_fn` is always None, so it is safe to use from threads.

Every backend reads `os.environ` when `prepare()` is called, never when it is
constructed, and the caller's argv is always the tail of the returned argv.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Protocol, runtime_checkable

from ..spec import Bind, Dev, Limits, Proc, RoBind, Spec, Tmpfs

__all__ = [
    "HERMETIC_ENV_KEYS",
    "MODES",
    "SANDBOX_EXEC_PROFILE",
    "Bwrap",
    "Container",
    "ExecSpec",
    "HermeticEnv",
    "NativeSandbox",
    "NoSandbox",
    "RLimits",
    "Sandbox",
    "SandboxExec",
    "SandboxUnavailable",
    "hermetic_env",
    "make_sandbox",
    "native_spec",
]

# Names hermetic_env keeps (plus every name starting with "LC_").
HERMETIC_ENV_KEYS: frozenset[str] = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "TMPDIR", "TMP", "TEMP", "TZ",
    "VIRTUAL_ENV", "SSL_CERT_FILE", "SSL_CERT_DIR",
})
LOCALE_PREFIX = "LC_"

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
SANDBOX_EXEC_PROFILE = "(version 1)(allow default)(deny network*)"

# The launcher module, imported lazily: it is optional until the native mode is used.
_LAUNCHER_MODULE = __name__.rsplit(".", 2)[0] + ".launcher"


class SandboxUnavailable(RuntimeError):
    """The requested sandbox mode cannot run on this host (the message says why)."""


@dataclass(frozen=True)
class ExecSpec:
    """How to run one command: `argv`, the complete child environment `env`,
    and a function to run in the child before exec (or None)."""

    argv: list[str]
    env: dict[str, str]
    preexec_fn: Callable[[], None] | None = None


@runtime_checkable
class Sandbox(Protocol):
    """A sandbox backend: a `mode` name and a pure `prepare`."""

    mode: str

    def prepare(self, argv: list[str], cwd: Path) -> ExecSpec:
        """Return how to run `argv` sandboxed with working directory `cwd`."""
        ...


@dataclass(frozen=True)
class RLimits:
    """Resource limits: CPU seconds, largest file written (bytes), processes.

    `cpu_seconds` and `fsize_bytes` are applied by `preexec()`; `pids` is used
    by the container mode (`--pids-limit`) and by the native mode.
    """

    cpu_seconds: int = 300
    fsize_bytes: int = 536870912
    pids: int = 1024

    def preexec(self) -> Callable[[], None] | None:
        """A function for `preexec_fn` that lowers the soft RLIMIT_CPU and
        RLIMIT_FSIZE to min(want, hard) (want when hard is infinite), leaving
        the hard limits alone and never raising; None without `resource`."""
        try:
            import resource
        except ImportError:
            return None
        wanted = ((resource.RLIMIT_CPU, self.cpu_seconds), (resource.RLIMIT_FSIZE, self.fsize_bytes))

        def apply_rlimits() -> None:
            for limit, want in wanted:
                try:
                    _soft, hard = resource.getrlimit(limit)
                    soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
                    resource.setrlimit(limit, (soft, hard))
                except (ValueError, OSError, OverflowError):  # never fail the exec over a limit
                    pass

        return apply_rlimits


def hermetic_env(source: Mapping[str, str]) -> dict[str, str]:
    """A new dict with only the names of HERMETIC_ENV_KEYS and those starting
    with "LC_" (case-sensitive) from `source`; `source` is not modified."""
    return {k: v for k, v in source.items() if k in HERMETIC_ENV_KEYS or k.startswith(LOCALE_PREFIX)}


def _preexec(rlimits: RLimits | None) -> Callable[[], None] | None:
    return rlimits.preexec() if rlimits is not None else None


# ---------------------------------------------------------------- harness backends

@dataclass(frozen=True, kw_only=True)
class NoSandbox:
    """Mode `none`: the command as given, the full environment, no limits."""

    mode = "none"

    def prepare(self, argv: list[str], cwd: Path) -> ExecSpec:
        """Return `argv` unchanged with a copy of `os.environ`."""
        return ExecSpec(argv=list(argv), env=dict(os.environ))


@dataclass(frozen=True, kw_only=True)
class HermeticEnv:
    """Mode `hermetic-env`: the command as given, the hermetic environment,
    and the rlimits (if any) applied before exec."""

    rlimits: RLimits | None = None
    mode = "hermetic-env"

    def prepare(self, argv: list[str], cwd: Path) -> ExecSpec:
        """Return `argv` unchanged with `hermetic_env(os.environ)`."""
        return ExecSpec(argv=list(argv), env=hermetic_env(os.environ), preexec_fn=_preexec(self.rlimits))


@dataclass(frozen=True, kw_only=True)
class SandboxExec:
    """Mode `sandbox-exec` (macOS): deny the network with a Seatbelt profile."""

    allow_network: bool = False
    rlimits: RLimits | None = None
    mode = "sandbox-exec"

    def prepare(self, argv: list[str], cwd: Path) -> ExecSpec:
        """Wrap `argv` in sandbox-exec (unless the network is allowed)."""
        if self.allow_network:
            cmd = list(argv)
        else:
            cmd = [SANDBOX_EXEC, "-p", SANDBOX_EXEC_PROFILE, *argv]
        return ExecSpec(argv=cmd, env=hermetic_env(os.environ), preexec_fn=_preexec(self.rlimits))


@dataclass(frozen=True, kw_only=True)
class Bwrap:
    """Mode `bwrap`: the system read-only, `cwd` writable, a fresh /tmp,
    /dev and /proc, and no network unless allowed, through bubblewrap."""

    allow_network: bool = False
    rlimits: RLimits | None = None
    mode = "bwrap"

    def prepare(self, argv: list[str], cwd: Path) -> ExecSpec:
        """Wrap `argv` in a bwrap command line."""
        where = str(cwd)
        cmd = [
            "bwrap", "--die-with-parent",
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",
            "--bind", where, where,
            "--chdir", where,
        ]
        if not self.allow_network:
            cmd.append("--unshare-net")
        cmd.extend(argv)
        return ExecSpec(argv=cmd, env=hermetic_env(os.environ), preexec_fn=_preexec(self.rlimits))


@dataclass(frozen=True, kw_only=True)
class Container:
    """Mode `container`: run `argv` in `image` with podman (or `runtime`):
    a read-only root, a tmpfs /tmp, `cwd` at /workspace, a pids limit.

    Only LANG, TZ and LC_* reach the container, passed as `-e` options in that
    order (LANG, TZ, then the LC_* names sorted); the runtime itself gets the
    full environment.
    """

    image: str
    runtime: str = "podman"
    allow_network: bool = False
    rlimits: RLimits | None = None
    mode = "container"

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("the container sandbox mode needs an image")

    def prepare(self, argv: list[str], cwd: Path) -> ExecSpec:
        """Wrap `argv` in a `<runtime> run` command line."""
        environ = dict(os.environ)
        pids = (self.rlimits or RLimits()).pids
        cmd = [
            self.runtime, "run", "--rm", "-i",
            "--network", "bridge" if self.allow_network else "none",
            "--read-only",
            "--tmpfs", "/tmp",
            "--pids-limit", str(pids),
            "-v", f"{cwd}:/workspace:rw",
            "-w", "/workspace",
        ]
        passed: list[str] = [k for k in ("LANG", "TZ") if k in environ]
        passed += sorted(k for k in environ if k.startswith(LOCALE_PREFIX))
        for key in passed:
            cmd += ["-e", f"{key}={environ[key]}"]
        cmd.append(self.image)
        cmd.extend(argv)
        return ExecSpec(argv=cmd, env=environ)


# ---------------------------------------------------------------- native mode

def _launcher() -> ModuleType:
    """Import the launcher module, or raise SandboxUnavailable if it is missing."""
    try:
        return importlib.import_module(_LAUNCHER_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != _LAUNCHER_MODULE:
            raise
        raise SandboxUnavailable(f"the native launcher is not installed ({_LAUNCHER_MODULE} is missing)") from None


def _handoff() -> ModuleType:
    """sandbox.compat.handoff, imported when a warm native sandbox first needs it."""
    return importlib.import_module(__name__.rsplit(".", 1)[0] + ".handoff")


def _native_limits(rlimits: RLimits | None) -> Limits:
    if rlimits is None:  # as in the other backends: no rlimits, no limits
        return Limits()
    return Limits(cpu_s=rlimits.cpu_seconds, file_bytes=rlimits.fsize_bytes, nproc=rlimits.pids)


def native_spec(
    cwd: Path | str,
    *,
    allow_network: bool = False,
    rlimits: RLimits | None = None,
    environ: Mapping[str, str],
) -> Spec:
    """The Spec of the native mode, pure: the host root read-only, a minimal
    /dev, a fresh /proc, a fresh /tmp, `cwd` writable at its own path and the
    working directory; no network but loopback unless `allow_network`; the
    command's environment is `hermetic_env(environ)`; `rlimits`, if given,
    become the launcher's limits (none without).

    `cwd` must be absolute (SpecError, a ValueError, otherwise). A `cwd` that
    does not exist on the host is not checked here: the launcher fails to bind
    it and exits 125 with a `sandbox: ...` line on stderr.
    """
    where = os.fspath(cwd)
    return Spec(
        mounts=(RoBind("/", "/"), Dev("/dev"), Proc("/proc"), Tmpfs("/tmp"), Bind(where, where)),
        network="host" if allow_network else "none",
        env=hermetic_env(environ),
        cwd=where,
        limits=_native_limits(rlimits),
        die_with_parent=True,
        new_session=True,
    )


@dataclass(frozen=True, kw_only=True)
class NativeSandbox:
    """Mode `native`: the `Bwrap` world through this package's launcher.

    The launcher executable sets the sandbox up, applies the limits (CPU
    seconds, file size, processes) and keeps the harness's exit-code contract:
    the command's exit code unchanged, death by signal N as returncode -N,
    127 for a command not found inside, 126 for one not executable, 125 and a
    `sandbox: ...` line on stderr when the setup fails. `preexec_fn` is always
    None. Availability is checked once, at construction: SandboxUnavailable
    (with the reason) if the launcher cannot run here.

    With `warm=True`, the first `prepare()` for a `cwd` also starts building
    a `sandbox.Template` of that world in this process (in the background,
    sandbox.compat.handoff); once it is warm, `prepare()` returns a launcher
    command line that hands the command over to it (the same world, limits,
    environment and exit-code contract, at a Template's cost), and the
    launcher sets the sandbox up itself if the template has gone. Such an
    ExecSpec is good for one handoff: its `env` carries a one-use ticket
    (SANDBOX_HANDOFF, which the launcher takes out before the command sees
    its environment); run again, it falls back to the launcher's own setup.
    `prewarm(cwd)` builds it now. Without `warm`, `prepare()` is pure: no
    I/O, no process, no temporary file; equal inputs give equal results.
    """

    allow_network: bool = False
    rlimits: RLimits | None = None
    warm: bool = False
    mode = "native"

    def __post_init__(self) -> None:
        ok, reason = _launcher().available()
        if not ok:
            raise SandboxUnavailable(reason)

    def prepare(self, argv: list[str], cwd: Path) -> ExecSpec:
        """The launcher command line for `argv` in `cwd` (see the class docstring)."""
        env = hermetic_env(os.environ)
        if self.warm:
            route = _handoff().handoff().route(self._key(cwd))
            if route is not None:
                prefix, ticket = route
                return ExecSpec(argv=[*prefix, "--", *_launcher().check_argv(argv)], env={**env, **ticket},
                                preexec_fn=None)
        spec = native_spec(cwd, allow_network=self.allow_network, rlimits=self.rlimits, environ=env)
        cmd = _launcher().launcher_argv(spec, list(argv), os.fspath(cwd))
        if self.warm and cmd[0] == _launcher().launcher_path():
            _handoff().handoff().warm(self._key(cwd), spec, cmd[:cmd.index("--")], wait=False)
        return ExecSpec(argv=list(cmd), env=env, preexec_fn=None)

    def prewarm(self, cwd: Path) -> None:
        """Build the Template for `cwd` now and wait for it (even without
        `warm`, prepare() then hands off to it only with `warm=True`);
        raises what sandbox.Template raises if it cannot be built here."""
        env = hermetic_env(os.environ)
        spec = native_spec(cwd, allow_network=self.allow_network, rlimits=self.rlimits, environ=env)
        cmd = _launcher().launcher_argv(spec, ["true"], os.fspath(cwd))
        if cmd[0] != _launcher().launcher_path():
            raise SandboxUnavailable(f"{cmd[0]} is not the native launcher: no handoff")
        _handoff().handoff().warm(self._key(cwd), spec, cmd[:cmd.index("--")], wait=True)

    def _key(self, cwd: Path | str) -> tuple[str, bool, RLimits | None]:
        return (os.fspath(cwd), self.allow_network, self.rlimits)


# ---------------------------------------------------------------- factory

MODES: tuple[str, ...] = ("none", "hermetic-env", "sandbox-exec", "bwrap", "container", "native")


def make_sandbox(
    mode: str,
    *,
    allow_network: bool = False,
    rlimits: RLimits | None = None,
    image: str = "",
    runtime: str = "podman",
    warm: bool = False,
) -> Sandbox:
    """The backend for `mode` (one of MODES).

    `none` ignores `rlimits` and `allow_network`; `hermetic-env` ignores
    `allow_network`; `image` and `runtime` are for `container`, which needs an
    image; `warm` is for `native` (NativeSandbox). Raises ValueError for an unknown mode or a container without an
    image, SandboxUnavailable if `native` cannot run on this host.
    """
    if mode == "none":
        return NoSandbox()
    if mode == "hermetic-env":
        return HermeticEnv(rlimits=rlimits)
    if mode == "sandbox-exec":
        return SandboxExec(allow_network=allow_network, rlimits=rlimits)
    if mode == "bwrap":
        return Bwrap(allow_network=allow_network, rlimits=rlimits)
    if mode == "container":
        if not image:
            raise ValueError("sandbox_mode 'container' needs an image (image=...)")
        return Container(image=image, runtime=runtime, allow_network=allow_network, rlimits=rlimits)
    if mode == "native":
        return NativeSandbox(allow_network=allow_network, rlimits=rlimits, warm=warm)
    raise ValueError(f"unknown sandbox_mode: {mode!r}")
