"""A Spec as the task description the broker starts (the brokered executor's one translation).

A Spec inside a task sandbox cannot be started there (no user namespaces
for untrusted code); the brokered executor sends it to the broker instead.
The Spec becomes the task description that shows what it asks for, in this
sandbox's paths: binds become `read`, `write` and `binds`; the network
`host` becomes `open` (anything else `isolated`); `env`, `env_inherit`,
`cwd`, the memory, file and CPU limits, `probe_paths` and `forward` carry
over. Binds of what every task sandbox shows anyway (the system under /usr
and its links, the /etc files, this interpreter) are left to the task world,
as are /proc, /dev, tmpfs, directories, links and remounts. What a task
description cannot express, or what would widen, is refused by name:
another seccomp policy, capabilities, a uid, a hostname, namespaces turned
off, device binds, files with data, landlock, other limits. The broker then
checks the description like any other (it can only narrow).
"""

from __future__ import annotations

import dataclasses
import os
import sys

from ...errors import SpecError
from ...mounts import Bind as SBind
from ...mounts import DevBind, File, RoBind
from ...paths import is_under
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
        if isinstance(m, (DevBind, File)):
            raise SpecError(f"mounts[{i}]", m, "a nested sandbox shows no devices and no files made of data")
        if not isinstance(m, SBind):
            continue  # /proc, /dev, tmpfs, directories, links, remounts: the task world has its own
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
        read=read, write=write, binds=binds, chdir=spec.cwd, env_allow=spec.env_inherit, env=dict(spec.env),
        network="open" if spec.network == "host" else "isolated", probes=spec.probe_paths,
        ports=[p for p, t in forward.items() if isinstance(t, int)],
        sockets={p: t for p, t in forward.items() if isinstance(t, str)},
        limits=Limits(**{n: getattr(spec.limits, n) for n in _TASK_LIMITS}))
