"""Starting a command under a task description: spawn() and run().

One start: choose a backend (or, without confinement, refuse under
`required` or run unconfined under `best_effort`), gather the host's facts,
start the allowlist proxy, compile, check that every forwarded target
answers, translate the command and start it (the core checks the probes and
the network namespace before the command runs), and when it ends write the
record and stop the proxy.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, cast

from .. import api, backends
from ..errors import IsolationError, SandboxError, SpecError, TimeoutExpired, UnavailableError
from ..output import DEFAULT_MAX_OUTPUT, OutputLimitError, check_cap
from ..plan import check_argv, resolve_env
from ..process import SandboxProcess
from ..spec import Spec
from ..validate import StrPath
from . import nested
from .broker import Broker
from .broker_socket import INSIDE as BROKER_INSIDE
from .broker_socket import BrokerSocket
from .compile import Compiled, compile_task
from .description import Sandbox
from .facts import Facts
from .proxy import AllowlistProxy
from .records import scrub, secrets_of, write_record
from .wire import BROKER_ENV

if TYPE_CHECKING:
    from ..cgroups import Usage

StdioArg = int | IO[Any] | None


class TaskProcess:
    """A started task sandbox, shaped like subprocess.Popen: the record and the proxy around the process
    (a sandbox.SandboxProcess, or a subprocess.Popen when unconfined). When it ends the record is written
    (`record_path`) and the proxy stopped. Inside a task sandbox the broker writes the record of the nested
    sandbox it starts (`brokered`: its handle), and this one takes it from there."""

    def __init__(self, proc: SandboxProcess | subprocess.Popen[bytes], record: dict[str, Any], sb: Sandbox,
                 environ: Mapping[str, str], proxy: AllowlistProxy | None, compiled: Compiled | None,
                 broker: Broker | None = None, brokered: nested.NestedHandle | None = None) -> None:
        self._proc = proc
        self._broker = broker
        self._nested = brokered
        self.record = record
        self.record_path: str | None = None
        self.compiled = compiled
        self._sb, self._environ, self._proxy = sb, environ, proxy
        self._finished = False
        self.args, self.pid = proc.args, proc.pid
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr

    @property
    def returncode(self) -> int | None:
        """The command's exit code, -N if signal N killed it, None while it runs."""
        return self._proc.returncode

    @property
    def confined(self) -> bool:
        """Whether the command runs in a sandbox."""
        return bool(self.record.get("confined", True))  # a broker's record may leave it out: it always confines

    @property
    def usage(self) -> Usage | None:
        """Once ended, what the sandbox's cgroup counted (cpu_s, memory_peak_mb,
        pids_peak; sandbox.cgroups.Usage), or None where nothing counted it (no
        cgroup, an unconfined run)."""
        return getattr(self._proc, "usage", None)

    @property
    def killed_by(self) -> str | None:
        """Once ended, the limit that ended it ("memory", "pids", "cpu",
        "timeout", "output": sandbox.killedby), or None: a plain exit or
        signal, or an unconfined run."""
        return getattr(self._proc, "killed_by", None)

    def _finish(self) -> None:
        if self._finished or self._proc.returncode is None:
            return
        self._finished = True
        if self._nested is not None:  # the broker wrote it, and sent it with the exit
            self.record, self.record_path = self._nested.record, self._nested.record_path
            return
        if self._broker is not None:
            self._broker.close()  # and with it every nested sandbox still running
        if self._proxy is not None:
            self._proxy.close()
        self.record["exit_status"] = self._proc.returncode
        if self._sb.records:
            self.record_path = write_record(self._sb.records, self.record, self._environ)
        self.record = scrub(self.record, secrets_of(self._environ))

    def poll(self) -> int | None:
        """The return code if it has ended, else None."""
        rc = self._proc.poll()
        self._finish()
        return rc

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the end (subprocess.TimeoutExpired after `timeout` seconds)."""
        rc = self._proc.wait(timeout)
        self._finish()
        return int(rc)

    def communicate(self, input: bytes | None = None, timeout: float | None = None) -> tuple[Any, Any]:
        """As Popen.communicate."""
        out = self._proc.communicate(input, timeout)
        self._finish()
        return out

    def send_signal(self, sig: int) -> None:
        """Send `sig` to the command (through the sandbox's pid 1)."""
        self._proc.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM."""
        self._proc.terminate()

    def kill(self) -> None:
        """End the whole sandbox now."""
        self._proc.kill()

    def __enter__(self) -> TaskProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.kill()
        self._proc.__exit__(exc_type, exc, tb)
        self._finish()


def _record(sb: Sandbox, **fields: Any) -> dict[str, Any]:
    limits = {k: v for k, v in (("memory_mb", sb.limits.memory_mb), ("file_mb", sb.limits.file_mb),
                                ("cpu_s", sb.limits.cpu_s)) if v is not None}
    base: dict[str, Any] = {
        "role": sb.role, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "backend": None, "confined": False,
        "reason": None, "command": [], "chdir": sb.chdir, "binds": [], "hidden": [], "emptied": [],
        "env_names": [], "network": sb.network, "ports": list(sb.ports),
        "proxy": None if sb.proxy is None else {"allowed_hosts": list(sb.proxy.allowed_hosts)},
        "limits": limits, "enforce": sb.enforce, "check": [], "exit_status": None,
    }
    base.update(fields)
    return base


def check_targets(forward: Sequence[tuple[int, int | str]]) -> list[dict[str, Any]]:
    """Connect to each forwarded target on the host (the relay's far end);
    IsolationError naming the first that does not answer."""
    entries = []
    for port, target in forward:
        try:
            if isinstance(target, int):
                s = socket.create_connection(("127.0.0.1", target), timeout=5)
            else:
                s = socket.socket(socket.AF_UNIX)
                s.settimeout(5)
                s.connect(target)
            s.close()
        except OSError as exc:
            raise IsolationError(f"isolation check failed: forwarded port {port} (to {target}) does not answer: "
                                 f"{exc.strerror or exc}") from None
        entries.append({"name": f"port {port}", "target": target, "ok": True})
    return entries


def _unconfined(argv: list[str], sb: Sandbox, environ: Mapping[str, str], reason: str, full_env: bool,
                **popen: Any) -> TaskProcess:
    env = dict(environ) if full_env else {**resolve_env(Spec(env_inherit=sb.env_allow), environ), **sb.env_dict}
    if "PATH" not in env and "PATH" in environ:
        env["PATH"] = environ["PATH"]
    record = _record(sb, reason=reason, command=argv, env_names=sorted(env))
    proc = subprocess.Popen(argv, env=env, cwd=sb.chdir, **popen)
    return TaskProcess(proc, record, sb, environ, None, None)


def spawn(argv: Sequence[StrPath], sb: Sandbox, *, backend: str = "auto", stdin: StdioArg = None,
          stdout: StdioArg = None, stderr: StdioArg = None, pass_fds: Iterable[int] = (),
          environ: Mapping[str, str] | None = None) -> TaskProcess:
    """Start `argv` (host paths, translated) under `sb`; return at once.

    Inside a task sandbox (SANDBOX_TASK_BROKER set) the request goes to the
    broker of that sandbox instead (sandbox.task.nested): `sb` is then in
    this sandbox's paths, and may only narrow what this sandbox allows; the
    broker writes the record, and `record_path` says where once it ends.

    `environ` is the caller's environment the allowlist draws from (default
    os.environ). Raises UnavailableError under `enforce='required'` when no
    backend can confine here (before any process starts), IsolationError
    naming what failed the isolation check (the command never runs), and
    what sandbox.spawn raises.
    """
    if not isinstance(sb, Sandbox):
        raise SpecError("sandbox", sb, "must be a sandbox.task.Sandbox")
    args = check_argv(cast("Sequence[str]", argv))  # it takes os.PathLike elements too
    env_in = dict(os.environ if environ is None else environ)
    path = nested.broker_path()
    if path is not None:
        return _nested(path, args, sb, api.Stdio.of(stdin, stdout, stderr), api.check_pass_fds(pass_fds), env_in)
    popen = {"stdin": stdin, "stdout": stdout, "stderr": stderr, "pass_fds": tuple(pass_fds)}
    return start_here(args, sb, backend, env_in, popen)


def _nested(path: str, args: list[str], sb: Sandbox, stdio: api.Stdio, pass_fds: tuple[int, ...],
            env_in: dict[str, str]) -> TaskProcess:
    """`sb` (in this sandbox's paths) started beside this sandbox by its broker at `path`."""
    try:
        if pass_fds:
            raise SpecError("pass_fds", pass_fds, "a nested sandbox gets its stdio only (no other fds)")
        handle = nested.ask(path, {"kind": "task", "sandbox": sb.to_dict()}, args, stdio.child, env_in)
    except BaseException:
        stdio.abort()
        raise
    stdio.started()
    proc = SandboxProcess(args, handle, backend="brokered", backend_reason="nested: started beside this sandbox by "
                          "the sandbox.task broker", network="host" if sb.network == "open" else "none",
                          pipes=stdio.parent)
    return TaskProcess(proc, handle.record, sb, env_in, None, None, brokered=handle)


def start_here(args: list[str], sb: Sandbox, backend: str, env_in: dict[str, str], popen: dict[str, Any],
               pinned: Mapping[str, str] | None = None) -> TaskProcess:
    """spawn() in this process, never through a broker; `pinned` as compile_task takes it."""
    if not sb.enabled:
        return _unconfined(args, sb, env_in, "enabled=False", True, **popen)
    try:
        name, _ = backends.choose(backend)
    except UnavailableError as exc:
        if sb.enforce == "required":
            raise UnavailableError(f"enforce='required' and no confinement here: {exc}{nested.no_broker_note()}") \
                from None
        return _unconfined(args, sb, env_in, str(exc), False, **popen)
    facts = Facts.gather(sb, env_in)
    proxy = AllowlistProxy(sb.proxy.allowed_hosts) if sb.proxy is not None and sb.network == "isolated" else None
    try:
        return _start(args, sb, name, facts, env_in, proxy, popen, pinned)
    except BaseException:
        if proxy is not None:
            proxy.close()
        raise


def _start(args: list[str], sb: Sandbox, name: str, facts: Facts, env_in: dict[str, str],
           proxy: AllowlistProxy | None, popen: dict[str, Any], pinned: Mapping[str, str] | None) -> TaskProcess:
    listening = BrokerSocket()  # the socket of its broker of nested sandboxes, bound inside
    try:
        compiled = compile_task(sb, facts, env_in, proxy.port if proxy else None, pinned, listening.path)
        broker = Broker(sb, compiled, name, listening, start=start_here)
    except BaseException:
        listening.close()
        raise
    command = compiled.translator.argv(args)
    record = _record(sb, backend=name, confined=True, command=command, chdir=compiled.spec.cwd,
                     binds=[{"source": b.source, "target": b.target, "writable": b.writable} for b in compiled.binds],
                     hidden=list(compiled.hidden), emptied=list(compiled.emptied),
                     env_names=list(compiled.env_names), ports=[p for p, _ in compiled.forward])
    spec = compiled.spec.replace(env={**compiled.spec.env_dict, BROKER_ENV: BROKER_INSIDE})
    record["env_names"] = sorted([*record["env_names"], BROKER_ENV])
    try:
        record["check"] = check_targets(compiled.forward)
        proc = api.spawn(command, spec, backend=name, **popen)
    except SandboxError as exc:
        broker.close()
        record["check"] = record["check"] + _failed_checks(exc, compiled)
        record["reason"] = str(exc)
        if sb.records:
            write_record(sb.records, record, env_in)
        raise
    except BaseException:
        broker.close()
        raise
    broker.attach(proc.pid)
    record["check"] += _passed_checks(proc.isolation, sb)
    return TaskProcess(proc, record, sb, env_in, proxy, compiled, broker)


def _passed_checks(isolation: Mapping[str, Any], sb: Sandbox) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"name": f"probe {p}", "ok": True, "result": "absent"} for p in sb.probes]
    net = isolation.get("network")
    if net is not None:
        out.append({"name": "network", "ok": True, "result": net})
    return out


