"""The bwrap backend: run a Plan with bubblewrap (/usr/bin/bwrap, 0.8.0 or newer).

The Plan is rendered to bwrap options (`sandbox.bwrap_render.render_plan`)
passed through an `--args` memfd, so neither the options nor the
environment's values show in `ps`. bwrap is started with
`subprocess.Popen(close_fds=True)` (no Python runs between fork and exec) and
`launch()` returns only once the command has been exec'd, raising SetupError,
ExecError or UnavailableError otherwise, like the native backend. How:

- `--json-status-fd`: bwrap writes `{"child-pid": N, ...}` once its sandbox
  child exists, and `{"exit-code": N}` only if the command was exec'd.
- `--block-fd`: the sandbox child reads it after setup (the byte is there
  already) and closes it; when every copy of the pipe's read end is closed,
  setup is over.
- rlimits: with limits, `--seccomp` reads from a pipe the parent has not
  written yet, so bwrap waits right after setup; the parent applies the
  plan's rlimits to the child with prlimit(2) (so they bind the command and
  its reaper, nothing of the setup, as in the native backend), then writes
  the program.
- exec: the command's process (the child, or its first child under bwrap's
  pid-1 reaper) is watched until its /proc cmdline is no longer bwrap's. If
  bwrap exits first without an exit-code record, setup or exec failed, and
  bwrap's message says which.

bwrap backend differences
-------------------------
Made to match the native backend: only stdio, `pass_fds` and bwrap's own
option fds reach bwrap (it closes the latter before exec), so inherited fds
never reach the command; `--new-session` and `--die-with-parent` follow the
plan; capabilities are exact (`--cap-drop ALL` + `--cap-add`, so root does not
keep everything); rlimits apply at the native backend's point (after setup,
before exec); missing parent directories get the plan's modes (explicit
`--dir` where bwrap's own rule differs, e.g. a File with perms 0600); /dev/shm
is 1777 (bwrap makes it 0755); a plan without a user namespace fails for a
non-root caller as it does natively (bwrap would quietly add one); exit codes
are decoded to -N for signal N; setup and exec errors are raised by spawn().
What remains different:

- PWD: bwrap always sets PWD=<cwd> in the command's environment (after every
  --setenv/--unsetenv, so it cannot be removed); the native backend adds
  nothing to the plan's env.
- Exit status: bwrap reports a command killed by signal N as exit code 128+N
  and cannot tell it from `exit(128+N)`; codes 129-192 are reported as -N
  (signal N), so a command that exits with such a code looks killed.
- Signals: bwrap forwards none, and `SandboxProcess.pid` is bwrap's monitor
  (outside every namespace). `send_signal`/`terminate` signal the monitor,
  which dies of it; with die_with_parent (the default) its death SIGKILLs the
  sandbox, so the returncode is -N for the signal sent and the command cannot
  catch it. Without die_with_parent, `kill()` ends only the monitor and the
  sandbox runs on, orphaned.
- pid 1 of a pid namespace is bwrap itself (/proc/1/cmdline "bwrap ..."), not
  sandbox-init; it keeps the command's stdio open until every process of the
  sandbox has exited or die_with_parent kills it.
- Destinations below an absolute symlink (from a bound host tree) fail in
  bwrap ("Can't mkdir ...: No such file or directory", bubblewrap #195); the
  native backend resolves them inside the new root.
- uid/gid above 2**31-1: bwrap reads --uid/--gid as a signed int and refuses
  them (SetupError "Invalid uid: ..."; bubblewrap #642).
- `--dev` also binds the host tty at /dev/console when stdout is a terminal.
- /proc/sys: bwrap self-binds it read-only only if writable; inside a user
  namespace it is not, so it is no separate mount (writes fail with EACCES
  instead of EROFS).
- As root without a user namespace, bwrap leaves the bounding capability set
  alone (effective, permitted, inheritable and ambient are exact).
- No mount namespace (namespaces.mount=False): bwrap always makes one; the
  host root is bound whole (`--dev-bind / /`, so nosuid everywhere), and for a
  non-root caller bwrap always makes a user namespace.
- rlimits without a seccomp program: bwrap's wait point is its seccomp read,
  so such a sandbox gets a one-instruction allow-all filter (Seccomp: 2 in
  /proc/self/status instead of 0).
- Setup messages: bwrap writes its error message to the command's stderr.
  The backend reads it back (and, from a pipe, takes it out) when that stderr
  is a pipe given to spawn() or a regular file; otherwise (a terminal,
  /dev/null, an inherited pipe) the message also shows there, and the
  backend re-runs the setup with a stderr of its own to learn it (the command
  never runs in such a diagnostic run; an exec error is then told apart as
  ENOENT or EACCES by probing the command's candidate paths with --chdir).
- bwrap failing to create its namespaces (clone refused, e.g.
  user.max_user_namespaces=0) raises UnavailableError, naming the native
  backend's reason too when that one is refused as well: the host cannot
  sandbox, it is not a setup error of the Spec.
- Timings: "spawned" (bwrap started), "child" (its sandbox child exists),
  "ready" (setup done), "exec" (command seen exec'd), µs from the start.
"""

