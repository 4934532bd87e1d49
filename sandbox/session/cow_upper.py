"""The directory that keeps a Session's writes (`Session(spec, upper=DIR)`):
made and checked before the session starts, so that nothing planted in it
redirects the writes (tests/adversarial/test_session_upper.py)."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import urllib.parse
from collections.abc import Iterable

from ..errors import SessionError, SpecError


def upper_name(dest: str, taken: set[str]) -> str:
    """The kept directory's subdirectory for the overlay at `dest`: its path
    quoted into one name ("%2Fusr"), numbered if taken ("%2Fusr.2")."""
    base = urllib.parse.quote(dest, safe="")
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}.{k}"
    taken.add(name)
    return name


def prepare_upper(upper: str, names: Iterable[str]) -> int:
    """Make the kept directory `upper` (if missing) and its subdirectories
    `names`, refusing what could redirect the session's writes: `upper`
    owned by another user or writable by others, a subdirectory that is a
    symlink or not a directory. overlayfs (csrc/core/mounts.c) then opens each
    subdirectory by path; only its owner could swap it meanwhile. Returns
    an fd of `upper` holding an exclusive flock: two overlays sharing an
    upper directory are undefined behaviour to the kernel (it only warns),
    so a second session over it is refused while the first lives."""
    os.makedirs(upper, mode=0o700, exist_ok=True)
    top = os.open(upper, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check_dir(top, upper)
        try:
            fcntl.flock(top, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SessionError(f"the kept upper directory {upper} is in use by another session") from None
        for name in names:
            try:
                os.mkdir(name, 0o700, dir_fd=top)
            except FileExistsError:
                pass
            _check_sub(top, upper, name)
    except BaseException:
        os.close(top)
        raise
    return top


def _check_dir(fd: int, path: str) -> None:
    st = os.fstat(fd)
    if st.st_uid != os.geteuid():
        raise SpecError("upper", path, f"is owned by uid {st.st_uid}, not by the caller (uid {os.geteuid()})")
    if st.st_mode & 0o022:
        raise SpecError("upper", path, f"is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
                        "they could swap what the session writes into")


def _check_sub(top: int, upper: str, name: str) -> None:
    path = os.path.join(upper, name)
    try:
        fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=top)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SpecError("upper", path, "is a symlink or not a directory: the session's writes of this "
                            "mount go there; remove it") from None
        raise
    try:
        _check_dir(fd, path)
    finally:
        os.close(fd)
