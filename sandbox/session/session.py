"""sandbox.Session: a sandbox that lives until closed, and the commands run in it."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._core import fdpass
from ..api import Stdio, StdioArg, inheritable, run_with, with_call_options
from ..errors import SessionError
from ..output import DEFAULT_MAX_OUTPUT, check_cap
from ..plan import Plan, check_argv, compile_plan
from ..process import CompletedProcess, SandboxProcess
from ..spec import Spec
from ..validate import StrPath
from . import call, cow, wire
from .files import Root
from .launch import launch
from .users import resolve

if TYPE_CHECKING:
    from ..aio import AsyncProcess
    from .holder import Holder

MAX_OPTION_PLANS = 32  # the plans of a call's own cwd/env, kept per session


class Session:
    """A sandbox that stays up until `close()`: its own mount, pid, ipc, uts,
    cgroup and (loopback-only, as the Spec's defaults give) network
    namespaces, its pid 1 the library's. Each `exec`/`start` runs a new
    process inside those same namespaces and root, under exactly the
    confinement a fresh sandbox of the Spec gives its command (the same
    seccomp filter, Landlock domain, capabilities, no_new_privs, rlimits): a
    server one call starts answers the next on 127.0.0.1, and files persist.

        with sandbox.Session(sandbox.presets.minimal_system()) as s:
            s.exec(["sh", "-c", "echo hi > /tmp/x"])
            assert s.read_file("/tmp/x") == b"hi\\n"

    A timeout or kill ends that call's whole process tree (setsid or not)
    and nothing else; what a call that ended normally left running keeps
    running, as with `docker exec`. The session ends with `close()` or with
    its caller (its pid 1 sees its control socket close). Raises what
    `sandbox.spawn` raises for the Spec; `SpecError` when the Spec has no
    pid namespace or asks for `as_pid_1`.

    The root is copy-on-write (`writable_root=True`, the default): the
    Spec's read-only binds and overlays are overlaid for the session, so a
    package install into /usr or a write to /etc (as the ids mapped allow)
    lands in the session's own layer and never on the host
    (sandbox.session.cow says what each mount becomes). Those writes live
    in tmpfs, gone with the session, or, with `upper=DIR`, in one
    subdirectory of the host directory DIR per overlaid mount, kept after
    `close()` (one session at a time: another raises SessionError while
    this one lives; a planted link there is a SpecError).
    `writable_root=False` runs the Spec as it is: its read-only mounts stay
    read-only. `spec` is the caller's Spec; `effective_spec` is the one the
    session runs.
    """

    def __init__(self, spec: Spec, *, writable_root: bool = True, upper: StrPath | None = None) -> None:
        self._cow = cow.session_root(spec, writable_root, upper)
        try:
            started = launch(self._cow.spec)
        except BaseException:
            self._cow.release()
            raise
        self.spec = spec
        self.effective_spec = self._cow.spec
        self.plan: Plan = started.plan
        self._host = started.host
        self._proc = started.proc
        self.ids = started.ids  # what its user namespace maps (session/ids.py)
        self._control = started.control
        self._send_lock = threading.Lock()
        self._closed = False
        self._published: Holder | None = None  # publish()'s server
        self._plans: dict[tuple[Any, ...], Plan] = {}
        self._plans_lock = threading.Lock()
        self._null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._root = Root(self._proc.pid)
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        """The host pid of the session's pid 1."""
        return self._proc.pid

    # ------------------------------------------------------------ commands

    def start(self, argv: Sequence[str], *, stdin: StdioArg = None, stdout: StdioArg = None,
              stderr: StdioArg = None, cwd: StrPath | None = None, env: Mapping[str, str] | None = None,
              max_output: int | None = None, on_overflow: str = "tail",
              user: str | int | None = None) -> SandboxProcess:
        """Start `argv` in the session; return once it has exec'd.

        stdin/stdout/stderr take what subprocess.Popen takes. `cwd` (inside
        the session) and `env` (the whole environment) override the Spec's
        for this call, as in `sandbox.spawn`. A missing executable runs as
        a shell's would: exit 127, its message on the command's stderr. Raises
        ExecPermissionError (not executable), SetupError (step "cwd": no such
        directory), SessionError (the session is closed or has ended). The
        process's `kill()` ends its whole process tree; `pid` is its host pid.
        `max_output` and `on_overflow` cap what its communicate() keeps of
        each stream, as sandbox.spawn's do (sandbox.output; "kill" and
        "raise" end the command's tree). `user`: a name of the session's
        own /etc/passwd or a uid to run as (its gid and groups from the
        session's /etc/passwd and /etc/group); SessionUserError if there is
        no such user or its ids are not mapped (`ids`).
        """
        check_cap(max_output, on_overflow)
        return self._start(argv, stdin, stdout, stderr, cwd, env, quiet=False, max_output=max_output,
                           on_overflow=on_overflow, user=user)

    def _start(self, argv: Sequence[str], stdin: StdioArg, stdout: StdioArg, stderr: StdioArg,
               cwd: StrPath | None, env: Mapping[str, str] | None, *, quiet: bool,
               max_output: int | None = None, on_overflow: str = "tail",
               user: str | int | None = None) -> SandboxProcess:
        """start(); `quiet`: return at once, the command's start unconfirmed
        (its failure is raised by the process's wait, as exec needs it)."""
        args, sock, stdio, where = self._request(argv, stdin, stdout, stderr, cwd, env, quiet, user)
        handle = call.Call(sock, args, where, self._ended)
        if not quiet:
            try:
                handle.take_started()
            except BaseException:
                stdio.abort()
                raise
        return SandboxProcess(args, handle, backend="session", network=self.plan.network, pipes=stdio.parent,
                              max_output=max_output, on_overflow=on_overflow)

    def exec(self, argv: Sequence[str], *, input: bytes | str | None = None, capture_output: bool = False,
             timeout: float | None = None, check: bool = False, text: bool = False, stdin: StdioArg = None,
             stdout: StdioArg = None, stderr: StdioArg = None, cwd: StrPath | None = None,
             env: Mapping[str, str] | None = None, max_output: int | None = DEFAULT_MAX_OUTPUT,
             on_overflow: str = "tail", user: str | int | None = None) -> CompletedProcess:
        """Run `argv` in the session and wait, like subprocess.run: the
        result's returncode is the command's (-N if signal N ended it); on
        `timeout` its whole process tree is killed and
        subprocess.TimeoutExpired raised. Of each captured stream at most
        `max_output` bytes are kept (default 64 MiB, as sandbox.run; the
        result's `stdout_dropped`/`stderr_dropped` say what was not), by
        `on_overflow` ("tail", "head", "kill", "raise": sandbox.output).
        `user` as in `start`. Raises what `start` raises."""
        check_cap(max_output, on_overflow)

        def begin(i: StdioArg, o: StdioArg, e: StdioArg) -> SandboxProcess:
            return self._start(argv, i, o, e, cwd, env, quiet=True, max_output=max_output,
                               on_overflow=on_overflow, user=user)

        return run_with(begin, input=input, capture_output=capture_output, timeout=timeout, check=check, text=text,
                        stdin=stdin, stdout=stdout, stderr=stderr)

    async def astart(self, argv: Sequence[str], *, stdin: StdioArg = None, stdout: StdioArg = None,
                     stderr: StdioArg = None, cwd: StrPath | None = None,
                     env: Mapping[str, str] | None = None, user: str | int | None = None,
                     max_output: int | None = None, on_overflow: str = "tail") -> AsyncProcess:
        """`start`, awaited: an AsyncProcess (await wait(), communicate()).
        No thread: the event loop waits on the call socket and the pipes.
        `max_output` and `on_overflow` cap what its communicate() keeps, as
        `start`'s do."""
        from . import aio  # lazy: asyncio only for the awaited calls: 21 ms (import timed, median of 7)

        check_cap(max_output, on_overflow)
        args, sock, stdio, where = self._request(argv, stdin, stdout, stderr, cwd, env, quiet=False, user=user)
        return await aio.started(call.Call(sock, args, where), stdio, max_output, on_overflow)

    async def aexec(self, argv: Sequence[str], *, input: bytes | str | None = None, capture_output: bool = False,
                    timeout: float | None = None, check: bool = False, text: bool = False, stdin: StdioArg = None,
                    stdout: StdioArg = None, stderr: StdioArg = None, cwd: StrPath | None = None,
                    env: Mapping[str, str] | None = None, user: str | int | None = None,
                    max_output: int | None = DEFAULT_MAX_OUTPUT, on_overflow: str = "tail") -> CompletedProcess:
        """`exec`, awaited, with its output caps (`max_output`, default
        64 MiB per captured stream, and `on_overflow`, as `exec`'s).
        Cancelling the awaiting task kills the command's tree."""
        from .. import aio  # lazy: asyncio only for the awaited calls: 21 ms (import timed, median of 7)

        check_cap(max_output, on_overflow)

        async def begin(i: StdioArg, o: StdioArg, e: StdioArg) -> AsyncProcess:
            args, sock, stdio, where = self._request(argv, i, o, e, cwd, env, quiet=True, user=user)
            return aio.AsyncProcess(args, call.Call(sock, args, where, self._ended), stdio.parent, max_output,
                                    on_overflow)

        return await aio.run(begin, input=input, capture_output=capture_output, timeout=timeout, check=check,
                             text=text, stdin=stdin, stdout=stdout, stderr=stderr)

    def _request(self, argv: Sequence[str], stdin: StdioArg, stdout: StdioArg, stderr: StdioArg,
                 cwd: StrPath | None, env: Mapping[str, str] | None,
                 quiet: bool, user: str | int | None = None) -> tuple[list[str], socket.socket, Stdio, str]:
        """Send one command's request: (argv, the call socket, its stdio, its cwd)."""
        args = check_argv(argv)
        path, where, environ = self._options(cwd, env)
        data = wire.request(path, where, args, environ, quiet, self._user_ids(user))
        stdio = Stdio(stdin, stdout, stderr)
        try:
            sock = self._send(data, stdio.child)
        except BaseException:
            stdio.abort()
            raise
        stdio.started()
        return args, sock, stdio, where

    def _user_ids(self, user: str | int | None) -> tuple[int, int, tuple[int, ...]] | None:
        """The ids a call's `user` runs as, for its request (None: pid 1's own,
        with the Spec's capabilities; given, a uid other than 0 holds none)."""
        if user is None:
            return None
        self._check_open()
        found = resolve(user, self._root, self.ids)
        if not self.ids.several:  # one id, pid 1's: nothing to switch, but a uid other than 0 drops its capabilities
            return found.uid, found.gid, ()
        return found.uid, found.gid, found.groups

    def _options(self, cwd: StrPath | None, env: Mapping[str, str] | None) -> tuple[str, str, tuple[str, ...]]:
        """(PATH, cwd, environment) of a call: the Spec's, or with the call's
        cwd and env those of the plan of the Spec with them (compile_plan
        decides, as for `sandbox.spawn`)."""
        if cwd is None and env is None:
            return self.plan.path, "", self.plan.env
        key = (None if cwd is None else os.fspath(cwd),
               None if env is None else tuple(sorted(env.items())) if isinstance(env, Mapping) else env)
        with self._plans_lock:
            plan = self._plans.get(key)
        if plan is None:
            plan = compile_plan(with_call_options(self.spec, cwd, env), self._host)
            with self._plans_lock:
                if len(self._plans) >= MAX_OPTION_PLANS:
                    self._plans.pop(next(iter(self._plans)))
                self._plans[key] = plan
        return plan.path, plan.cwd_candidates[0] if cwd is not None else "", plan.env

    def _send(self, data: bytes, child: tuple[int, int, int]) -> socket.socket:
        """The request on the control socket, with a new call socket; our end of it."""
        stdio = [fd if fd >= 0 else i if inheritable(i) else self._null for i, fd in enumerate(child)]
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self._send_lock:
                if self._closed:
                    raise SessionError("the session is closed")
                n = fdpass.send_fds(self._control, data, (theirs.fileno(), *stdio))
                if n < len(data):
                    self._control.sendall(memoryview(data)[n:])
        except OSError as exc:
            mine.close()
            raise SessionError(f"the session has ended ({exc.strerror or exc}): its pid 1 is gone") from None
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        return mine

    # ------------------------------------------------------------ files

    def read_file(self, path: StrPath, max_bytes: int | None = None) -> bytes:
        """The contents of the regular file `path` in the session, resolved in
        its root as a command there would (links never lead out). Raises
        FileNotFoundError, PermissionError, IsADirectoryError,
        NotADirectoryError, OSError(EINVAL) for a FIFO, device or socket
        (never opened), OSError(EFBIG) past `max_bytes`."""
        self._check_open()
        return self._root.read_file(path, max_bytes)

    def write_file(self, path: StrPath, data: bytes | str, mode: int = 0o644, parents: bool = False) -> None:
        """Write `data` to `path` in the session, resolved as `read_file`
        resolves: an existing regular file is replaced in place (its mode
        kept), a new one made with `mode` and owned by the session's user
        (its missing directories too with `parents=True`). A read-only mount
        is a PermissionError."""
        self._check_open()
        self._root.write_file(path, data, mode, parents)

    def _ended(self) -> bool:
        """Whether the session's pid 1 has gone (waited for a moment: a call
        socket's EOF can come while the kernel still ends its namespace)."""
        try:
            self._proc.wait(1.0)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _check_open(self) -> None:
        if self._closed:
            raise SessionError("the session is closed")

    # ------------------------------------------------------------ lifetime

    def publish(self, name: str | None = None) -> str:
        """Let `sandbox exec ID -- CMD` (and `sandbox session list/stop`) reach
        this session from a command line of the same user, as if `sandbox
        session start` had made it; return its ID (`name`, if given). A thread
        of this process serves it, with the holder's checks (only this
        user, in this process's namespaces); its socket goes with `close()`,
        and `sandbox session stop ID` closes the session. Once per session."""
        from . import holder  # lazy: the holder's machinery only for share(): 9 ms (import timed, median of 7)

        with self._send_lock:
            if self._closed:
                raise SessionError("the session is closed")
            if self._published is not None:
                raise SessionError(f"the session is already published as {self._published.ident}")
            self._published = holder.publish(self, name)
        return self._published.ident

    def close(self) -> None:
        """End every process of the session and wait until its pid 1 has gone
        (the kernel then tears its namespaces and mounts down). Idempotent."""
        with self._send_lock:
            if self._closed:
                return
            self._closed = True
            self._control.close()  # pid 1 sees EOF: kill(-1), reap, exit
        published, self._published = self._published, None
        if published is not None and published.thread is not threading.current_thread():
            published.stop("the session was closed")
            assert published.thread is not None
            published.thread.join()  # its socket is removed before close() returns
        try:
            self._proc.wait()
        finally:
            if hasattr(self, "_root"):
                self._root.close()
            os.close(self._null)
            self._cow.release()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Session pid={self.pid} {state}>"