from __future__ import annotations

import contextlib
import errno as E
import fcntl
import json
import os
import re
import resource
import secrets
import select
import signal
import socket
import stat
import struct
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bwrap_render import BwrapArgv, data_fd, render_plan
from ..errors import ExecError, IsolationError, SetupError, UnavailableError
from ..plan import OpKind, Plan
from ..probe import probe
from ..spec import Spec

GLIBC_DEFAULT_PATH = "/bin:/usr/bin"
MAX_POLL_S = 0.002
NEWROOT = "/newroot"
ALLOW_ALL = struct.pack("<HBBI", 0x06, 0, 0, 0x7FFF0000)  # BPF_RET|BPF_K SECCOMP_RET_ALLOW
ERRNO_BY_TEXT = {os.strerror(n): n for n in sorted(E.errorcode, reverse=True)}


# ---------------------------------------------------------------- entry point

def launch(plan: Plan, spec: Spec, argv: list[str], stdio: tuple[int, int, int],
           pass_fds: tuple[int, ...]) -> dict[str, Any]:
    """Start `argv` under `plan` with bwrap; return SandboxProcess keyword arguments.

    Returns once the command has been exec'd. Raises SetupError if the
    sandbox could not be set up, ExecError if the command could not be
    executed, UnavailableError if bwrap is missing.
    """
    bwrap = probe().bwrap
    if not bwrap:
        raise UnavailableError(f"bwrap backend unavailable: {probe().bwrap_reason}")
    _refuse_like_native(plan)
    if plan.landlock and not plan.landlock_best_effort:
        raise UnavailableError("landlock=True needs the native backend (bwrap has no Landlock support); "
                               "use landlock='best-effort' to run without it under bwrap")
    run = _Run(bwrap, plan, argv)
    return run.start(stdio, pass_fds)


def _refuse_like_native(plan: Plan) -> None:
    """Without a user namespace only root can make namespaces; bwrap would
    quietly add one for everybody else, the native backend fails."""
    others = plan.mount_ns or plan.pid_ns or plan.net_ns or plan.ipc_ns or plan.uts_ns or plan.cgroup_ns
    if not plan.user_ns and others and os.geteuid() != 0:
        raise SetupError("Creating new namespace failed: Operation not permitted (no user namespace requested)",
                         step="clone", errno=E.EPERM, backend="bwrap")


# ---------------------------------------------------------------- one launch

@dataclass
class _Pipes:
    """The pipes between the parent and bwrap: status (bwrap writes JSON),
    block (setup is over when its read ends are all closed) and, with rlimits,
    seccomp (bwrap blocks reading it right after setup)."""

    status_r: int
    status_w: int
    block_r: int
    block_w: int
    seccomp_r: int = -1
    seccomp_w: int = -1

    @classmethod
    def make(cls, barrier: bool) -> _Pipes:
        fds: list[int] = []
        try:
            for _ in range(3 if barrier else 2):
                fds += os.pipe2(os.O_CLOEXEC)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return cls(*fds)

    def child_started(self) -> None:
        """bwrap holds its ends now: close ours."""
        for name in ("status_w", "block_r", "seccomp_r"):
            self.close_one(name)

    def close_one(self, name: str) -> None:
        _close(getattr(self, name))
        setattr(self, name, -1)

    def close(self) -> None:
        for name in ("status_r", "status_w", "block_r", "block_w", "seccomp_r", "seccomp_w"):
            self.close_one(name)


