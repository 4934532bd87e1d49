"""Write a Spec as a command line of `python -m sandbox run`, the inverse of `parse.py`.

`from_bwrap_args(to_bwrap_args(spec, argv))` gives back `(spec, argv)` for
every Spec the grammar can say (see `to_bwrap_args`). Spec mounts map one to
one onto bwrap's filesystem options, so they are written directly, without
the planner: the planner's decisions (parent modes, dev/shm) are the bwrap
backend's business, not the grammar's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from .. import spec as S
from ..errors import SpecError
from ..seccomp import DEFAULT_POLICY, compile_policy
from .argv import (
    BwrapArgv,
    bind_args,
    cap_args,
    chmod_args,
    dir_args,
    env_args,
    file_args,
    seccomp_args,
    tmpfs_args,
    unshare_args,
)
from .parse import spec_environment
from .state import LIMIT_OPTION, MAX_ID, PROC_COVERS


def to_bwrap_args(spec: S.Spec, argv: Sequence[str], *, environ: Mapping[str, str] | None = None) -> BwrapArgv:
    """`spec` and `argv` as one command line in `sandbox.bwrap.parse`'s grammar.

    The environment is made explicit (`--clearenv`, then `--setenv` for each
    variable); `spec.env_inherit` is resolved against `environ` (default:
    this process's), since the grammar has no patterns. Capabilities are
    exact (`--cap-drop ALL`, then `--cap-add`). Limits use this package's
    `--limit-*` options, which the real bwrap rejects. The default seccomp
    policy is `--seccomp-default`; another is compiled and given as
    `--seccomp FD` (it comes back as a raw program). File data is in memfds
    listed in `.fds` (read and closed by `from_bwrap_args`).

    Raises SpecError for what the grammar cannot say: no mount namespace, a
    uid or gid above 2**31-1, a limit without a `--limit-*`
    option (`file_bytes`), Procs with different covers.

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
    env = spec_environment(spec, os.environ if environ is None else environ)
    fds: list[int] = []
    try:
        args = _namespaces(spec) + _identity(spec) + _proc_covers(spec)
        for mount in spec.mounts:
            args += _mount(mount, fds)
        args += env_args(sorted(env.items()))
        args += _process(spec) + _limits(spec.limits) + cap_args(spec.cap_add) + _seccomp(spec, fds)
        args += ["--", *argv]
    except BaseException:
        BwrapArgv((), fds).close()
        raise
    return BwrapArgv(args, fds)


def _namespaces(spec: S.Spec) -> list[str]:
    ns = spec.namespaces
    net = spec.network in ("none", "pool")
    out = unshare_args(user=ns.user, pid=ns.pid, net=net, ipc=ns.ipc, uts=ns.uts, cgroup=ns.cgroup)
    if not net:
        out.append("--share-net")
    if spec.network == "pool":
        out.append("--netns-pool")  # an option of ours: the CLI's grammar, not bwrap's
    return out


def _identity(spec: S.Spec) -> list[str]:
    out = []
    for name in ("uid", "gid"):
        value = getattr(spec, name)
        if value is None:
            continue
        if value > MAX_ID:
            raise SpecError(name, value, f"bwrap's --{name} takes at most {MAX_ID}")
        out += [f"--{name}", str(value)]
    if spec.hostname is not None:
        out += ["--hostname", spec.hostname]
    return out


def _proc_covers(spec: S.Spec) -> list[str]:
    """`--proc-covers` where the Procs' covers are not the grammar's default
    (the option applies to every --proc, so they must all have the same)."""
    sets = {m.covers for m in spec.mounts if isinstance(m, S.Proc)}
    if len(sets) > 1:
        raise SpecError("mounts", sorted(sets), "the grammar gives every --proc the same covers (--proc-covers)")
    if not sets or sets == {PROC_COVERS[0]}:
        return []
    return ["--proc-covers", sets.pop()]


def _mount(m: S.Mount, fds: list[int]) -> list[str]:
    """The option for one Spec mount; a File's data goes into a new fd appended to `fds`."""
    if isinstance(m, S.Bind):
        return bind_args(m.src, m.dest_path(), readonly=m.readonly, devices=m.devices, optional=m.optional)
    if isinstance(m, S.Tmpfs):
        return tmpfs_args(m.dest, m.perms, m.size)
    if isinstance(m, S.Dir):
        return dir_args(m.dest, m.perms)
    if isinstance(m, S.File):
        return file_args(m.dest, m.data, m.perms, m.readonly, fds)
    if isinstance(m, S.Chmod):
        return chmod_args(m.path, m.perms)
    if isinstance(m, S.Symlink):
        return ["--symlink", m.target_path, m.dest]
    if isinstance(m, S.Proc):
        return ["--proc", m.dest]
    if isinstance(m, S.Dev):
        return ["--dev", m.dest]
    if isinstance(m, S.Mqueue):
        return ["--mqueue", m.dest]
    if isinstance(m, S.RemountRo):
        return ["--remount-ro", m.dest]
    raise SpecError("mounts", m, "mount operation the bwrap grammar cannot express")


def _process(spec: S.Spec) -> list[str]:
    out = []
    if spec.cwd is not None:
        out += ["--chdir", spec.cwd]
    for flag, option in ((spec.die_with_parent, "--die-with-parent"), (spec.new_session, "--new-session"),
                         (spec.as_pid_1, "--as-pid-1"), (spec.disable_userns, "--disable-userns")):
        if flag:
            out.append(option)
    return out


def _limits(limits: S.Limits) -> list[str]:
    out = []
    for f in dataclasses.fields(limits):
        value = getattr(limits, f.name)
        if value is None or value is False:  # unset (require_cgroups: off)
            continue
        if f.name not in LIMIT_OPTION:
            raise SpecError(f"limits.{f.name}", value, "the bwrap grammar has no option for it")
        out += [LIMIT_OPTION[f.name], str(value)]
    return out


def _seccomp(spec: S.Spec, fds: list[int]) -> list[str]:
    """Nothing for no filter (the grammar's default, as bwrap's),
    `--seccomp-default` for the default policy, else `--seccomp FD` with the
    compiled policy."""
    if spec.seccomp is None:
        return []
    if spec.seccomp == DEFAULT_POLICY:
        return ["--seccomp-default"]
    return seccomp_args(compile_policy(spec.seccomp), fds)
