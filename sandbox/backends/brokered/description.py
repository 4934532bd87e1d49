"""A Spec as the task description the broker starts (the brokered executor's one translation).

A Spec inside a task sandbox cannot be started there (no user namespaces
for untrusted code); the brokered executor sends it to the broker instead.
The Spec becomes the task description that shows what it asks for, in this
sandbox's paths: binds become `read`, `write` and `binds`; the network
`host` becomes `open` (anything else `isolated`); `env`, `env_inherit`,
`cwd`, the memory, file and CPU limits, `probe_paths` and `forward` carry
over; without a `cwd`, where bwrap's rule starts the command is decided
here (the caller's working directory if shown, else HOME if shown, else /):
the broker is another process, with a working directory of its own. Binds of what every
task sandbox shows anyway (the system under /usr and its links, the /etc
files, this interpreter) are left to the task world, as are the mounts it
makes itself: a /proc at /proc, a /dev at /dev, a tmpfs at /tmp (the task
world's: mode 1777, bounded by the memory limit rather than a size of its
own) and the system's top-level links. What a task description cannot
express, or what would widen, is refused by name: another seccomp policy,
capabilities, a uid, a hostname, namespaces turned off, device binds, files
with data, landlock, other limits; and every other mount (a tmpfs, proc or
dev elsewhere, a directory, a link, a remount, a chmod, an mqueue, an
overlay), which the nested sandbox would otherwise silently lack (writes
meant for a tmpfs would reach the bind below it; a path meant read-only
would stay writable), as would one of the task world's mounts that the Spec
puts over an earlier mount (the task world makes its own first). The
broker then checks the description like any other (it can only narrow).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from ...errors import SpecError
from ...host_system import system_mounts
from ...mounts import Bind as SBind
from ...mounts import Dev, DevBind, Mount, Proc, RoBind, Symlink, Tmpfs
from ...paths import is_under
from ...plan import resolve_env
from ...seccomp import DEFAULT_POLICY
from ...spec import Limits as SLimits
from ...spec import Namespaces, Spec
from ...task.description import Bind, Limits, Sandbox
from ...task.facts import ETC_FILES

SHOWN_ANYWAY = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", *ETC_FILES)
_DEFAULTS: dict[str, object] = {"namespaces": Namespaces(), "hostname": None, "uid": None, "gid": None,
                                "die_with_parent": True, "as_pid_1": False, "cap_add": (), "seccomp": DEFAULT_POLICY,
                                "landlock": False}
_TASK_LIMITS = ("memory_mb", "file_mb", "cpu_s")


def _shown_anyway(path: str) -> bool:
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return any(is_under(path, p) for p in (*SHOWN_ANYWAY, *prefixes))


def _task_world_has(m: Mount) -> bool:
    """Whether the task world makes `m` itself (before every bind)."""
    if isinstance(m, (Proc, Dev, Tmpfs)):
        return m.dest == {Proc: "/proc", Dev: "/dev", Tmpfs: "/tmp"}[type(m)]
    return isinstance(m, Symlink) and m in system_mounts()


def _check_world_mount(mounts: tuple[Mount, ...], i: int) -> None:
    """Mount `i`, not a bind, is the task world's own, over no earlier mount of the Spec; else SpecError."""
    m = mounts[i]
    if not _task_world_has(m):
        raise SpecError(f"mounts[{i}]", m, "a nested sandbox shows binds of host paths, and of its own only /proc, "
                        "/dev, /tmp and the system's links: no device, file with data, other tmpfs, proc or dev, "
                        "directory, link, remount, chmod, mqueue or overlay")
    dest = m.dest_path()
    for j, earlier in enumerate(mounts[:i]):
        if is_under(earlier.dest_path(), dest):
            raise SpecError(f"mounts[{i}]", m, f"covers mounts[{j}] ({earlier.dest_path()}): in a nested sandbox "
                            f"{dest} is the task world's own, mounted before every bind")


def _host_dir(path: str, spec: Spec) -> str | None:
    """Where `path` of the nested sandbox is in this one: through the Spec's most specific bind that shows it."""
    found = None
    for m in spec.mounts:
        if (isinstance(m, SBind) and not isinstance(m, DevBind) and is_under(path, m.dest_path())
                and not (m.optional and not os.path.exists(m.src))):
            if found is None or len(m.dest_path()) >= len(found.dest_path()):
                found = m
    if found is None:
        return None
    rest = path[len(found.dest_path()):].lstrip("/")
    return os.path.join(found.src, rest) if rest else found.src


def _start_dir(spec: Spec) -> str:
    """Where the command starts without a `cwd`, by bwrap's rule (sandbox.plan.cwd_candidates), decided here:
    the broker is another process, whose own cwd is not the caller's. This process's working directory if
    the nested sandbox shows it, else the command's HOME if it shows that, else /."""
    try:
        cwd: str | None = os.getcwd()
    except OSError:
        cwd = None
    for candidate in (cwd, resolve_env(spec, os.environ).get("HOME")):
        if candidate and candidate.startswith("/"):
            host = _host_dir(candidate, spec)
            if host is not None and os.path.isdir(host):
                return candidate
    return "/"


def description_of(spec: Spec) -> Sandbox:
    """The task description that shows what `spec` asks for; SpecError naming what it cannot express."""
    for name, default in _DEFAULTS.items():
        if getattr(spec, name) != default:
            raise SpecError(name, getattr(spec, name), "a Spec started through the sandbox.task broker must "
                            "leave it as the default (a nested sandbox can only narrow)")
    for name in (f.name for f in dataclasses.fields(SLimits)):
        if name not in _TASK_LIMITS and getattr(spec.limits, name) != getattr(SLimits(), name):
            raise SpecError(f"limits.{name}", getattr(spec.limits, name), "a nested sandbox takes memory_mb, "
                            "file_mb and cpu_s only")
    read: list[str] = []
    write: list[str] = []
    binds: list[Bind] = []
    for i, m in enumerate(spec.mounts):
        if not isinstance(m, SBind) or isinstance(m, DevBind):
            _check_world_mount(spec.mounts, i)
            continue
        dest = m.dest_path()
        if m.optional and not os.path.exists(m.src):
            continue
        writable = not isinstance(m, RoBind)
        if m.src == dest and not writable and _shown_anyway(m.src):
            continue
        if m.src == dest:
            (write if writable else read).append(m.src)
        else:
            binds.append(Bind(m.src, dest, writable))
    forward = dict(spec.forward)
    return Sandbox(
        read=read, write=write, binds=binds, chdir=spec.cwd if spec.cwd is not None else _start_dir(spec),
        env_allow=spec.env_inherit, env=dict(spec.env),
        network="open" if spec.network == "host" else "isolated", probes=spec.probe_paths,
        ports=[p for p, t in forward.items() if isinstance(t, int)],
        sockets={p: t for p, t in forward.items() if isinstance(t, str)},
        limits=Limits(**{n: getattr(spec.limits, n) for n in _TASK_LIMITS}))