@dataclass
class _Status:
    """The JSON status records bwrap writes, read as they come."""

    fd: int
    buffer: bytes = b""
    eof: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)

    def read_available(self) -> None:
        """Read what is there without blocking."""
        while not self.eof and _readable([self.fd], 0):
            self._read_once()

    def read_until(self, key: str, pidfd: int) -> bool:
        """Block until a record with `key` arrives (True) or bwrap exits (False)."""
        while self.find(key) is None:
            if self.eof:
                return False
            ready = _readable([self.fd, pidfd], None)
            if self.fd in ready:
                self._read_once()
            elif pidfd in ready:
                self.read_available()
                return self.find(key) is not None
        return True

    def _read_once(self) -> None:
        chunk = os.read(self.fd, 4096)
        if not chunk:
            self.eof = True
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if line.strip():
                self.records.append(_json_record(line))

    def find(self, key: str) -> Any:
        """The value of `key` in the records so far, or None."""
        for rec in self.records:
            if key in rec:
                return rec[key]
        return None


def _json_record(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class _Run:
    """One bwrap invocation, from rendering to "the command was exec'd"."""

    def __init__(self, bwrap: str, plan: Plan, argv: list[str]) -> None:
        self.bwrap, self.plan, self.argv = bwrap, plan, argv
        self.t0 = time.monotonic()
        self.timings: dict[str, float] = {}

    def _stamp(self, name: str) -> None:
        self.timings[name] = (time.monotonic() - self.t0) * 1e6

    def start(self, stdio: tuple[int, int, int], pass_fds: tuple[int, ...]) -> dict[str, Any]:
        tap = _StderrTap(stdio[2])
        plan = self.plan
        # a pause after setup, before exec: bwrap waits there for its seccomp program
        pipes = _Pipes.make(barrier=bool(plan.rlimits or plan.forward or plan.check_network or plan.probe_paths))
        try:
            with render_plan(self.plan, pipes.seccomp_r if pipes.seccomp_r >= 0 else None) as opts:
                popen = self._spawn(opts, pipes, stdio, pass_fds)
            pipes.child_started()
            return self._follow(popen, pipes, tap)
        except BaseException:
            pipes.close()
            raise

    def _spawn(self, opts: BwrapArgv, pipes: _Pipes, stdio: tuple[int, int, int],
               pass_fds: tuple[int, ...]) -> subprocess.Popen[bytes]:
        opts = BwrapArgv([*opts, "--json-status-fd", str(pipes.status_w), "--block-fd", str(pipes.block_r)],
                         opts.fds)
        args_fd = data_fd(b"".join(os.fsencode(a) + b"\0" for a in opts))
        try:
            self.command_line = [self.bwrap, "--args", str(args_fd), "--", *self.argv]
            keep = {fd for fd in pass_fds if fd > 2} | {args_fd, pipes.status_w, pipes.block_r, *opts.fds}
            if pipes.seccomp_r >= 0:
                keep.add(pipes.seccomp_r)
            popen = subprocess.Popen(
                self.command_line, stdin=_std(stdio[0]), stdout=_std(stdio[1]), stderr=_std(stdio[2]),
                pass_fds=sorted(keep), close_fds=True, start_new_session=False)
        finally:
            os.close(args_fd)
        self._stamp("spawned")
        return popen

    def _follow(self, popen: subprocess.Popen[bytes], pipes: _Pipes, tap: _StderrTap) -> dict[str, Any]:
        """Drive bwrap to the exec of the command; raise if it fails first.
        Whatever interrupts this (even KeyboardInterrupt) kills bwrap first."""
        status = _Status(pipes.status_r)
        pidfd = os.pidfd_open(popen.pid)
        try:
            if self._drive(popen, pipes, status, pidfd):
                return self._started(popen, pipes, status)
            self._wait_exit(popen.pid)
            status.read_available()
            if status.find("exit-code") is not None:  # ran and ended already
                return self._started(popen, pipes, status)
            popen.wait()
            raise self._failure(tap, setup_done="ready" in self.timings)
        except BaseException:
            if popen.returncode is None:
                popen.kill()
                popen.wait()
            raise
        finally:
            os.close(pidfd)

    def _drive(self, popen: subprocess.Popen[bytes], pipes: _Pipes, status: _Status, pidfd: int) -> bool:
        """True once the command is seen exec'd; False if bwrap exits first."""
        if not status.read_until("child-pid", pidfd):
            return False
        child = int(status.find("child-pid"))
        self._stamp("child")
        try:
            os.write(pipes.block_w, b"x")
        except BrokenPipeError:
            return False
        if self._wait_setup(pipes.block_w, pidfd):
            self._stamp("ready")
            self._release(popen, child, pipes)
        if not self._wait_exec(child, pidfd):
            return False
        self._stamp("exec")
        return True

    def _release(self, popen: subprocess.Popen[bytes], child: int, pipes: _Pipes) -> None:
        """Setup is over; with rlimits bwrap now waits for its seccomp program:
        set the limits on it, then hand the program over."""
        if pipes.seccomp_w < 0:
            return
        self.isolation = _isolate(self.plan, popen, child)
        if self._apply_rlimits(popen, child):
            try:
                os.write(pipes.seccomp_w, self.plan.seccomp or ALLOW_ALL)
            except BrokenPipeError:
                pass  # bwrap died; the caller finds out how
        pipes.close_one("seccomp_w")

    def _started(self, popen: subprocess.Popen[bytes], pipes: _Pipes, status: _Status) -> dict[str, Any]:
        _close(pipes.block_w)
        pipes.block_w = -1
        pipes.status_r = -1  # owned by the decoder from now on
        decoder = _Decoder(popen, status)
        isolated = getattr(self, "isolation", None)
        return {"pid": popen.pid, "status_fd": -1, "timings": dict(self.timings), "decode_status": decoder,
                "isolation": isolated.findings if isolated else {}, "on_exit": isolated.close if isolated else None}

    # ------------------------------------------------------------ steps

    def _apply_rlimits(self, popen: subprocess.Popen[bytes], child: int) -> bool:
        """Set the plan's rlimits on bwrap's sandbox child (False if it is gone)."""
        for res, value in self.plan.rlimits:
            try:
                _soft, hard = resource.prlimit(child, res)
                v = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.prlimit(child, res, (v, v))
            except ProcessLookupError:
                return False
            except OSError as exc:
                popen.kill()
                popen.wait()
                raise SetupError(f"Can't set resource limit {res}: {exc.strerror}", step="rlimit",
                                 errno=exc.errno or 0, backend="bwrap") from None
        return True

    @staticmethod
    def _wait_setup(block_w: int, pidfd: int) -> bool:
        """Wait until every read end of the block pipe is closed (setup done, or bwrap died)."""
        poller = select.poll()
        poller.register(block_w, 0)
        poller.register(pidfd, select.POLLIN)
        while True:
            for fd, _ev in poller.poll():
                if fd == block_w:
                    return True
                if fd == pidfd:
                    return False

    def _wait_exec(self, child: int, pidfd: int) -> bool:
        """Poll the command's process until it is no longer bwrap (True) or bwrap exits (False)."""
        mine = b"".join(os.fsencode(a) + b"\0" for a in self.command_line)
        reaper = self.plan.pid_ns and self.plan.reaper
        delay = 0.00005
        while True:
            pid = _first_child(child) if reaper else child
            if pid is not None:
                cmdline = _read(f"/proc/{pid}/cmdline")
                if cmdline and cmdline != mine:
                    return True
            if _readable([pidfd], 0):
                return False
            time.sleep(delay)  # sub-millisecond: poll(2) counts in milliseconds
            delay = min(delay * 2, MAX_POLL_S)

    @staticmethod
    def _wait_exit(pid: int) -> None:
        """Wait for bwrap to exit, leaving it to be reaped."""
        while True:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
                return
            except ChildProcessError:
                return
            except InterruptedError:
                continue

    def _failure(self, tap: _StderrTap, setup_done: bool) -> Exception:
        """The exception for a bwrap that exited without running the command."""
        message = tap.read()
        if message is None:
            message = _Diagnose(self, setup_done).message()
        return _error_from(message, self.plan, self.argv, setup_done)


# ---------------------------------------------------------------- status decoding

class _Decoder:
    """Maps bwrap's wait status to the command's returncode (SandboxProcess.decode_status)."""

    def __init__(self, popen: subprocess.Popen[bytes], status: _Status) -> None:
        self.popen = popen  # kept so subprocess never reaps bwrap behind SandboxProcess's back
        self.status = status

    def __call__(self, raw_status: int, code: int) -> int:
        self.status.read_available()
        exit_code = self.status.find("exit-code")
        self.close()
        self.popen.returncode = code  # reaped by SandboxProcess
        if os.WIFSIGNALED(raw_status) or exit_code is None:
            return code
        return decode_exit_code(int(exit_code))

    def close(self) -> None:
        _close(self.status.fd)
        self.status.fd = -1
        self.status.eof = True

    def __del__(self) -> None:
        if self.status.fd >= 0:
            self.close()


def decode_exit_code(code: int) -> int:
    """bwrap's exit code -> a subprocess returncode: 128+N (N a signal) is -N."""
    if 128 < code <= 128 + 64:
        return -(code - 128)
    return code


# ---------------------------------------------------------------- bwrap's messages

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
    """The last line of `data` that bwrap wrote ("bwrap: ..."), without the prefix."""
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.startswith("bwrap: ")]
    return lines[-1][len("bwrap: "):] if lines else None


