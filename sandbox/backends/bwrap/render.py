"""Render a compiled Plan as the options the bwrap backend gives /usr/bin/bwrap (0.8.0).

The options are spelled by `sandbox.bwrap.argv` (`spell`), as the CLI's unparser
spells them. What this module adds is the Plan's decisions, where bwrap's
own rules would decide otherwise: explicit parent directories where bwrap's
mode rule differs from the plan's, /dev/shm's mode, exact capabilities and
environment. File data and the seccomp program travel in memfds, listed in
the returned argv's `.fds`.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Collection, Sequence

from ... import spec as S
from ...bwrap import argv as spell
from ...bwrap.argv import BwrapArgv
from ...errors import SpecError
from ...plan import DEV_MODE, DEV_SHM_MODE, Op, OpFlag, OpKind, Plan, parent_mode_for
from ...proc_covers import Cover

# What bwrap 0.8.0 makes by itself: --dev's tmpfs and its shm directory are
# 0755; --remount-ro adds nodev and nosuid (bind_mount() in bind-mount.c).
BWRAP_DEV_MODE = 0o755
BWRAP_DEV_SHM_MODE = 0o755
REMOUNT_RO_FLAGS = OpFlag.RDONLY | OpFlag.NODEV | OpFlag.NOSUID
# bwrap resolves a source SRC as /oldroot/SRC (the host's root, put there by
# its first pivot_root) and a destination DEST as /newroot/DEST: so the source
# NEWROOT_SOURCE + DEST, /oldroot/../newroot/DEST, is DEST in the sandbox
# being built (how the covers of a fresh procfs bind its entries over themselves).
NEWROOT_SOURCE = "/../newroot"


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
        out += spell.dir_args(parent, op.parent_mode)
    return out


def _dev_options(op: Op, match_native: bool) -> list[str]:
    """`--dev`, then `--chmod` for each mode of the op bwrap's own --dev does not make.
    Without `match_native` (this package's grammar, where --dev is a Dev mount) the op must be a Dev's."""
    if not match_native:
        if (op.mode, op.shm_mode) != (DEV_MODE, DEV_SHM_MODE):
            raise SpecError("mounts", op.dest, "--dev makes /dev and /dev/shm with the default modes only")
        return ["--dev", op.dest]
    out = ["--dev", op.dest]
    if op.mode != BWRAP_DEV_MODE:
        out += spell.chmod_args(op.dest, op.mode)
    if op.shm_mode != BWRAP_DEV_SHM_MODE:
        out += spell.chmod_args(op.dest.rstrip("/") + "/shm", op.shm_mode)
    return out


def _proc_options(op: Op, match_native: bool) -> list[str]:
    """`--proc`, then, for the real bwrap, the op's covers as the native backend makes them.

    bwrap 0.8.0 covers only sys, sysrq-trigger, irq and bus read-only, and
    only where its access(W_OK) test passes: never /proc/sys, whose
    directory refuses write access to everyone, while uid 0 of the host may
    write its files. So each read-only cover is an explicit bind of the entry
    over itself (`-try`: skipped where this kernel lacks it); each mask binds
    /dev/null, which bwrap binds without device access, over an entry this
    kernel has (the sandbox's procfs has the host's global entries)."""
    out = ["--proc", op.dest]
    if not match_native:
        return out  # this package's grammar: --proc-covers names them
    for path, cover in op.covers:
        dest = op.dest.rstrip("/") + "/" + path
        if cover is Cover.READ_ONLY:
            out += ["--ro-bind-try", NEWROOT_SOURCE + dest, dest]
        elif os.path.lexists("/proc/" + path):
            out += ["--ro-bind", "/dev/null", dest]
    return out


def overlay_args(op: Op) -> list[str]:
    """An OVERLAY in bubblewrap 0.11's words (what `sandbox.explain` shows; the
    bwrap backend, for bwrap 0.8.0, refuses it first: Capability.OVERLAY):
    `--overlay-src` per layer, the lowest first, then the upper's option
    (a tmpfs's size has no bwrap option); one read-only layer is a read-only bind."""
    srcs = [arg for lower in reversed(op.lowers) for arg in ("--overlay-src", lower)]
    if op.flags & OpFlag.RDONLY:
        return ["--ro-bind", op.lowers[0], op.dest] if len(op.lowers) == 1 else [*srcs, "--ro-overlay", op.dest]
    if op.src:
        return [*srcs, "--overlay", posixpath.join(op.src, "upper"), posixpath.join(op.src, "work"), op.dest]
    return [*srcs, "--tmp-overlay", op.dest]


def render_op(op: Op, fds: list[int], match_native: bool = False) -> list[str]:
    """The bwrap options for one operation; a FILE's data goes into a new fd appended to `fds`.

    With `match_native`, the options are for the real bwrap and make what the
    native backend makes (a DEV op's modes, where bwrap's differ); without,
    they are in this package's grammar."""
    kind = op.kind
    if kind is OpKind.BIND:
        if not op.flags & OpFlag.NOSUID:
            raise SpecError("mounts", op.dest, "bwrap always binds nosuid")
        src = _fd_source(op.src) if op.flags & OpFlag.FD_SOURCE else op.src
        return spell.bind_args(src, op.dest, readonly=bool(op.flags & OpFlag.RDONLY),
                         devices=not op.flags & OpFlag.NODEV, optional=bool(op.flags & OpFlag.OPTIONAL))
    if kind is OpKind.TMPFS:
        return spell.tmpfs_args(op.dest, op.mode, op.size)
    if kind is OpKind.PROC:
        return _proc_options(op, match_native)
    if kind is OpKind.DEV:
        return _dev_options(op, match_native)
    if kind is OpKind.MQUEUE:
        return ["--mqueue", op.dest]
    if kind is OpKind.DIR:
        return spell.dir_args(op.dest, op.mode)
    if kind is OpKind.SYMLINK:
        return ["--symlink", op.src, op.dest]
    if kind is OpKind.FILE:
        return spell.file_args(op.dest, op.data, op.mode, bool(op.flags & OpFlag.RDONLY), fds)
    if kind is OpKind.REMOUNT_RO:
        if op.flags != REMOUNT_RO_FLAGS:
            raise SpecError("mounts", op.dest, "bwrap's --remount-ro always sets ro, nodev and nosuid")
        return ["--remount-ro", op.dest]
    if kind is OpKind.CHMOD:
        return spell.chmod_args(op.dest, op.mode)
    if kind is OpKind.OVERLAY:
        return overlay_args(op)
    raise SpecError("mounts", op.kind, "operation bwrap cannot express")


def render_ops(ops: Sequence[Op], fds: list[int], match_native: bool = True,
               skip: Collection[int] = ()) -> list[str]:
    """The options for `ops`, in order, but those whose index is in `skip`
    (done already, see dests.py). `match_native` adds what makes bwrap's
    result equal the native backend's: explicit parent directories where
    bwrap's mode rule differs from the plan's, and dev/shm's mode."""
    out: list[str] = []
    for i, op in enumerate(ops):
        if i in skip:
            continue
        if match_native:
            out += _parents(op)
        out += render_op(op, fds, match_native)
    return out


def handed_fds(plan: Plan) -> tuple[int, ...]:
    """The caller's fds bwrap itself uses: the namespaces and fds of the plan's sync that it is handed."""
    sync = plan.sync
    return tuple(fd for fd in (sync.userns_fd, sync.pidns_fd, sync.userns2_fd, sync.userns_block_fd) if fd >= 0)


def _fd_source(src: str) -> str:
    """What a caller's fd (/proc/self/fd/N, OpFlag.FD_SOURCE) names, as a path.
    bwrap 0.8.0 has no --bind-fd, and every fd it holds reaches the command,
    so it is given the path (as 0.10 binds it), not the fd; a missing fd is
    left as it is, for bwrap to fail on."""
    try:
        return os.readlink(src)
    except OSError:
        return src


def _sync_args(plan: Plan, fds: list[int]) -> list[str]:
    """bwrap's options for the plan's sync, but started_fd and block_fd (the
    driver's: it reports the pid and relays the block). --userns-block-fd
    needs an --info-fd: the driver reads the pid from --json-status-fd, so
    bwrap's info goes to /dev/null."""
    sync, out = plan.sync, []
    for option, fd in (("--userns", sync.userns_fd), ("--pidns", sync.pidns_fd), ("--userns2", sync.userns2_fd)):
        if fd >= 0:
            out += [option, str(fd)]
    if sync.userns_block_fd >= 0:
        fds.append(os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC))
        out += ["--userns-block-fd", str(sync.userns_block_fd), "--info-fd", str(fds[-1])]
    for path in sync.lock_files:  # bwrap's pid 1 takes them, as ours does
        out += ["--lock-file", path]
    return out


