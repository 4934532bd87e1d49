"""Destinations inside bound host trees, made safe before bwrap runs.

bwrap resolves every destination by name under /newroot, following links,
while the host's root is visible at /oldroot: a link that an earlier run left
in a bound directory (`config -> ../../oldroot/home/me` or `/oldroot/...`)
turns the next run's File, Dir, Symlink or Chmod below it into a write on the
host, and its mount points and missing parents into directories and files
created there. The native backend resolves inside the new root
(openat2(RESOLVE_IN_ROOT)); bwrap 0.8.0 cannot. So, before bwrap starts, the
plan's operations are walked in order over a model of the tree being built:

- A destination whose path crosses (or, where the operation follows it, ends
  in) a symlink inside a bound host tree is refused: SetupError naming it.
  The tree is walked with O_PATH|O_NOFOLLOW from fds, one component at a
  time, so the check itself follows no link.
- Writes below a bound tree (File, Dir, Symlink, Chmod) are done here, on
  those fds, and not rendered for bwrap: a link swapped in after the check
  cannot redirect them. Missing parents and mount points of the mounts below
  a bound tree are created here too, so bwrap finds them and creates nothing.
- The mounts below a bound tree are still made by bwrap, by name: a link
  swapped in during its setup (by a sandbox still running on the same
  writable directory) can only send such a mount into bwrap's own mount
  namespace, where the host never sees it (mounts do not propagate out); such
  a sandbox would lack the mount, so they are counted after setup and a
  missing one fails the start (`verify`). What remains: in that race bwrap may
  create an empty directory or file (a mount point or its parent) in an
  existing host directory the swapped link names, as the caller.
"""

from __future__ import annotations

import errno as E
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...errors import SetupError
from ...paths import is_under
from ...plan import Op, OpFlag, OpKind, Plan

# Operations done here when their destination lies inside a bound tree.
WRITES = (OpKind.FILE, OpKind.DIR, OpKind.SYMLINK, OpKind.CHMOD)
# Mount points bwrap creates for each mount kind: a directory unless the source is a file.
MOUNT_DIR_MODE = 0o755
MOUNT_FILE_MODE = 0o444


@dataclass
class _Mount:
    """A mount of the model: where it is (resolved), and for a bind its host source, opened."""

    dest: str
    src_fd: int = -1  # O_PATH fd of the bind's host source, -1 for our own filesystems
    readonly: bool = False


@dataclass
class Guard:
    """What the walk decided: ops done here (not rendered), mounts to verify after setup."""

    done: frozenset[int] = frozenset()
    verify: tuple[tuple[Op, str], ...] = ()  # (op, the mount point of the bound tree its mount goes in)


@dataclass
class _Walk:
    """The model of the tree bwrap builds: its mounts, in order."""

    plan: Plan
    mounts: list[_Mount] = field(default_factory=list)
    done: set[int] = field(default_factory=set)
    verify: list[tuple[Op, str]] = field(default_factory=list)

    def visible(self, path: str) -> _Mount | None:
        """The mount `path` lies in: the last one made at it or at an ancestor."""
        found = None
        for m in self.mounts:
            if is_under(path, m.dest):
                found = m
        return found


def prepare(plan: Plan) -> Guard:
    """Walk `plan`'s ops; raise SetupError for a destination that crosses a link
    inside a bound tree; do the writes below bound trees; say what to verify."""
    walk = _Walk(plan)
    try:
        for i, op in enumerate(plan.ops):
            _step(walk, i, op)
    finally:
        for m in walk.mounts:
            if m.src_fd >= 0:
                os.close(m.src_fd)
    return Guard(frozenset(walk.done), tuple(walk.verify))


def _step(walk: _Walk, i: int, op: Op) -> None:
    dest, mount, rel = _resolve(walk, op)
    if mount is not None and mount.src_fd >= 0 and _inside_tree(walk, i, op, mount, rel):
        walk.verify.append((op, mount.dest))
    _record(walk, op, dest)


def _resolve(walk: _Walk, op: Op) -> tuple[str, _Mount | None, str]:
    """Where `op.dest` is in the model: (path, the mount it lies in, the path
    relative to that mount). A Spec puts no destination below a link of its
    own (validate.py), and `dest` is normalized: nothing to follow here."""
    path = op.dest
    mount = walk.visible(path)
    rel = "" if mount is None else path[len(mount.dest):].lstrip("/")
    return path, mount, rel


def _join(path: str, comp: str) -> str:
    return path.rstrip("/") + "/" + comp