class _Diagnose:
    """Re-runs a failed setup with a stderr of ours to learn bwrap's message.

    The command is never run: a failed setup is re-run up to a final
    operation that cannot succeed (a remount of a path that does not exist),
    and a failure after setup is re-run with a command that does not exist;
    for an exec failure, each place the command could be is probed with
    `--chdir` (which tells a missing path from an existing one).
    """

    def __init__(self, run: _Run, setup_done: bool) -> None:
        self.run = run
        self.setup_done = setup_done
        self.marker = f"/.sandbox-diagnostic-{secrets.token_hex(16)}"

    def message(self) -> str:
        if not self.setup_done:
            text = self._bwrap(["--remount-ro", self.marker], [self.marker])
            if text is None or self.marker in text:
                return "bwrap failed during setup and its message could not be read back"
            return text
        text = self._bwrap([], [self.marker])
        if text is not None and self.marker not in text:
            return text
        return self._exec_message()

    def _exec_message(self) -> str:
        """bwrap's 'execvp CMD: error' for the command, found with --chdir probes."""
        command = self.run.argv[0]
        err = E.ENOENT
        for path in _exec_candidates(command, self.run.plan):
            text = self._bwrap(["--chdir", path], [self.marker])
            if text is None:
                continue
            if self.marker in text or text.endswith(os.strerror(E.ENOTDIR)) or text.endswith(os.strerror(E.EACCES)):
                err = E.EACCES
                break
        return f"execvp {command}: {os.strerror(err)}"

    def _bwrap(self, extra: list[str], command: list[str]) -> str | None:
        """Run bwrap with the plan's options plus `extra`; its last message."""
        with render_plan(self.run.plan) as opts:
            args_fd = data_fd(b"".join(os.fsencode(a) + b"\0" for a in [*opts, *extra]))
            try:
                proc = subprocess.run([self.run.bwrap, "--args", str(args_fd), "--", *command],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      pass_fds=[args_fd, *opts.fds], close_fds=True, timeout=30, check=False)
            except subprocess.TimeoutExpired:
                return None
            finally:
                os.close(args_fd)
        return last_bwrap_line(proc.stderr)