def _failed_checks(exc: SandboxError, compiled: Compiled) -> list[dict[str, Any]]:
    if not isinstance(exc, IsolationError):
        return []
    path = getattr(exc, "path", None)
    return [{"name": f"probe {path}" if path else "isolation", "ok": False, "result": str(exc)}]


class TaskResult(subprocess.CompletedProcess[Any]):
    """task.run()'s result: a subprocess.CompletedProcess with the task's
    `record` (`record_path`: where `sb.records` received it), `confined`, and
    the sandbox's `usage` and `killed_by` (TaskProcess's), and the bytes of
    each stream the output cap dropped (`stdout_dropped`, `stderr_dropped`)."""

    record: dict[str, Any]
    record_path: str | None
    confined: bool
    usage: Usage | None
    killed_by: str | None
    stdout_dropped: int
    stderr_dropped: int


def run(argv: Sequence[StrPath], sb: Sandbox, *, input: bytes | str | None = None, capture_output: bool = False,
        timeout: float | None = None, text: bool = False, backend: str = "auto",
        environ: Mapping[str, str] | None = None, max_output: int | None = DEFAULT_MAX_OUTPUT,
        on_overflow: str = "tail", **stdio: Any) -> TaskResult:
    """Run `argv` under `sb` and wait, like subprocess.run; the result carries
    `.record` (and `.record_path` when `sb.records` is set), `.confined`, and
    the sandbox's `.usage` and `.killed_by` (TaskProcess's). `max_output`
    and `on_overflow` cap each captured stream as sandbox.run does
    (sandbox.output; `.stdout_dropped`, `.stderr_dropped`); an unconfined
    run is not capped. A timeout raises sandbox.TimeoutExpired (a
    subprocess.TimeoutExpired) with `usage` and `killed_by` too."""
    check_cap(max_output, on_overflow)
    if capture_output:
        stdio["stdout"] = stdio["stderr"] = subprocess.PIPE
    if input is not None:
        stdio["stdin"] = subprocess.PIPE
    data = input.encode() if isinstance(input, str) else input
    proc = spawn(argv, sb, backend=backend, environ=environ, **stdio)
    inner = getattr(proc, "_proc", None)
    if isinstance(inner, SandboxProcess):
        inner.max_output, inner.on_overflow = max_output, on_overflow
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        if isinstance(inner, SandboxProcess):
            inner._timed_out()
        proc.kill()
        proc.wait()
        raise TimeoutExpired(exc.cmd, exc.timeout, exc.output, exc.stderr, usage=proc.usage,
                             killed_by=proc.killed_by or "timeout") from None
    except OutputLimitError:
        proc.wait()  # writes its record
        raise
    finally:
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                f.close()
    if text:
        out = api.decoded(out, getattr(inner, "stdout_dropped", 0))
        err = api.decoded(err, getattr(inner, "stderr_dropped", 0))
    result = TaskResult(proc.args, proc.wait(), out, err)
    result.record, result.record_path, result.confined = proc.record, proc.record_path, proc.confined
    result.usage, result.killed_by = proc.usage, proc.killed_by
    result.stdout_dropped = getattr(inner, "stdout_dropped", 0)
    result.stderr_dropped = getattr(inner, "stderr_dropped", 0)
    return result


NestedProcess = TaskProcess  # what task.spawn returned inside a task sandbox before it was one class
