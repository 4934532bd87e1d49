"""Handoffs: what leaves a sandbox leaves as a copy, made and then sanitized.

`sanitized_copy(src, dst)` copies the tree at `src` (a file or directory the
sandbox could write) to `dst`, which must not exist, never following a link:
a link whose target stays inside the tree is copied as a link; one that
points out of it (absolute, or climbing out with `..`) is dropped; so are
special files (devices, sockets, fifos), and setuid/setgid/sticky bits are
cleared on what is kept. Every file is opened with O_NOFOLLOW relative to its
already-opened directory, so a link swapped in while copying is not followed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from ..validate import StrPath, as_text, check_text

KEEP_BITS = 0o777


@dataclass
class CopyReport:
    """What the copy kept and dropped (paths relative to the source)."""

    copied: list[str] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (path, why)


def _link_stays_inside(rel: str, target: str) -> bool:
    if target.startswith("/"):
        return False
    parts = [p for p in os.path.dirname(rel).split("/") if p]
    for comp in target.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if not parts:
                return False
            parts.pop()
        else:
            parts.append(comp)
    return True


def sanitized_copy(src: StrPath, dst: StrPath) -> CopyReport:
    """Copy `src` to `dst` (which must not exist), sanitized; return what was kept and dropped."""
    src = check_text("src", as_text(src))
    dst = check_text("dst", as_text(dst))
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
            if _link_stays_inside(path_rel, target):
                os.symlink(target, out)
                report.copied.append(path_rel)
            else:
                report.dropped.append((path_rel, f"link out of the tree ({target})"))
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
