"""read_file and write_file of Inspect's contract over a Session's file API.

The Session resolves every path inside the sandbox's root (links never lead
out) and raises the errors Inspect names: FileNotFoundError,
PermissionError, IsADirectoryError. A file past Inspect's read limit
(`INSPECT_SANDBOX_MAX_READ_FILE_SIZE`, 100 MiB by default) is
OutputLimitExceededError; text is UTF-8, newlines kept as they are.

One difference needs a check of its own: the file API acts with the
caller's rights, and a root caller's CAP_DAC_OVERRIDE reads and writes
files whose modes deny the sandbox's own root (whose mode checks Inspect's
contract expects to bind). For a root caller, a regular file that exists is
first opened for reading (or appending, which changes nothing) by a shell
inside, as the sandbox's user without CAP_DAC_OVERRIDE, so the answer is the
one the file's mode gives (`test -r` would not do: shells answer it from the
uid alone for root).
"""

from __future__ import annotations

import errno
import os

from inspect_ai.util import OutputLimitExceededError, SandboxEnvironmentLimits

from ..process import DEVNULL
from ..session import Session

# The open is tried without the two capabilities that skip a file's mode (nsbox's commands hold docker's
# default set, CAP_DAC_OVERRIDE among them): util-linux's setpriv drops them from every set before the
# shell that opens the file runs. A root without setpriv in its /usr opens it with them.
NO_OVERRIDE = "setpriv --inh-caps=-all --ambient-caps=-all --bounding-set=-dac_override,-dac_read_search"


def _denied(session: Session, path: str, redirect: str) -> bool:
    """Whether opening the regular file `path` inside fails for the sandbox's user (root callers only)."""
    if os.geteuid() != 0:
        return False
    opening = f': {redirect} "$1"'
    script = (f'[ -f "$1" ] || exit 0; command -v setpriv >/dev/null 2>&1 && '
              f"exec {NO_OVERRIDE} /bin/sh -c '{opening}' sh \"$1\"; {opening}")
    done = session.exec(["/bin/sh", "-c", script, "sh", path], stdin=DEVNULL, stdout=DEVNULL, stderr=DEVNULL,
                        timeout=60)
    return done.returncode != 0


def read_file(session: Session, path: str, text: bool) -> str | bytes:
    """The file's contents, as Inspect's read_file returns them."""
    limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
    if _denied(session, path, "<"):
        raise PermissionError(errno.EACCES, "Permission denied (in the session)", path)
    try:
        data = session.read_file(path, max_bytes=limit)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None) from None
        raise _named(exc, path) from None
    return data.decode("utf-8") if text else data


def write_file(session: Session, path: str, contents: str | bytes) -> None:
    """Write the file, its missing directories made, as Inspect's write_file does."""
    if _denied(session, path, ">>"):
        raise PermissionError(errno.EACCES, "Permission denied (in the session)", path)
    data = contents.encode("utf-8") if isinstance(contents, str) else contents
    try:
        session.write_file(path, data, parents=True)
    except OSError as exc:
        raise _named(exc, path) from None


def _named(exc: OSError, path: str) -> OSError:
    """`exc` with the path Inspect's callers look for in its message (the Session's
    open of the file itself, past the lookup, names the caller's /proc/self/fd/N instead)."""
    if exc.errno is None or (exc.filename is not None and not str(exc.filename).startswith("/proc/self/fd/")):
        return exc
    return type(exc)(exc.errno, f"{exc.strerror or os.strerror(exc.errno)} (in the session)", path)
