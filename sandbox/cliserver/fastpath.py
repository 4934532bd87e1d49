"""The server's one decision: does the client run its sandbox itself, from a plan, or does a worker?

A command line whose whole behaviour a plan carries is answered with that
plan (wire.PLAN): the client (csrc/client/cliplan.c) starts the sandbox as its own
child, waits, and exits as the Python CLI would. No worker, no Python on
the client's side: the server parses the command line as the Python CLI
would (with the client's cwd, environment and hard limits), compiles the
plan and serializes it, all three memoized (bwrap/memo.py, plan_cache.py,
the native blob), and remembers whole answers by their request.

What a plan carries: the options of bwrap/memo.py's PURE set (no fd, file
or check of the moment is read while parsing) and `--args FD`, whose
content the server reads without taking it (a file's from its offset with
pread, a pipe's whose writers are gone with tee), and takes only once the
answer goes out. The words of every such file are screened by the same
walk of the grammar before anything parses them: an option that names an
fd (`--file`, `--seccomp`, `--sync-fd`, ...) or a file would otherwise be
looked up by the client's number in the server's own fd table (its
listener, its log, another client's pipe), so only PURE options pass, and
whatever else goes to a worker, which holds the client's fds at their
numbers; a sandbox the native backend starts with nothing the
client would have to do after the spawn: no status or sync fds, no
`--userns`, `--lock-file`, no cgroup of its own, no pooled network, no
forwarded ports, no bwrap backend. Everything else goes to a worker, which
runs the Python CLI for the client (worker.py), and `decide` says why.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import fcntl
import os
import select
import stat
import struct
from dataclasses import dataclass
from typing import Any

from .. import backends
from .._core import cliwire as wire
from ..bwrap.grammar import BY_NAME
from ..bwrap.memo import PURE
from ..bwrap.parse import parse_bwrap_args
from ..bwrap.values import split_args
from ..errors import SandboxError
from ..host import LIMITED_RESOURCES
from ..plan import check_argv
from ..plan_cache import compiled_plan
from ..refusal import refusal

ARGS_MAX = 1 << 18  # bytes of an --args file read here; a larger one goes to a worker
PIPE_PAGE = 1 << 16  # a pipe's default capacity
MAX_ANSWERS = 16
FIONREAD = 0x541B  # <asm-generic/ioctls.h>
F_SETPIPE_SZ = 1031  # <linux/fcntl.h>
SPLICE_F_NONBLOCK = 2


@dataclass(frozen=True)
class Answer:
    """A PLAN answer, and whether sandbox-init's fd goes with it."""

    data: bytes
    reaper: bool


@dataclass
class ArgsFile:
    """An `--args FD` of the request's: the client's number, the server's copy, its content."""

    number: int
    fd: int
    data: bytes
    pipe: bool
    offset: int = 0  # a file's offset (where the content starts)


class Worker(Exception):
    """The command line needs a worker: the message says why."""


# ---------------------------------------------------------------- the decision

@dataclass
class _Known:
    """A request answered before: where its --args fds are (index in its fd list, and their
    numbers), and its answer for each content of theirs seen."""

    args: list[tuple[int, int]]
    answers: dict[tuple[bytes, ...], Answer]


_known: collections.OrderedDict[bytes, _Known] = collections.OrderedDict()
_SIGMASK = slice(wire.ffi.offsetof("struct sbx_cli_request", "sigmask"),
                 wire.ffi.offsetof("struct sbx_cli_request", "sigmask") + 8)


def _key(data: bytes) -> bytes:
    """A request's bytes but its signal mask (the plan does not depend on it)."""
    return data[:_SIGMASK.start] + bytes(8) + data[_SIGMASK.stop:]


def lookup(data: bytes, fds: list[int]) -> tuple[Answer, list[ArgsFile]] | None:
    """The answer decide() gave a request of the very same bytes (`data`: its words, cwd,
    environment, fd numbers, limits, client build; `fds`: the server's copies of its fds) whose
    --args files hold the same content: no parsing, no planning. None if there is none."""
    known = _known.get(_key(data))
    if known is None:
        return None
    try:
        files = [_peek(number, fds[index]) for index, number in known.args]
    except Worker:
        return None
    answer = known.answers.get(tuple(f.data for f in files))
    if answer is None:
        return None
    _known.move_to_end(_key(data))
    return answer, files


