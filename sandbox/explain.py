"""What a sandbox will look like, in words and as a bwrap command line, without running it.

`explain(spec, argv)` is what `python -m sandbox run --dry-run ...` prints:
the backend that would run and why, then the compiled Plan (the decisions
both backends carry out) described line by line, then the equivalent
`bwrap` command line, as the bwrap backend would give it to bwrap 0.8.0.
Nothing is started: no namespace, no pool, no process.
"""

from __future__ import annotations

import resource
import shlex
import sys
import types
from collections.abc import Sequence

from . import backends
from . import spec as S
from .errors import UnavailableError
from .host import HostInfo
from .plan import Op, OpFlag, OpKind, Plan, check_argv, compile_plan
from .proc_covers import Cover
from .redact import env_of, redact
from .refusal import refusal
from .seccomp import DEFAULT_POLICY, compile_policy
from .validate import check_instance

__all__ = ["bwrap_command", "describe_plan", "explain"]

RLIMIT_NAMES = {
    resource.RLIMIT_CPU: ("RLIMIT_CPU", "s of CPU time"),
    resource.RLIMIT_AS: ("RLIMIT_AS", "bytes of address space"),
    resource.RLIMIT_FSIZE: ("RLIMIT_FSIZE", "bytes per file written"),
    resource.RLIMIT_NOFILE: ("RLIMIT_NOFILE", "open files"),
    resource.RLIMIT_NPROC: ("RLIMIT_NPROC", "processes of the user"),
    resource.RLIMIT_DATA: ("RLIMIT_DATA", "bytes of writable memory"),
}
FD_OPTIONS = ("--file", "--bind-data", "--ro-bind-data", "--seccomp")  # their first value is an fd


def explain(spec: S.Spec, argv: Sequence[str], backend: str = "auto", *, reveal: bool = False) -> str:
    """The sandbox `spawn(argv, spec, backend=backend)` would start, described; nothing runs.
    Key-like values (sandbox.redact) of the command's and the caller's environment
    read `<NAME>` unless `reveal`."""
    check_instance("spec", spec, S.Spec, "a sandbox.Spec")
    args = check_argv(argv)
    try:
        name, reason = backends.choose(backend)
    except UnavailableError as exc:
        name, reason = (backend if backend != "auto" else "native"), f"none can run here: {exc}"
    # Read the host without starting the network namespace pool (HostInfo.current
    # only reads): a plan compiled here shows a fresh namespace where a spawn
    # might lease one, unless the pool is already running.
    host = HostInfo.current(backends.get(name).traits)
    plan = compile_plan(spec, host)
    lines = [f"backend: {name} ({reason})"]
    refused = refusal(plan, host)
    if refused is not None:
        lines.append(f"refused before anything runs: {type(refused).__name__}: {refused}")
    lines += describe_plan(plan, args, spec)
    bwrap_plan = compile_plan(spec, HostInfo.current(backends.get("bwrap").traits))
    lines += ["", "equivalent bwrap command line:", bwrap_command(bwrap_plan, args)]
    text = "\n".join(lines)
    return text if reveal else redact(text, env_of(plan.env), host.environ)


