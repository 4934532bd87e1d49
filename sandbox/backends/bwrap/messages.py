"""bwrap's messages: read back from the command's stderr (or learned by a
diagnostic re-run) and turned into SetupError, ExecError or UnavailableError."""

from __future__ import annotations

import errno as E
import os
import re
import secrets
import stat
import subprocess
import tempfile
from collections.abc import Collection, Sequence

from ...bwrap.argv import data_fd
from ...errors import ExecError, SetupError, UnavailableError
from ...paths import is_under
from ...plan import OpKind, Plan
from .procfs import _kill_orphans
from .render import render_plan

NEWROOT = "/newroot"
ERRNO_BY_TEXT = {os.strerror(n): n for n in sorted(E.errorcode, reverse=True)}


def decode_exit_code(code: int) -> int:
    """bwrap's exit code -> a subprocess returncode: 128+N (N a signal) is -N."""
    if 128 < code <= 128 + 64:
        return -(code - 128)
    return code


class _StderrTap:
    """Reads back what bwrap wrote to the command's stderr, where that is possible."""

    def __init__(self, fd: int) -> None:
        self.fd = fd if fd >= 0 else 2
        self.kind: str | None = None
        self.offset = 0
        try:
            st = os.fstat(self.fd)
        except OSError:
            return
        if stat.S_ISFIFO(st.st_mode) and fd >= 0:
            self.kind = "fifo"
        elif stat.S_ISREG(st.st_mode):
            self.kind, self.offset = "file", st.st_size

    def read(self) -> str | None:
        """bwrap's last `bwrap: ...` line, or None if it cannot be read back."""
        if self.kind is None:
            return None
        try:
            data = self._read_fifo() if self.kind == "fifo" else self._read_file()
        except OSError:
            return None
        return last_bwrap_line(data)

    def _read_fifo(self) -> bytes:
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        chunks = []
        try:
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks)

    def _read_file(self) -> bytes:
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, 1 << 20, self.offset)
        finally:
            os.close(fd)


def last_bwrap_line(data: bytes) -> str | None:
    """The last line of `data` that bwrap wrote ("bwrap: ..."), without the prefix.

    Two bwrap processes can die of the same step at once: with a pid
    namespace bwrap's init applies the seccomp program as its child does.
    Each writes "bwrap: ", the message and ": error\n" as separate writes to
    an unbuffered stderr, so their words interleave, and the kernel kills
    the child mid-message when init exits. A finished line is preferred to
    an unfinished one, and a prefix written into the middle of a line is
    dropped."""
    text = data.decode(errors="replace")
    lines = text.split("\n")
    finished = [ln for ln in lines[:-1] if ln.startswith("bwrap: ")]
    chosen = finished or [ln for ln in lines[-1:] if ln.startswith("bwrap: ")]
    return chosen[-1].replace("bwrap: ", "") if chosen else None


class _Diagnose:
    """Re-runs a failed setup with a stderr of ours to learn bwrap's message.

    The command is never run: a failed setup is re-run up to a final
    operation that cannot succeed (a remount of a path that does not exist),
    and a failure after setup is re-run with a command that does not exist;
    for an exec failure, each place the command could be is probed with
    `--chdir` (which tells a missing path from an existing one).
    """

    def __init__(self, bwrap: str, plan: Plan, argv: Sequence[str], setup_done: bool,
                 skip: Collection[int] = ()) -> None:
        self.bwrap, self.plan, self.argv = bwrap, plan, argv
        self.setup_done = setup_done
        self.skip = skip  # ops done outside bwrap (dests.py): not done again
        self.marker = f"/.sandbox-diagnostic-{secrets.token_hex(16)}"

    def message(self) -> str:
        if not self.setup_done:
            text = self._bwrap(["--remount-ro", self.marker], [self.marker])
            if text is None or self.marker in text:
                return "bwrap failed during setup and its message could not be read back"
            return text
        text = self._bwrap([], [self.marker])
        if text is None:  # the re-run died without a word: not an exec failure, which bwrap reports
            return "bwrap failed during setup and its message could not be read back"
        if self.marker not in text:
            return text
        return self._exec_message()

    def _exec_message(self) -> str:
        """bwrap's 'execvp CMD: error' for the command, found with --chdir probes."""
        command = self.argv[0]
        err = E.ENOENT
        for path in _exec_candidates(command, self.plan):
            text = self._bwrap(["--chdir", path], [self.marker])
            if text is None:
                continue
            if self.marker in text or text.endswith(os.strerror(E.ENOTDIR)) or text.endswith(os.strerror(E.EACCES)):
                err = E.EACCES
                break
        return f"execvp {command}: {os.strerror(err)}"

    def _bwrap(self, extra: list[str], command: list[str]) -> str | None:
        """Run bwrap with the plan's options plus `extra`; its last message."""
        with render_plan(self.plan, skip=self.skip) as opts:
            args_fd = data_fd(b"".join(os.fsencode(a) + b"\0" for a in [*opts, *extra]))
            line = [self.bwrap, "--args", str(args_fd), "--", *command]
            # stderr into a file, not a pipe: a child bwrap left behind would hold a pipe open
            with tempfile.TemporaryFile() as err:
                try:
                    subprocess.run(line, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                   pass_fds=[args_fd, *opts.fds], close_fds=True, timeout=30, check=False)
                except subprocess.TimeoutExpired:
                    return None
                finally:
                    os.close(args_fd)
                    _kill_orphans(b"".join(os.fsencode(a) + b"\0" for a in line))  # the re-run fails as the run did
                err.seek(0)
                return last_bwrap_line(err.read(1 << 20))