def _exec_candidates(command: str, plan: Plan) -> list[str]:
    """Where execvp looks for `command`, as absolute paths (relative ones are skipped)."""
    if "/" in command:
        return [command] if command.startswith("/") else []
    env = dict(e.split("=", 1) for e in plan.env)
    dirs = env.get("PATH", GLIBC_DEFAULT_PATH).split(":")
    return [f"{d.rstrip('/')}/{command}" for d in dirs if d.startswith("/")][:32]


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
)


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
        result = probe()
        if not result.native:
            return UnavailableError(f"no sandbox backend: native: {result.native_reason}; bwrap: {message}")
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
        return _op_step(plan, path), path
    for prefix, step in _STEPS:
        if prefix in message:
            path = message.split("Can't chdir to ", 1)[1].split(": ")[0] if step == "cwd" else None
            return step, path
    return "setup", None


def _op_step(plan: Plan, path: str) -> str:
    """The kind of the operation `path` belongs to (its destination, or one below it)."""
    for op in plan.ops:
        if op.dest == path:
            return op.kind.name.lower()
    for op in plan.ops:
        if op.dest.startswith(path.rstrip("/") + "/"):
            return op.kind.name.lower()
    return OpKind.BIND.name.lower() if "bind mount" in path else "op"


# ---------------------------------------------------------------- small helpers