def describe_plan(plan: Plan, argv: Sequence[str], spec: S.Spec | None = None) -> list[str]:
    """`plan` in words, one line per decision (the filesystem one per operation, in order)."""
    lines = [f"command: {shlex.join(argv)} (searched in PATH={plan.path})",
             f"namespaces: {_namespaces(plan)}",
             f"network: {_network(plan)}",
             f"identity: uid {plan.uid}, gid {plan.gid} inside; the caller's {plan.host_uid}/{plan.host_gid} "
             "outside" + ("; no user namespace can be made inside" if plan.disable_userns else ""),
             "filesystem, in order, on an empty root (a fresh tmpfs):"]
    lines += [f"  {i + 1}. {describe_op(op)}" for i, op in enumerate(plan.ops)] or ["  (nothing: an empty root)"]
    lines += [f"working directory: {_cwd(plan)}",
              "environment: " + (", ".join(plan.env) if plan.env else "empty"),
              "limits: " + (", ".join(_rlimit(res, value) for res, value in plan.rlimits) or "none"),
              f"cgroup: {_cgroup(plan)}",
              f"capabilities: {_caps(plan.keep_caps)}",
              f"process: {_process(plan)}",
              f"seccomp: {_seccomp(plan, spec)}"]
    if plan.landlock:
        lines.append("landlock: " + ("best effort; " if plan.landlock_best_effort else "")
                     + ", ".join(f"{path} ({'rw' if rw else 'rx'})" for path, rw in plan.landlock_rules))
    if plan.hostname is not None:
        lines.append(f"hostname: {plan.hostname}")
    if plan.probe_paths:
        lines.append("proven absent before the command runs: " + ", ".join(plan.probe_paths))
    if plan.forward:
        lines.append("forwarded: " + ", ".join(f"127.0.0.1:{port} inside -> {target}" for port, target in plan.forward))
    if plan.check_network:
        lines.append("network inspected from the host before the command runs (only lo, no route out)")
    return lines


def describe_op(op: Op) -> str:
    """One setup operation in words."""
    kind, flags = op.kind, op.flags
    if kind is OpKind.BIND:
        text = f"bind {op.src} at {op.dest}, " + ("read-only" if flags & OpFlag.RDONLY else "writable")
        text += ", devices usable" if not flags & OpFlag.NODEV else ""
        return text + (" (skipped if the source is missing)" if flags & OpFlag.OPTIONAL else "")
    if kind is OpKind.TMPFS:
        return f"tmpfs at {op.dest}, mode {op.mode:04o}" + (f", {op.size} bytes" if op.size else "")
    if kind is OpKind.PROC:
        return f"proc at {op.dest}" + (", a new one (only the sandbox's processes)" if flags & OpFlag.FRESH
                                       else ", the host's (no pid namespace)") + _proc_covers(op)
    if kind is OpKind.DEV:
        return (f"a minimal /dev at {op.dest} (a tmpfs, mode {op.mode:04o}: null, zero, full, random, urandom, "
                f"tty, a private pts, shm with mode {op.shm_mode:04o})")
    if kind is OpKind.MQUEUE:
        return f"a new mqueue filesystem at {op.dest} (the message queues of the sandbox's IPC namespace)"
    if kind is OpKind.DIR:
        return f"directory {op.dest}, mode {op.mode:04o}"
    if kind is OpKind.SYMLINK:
        return f"symlink {op.dest} -> {op.src}"
    if kind is OpKind.FILE:
        return (f"file {op.dest}, {len(op.data)} bytes, mode {op.mode:04o}"
                + (", read-only" if flags & OpFlag.RDONLY else ""))
    if kind is OpKind.REMOUNT_RO:
        return f"remount {op.dest} read-only"
    if kind is OpKind.CHMOD:
        return f"chmod {op.mode:04o} {op.dest}"
    return f"{kind.name.lower()} {op.dest}"


def bwrap_command(plan: Plan, argv: Sequence[str]) -> str:
    """`bwrap OPTIONS -- ARGV` for `plan`, as the bwrap backend renders it, with a note
    on what each fd carries (numbered from 3 here; the backend passes memfds)."""
    from .backends.bwrap.render import render_plan  # lazy: the bwrap executor's renderer only here: 22 ms

    with render_plan(plan) as rendered:
        args = list(rendered)
    notes, number = [], 3
    for i, arg in enumerate(args[:-1]):
        if arg in FD_OPTIONS:
            what = ("the seccomp program" if arg == "--seccomp" else f"the data of {args[i + 2]}")
            notes.append(f"fd {number}: {what}")
            args[i + 1] = str(number)
            number += 1
    line = shlex.join(["bwrap", *args, "--", *argv])
    unsaid = [_rlimit(res, value) for res, value in plan.rlimits]
    if unsaid:
        notes.append("bwrap has no option for the limits (the bwrap backend sets them with prlimit while bwrap "
                     "waits after setup): " + ", ".join(unsaid))
    return "\n".join([line, *(f"  # {note}" for note in notes)])