def _exec_candidates(command: str, plan: Plan) -> list[str]:
    """Where execvp looks for `command`, as absolute paths (relative ones are skipped)."""
    if "/" in command:
        return [command] if command.startswith("/") else []
    return [f"{d.rstrip('/')}/{command}" for d in plan.path.split(":") if d.startswith("/")][:32]


_SOURCE = re.compile(r"Can't find source path (?P<path>.*?): ")
_PATHS = re.compile(
    r"Can't (?:bind mount \S+ on|mount \S+ on|remount readonly on|mkdir parents for|mkdir|create file at|"
    r"create file|make symlink at|create symlink|chmod \S+|write data to file|create tmpfile for|"
    r"set mode \S+ on file to be used for) (?P<path>/\S*?)(?::|$)")
_STEPS = (
    ("Can't chdir to", "cwd"), ("Creating new namespace failed", "clone"), ("No permissions to creating", "clone"),
    ("setting up uid map", "uid_map"), ("setting up gid map", "gid_map"), ("error writing to setgroups", "setgroups"),
    ("loopback:", "loopback"), ("Can't set hostname", "hostname"), ("unshare user ns", "nested_userns"),
    ("creation of new user namespaces", "disable_userns"), ("Can't read seccomp", "seccomp"),
    ("prctl(PR_SET_SECCOMP)", "seccomp"), ("execvp", "exec"),
    # the steps below carry the native backend's names (csrc/core/sandbox.h, SBX_STEP_*)
    ("Failed to make / slave", "mount_private"), ("Failed to mount tmpfs", "newroot"),
    ("Creating newroot failed", "newroot"), ("Creating oldroot failed", "newroot"), ("chdir base_path", "newroot"),
    ("pivot_root", "pivot"), ("fchdir to oldroot", "pivot"), ("unmount old root", "pivot"),
    ("prctl(PR_SET_NO_NEW_PRIVS)", "no_new_privs"), ("Dropping capability", "caps"), ("capset failed", "caps"),
    ("capget failed", "caps"), ("prctl(PR_SET_KEEPCAPS)", "caps"), ("prctl(PR_CAP_AMBIENT", "caps"),
    ("setsid", "session"), ("max_user_namespaces", "disable_userns"),
)
_PDEATHSIG = "prctl: "  # bwrap's PR_SET_PDEATHSIG failure, worded "prctl: ERROR"


def _error_from(message: str, plan: Plan, argv: Sequence[str], setup_done: bool) -> Exception:
    """SetupError or ExecError for bwrap's message; UnavailableError if bwrap
    could not create the namespaces at all (with the native backend's reason
    too when that one is refused as well)."""
    message = message.replace(NEWROOT + "/", "/")
    errno = _errno_of(message)
    if message.startswith("execvp "):
        return ExecError.from_errno(errno or E.ENOENT, argv[0], backend="bwrap")
    step, path = _step_and_path(message, plan)
    if step == "clone":  # this host lets bwrap make no namespace: the backend is unusable here
        return UnavailableError(f"bwrap backend unavailable: {message}")
    return SetupError(message, step=step, path=path, errno=errno, backend="bwrap")


def _errno_of(message: str) -> int:
    for text, number in ERRNO_BY_TEXT.items():
        if message.endswith(": " + text):
            return number
    return 0


def _step_and_path(message: str, plan: Plan) -> tuple[str, str | None]:
    m = _SOURCE.search(message)
    if m:
        return "source", m.group("path")
    m = _PATHS.search(message)
    if m:
        path = m.group("path")
        return _op_step(plan, path, message), path
    if message.startswith(_PDEATHSIG):
        return "pdeathsig", None
    for prefix, step in _STEPS:
        if prefix in message:
            path = message.split("Can't chdir to ", 1)[1].split(": ")[0] if step == "cwd" else None
            return step, path
    return "setup", None


# What each of bwrap's "Can't VERB ..." messages was doing.
_VERB_KINDS = (
    ("bind mount", OpKind.BIND), ("remount readonly", OpKind.REMOUNT_RO), ("chmod", OpKind.CHMOD),
    ("make symlink", OpKind.SYMLINK), ("create symlink", OpKind.SYMLINK), ("create file", OpKind.FILE),
    ("write data to file", OpKind.FILE), ("create tmpfile", OpKind.FILE), ("set mode", OpKind.FILE),
    ("mount tmpfs", OpKind.TMPFS), ("mount proc", OpKind.PROC), ("mount mqueue", OpKind.MQUEUE),
)


def _op_step(plan: Plan, path: str, message: str) -> str:
    """The kind of the operation that failed on `path` (its destination, or
    one below it), of the kind the message's verb names where it names one."""
    kind = next((k for verb, k in _VERB_KINDS if f"Can't {verb}" in message), None)
    ops = [op for op in plan.ops if op.dest == path]
    ops = ops or [op for op in plan.ops if is_under(op.dest, path) and op.dest != path]
    chosen = next((op for op in ops if op.kind is kind), ops[0] if ops else None)
    if chosen is not None:
        return chosen.kind.name.lower()
    return kind.name.lower() if kind is not None else "op"