def decide(data: bytes, request: wire.Request, fds: list[int]) -> tuple[Answer, list[ArgsFile]]:
    """The PLAN answer for the request `data` (parsed: `request`; `fds`: the server's copies of
    its fds, in its order) and its --args files, read but not taken: take() them once the answer
    is sent. Raises Worker, saying why, when a worker must run it (nothing is taken then). The
    answer is remembered for lookup()."""
    args, as_bwrap = command_args(request.argv)
    if any(e.startswith(b"SANDBOX_") for e in request.environ):
        raise Worker("the package's own settings are in its environment")
    at = _top_level_args(args, request.fd_numbers)
    where = [(request.fd_numbers.index(int(args[i])), int(args[i])) for i in at]
    files = [_peek(number, fds[index]) for index, number in where]
    if len({_identity(f.fd) for f in files}) != len(files):
        raise Worker("two --args fds share one file")
    for f in files:
        _screen_file(f)
    answer = _compile(request, args, as_bwrap, dict(zip(at, files, strict=True)))
    known = _known.setdefault(_key(data), _Known(where, {}))
    known.answers[tuple(f.data for f in files)] = answer
    while len(known.answers) > MAX_ANSWERS:
        del known.answers[next(iter(known.answers))]
    while len(_known) > MAX_ANSWERS:
        _known.popitem(last=False)
    return answer, files


def command_args(argv: list[bytes]) -> tuple[list[str], bool]:
    """The options and command of a `run` (or of `bwrap`), and whether bwrap's conventions hold."""
    words = [os.fsdecode(a) for a in argv]
    if os.path.basename(words[0]) == "bwrap":
        return words[1:], True
    if words[1:2] == ["run"]:
        return words[2:], False
    raise Worker("not a `run`")


def _top_level_args(args: list[str], numbers: list[int]) -> list[int]:
    """Where the fds of the command line's own `--args` are in `args` (read with the grammar's
    arities); Worker if an option needs more than a plan (or the Python CLI's words)."""
    found = []
    for i, name, values in _options(args, ""):
        if name == "--args":
            if not values[0].isdigit() or int(values[0]) not in numbers or int(values[0]) < 3:
                raise Worker(f"--args {values[0]} is not an fd of the client's above stdio")
            found.append(i + 1)
    return found


def _screen_file(f: ArgsFile) -> None:
    """Worker unless every option of the --args file `f` is one a plan carries: parsing one that
    names an fd would read the server's fd of that number, not the client's."""
    where = f" in its --args {f.number} file"
    for _, name, _ in _options(split_args(f.data), where):
        if name == "--args":  # bwrap refuses it there: the Python CLI says so
            raise Worker(f"--args{where} is not carried by a plan")


def _options(args: list[str], where: str) -> list[tuple[int, str, list[str]]]:
    """The options at the front of `args` as the parser walks them (the grammar's arities): their
    index, name and values. Worker (saying `where`) for one that is not pure (nor --args), or
    that lacks its values: only the Python CLI, holding the client's fds, may apply it."""
    found = []
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        option = BY_NAME.get(args[i])
        if option is None or (args[i] not in PURE and args[i] != "--args"):
            raise Worker(f"{args[i]}{where} is not carried by a plan")
        values = args[i + 1:i + 1 + option.nargs]
        if len(values) < option.nargs:
            raise Worker(f"{args[i]}{where} lacks its value")
        found.append((i, args[i], values))
        i += 1 + option.nargs
    return found


def _compile(request: wire.Request, args: list[str], as_bwrap: bool, files: dict[int, ArgsFile]) -> Answer:
    """Parse, plan and serialize as the Python CLI would for this client (Worker if a plan cannot carry it)."""
    # lazy: the server runs without the C core (bwrap only: every command line goes to a worker)
    from ..backends.native import blob_for

    env = _environment(request.environ)
    cwd = os.fsdecode(request.cwd)
    try:
        spec, command, extras = _parse(args, files, env, cwd)
        if extras.replay is None or extras.show_help or extras.show_version or extras.dry_run:
            raise Worker("an option of its --args file is not carried by a plan")
        name, reason = backends.choose(extras.backend)
        if name != "native":  # the backend chosen: the client runs the native core's plans only
            raise Worker(f"the {name} backend runs it")
        limits = {r: request.rlim_max[r] for r in LIMITED_RESOURCES if request.rlim_max[r] != wire.RLIM_INFINITY}
        host = dataclasses.replace(backends.host_for(name), cwd=cwd, environ=env, hard_limits=limits)
        plan = compiled_plan(spec, host)
        refused = refusal(plan, host)
        argv = check_argv(command)
    except SandboxError as exc:
        raise Worker(f"the Python CLI says: {exc}") from None
    if refused is not None:
        raise Worker(f"the Python CLI refuses it: {refused}")
    _check_runnable(plan, host)
    held = {f.number for f in files.values()}
    pass_fds = [] if extras.close_fds else sorted(n for n in request.fd_numbers if n > 2 and n not in held)
    prefix = "bwrap" if as_bwrap else "sandbox"
    before = "".join(_said(prefix, w) for w in extras.warnings)
    after = _said(prefix, f"{name} backend ({reason}), network {plan.network}") if extras.verbose else ""
    data = wire.plan_answer(blob_for(plan), [os.fsencode(a) for a in argv], [os.fsencode(e) for e in plan.env],
                            pass_fds, die_with_parent=spec.die_with_parent, before=_text(before), after=_text(after))
    if len(data) > wire.MAX_ANSWER:
        raise Worker(f"its plan takes {len(data)} bytes")
    return Answer(data=data, reaper=plan.reaper)