# ---------------------------------------------------------------- pieces

def _namespaces(plan: Plan) -> str:
    names = [n for n, on in (("user", plan.user_ns), ("mount", plan.mount_ns), ("pid", plan.pid_ns),
                             ("ipc", plan.ipc_ns), ("uts", plan.uts_ns), ("cgroup", plan.cgroup_ns)) if on]
    return "new " + ", ".join(names) if names else "none (the caller's)"


def _network(plan: Plan) -> str:
    if plan.network == "host":
        return "the host's (shared)"
    where = "leased from the pool" if plan.network == "pool" else "its own"
    return f"{where}: only lo, up, with 127.0.0.1 and ::1; no route out"


def _cwd(plan: Plan) -> str:
    if plan.cwd_strict:
        return f"{plan.cwd_candidates[0]} (must exist inside)"
    return "the first that exists inside of " + ", ".join(plan.cwd_candidates)


def _rlimit(res: int, value: int) -> str:
    name, unit = RLIMIT_NAMES.get(res, (f"resource {res}", ""))
    return f"{name} {value} {unit}".rstrip()


def _cgroup(plan: Plan) -> str:
    parts = []
    if plan.cgroup is not None:
        lim = plan.cgroup
        parts.append(f"its own ({plan.limits_mechanism}): " + ", ".join(
            text for text, used in ((f"memory {lim.memory_bytes} bytes", lim.memory_bytes),
                                    (f"{lim.pids} tasks", lim.pids),
                                    (f"CPU quota {lim.cpu_quota_us} µs per 100 ms", lim.cpu_quota_us)) if used))
    if plan.limits_fallback:
        parts.append(f"no cgroup here for {', '.join(plan.limits_fallback)} (rlimit fallback where one exists)")
    return "; ".join(parts) or "none asked for"


def _caps(mask: int) -> str:
    names = [name for bit, name in enumerate(S.CAPABILITIES) if mask >> bit & 1]
    if not names:
        return "none (every set emptied)"
    if len(names) == len(S.CAPABILITIES):
        return f"all {len(names)} kept (the bounding set too)"
    return ", ".join(names)


def _process(plan: Plan) -> str:
    parts = ["pid 1 is sandbox-init (reaps, forwards signals)" if plan.reaper
             else "the command is pid 1" if plan.pid_ns else "no pid namespace"]
    parts.append("a new session (no controlling terminal)" if plan.new_session else "the caller's session")
    parts.append("killed when the caller dies" if plan.die_with_parent else "outlives the caller")
    parts.append("NO_NEW_PRIVS")
    return "; ".join(parts)


def _proc_covers(op: Op) -> str:
    if not op.covers:
        return "; no entry covered (a user namespace inside may mount a procfs of its own)"
    read_only = [path for path, cover in op.covers if cover is Cover.READ_ONLY]
    hidden = [path for path, cover in op.covers if cover is Cover.MASK]
    return "".join(f"; {what}: {', '.join(paths)}" for what, paths in (("read-only", read_only), ("hidden", hidden))
                   if paths)


def _seccomp(plan: Plan, spec: S.Spec | None) -> str:
    if not plan.seccomp:
        return "none"
    size = f"{len(plan.seccomp) // 8} BPF instructions"
    if spec is not None and spec.seccomp == DEFAULT_POLICY or plan.seccomp == compile_policy(DEFAULT_POLICY):
        return f"the default policy ({size}; see docs/hardening.md)"
    return f"a custom policy ({size})"


class _CallableModule(types.ModuleType):
    """This module's type: calling the module calls `explain()`. `sandbox.explain`
    is the function, imported on first use; but if this module is imported
    first (`from sandbox.explain import describe_plan`), the import system
    binds the module to that name, which must then work as the function."""

    def __call__(self, spec: S.Spec, argv: Sequence[str], backend: str = "auto", *, reveal: bool = False) -> str:
        return explain(spec, argv, backend, reveal=reveal)


sys.modules[__name__].__class__ = _CallableModule