def _record(walk: _Walk, op: Op, dest: str) -> None:
    """What `op` adds to the model."""
    if op.kind is OpKind.BIND:
        try:
            fd = os.open(op.src, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # an optional source that is missing, or bwrap fails on it and says why
        walk.mounts.append(_Mount(dest, fd, bool(op.flags & OpFlag.RDONLY)))
    elif op.kind in (OpKind.TMPFS, OpKind.PROC, OpKind.DEV, OpKind.MQUEUE) or (
            op.kind is OpKind.FILE and op.flags & OpFlag.RDONLY):
        walk.mounts.append(_Mount(dest))
    elif op.kind is OpKind.REMOUNT_RO:
        mount = walk.visible(dest)
        if mount is not None and mount.dest == dest:
            mount.readonly = True


# ---------------------------------------------------------------- inside a bound tree

def _error(op: Op, what: str, errno: int, why: str | None = None) -> SetupError:
    """bwrap's wording for a failed `what` ("Can't mkdir /x"), with the errno's text or `why`."""
    return SetupError(f"{what}: {why or os.strerror(errno)}", step=op.kind.name.lower(), path=op.dest,
                      errno=errno, backend="bwrap")


def _what(op: Op) -> str:
    """How bwrap words a failure of `op`'s own step."""
    if op.kind is OpKind.FILE:
        return f"Can't create file at {op.dest}"
    if op.kind is OpKind.DIR:
        return f"Can't mkdir {op.dest}"
    if op.kind is OpKind.SYMLINK:
        return f"Can't make symlink at {op.dest}"
    if op.kind is OpKind.CHMOD:
        return f"Can't chmod {op.mode:#o} {op.dest}"
    return f"Can't mkdir parents for {op.dest}"


def _inside_tree(walk: _Walk, i: int, op: Op, mount: _Mount, rel: str) -> bool:
    """Check, and do or prepare, op `i` whose destination is `rel` inside the
    bound tree `mount`. True if it is a mount bwrap makes there (to verify)."""
    comps = [c for c in rel.split("/") if c]
    if not comps:
        return False  # the tree's own mount point: reached as when it was mounted
    fds: list[int] = []
    try:
        parent, missing = _open_existing(op, mount, comps, fds)
        if op.kind is OpKind.REMOUNT_RO:
            return True
        writes = op.kind in WRITES and not (op.kind is OpKind.DIR and not missing)  # an existing dir is kept
        if mount.readonly and (missing or writes):
            raise _error(op, _what(op) if op.kind in WRITES else f"Can't mkdir parents for {op.dest}", E.EROFS)
        if missing:
            parent = _make_dirs(op, parent, missing[:-1], fds)
        if op.kind in WRITES:
            _write(op, parent, comps[-1], exists=not missing)
            walk.done.add(i)
            return False
        if missing:
            _make_mount_point(op, parent, comps[-1])
        return True
    finally:
        for fd in fds:
            os.close(fd)


def _open_existing(op: Op, mount: _Mount, comps: list[str], fds: list[int]) -> tuple[int, list[str]]:
    """Open the existing components of `comps` below the tree's source, one at a
    time, following no link (a link on the way is refused); return the fd of
    the directory holding the last existing one and the missing components."""
    follows_last = op.kind is not OpKind.SYMLINK
    cur = mount.src_fd
    for k, comp in enumerate(comps):
        last = k == len(comps) - 1
        try:
            fd = os.open(comp, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=cur)
        except FileNotFoundError:
            return cur, comps[k:]
        except OSError as exc:
            raise _error(op, _what(op), exc.errno or E.EIO) from None
        fds.append(fd)
        mode = os.fstat(fd).st_mode
        if stat.S_ISLNK(mode) and (follows_last or not last):
            link = _join(mount.dest, "/".join(comps[:k + 1]))
            raise _error(op, _what(op), E.ELOOP, f"{link} is a symbolic link inside a bound directory, "
                         "which bwrap would follow out of the sandbox: refused")
        if last:
            return cur, []
        if not stat.S_ISDIR(mode):
            raise _error(op, _what(op), E.ENOTDIR)
        cur = fd
    return cur, []


def _mkdir(parent: int, name: str, mode: int) -> None:
    """mkdir with exactly `mode` (mkdir applies our umask); an existing entry is left alone."""
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        return
    # O_PATH: a mode without read permission (--perms 0000) must not stop the open
    fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        os.chmod(f"/proc/self/fd/{fd}", mode)  # an O_PATH fd: chmod through its magic link
    finally:
        os.close(fd)


def _make_dirs(op: Op, parent: int, names: list[str], fds: list[int]) -> int:
    """Create the missing parents `names` below `parent` with the plan's parent
    mode (as the native backend does); the fd of the last one."""
    try:
        for name in names:
            _mkdir(parent, name, op.parent_mode)
            parent = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
            fds.append(parent)
    except OSError as exc:
        raise _error(op, f"Can't mkdir parents for {op.dest}", exc.errno or E.EIO) from None
    return parent


def _make_mount_point(op: Op, parent: int, name: str) -> None:
    """What bwrap would create to mount on: a directory, or an empty file for a file source."""
    is_file = op.kind is OpKind.FILE or (op.kind is OpKind.BIND and not os.path.isdir(op.src))
    try:
        if not is_file:
            _mkdir(parent, name, MOUNT_DIR_MODE)
            return
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, MOUNT_FILE_MODE,
                     dir_fd=parent)
        try:
            os.fchmod(fd, MOUNT_FILE_MODE)
        finally:
            os.close(fd)
    except FileExistsError:
        pass
    except OSError as exc:
        raise _error(op, f"Can't create file at {op.dest}", exc.errno or E.EIO) from None