def render_plan(plan: Plan, seccomp_fd: int | None = None, skip: Collection[int] = ()) -> BwrapArgv:
    """bwrap 0.8.0 options (without the command) that set up `plan`, but the
    ops whose index is in `skip` (done already, see dests.py).

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
        args = spell.unshare_args(user=plan.user_ns, pid=plan.pid_ns, net=plan.net_ns, ipc=plan.ipc_ns,
                            uts=plan.uts_ns, cgroup=plan.cgroup_ns)
        args += _sync_args(plan, fds)
        if plan.user_ns and plan.sync.userns_block_fd < 0:  # else the caller maps the ids
            args += ["--uid", str(plan.uid), "--gid", str(plan.gid)]
        if plan.disable_userns:
            args.append("--disable-userns")
        if plan.hostname is not None:
            args += ["--hostname", plan.hostname]
        if not plan.mount_ns:
            args += spell.bind_args("/", "/", readonly=False, devices=True, optional=False)
        args += render_ops(plan.ops, fds, skip=skip)
        args += spell.env_args((name, value) for name, _, value in (e.partition("=") for e in plan.env))
        if plan.cwd_strict:
            args += ["--chdir", plan.cwd_candidates[0]]
        if plan.die_with_parent:
            args.append("--die-with-parent")
        if plan.new_session:
            args.append("--new-session")
        if plan.pid_ns and not plan.reaper:
            args.append("--as-pid-1")
        # no option where bwrap's default is the plan's (root: its own set; others: none), since bwrap
        # then changes no capability set (inheritable and ambient stay as they were)
        if not (plan.caps_as_caller or (not plan.keep_caps and os.getuid() != 0)):
            args += spell.cap_args(_cap_names(plan.keep_caps))
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        elif plan.seccomp:
            args += spell.seccomp_args(plan.seccomp, fds)
    except BaseException:
        BwrapArgv((), fds).close()
        raise
    return BwrapArgv(args, fds)



def _cap_names(keep: int) -> list[str]:
    return [name for bit, name in enumerate(S.CAPABILITIES) if keep >> bit & 1]
