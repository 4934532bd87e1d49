"""Render sandbox descriptions as bubblewrap command lines.

Two entry points share one operation renderer:

- `render_plan(plan)`: the options the bwrap backend gives the real
  /usr/bin/bwrap (0.8.0 grammar) for a compiled Plan, plus what the backend
  must do itself (rlimits).
- `to_bwrap_args(spec, argv)`: a Spec as a command line in the grammar of
  `sandbox.bwrap_args` (bwrap's options plus this package's `--limit-*`),
  so that `from_bwrap_args(to_bwrap_args(spec, argv))` gives back
  `(spec, argv)`.

File contents (`File` mounts) travel through fds, as bwrap wants them: each
`--file` / `--ro-bind-data` gets its own memfd (anonymous memory, never a
file on disk), positioned at the start. The rendered argv keeps those fds in
`.fds`; whoever consumes the command line reads and closes them (bwrap, or
`from_bwrap_args`), and the renderer's owner closes its copies with `.close()`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence

from . import spec as S
from .errors import SpecError
from .plan import (
    DEV_MODE,
    DEV_SHM_MODE,
    Op,
    OpFlag,
    OpKind,
    Plan,
    compile_mount,
    parent_mode_for,
    resolve_env,
)
from .seccomp import compile_policy

# What bwrap 0.8.0 makes by itself: --dev's tmpfs and its shm directory are
# 0755; --remount-ro adds nodev and nosuid (bind_mount() in bind-mount.c).
BWRAP_DEV_MODE = 0o755
BWRAP_DEV_SHM_MODE = 0o755
REMOUNT_RO_FLAGS = OpFlag.RDONLY | OpFlag.NODEV | OpFlag.NOSUID

LIMIT_OPTIONS = {
    "cpu_s": "--limit-cpu",
    "memory_mb": "--limit-memory",
    "file_mb": "--limit-file",
    "nofile": "--limit-nofile",
    "nproc": "--limit-nproc",
}


class BwrapArgv(list[str]):
    """A rendered bwrap argument list (a list of str) that owns the data fds it names."""

    def __init__(self, args: Iterable[str] = (), fds: Iterable[int] = ()) -> None:
        super().__init__(args)
        self.fds: list[int] = list(fds)

    def close(self) -> None:
        """Close this process's copies of the data fds (idempotent)."""
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()

    def __enter__(self) -> BwrapArgv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def data_fd(data: bytes) -> int:
    """A close-on-exec memfd holding `data`, at offset 0 (pass it to a child explicitly)."""
    fd = os.memfd_create("sandbox-file", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ---------------------------------------------------------------- operations

def implicit_parent_mode(op: Op) -> int:
    """The mode bwrap gives missing parents of `op`: from --perms for the ops
    that take one (tmpfs, dir, file), 0700 for the others."""
    if op.kind in (OpKind.TMPFS, OpKind.DIR, OpKind.FILE):
        return parent_mode_for(op.mode)
    return 0o700


def _ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b'] (the root excluded)."""
    parts = [p for p in path.split("/") if p]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def _parents(op: Op) -> list[str]:
    """Explicit `--dir` options that create missing parents with op.parent_mode
    when bwrap's implicit rule would choose another mode."""
    if op.parent_mode == implicit_parent_mode(op):
        return []
    out: list[str] = []
    for parent in _ancestors(op.dest):
        out += ["--perms", f"{op.parent_mode:04o}", "--dir", parent]
    return out


def _bind_option(op: Op) -> str:
    if not op.flags & OpFlag.NOSUID:
        raise SpecError("mounts", op.dest, "bwrap always binds nosuid")
    readonly = bool(op.flags & OpFlag.RDONLY)
    nodev = bool(op.flags & OpFlag.NODEV)
    if readonly and not nodev:
        raise SpecError("mounts", op.dest, "bwrap cannot bind read-only with device access")
    name = "--ro-bind" if readonly else "--bind" if nodev else "--dev-bind"
    return name + ("-try" if op.flags & OpFlag.OPTIONAL else "")


def _dev_options(op: Op, match_native: bool) -> list[str]:
    """`--dev`, then `--chmod` for each mode of the op bwrap's own --dev does not make.
    Without `match_native` (this package's grammar, where --dev is a Dev mount) the op must be a Dev's."""
    if not match_native:
        if (op.mode, op.shm_mode) != (DEV_MODE, DEV_SHM_MODE):
            raise SpecError("mounts", op.dest, "--dev makes /dev and /dev/shm with the default modes only")
        return ["--dev", op.dest]
    out = ["--dev", op.dest]
    if op.mode != BWRAP_DEV_MODE:
        out += ["--chmod", f"{op.mode:04o}", op.dest]
    if op.shm_mode != BWRAP_DEV_SHM_MODE:
        out += ["--chmod", f"{op.shm_mode:04o}", op.dest.rstrip("/") + "/shm"]
    return out


def render_op(op: Op, fds: list[int], match_native: bool = False) -> list[str]:
    """The bwrap options for one operation; a FILE's data goes into a new fd appended to `fds`.

    With `match_native`, the options are for the real bwrap and make what the
    native backend makes (a DEV op's modes, where bwrap's differ); without,
    they are in this package's grammar."""
    kind = op.kind
    if kind is OpKind.BIND:
        return [_bind_option(op), op.src, op.dest]
    if kind is OpKind.TMPFS:
        size = ["--size", str(op.size)] if op.size else []
        return ["--perms", f"{op.mode:04o}", *size, "--tmpfs", op.dest]
    if kind is OpKind.PROC:
        return ["--proc", op.dest]
    if kind is OpKind.DEV:
        return _dev_options(op, match_native)
    if kind is OpKind.DIR:
        return ["--perms", f"{op.mode:04o}", "--dir", op.dest]
    if kind is OpKind.SYMLINK:
        return ["--symlink", op.src, op.dest]
    if kind is OpKind.FILE:
        fd = data_fd(op.data)
        fds.append(fd)
        option = "--ro-bind-data" if op.flags & OpFlag.RDONLY else "--file"
        return ["--perms", f"{op.mode:04o}", option, str(fd), op.dest]
    if kind is OpKind.REMOUNT_RO:
        if op.flags != REMOUNT_RO_FLAGS:
            raise SpecError("mounts", op.dest, "bwrap's --remount-ro always sets ro, nodev and nosuid")
        return ["--remount-ro", op.dest]
    if kind is OpKind.CHMOD:
        return ["--chmod", f"{op.mode:04o}", op.dest]
    raise SpecError("mounts", op.kind, "operation bwrap cannot express")


def render_ops(ops: Sequence[Op], fds: list[int], match_native: bool = True) -> list[str]:
    """The options for `ops`, in order. `match_native` adds what makes bwrap's
    result equal the native backend's: explicit parent directories where
    bwrap's mode rule differs from the plan's, and dev/shm's mode."""
    out: list[str] = []
    for op in ops:
        if match_native:
            out += _parents(op)
        out += render_op(op, fds, match_native)
    return out


def _env_options(env: Iterable[tuple[str, str]]) -> list[str]:
    out = ["--clearenv"]
    for name, value in env:
        out += ["--setenv", name, value]
    return out


def _cap_options(caps: Iterable[str]) -> list[str]:
    """Exactly `caps` (bwrap's root default is "keep everything", ours is "nothing")."""
    out = ["--cap-drop", "ALL"]
    for cap in caps:
        out += ["--cap-add", cap]
    return out


# ---------------------------------------------------------------- Plan -> bwrap 0.8.0

def _plan_namespaces(plan: Plan) -> list[str]:
    out = []
    for on, option in ((plan.user_ns, "--unshare-user"), (plan.pid_ns, "--unshare-pid"),
                       (plan.net_ns, "--unshare-net"), (plan.ipc_ns, "--unshare-ipc"),
                       (plan.uts_ns, "--unshare-uts"), (plan.cgroup_ns, "--unshare-cgroup")):
        if on:
            out.append(option)
    return out


def _plan_caps(plan: Plan) -> list[str]:
    return _cap_options(name for bit, name in enumerate(S.CAPABILITIES) if plan.keep_caps >> bit & 1)


def render_plan(plan: Plan, seccomp_fd: int | None = None) -> BwrapArgv:
    """bwrap 0.8.0 options (without the command) that set up `plan`.

    The seccomp program goes into a memfd, or is expected on `seccomp_fd` if
    given (the caller writes it; bwrap reads it after setup, to EOF).

    Not rendered, because bwrap has no option for them: `plan.rlimits` (the
    backend applies them itself) and the non-strict cwd candidates (bwrap's
    own rule picks among the caller's cwd, $HOME and /). Without a mount
    namespace in the plan, the host's root is bound whole (`--dev-bind / /`),
    since bwrap always makes one.
    """
    fds: list[int] = []
    try:
        args = _plan_namespaces(plan)
        if plan.user_ns:
            args += ["--uid", str(plan.uid), "--gid", str(plan.gid)]
        if plan.disable_userns:
            args.append("--disable-userns")
        if plan.hostname is not None:
            args += ["--hostname", plan.hostname]
        if not plan.mount_ns:
            args += ["--dev-bind", "/", "/"]
        args += render_ops(plan.ops, fds)
        args += _env_options((name, value) for name, _, value in (e.partition("=") for e in plan.env))
        if plan.cwd_strict:
            args += ["--chdir", plan.cwd_candidates[0]]
        if plan.die_with_parent:
            args.append("--die-with-parent")
        if plan.new_session:
            args.append("--new-session")
        if plan.pid_ns and not plan.reaper:
            args.append("--as-pid-1")
        args += _plan_caps(plan)
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        elif plan.seccomp:
            fds.append(data_fd(plan.seccomp))
            args += ["--seccomp", str(fds[-1])]
    except BaseException:
        BwrapArgv((), fds).close()
        raise
    return BwrapArgv(args, fds)


# ---------------------------------------------------------------- Spec -> CLI grammar

def _spec_namespaces(spec: S.Spec) -> list[str]:
    ns = spec.namespaces
    out = []
    for on, option in ((ns.user, "--unshare-user"), (ns.pid, "--unshare-pid"), (ns.ipc, "--unshare-ipc"),
                       (ns.uts, "--unshare-uts"), (ns.cgroup, "--unshare-cgroup")):
        if on:
            out.append(option)
    out.append("--unshare-net" if spec.network in ("none", "pool") else "--share-net")
    if spec.network == "pool":
        out.append("--netns-pool")  # an option of ours: the CLI's grammar, not bwrap's
    return out


MAX_BWRAP_ID = 2**31 - 1  # bwrap reads --uid/--gid as a signed int (bubblewrap #642)


def _spec_identity(spec: S.Spec) -> list[str]:
    out = []
    for name in ("uid", "gid"):
        value = getattr(spec, name)
        if value is None:
            continue
        if value > MAX_BWRAP_ID:
            raise SpecError(name, value, f"bwrap's --{name} takes at most {MAX_BWRAP_ID}")
        out += [f"--{name}", str(value)]
    if spec.hostname is not None:
        out += ["--hostname", spec.hostname]
    return out


def _spec_process(spec: S.Spec) -> list[str]:
    out = []
    if spec.cwd is not None:
        out += ["--chdir", spec.cwd]
    for flag, option in ((spec.die_with_parent, "--die-with-parent"), (spec.new_session, "--new-session"),
                         (spec.as_pid_1, "--as-pid-1")):
        if flag:
            out.append(option)
    if spec.disable_userns:
        out.append("--disable-userns")
    for name in dataclasses.fields(spec.limits):
        value = getattr(spec.limits, name.name)
        if value is None:
            continue
        if name.name not in LIMIT_OPTIONS:
            raise SpecError(f"limits.{name.name}", value, "the bwrap grammar has no option for it")
        out += [LIMIT_OPTIONS[name.name], str(value)]
    return out + _cap_options(spec.cap_add)


def _spec_seccomp(spec: S.Spec, fds: list[int]) -> list[str]:
    """`--seccomp FD` with the compiled policy, unless it is the grammar's default."""
    if spec.seccomp == S.Spec().seccomp:
        return []
    if spec.seccomp is None:
        raise SpecError("seccomp", None, "the bwrap grammar cannot turn the default seccomp policy off")
    fds.append(data_fd(compile_policy(spec.seccomp)))
    return ["--seccomp", str(fds[-1])]


def to_bwrap_args(spec: S.Spec, argv: Sequence[str], *, environ: Mapping[str, str] | None = None) -> BwrapArgv:
    """`spec` and `argv` as one command line in `sandbox.bwrap_args`' grammar.

    The environment is made explicit (`--clearenv`, then `--setenv` for each
    variable); `spec.env_inherit` is resolved against `environ` (default:
    this process's), since the grammar has no patterns. Capabilities are
    exact (`--cap-drop ALL`, then `--cap-add`). Limits use this package's
    `--limit-*` options, which the real bwrap rejects. A seccomp policy other
    than the default is compiled and given as `--seccomp FD` (it comes back
    as a raw program). File data is in memfds
    listed in `.fds` (read and closed by `from_bwrap_args`).

    Raises SpecError for what the grammar cannot say: no mount namespace, a
    uid or gid above 2**31-1, `seccomp=None`, a limit without a `--limit-*`
    option (`file_bytes`).

    The fds are closed by whoever consumes the command line; call `.close()`
    only for a command line that was not consumed (a consumed fd's number may
    already belong to something else).

    The CLI sets PWD like bwrap, so `from_bwrap_args` gives back `spec`
    exactly when `spec.env` already holds PWD set to the sandbox's cwd and
    `env_inherit` is empty; the user namespace round-trips as given only for
    a root caller (bwrap implies one for everybody else).
    """
    if not spec.namespaces.mount:
        raise SpecError("namespaces.mount", False, "bwrap always creates a mount namespace")
    env = resolve_env(spec, os.environ if environ is None else environ) if spec.env_inherit else dict(spec.env)
    fds: list[int] = []
    try:
        ops = [compile_mount(i, m, spec.namespaces.pid) for i, m in enumerate(spec.mounts)]
        args = _spec_namespaces(spec) + _spec_identity(spec)
        args += render_ops(ops, fds, match_native=False)
        args += _env_options(sorted(env.items()))
        args += _spec_process(spec) + _spec_seccomp(spec, fds)
        args += ["--", *argv]
    except BaseException:
        BwrapArgv((), fds).close()
        raise
    return BwrapArgv(args, fds)