def _write(op: Op, parent: int, name: str, exists: bool) -> None:
    """Do `op` (File, Dir, Symlink, Chmod) on `name` below `parent`, following no link."""
    try:
        if op.kind is OpKind.FILE:
            # O_NONBLOCK: a FIFO a previous tenant planted must not block us
            # (no reader: ENXIO); anything but a regular file is refused.
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, op.mode, dir_fd=parent)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise OSError(E.ENXIO, "not a regular file")
                if not exists:
                    os.fchmod(fd, op.mode)
                view = memoryview(op.data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        elif op.kind is OpKind.DIR:
            _mkdir(parent, name, op.mode)
            if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise OSError(E.ENOTDIR, os.strerror(E.ENOTDIR))
        elif op.kind is OpKind.SYMLINK:
            _symlink(op, parent, name)
        else:
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            try:
                if stat.S_ISLNK(os.fstat(fd).st_mode):
                    raise OSError(E.ELOOP, os.strerror(E.ELOOP))
                os.chmod(f"/proc/self/fd/{fd}", op.mode)  # an O_PATH fd: chmod through its magic link
            finally:
                os.close(fd)
    except OSError as exc:
        raise _error(op, _what(op), exc.errno or E.EIO) from None


def _symlink(op: Op, parent: int, name: str) -> None:
    """A link to op.src; an identical one already there is fine (as bwrap >= 0.9 and native)."""
    try:
        os.symlink(op.src, name, dir_fd=parent)
    except FileExistsError:
        try:
            same = os.readlink(name, dir_fd=parent) == op.src
        except OSError:
            same = False
        if not same:
            raise OSError(E.EEXIST, os.strerror(E.EEXIST)) from None


def verify(guard: Guard, child: int) -> None:
    """After bwrap's setup: each mount made below a bound tree is in that tree
    (a link swapped in during setup sends it into bwrap's own namespace, gone
    with /oldroot); else SetupError. Counted as mounts whose parent is the
    tree's mount, not by path: a directory renamed since moves its mounts."""
    wanted: dict[str, int] = {}
    for op, tree in guard.verify:
        if op.kind is OpKind.REMOUNT_RO or (op.kind is OpKind.BIND and op.flags & OpFlag.OPTIONAL
                                            and not os.path.exists(op.src)):
            continue  # no mount of its own / none made
        wanted[tree] = wanted.get(tree, 0) + 1
    if not wanted:
        return
    try:
        with open(f"/proc/{child}/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            rows = [line.split() for line in f.read().splitlines()]
    except OSError:
        return  # the setup child is gone (its setup failed: the caller reports how); nothing will run
    for tree, count in wanted.items():
        ids = [r[0] for r in rows if _unescape(r[4]) == tree]
        top = next((i for i in reversed(ids) if not any(r[1] == i and r[0] in ids for r in rows)), None)
        children = sum(1 for r in rows if r[1] == top)
        if top is None or children < count:
            op = next(op for op, t in guard.verify if t == tree)
            raise _error(op, f"Can't mount below {tree}", E.ELOOP,
                         "a mount is not in the bound directory after setup (a link swapped in during "
                         "setup sent it elsewhere): refused")


def fd_sources(plan: Plan) -> list[Op]:
    """The binds of a caller's fd (OpFlag.FD_SOURCE), which bwrap is given as paths."""
    return [op for op in plan.ops if op.flags & OpFlag.FD_SOURCE]


def verify_fd_sources(plan: Plan, child: int) -> None:
    """After bwrap's setup: each bind of a caller's fd shows that fd's file
    at its destination, as bwrap 0.10 checks after binding the path the fd's
    link names (a path swapped between reading it and bwrap's mount binds
    something else); else SetupError. Looked up in the sandbox's root: an
    absolute link on the way can only lead to another file, and a refusal."""
    for i, op in enumerate(plan.ops):
        if not op.flags & OpFlag.FD_SOURCE or _covered(op, plan.ops[i + 1:]):
            continue
        want = os.stat(op.src)
        try:
            got: os.stat_result | None = os.stat(f"/proc/{child}/root{op.dest}")
        except FileNotFoundError:
            got = None
        except OSError:
            return  # the setup child is gone (its setup failed: the caller reports how); nothing will run
        if got is None or (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
            raise _error(op, f"Can't bind {op.src} on {op.dest}", E.ESTALE,
                         "another file than the fd's was bound (its path changed during setup): refused")


MOUNT_KINDS = (OpKind.BIND, OpKind.TMPFS, OpKind.PROC, OpKind.DEV, OpKind.MQUEUE)


def _covered(op: Op, later: Sequence[Op]) -> bool:
    """Whether a later mount hides `op.dest` (at it or above it)."""
    return any(m.kind in MOUNT_KINDS and is_under(op.dest, m.dest)
               for m in later)


def _unescape(text: str) -> str:
    """mountinfo's octal escapes (of space, tab, newline and backslash)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)