def _readable(fds: list[int], timeout: float | None) -> set[int]:
    """Which of `fds` are readable (or hung up) within `timeout` seconds (None: wait)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    ms = None if timeout is None else max(0, int(timeout * 1000))
    return {fd for fd, _ in poller.poll(ms)}


def _std(fd: int) -> int | None:
    return None if fd < 0 else fd


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _first_child(pid: int) -> int | None:
    """The oldest child of `pid` (bwrap's reaper forks the command once)."""
    path = f"/proc/{pid}/task/{pid}/children"
    if os.path.exists(path) or not os.path.exists(f"/proc/{pid}"):
        text = _read(path).split()
        return int(text[0]) if text else None
    return _child_by_scan(pid)  # a kernel without CONFIG_PROC_CHILDREN


def _child_by_scan(parent: int) -> int | None:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat_text = _read(f"/proc/{name}/stat")
            fields = stat_text[stat_text.rfind(b")") + 2:].split()
            if len(fields) > 1 and int(fields[1]) == parent:
                found.append(int(name))
    return min(found) if found else None



# ---------------------------------------------------------------- isolation check and forwarding


@dataclass
class _Isolated:
    """What was checked in a bwrap sandbox, and its port relay (closed at exit)."""

    findings: dict[str, Any]
    relay: Any = None

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()


NS_GET_USERNS = 0xB701  # ioctl on a namespace fd: an fd of the user namespace owning it


def _isolate(plan: Plan, popen: subprocess.Popen[bytes], child: int) -> _Isolated:
    """While bwrap waits after setup: prove the probe paths absent inside,
    inspect the network namespace, make the forwarded ports' listeners in it.
    Any finding kills bwrap (the command never runs) and raises."""
    from .. import forward, isolation
    from .._native import ffi, lib

    try:
        for path in plan.probe_paths:
            _probe_absent(ffi, lib, child, path)
        if not (plan.forward or plan.check_network):
            return _Isolated(isolation.findings(plan, None))
        sockets = _netns_sockets(ffi, lib, child, [port for port, _ in plan.forward])
        netlink = sockets.pop()
        try:
            from pyroute2 import IPRoute

            with IPRoute(fileno=netlink) as ipr:
                network = isolation.check_netns(ipr)
        finally:
            _close(netlink)
        relay = forward.Forwarder([socket.socket(fileno=fd) for fd in sockets], [t for _, t in plan.forward])
        return _Isolated(isolation.findings(plan, network), relay)
    except BaseException:
        # the sandbox child first: it must not go on to read a closed seccomp pipe (and complain)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        popen.kill()
        popen.wait()
        raise


def _probe_absent(ffi: Any, lib: Any, child: int, path: str) -> None:
    root = os.open(f"/proc/{child}/root", os.O_PATH | os.O_CLOEXEC)
    try:
        rc = lib.sbx_exists_in_root(root, path.encode())
    finally:
        os.close(root)
    if rc == 0:
        raise IsolationError(f"isolation check failed: probe path {path} is visible inside the sandbox",
                             path=path, errno=E.EEXIST)
    if rc not in (-E.ENOENT, -E.ENOTDIR):
        raise IsolationError(f"isolation check failed: probe path {path} cannot be proven absent "
                             f"({os.strerror(-rc)})", path=path, errno=-rc)


def _netns_sockets(ffi: Any, lib: Any, child: int, ports: list[int]) -> list[int]:
    """Listening sockets for `ports` and a netlink socket, made inside the
    sandbox's network namespace (entered through its owning user namespace
    when we are not root)."""
    netns = os.open(f"/proc/{child}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    owner = -1
    try:
        if os.geteuid() != 0:
            owner = fcntl.ioctl(netns, NS_GET_USERNS)
        out = ffi.new("int[]", len(ports) + 1)
        rc = lib.sbx_netns_sockets(owner, netns, ffi.new("uint32_t[]", ports or [0]), len(ports), out)
    finally:
        os.close(netns)
        if owner >= 0:
            os.close(owner)
    if rc < 0:
        raise SetupError(f"Can't listen on a forwarded port in the sandbox: {os.strerror(-rc)}", step="forward",
                         errno=-rc, backend="bwrap")
    return list(out)