def _check_runnable(plan: Any, host: Any) -> None:
    """Worker unless the client can start the plan alone, as sandbox-launch would (nothing to do after the
    spawn): unless the blob executor (sandbox.backends.blob) accepts it (sandbox.refusal, by its traits)."""
    # lazy: this module loads before the server's --after wait (serve_command), the blob executor with warm()
    # after it: 1.2 ms (its import timed after server.py's, median of 15)
    from ..backends.blob import TRAITS as BLOB

    refused = refusal(plan, dataclasses.replace(host, executor=BLOB))
    if refused is not None:
        raise Worker(f"the client cannot run it alone: {refused}")


def _parse(args: list[str], files: dict[int, ArgsFile], env: dict[str, str], cwd: str) -> tuple[Any, list[str], Any]:
    """parse_bwrap_args over `args`, each --args FD (`files`, by the index of its number in
    `args`) read from a copy of its content."""
    args = list(args)
    copies: dict[int, tuple[int, int]] = {}
    try:
        for i, f in files.items():
            fd = _readable_copy(f.data)
            st = os.fstat(fd)
            copies[fd] = (st.st_dev, st.st_ino)
            args[i] = str(fd)
        return parse_bwrap_args(args, environ=env, cwd=cwd)
    finally:
        for fd, ident in copies.items():  # those parsing did not read (and close)
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == ident:
                    os.close(fd)


def _environment(entries: list[bytes]) -> dict[str, str]:
    """The client's environment as the worker would set it (a later entry of a name wins)."""
    env = {}
    for entry in entries:
        name, _, value = entry.partition(b"=")
        if name:
            env[os.fsdecode(name)] = os.fsdecode(value)
    return env


def _said(prefix: str, text: str) -> str:
    return f"{prefix}: {' '.join(text.splitlines())}\n"  # sandbox.cli._say


def _text(text: str) -> bytes:
    return text.encode("utf-8", "backslashreplace")  # as the worker's stderr writes it


# ---------------------------------------------------------------- --args files, read without taking them

def _peek(number: int, fd: int) -> ArgsFile:
    """The content of the client's fd `number` (our copy: `fd`) from where the Python CLI would
    start reading, read without taking it; Worker if that cannot be done now without waiting."""
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        offset = os.lseek(fd, 0, os.SEEK_CUR)
        data = os.pread(fd, ARGS_MAX + 1, offset)
        if len(data) > ARGS_MAX:
            raise Worker(f"its --args {number} file is larger than {ARGS_MAX} bytes")
        return ArgsFile(number, fd, data, pipe=False, offset=offset)
    if not stat.S_ISFIFO(st.st_mode):
        raise Worker(f"its --args {number} is neither a file nor a pipe")
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    if not any(ev & select.POLLHUP for _, ev in poll.poll(0)):
        raise Worker(f"its --args {number} pipe may still be written to")
    size = struct.unpack("i", fcntl.ioctl(fd, FIONREAD, b"\0\0\0\0"))[0]
    if size > ARGS_MAX:
        raise Worker(f"its --args {number} pipe holds more than {ARGS_MAX} bytes")
    return ArgsFile(number, fd, _tee(fd, size), pipe=True)


def _tee(fd: int, size: int) -> bytes:
    """The `size` bytes waiting in pipe `fd`, copied out without taking them (tee(2))."""
    if size == 0:
        return b""
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        if size > PIPE_PAGE:
            fcntl.fcntl(w, F_SETPIPE_SZ, size)
        copied = _libc().tee(fd, w, size, SPLICE_F_NONBLOCK)
        if copied != size:
            raise Worker(f"tee copied {copied} of the {size} bytes of an --args pipe")
        return os.read(r, size)
    except OSError as exc:
        raise Worker(f"an --args pipe could not be read without taking it ({exc.strerror})") from None
    finally:
        os.close(r)
        os.close(w)


def take(files: list[ArgsFile]) -> None:
    """Take what was read of each file, as the Python CLI's read to the end would have."""
    for f in files:
        if not f.pipe:
            os.lseek(f.fd, f.offset + len(f.data), os.SEEK_SET)
            continue
        left = len(f.data)
        poll = select.poll()
        poll.register(f.fd, select.POLLIN)
        while left > 0 and poll.poll(0):  # there, its writers gone: never a wait (nor for a FIFO's new one)
            chunk = os.read(f.fd, min(left, PIPE_PAGE))
            if not chunk:
                break
            left -= len(chunk)


def _readable_copy(data: bytes) -> int:
    """An fd that reads `data`, then EOF (a pipe; a memfd when it would not fit)."""
    if len(data) <= PIPE_PAGE:
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            os.write(w, data)
        finally:
            os.close(w)
        return r
    fd = os.memfd_create("sandbox-args", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


_tee_lib: Any = None


def _libc() -> Any:
    """libc, for tee(2) (the os module has no tee)."""
    global _tee_lib
    if _tee_lib is None:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.tee.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint)
        lib.tee.restype = ctypes.c_ssize_t
        _tee_lib = lib
    return _tee_lib
