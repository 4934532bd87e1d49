"""spawn() and run(): start a command in a sandbox, subprocess-style."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence

from . import backends
from .errors import SpecError, TimeoutExpired
from .output import DEFAULT_MAX_OUTPUT, OutputLimitError, check_cap
from .plan import check_argv
from .plan_cache import compiled_plan
from .process import PIPE, CompletedProcess, SandboxProcess
from .refusal import refusal
from .spec import Spec

# re-exported (`x as x`): these were sandbox.api's before stdio.py was split out, and session/ imports them here
from .stdio import INHERIT as INHERIT
from .stdio import Stdio as Stdio
from .stdio import StdioArg as StdioArg
from .stdio import check_pass_fds as check_pass_fds
from .stdio import inheritable as inheritable
from .sync import NO_SYNC, Sync
from .validate import StrPath


def with_call_options(spec: Spec, cwd: StrPath | None, env: Mapping[str, str] | None) -> Spec:
    """`spec` with a call's `cwd` and `env` applied: `cwd` replaces `spec.cwd` (a path
    inside the sandbox, which must exist there); `env`, like subprocess's, is the
    command's whole environment (it replaces `spec.env`, and `spec.env_inherit`
    takes nothing from the caller). Validated as a Spec is."""
    if cwd is not None:
        spec = spec.replace(cwd=cwd)
    if env is not None:
        if not isinstance(env, Mapping):
            raise SpecError("env", env, "must be a mapping of names to values")
        spec = spec.replace(env=dict(env), env_inherit=())
    return spec


def spawn(argv: Sequence[str], spec: Spec, *, stdin: StdioArg = None, stdout: StdioArg = None,
          stderr: StdioArg = None, pass_fds: Iterable[int] = (), backend: str = "auto",
          cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
          sync: Sync = NO_SYNC, max_output: int | None = None, on_overflow: str = "tail") -> SandboxProcess:
    """Start `argv` in a sandbox described by `spec`; return at once.

    stdin/stdout/stderr take what subprocess.Popen takes (None inherits,
    PIPE, DEVNULL, STDOUT for stderr, an fd or a file). Only stdio and
    `pass_fds` are open in the command. `backend` is "auto" (inside a task
    sandbox its broker, sandbox.backends.brokered; else native where the host
    allows it, else bwrap), "native", "bwrap", "brokered" or "blob". `cwd` and `env` override
    the Spec's for this call (see `with_call_options`: `env` is the whole
    environment, as in subprocess). `sync`: fds of the caller at which the
    setup reports or waits, as bwrap's --block-fd and friends (sandbox.sync).
    `max_output` (bytes per stream, None: no cap) and `on_overflow` ("tail",
    "head", "kill", "raise") cap what the process's communicate() keeps
    (sandbox.output).

    Raises SpecError (a ValueError) for bad arguments; SetupError when a setup
    step fails; ExecError (also FileNotFoundError or PermissionError) when the
    command cannot be executed; IsolationError when an isolation check fails;
    UnavailableError when no backend can run here. The command never runs
    in any of these cases.
    """
    args = check_argv(argv)
    if not isinstance(spec, Spec):
        raise SpecError("spec", spec, "must be a sandbox.Spec")
    check_cap(max_output, on_overflow)
    spec = with_call_options(spec, cwd, env)
    fds = check_pass_fds(pass_fds)
    name, reason = backends.choose(backend)
    host = backends.host_for(name)
    if not isinstance(sync, Sync):
        raise SpecError("sync", sync, "must be a sandbox.sync.Sync")
    if set(sync.fds()) & set(fds):
        raise SpecError("pass_fds", fds, "must not hold the sync fds (the command never gets them)")
    plan = compiled_plan(spec, host, sync)
    refused = refusal(plan, host)
    if refused is not None:
        raise refused
    stdio = Stdio.of(stdin, stdout, stderr)
    try:
        launched = backends.launch(name, plan, args, stdio.child, fds)
    except BaseException:
        stdio.abort()
        raise
    stdio.started()
    return SandboxProcess(args, launched, backend=name, backend_reason=reason, network=plan.network,
                          pipes=stdio.parent, max_output=max_output, on_overflow=on_overflow)


def run(argv: Sequence[str], spec: Spec, *, input: bytes | str | None = None, capture_output: bool = False,
        timeout: float | None = None, check: bool = False, text: bool = False, stdin: StdioArg = None,
        stdout: StdioArg = None, stderr: StdioArg = None, pass_fds: Iterable[int] = (),
        backend: str = "auto", cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None, max_output: int | None = DEFAULT_MAX_OUTPUT,
        on_overflow: str = "tail") -> CompletedProcess:
    """Run `argv` in a sandbox and wait, like subprocess.run.

    On timeout every process of the sandbox is killed and
    subprocess.TimeoutExpired raised; `check=True` raises
    subprocess.CalledProcessError on a non-zero exit. `cwd` and `env`
    override the Spec's for this call, as in spawn(). The result carries
    `.backend` and `.backend_reason` (which backend ran, and why), `.network`
    (the namespace it ran in), `.isolation` and `.timings`: microseconds
    since the spawn began, by stage (`start`, `child`, `ready`, `exec` on
    every backend; the native one adds `idmap`, `mounts`, `pivot`, `return`,
    `done`). Raises what spawn() raises.

    Of each captured stream at most `max_output` bytes are kept (default 64
    MiB; None: no cap): `on_overflow` "tail" (the default) keeps the last
    ones, "head" the first, "kill" the first and kills the sandbox
    (killed_by "output"), "raise" does that and raises OutputLimitError
    with what was kept (sandbox.output). `.stdout_dropped` and
    `.stderr_dropped` count the bytes left out.
    """
    def start(stdin: StdioArg, stdout: StdioArg, stderr: StdioArg) -> SandboxProcess:
        return spawn(argv, spec, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds, backend=backend,
                     cwd=cwd, env=env, max_output=max_output, on_overflow=on_overflow)

    return run_with(start, input=input, capture_output=capture_output, timeout=timeout, check=check, text=text,
                    stdin=stdin, stdout=stdout, stderr=stderr)


def run_stdio(input: bytes | str | None, capture_output: bool, timeout: float | None, stdin: StdioArg,
              stdout: StdioArg, stderr: StdioArg) -> tuple[StdioArg, StdioArg, StdioArg, bytes | None]:
    """run()'s arguments checked, and the stdio they mean: (stdin, stdout, stderr, the input's bytes)."""
    if input is not None and not isinstance(input, (bytes, bytearray, memoryview, str)):
        raise SpecError("input", input, "must be bytes, str or None")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
        raise SpecError("timeout", timeout, "must be a number of seconds (0 or more) or None")
    if capture_output:
        if stdout is not None or stderr is not None:
            raise SpecError("capture_output", True, "cannot be combined with stdout or stderr")
        stdout = stderr = PIPE
    if input is not None:
        if stdin is not None:
            raise SpecError("input", "...", "cannot be combined with stdin")
        stdin = PIPE
    return stdin, stdout, stderr, (input.encode() if isinstance(input, str) else input)


def run_with(start: Callable[[StdioArg, StdioArg, StdioArg], SandboxProcess], *, input: bytes | str | None,
             capture_output: bool, timeout: float | None, check: bool, text: bool, stdin: StdioArg,
             stdout: StdioArg, stderr: StdioArg) -> CompletedProcess:
    """run()'s semantics over `start(stdin, stdout, stderr)`, which spawns the sandbox."""
    stdin, stdout, stderr, data = run_stdio(input, capture_output, timeout, stdin, stdout, stderr)
    with start(stdin, stdout, stderr) as proc:
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            proc._timed_out()
            proc.wait()
            raise TimeoutExpired(proc.args, timeout or 0, exc.output, exc.stderr, usage=proc.usage,
                                 killed_by=proc.killed_by) from None
        except OutputLimitError as exc:
            if text:
                exc.stdout = decoded(exc.stdout, exc.stdout_dropped)
                exc.stderr = decoded(exc.stderr, exc.stderr_dropped)
            raise
    stdout_: bytes | str | None = out
    stderr_: bytes | str | None = err
    if text:
        stdout_ = decoded(out, proc.stdout_dropped)
        stderr_ = decoded(err, proc.stderr_dropped)
    assert proc.returncode is not None
    result = CompletedProcess(proc.args, proc.returncode, stdout_, stderr_, backend=proc.backend,
                              backend_reason=proc.backend_reason, timings=proc.timings, network=proc.network,
                              isolation=proc.isolation, usage=proc.usage, killed_by=proc.killed_by,
                              stdout_dropped=proc.stdout_dropped, stderr_dropped=proc.stderr_dropped)
    if check:
        result.check_returncode()
    return result


def decoded(data: bytes | str | None, dropped: int) -> str | None:
    """`data` as text; a stream cut by its output cap may end (or start) in the
    middle of a character, which is then replaced (U+FFFD), not an error."""
    if data is None or isinstance(data, str):
        return data
    return data.decode(errors="replace" if dropped else "strict")
