"""Handoffs: what leaves a sandbox leaves as a copy, made and then sanitized.

`sanitized_copy(src, dst)` copies the tree at `src` (a file or directory the
sandbox could write) to `dst`, never following a link while reading: every
file is opened with O_NOFOLLOW relative to its already-opened directory, so a
link swapped in while copying is not followed. Special files (devices,
sockets, fifos) are dropped, and setuid/setgid/sticky bits cleared on what is
kept.

Links are decided on the real tree, not on their text: the copy is made in a
private directory beside `dst` (links copied as links), then each link of the
copy is resolved there as the kernel would resolve it, component by
component, through the other links of the copy. A link that leaves the tree
anywhere on the way (an absolute target, a `..` above the top, even through
another link: `a -> .` with `b -> a/a/../../..`), that loops, or that leads
to nothing, is removed; removing one can leave another dangling, so this
repeats until none changes. The tree is the copy, which only this call
writes, so what is decided is what is handed off.

An existing `dst` (file, directory or link) is replaced as a whole: the new
copy is renamed into its place and the old one removed without following its
links; a second run of the same task gets a fresh copy, never one merged with
the first. `replace=False` refuses an existing `dst` instead.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field

from ..errors import SpecError
from ..validate import StrPath, as_text, check_bool, check_text

KEEP_BITS = 0o777
MAX_HOPS = 40  # the kernel's limit on links followed in one lookup (ELOOP)


@dataclass
class CopyReport:
    """What the copy kept and dropped (paths relative to the source)."""

    copied: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


def sanitized_copy(src: StrPath, dst: StrPath, *, replace: bool = True) -> CopyReport:
    """Copy `src` to `dst`, sanitized, replacing what `dst` held (unless `replace`
    is false: then an existing `dst` raises SpecError); return what was kept and dropped."""
    src = check_text("src", as_text(src))
    dst = os.path.abspath(check_text("dst", as_text(dst)))
    check_bool("replace", replace)
    if os.path.lexists(dst) and not replace:
        raise SpecError("dst", dst, "exists (replace=False)")
    work = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.", dir=os.path.dirname(dst))
    try:
        staged = os.path.join(work, "copy")
        report = _copy(src, staged)
        if os.path.isdir(staged):
            _drop_links_out(staged, report)
        if os.path.lexists(dst):
            os.rename(dst, os.path.join(work, "old"))
        if os.path.lexists(staged):
            os.rename(staged, dst)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _copy(src: str, dst: str) -> CopyReport:
    report = CopyReport()
    st = os.lstat(src)
    if stat.S_ISDIR(st.st_mode):
        fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.mkdir(dst, 0o700)
            _copy_dir(fd, dst, "", report)
            os.chmod(dst, stat.S_IMODE(st.st_mode) & KEEP_BITS)
        finally:
            os.close(fd)
    elif stat.S_ISREG(st.st_mode):
        parent = os.open(os.path.dirname(os.path.abspath(src)) or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _copy_file(parent, os.path.basename(src), dst, report, os.path.basename(src))
        finally:
            os.close(parent)
    else:
        report.dropped.append((os.path.basename(src), "not a regular file or directory"))
    return report


def _copy_dir(dir_fd: int, dst: str, rel: str, report: CopyReport) -> None:
    for name in sorted(os.listdir(dir_fd)):
        path_rel = f"{rel}/{name}" if rel else name
        out = os.path.join(dst, name)
        st = os.lstat(name, dir_fd=dir_fd)
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            target = os.readlink(name, dir_fd=dir_fd)
            if target.startswith("/"):
                report.dropped.append((path_rel, f"link out of the tree ({target})"))
            else:
                os.symlink(target, out)  # decided once the whole tree is there
                report.copied.append(path_rel)
        elif stat.S_ISDIR(mode):
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            try:
                os.mkdir(out, 0o700)
                _copy_dir(sub, out, path_rel, report)
                os.chmod(out, stat.S_IMODE(mode) & KEEP_BITS)
            finally:
                os.close(sub)
            report.copied.append(path_rel)
        elif stat.S_ISREG(mode):
            _copy_file(dir_fd, name, out, report, path_rel)
        else:
            report.dropped.append((path_rel, "special file"))


def _copy_file(dir_fd: int, name: str, out: str, report: CopyReport, rel: str) -> None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        report.dropped.append((rel, f"cannot open: {exc.strerror}"))
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped since lstat
            report.dropped.append((rel, "special file"))
            return
        wfd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            while chunk := os.read(fd, 1 << 20):
                os.write(wfd, chunk)
            os.fchmod(wfd, stat.S_IMODE(st.st_mode) & KEEP_BITS)  # no setuid, setgid or sticky bit
        finally:
            os.close(wfd)
        report.copied.append(rel)
    finally:
        os.close(fd)


def _drop_links_out(root: str, report: CopyReport) -> None:
    """Remove each link of the tree at `root` that does not resolve inside it, until none is left."""
    links = [rel for rel in report.copied if os.path.islink(os.path.join(root, rel))]
    changed = True
    while changed:
        changed = False
        for rel in list(links):
            target = os.readlink(os.path.join(root, rel))
            if resolve(root, rel.split("/")[:-1], target.split("/")) is None:
                os.unlink(os.path.join(root, rel))
                links.remove(rel)
                report.copied.remove(rel)
                report.dropped.append((rel, f"link that does not resolve inside the tree ({target})"))
                changed = True


def resolve(root: str, here: list[str], parts: list[str]) -> list[str] | None:
    """Where `parts`, looked up from the directory `here` (components under
    `root`), lead on the tree at `root`, following its links as the kernel
    does (a `..` after a link goes up from where the link led); None if the
    lookup leaves the tree, loops, or meets something missing or not a directory."""
    here, todo, hops = list(here), list(parts), 0
    while todo:
        comp = todo.pop(0)
        if comp in ("", "."):
            continue
        if comp == "..":
            if not here:
                return None
            here.pop()
            continue
        path = os.path.join(root, *here, comp)
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return None
        if stat.S_ISLNK(mode):
            hops += 1
            target = os.readlink(path)
            if hops > MAX_HOPS or target.startswith("/"):
                return None
            todo = target.split("/") + todo
        elif todo and not stat.S_ISDIR(mode):
            return None
        else:
            here.append(comp)
    return here
