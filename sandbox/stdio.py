"""A call's stdio as subprocess takes it (None, PIPE, DEVNULL, STDOUT, an fd, a file), made into the child's fds.

Shared by every face that starts a command (sandbox.api, sandbox.Template, sandbox.Session) and by the
executors that hand a caller's fd to another process (the Template's server, the task broker's client).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

from .errors import SpecError
from .process import DEVNULL, PIPE, STDOUT
from .validate import check_items

StdioArg = int | IO[Any] | None


class Stdio:
    """The child's three stdio fds (`child`), and the parent's ends of any pipes (`parent`)."""

    def __init__(self, stdin: StdioArg, stdout: StdioArg, stderr: StdioArg) -> None:
        child = [-1, -1, -1]
        self.parent: tuple[IO[bytes] | None, IO[bytes] | None, IO[bytes] | None] = (None, None, None)
        self._close_after: list[int] = []
        try:
            for i, arg in enumerate((stdin, stdout, stderr)):
                self._one(child, i, arg)
        except BaseException:
            self.abort()
            raise
        self.child = (child[0], child[1], child[2])

    @staticmethod
    def of(stdin: StdioArg, stdout: StdioArg, stderr: StdioArg) -> Stdio:
        """The Stdio of a call: the one shared INHERIT when all three are None
        (it holds nothing: started() and abort() have nothing to close)."""
        if stdin is None and stdout is None and stderr is None:
            return INHERIT
        return Stdio(stdin, stdout, stderr)

    def _one(self, child: list[int], i: int, arg: StdioArg) -> None:
        if arg is None:
            return
        if arg == PIPE:
            r, w = os.pipe2(os.O_CLOEXEC)
            mine, theirs = (w, r) if i == 0 else (r, w)
            child[i] = theirs
            self._close_after.append(theirs)
            parent = list(self.parent)
            parent[i] = open(mine, "wb" if i == 0 else "rb")
            self.parent = (parent[0], parent[1], parent[2])
        elif arg == DEVNULL:
            fd = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            child[i] = fd
            self._close_after.append(fd)
        elif arg == STDOUT:
            if i != 2:
                raise SpecError("stdin" if i == 0 else "stdout", "STDOUT", "only stderr may be STDOUT")
            if child[1] >= 0:
                child[2] = child[1]
            elif inheritable(1):
                child[2] = 1
            else:  # stdout reaches nothing a command would inherit: stderr (the same) neither
                self._one(child, 2, DEVNULL)
        elif isinstance(arg, int):
            if arg < 0:
                raise SpecError(("stdin", "stdout", "stderr")[i], arg, "must be a valid file descriptor")
            child[i] = arg
        elif hasattr(arg, "fileno"):
            child[i] = arg.fileno()
        else:
            raise SpecError(("stdin", "stdout", "stderr")[i], arg, "must be None, PIPE, DEVNULL, an fd or a file")

    def started(self) -> None:
        """The child holds its ends now: close ours."""
        if self._close_after:
            for fd in self._close_after:
                os.close(fd)
            self._close_after.clear()

    def abort(self) -> None:
        """Setup failed: close everything."""
        self.started()
        for f in self.parent:
            if f is not None:
                f.close()


INHERIT = Stdio(None, None, None)  # the child inherits the caller's three; nothing to open or close


def inheritable(fd: int) -> bool:
    """Whether a command this process execs would get `fd`: open and not
    close-on-exec. An executor that hands a stdio slot left to inherit to
    another process (over a socket, where close-on-exec does not travel)
    passes the caller's fd on only then: every fd this library opens is
    close-on-exec, and takes the number of a stdio fd the caller closed (a
    Template's own request socket, say)."""
    try:
        return not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    except OSError:  # not open
        return False


@contextlib.contextmanager
def handed_fds(child: Sequence[int]) -> Iterator[list[int]]:
    """The fds to hand another process (over a socket) as a child's stdio `child`: a slot left to inherit
    (-1) is the caller's own fd when a command would inherit it (`inheritable`), else /dev/null, opened
    here and closed when the block ends."""
    null = -1
    fds = []
    try:
        for i, fd in enumerate(child):
            if fd < 0 and not inheritable(i):
                if null < 0:
                    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
                fd = null
            fds.append(fd if fd >= 0 else i)
        yield fds
    finally:
        if null >= 0:
            os.close(null)


def check_pass_fds(pass_fds: Iterable[int]) -> tuple[int, ...]:
    """`pass_fds` checked: open, non-negative, each once, sorted; SpecError naming the bad one."""
    given = check_items("pass_fds", pass_fds, "file descriptors")
    for fd in given:
        if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
            raise SpecError("pass_fds", fd, "must be non-negative file descriptors")
    fds = sorted(set(given))
    for fd in fds:
        try:
            os.fstat(fd)
        except OSError:
            raise SpecError("pass_fds", fd, "is not an open file descriptor") from None
    return tuple(fds)
