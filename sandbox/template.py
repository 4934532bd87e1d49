"""sandbox.Template: many sandboxes of one Spec, each started at the cost of a clone.

    with sandbox.Template(spec) as t:
        for task in tasks:
            t.run(["python3", "-c", task], capture_output=True, binds=[sandbox.Bind(workdir, "/work")])

Everything the sandboxes of one Spec share is prepared once, in a small
resident process (sandbox-template) that lives in the prepared root: the mount
tree with its binds, /dev, the plan and the seccomp program. Each spawn()
clones a fresh sandbox from it: its own mount namespace (a copy of that tree),
pid, ipc, uts and user namespaces, a network namespace as the Spec says
(fresh, leased from the pool, or the host's), and a fresh tmpfs for every
Tmpfs, a fresh /dev/shm, devpts and /proc. Nothing one sandbox writes is
visible to another: the template's root, /dev and directories made on them
are read-only (declare a Tmpfs for scratch space; a writable File is a
private copy in each sandbox).

Results, errors, timings and guarantees are sandbox.spawn's, with backend
"template". The Spec is compiled once, when the Template is made: the
caller's cwd and environment (for env_inherit) are read then. Per call:
argv, stdio, pass_fds, and `env` (the complete environment), `cwd` (must
exist inside), `limits`, and `binds` (extra Bind/RoBind/DevBind, whose
destination must exist in the template's root or lie under a Tmpfs).

Closing the Template (or the caller's death) ends its process and every
sandbox it made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import backends
from .api import run_with
from .backends.template import RECYCLE_TRAITS, Server, launch_in
from .errors import SpecError
from .output import DEFAULT_MAX_OUTPUT, check_cap
from .plan import check_argv, compile_plan
from .process import CompletedProcess, SandboxProcess
from .refusal import refusal
from .spec import Bind, Limits, Spec
from .stdio import Stdio, StdioArg, check_pass_fds
from .validate import StrPath, check_env, check_items, check_path
from .warm_plan import plan_for_call, recycle_plan, template_plans

__all__ = ["Template"]


class Template:
    """A prepared root and resident process from which sandboxes of `spec` are cloned.

    Raises UnavailableError when the host cannot run it or the Spec asks for
    what a Template cannot do (no user, mount or pid namespace, port
    forwarding, the network check, CAP_SYS_ADMIN kept, a Tmpfs at /), and
    SetupError when building the root fails (a missing bind source...).

    `recycle=True` (opt-in): a standby sandbox whose command has ended is
    reset and serves the next request in the same namespaces instead of
    being replaced (docs/template.md says what it resets and what a
    recycled sandbox shares with its predecessor); UnavailableError names
    what in the Spec it could not reset.
    """

    def __init__(self, spec: Spec, *, recycle: bool = False) -> None:
        if not isinstance(spec, Spec):
            raise SpecError("spec", spec, "must be a sandbox.Spec")
        if not isinstance(recycle, bool):
            raise SpecError("recycle", recycle, "must be True or False")
        backends.choose("template")
        host = backends.host_for("template")
        plan = compile_plan(spec, host)
        refused = refusal(plan, host)
        if refused is None and recycle:  # what a recycled sandbox's pid 1 could not reset is refused too
            host = dataclasses.replace(host, executor=RECYCLE_TRAITS)
            plan = recycle_plan(plan)
            refused = refusal(plan, host)
        if refused is not None:
            raise refused
        self.spec = spec
        self._host = host
        self._plans = template_plans(plan)
        self.recycle = recycle
        # a recycled sandbox's reset makes every mount of the sandbox plan again: its blob is the reset blob
        self._server = Server(self._plans.shared, self._plans.sandbox,
                              recycle=self._plans.sandbox if recycle else None)

    @property
    def pid(self) -> int:
        """The template process's pid (the caller's child)."""
        return self._server.pid

    def spawn(self, argv: Sequence[str], *, stdin: StdioArg = None, stdout: StdioArg = None,
              stderr: StdioArg = None, pass_fds: Iterable[int] = (), env: Mapping[str, str] | None = None,
              cwd: StrPath | None = None, limits: Limits | None = None, binds: Sequence[Bind] = (),
              max_output: int | None = None, on_overflow: str = "tail") -> SandboxProcess:
        """Start `argv` in a new sandbox cloned from this template; return once it has exec'd.

        Takes what sandbox.spawn takes (`max_output` and `on_overflow`: its
        communicate()'s output cap, sandbox.output), plus the per-call
        overrides (see the module docstring); raises what it raises.
        """
        args = _argv(argv)
        if max_output is not None or on_overflow != "tail":
            check_cap(max_output, on_overflow)
        fds = check_pass_fds(pass_fds) if pass_fds else ()
        plan = self._plans.sandbox
        if env is not None or cwd is not None or limits is not None or binds:
            plan = plan_for_call(plan, self._host, env=_check_env(env), cwd=_check_cwd(cwd),
                                 limits=_check_limits(limits), binds=_check_binds(binds), recycled=self.recycle)
        stdio = Stdio.of(stdin, stdout, stderr)
        try:
            launched = launch_in(self._server, plan, args, stdio.child, fds)
        except BaseException:
            stdio.abort()
            raise
        stdio.started()
        return SandboxProcess(args, launched, backend="template", backend_reason="sandbox.Template",
                              network=plan.network, pipes=stdio.parent, max_output=max_output,
                              on_overflow=on_overflow)

    def run(self, argv: Sequence[str], *, input: bytes | str | None = None, capture_output: bool = False,
            timeout: float | None = None, check: bool = False, text: bool = False, stdin: StdioArg = None,
            stdout: StdioArg = None, stderr: StdioArg = None, max_output: int | None = DEFAULT_MAX_OUTPUT,
            on_overflow: str = "tail", **call: Any) -> CompletedProcess:
        """Run `argv` in a new sandbox and wait, like sandbox.run (the same
        output cap, 64 MiB per stream by default); `call` takes spawn()'s
        pass_fds, env, cwd, limits and binds."""
        def start(stdin: StdioArg, stdout: StdioArg, stderr: StdioArg) -> SandboxProcess:
            return self.spawn(argv, stdin=stdin, stdout=stdout, stderr=stderr, max_output=max_output,
                              on_overflow=on_overflow, **call)

        return run_with(start, input=input, capture_output=capture_output, timeout=timeout, check=check,
                        text=text, stdin=stdin, stdout=stdout, stderr=stderr)

    def close(self) -> None:
        """End the template process and every sandbox it made (idempotent)."""
        self._server.close()

    def __enter__(self) -> Template:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        server = getattr(self, "_server", None)
        if server is not None:
            server.close()

    def __repr__(self) -> str:
        state = "closed" if self._server.closed else f"pid={self._server.pid}"
        return f"<Template {state} network={self._plans.sandbox.network}>"


def _argv(argv: Sequence[str]) -> list[str]:
    """check_argv's list, at once for the usual list of non-empty plain strings (a call's whole cost counts)."""
    if type(argv) is list and argv:
        for a in argv:
            if type(a) is not str or not a or "\0" in a:
                return check_argv(argv)
        return list(argv)
    return check_argv(argv)


def _check_env(env: Mapping[str, str] | None) -> Mapping[str, str] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise SpecError("env", env, "must be a mapping of names to values")
    return dict(check_env("env", env))


def _check_cwd(cwd: StrPath | None) -> str | None:
    return None if cwd is None else check_path("cwd", cwd)


def _check_limits(limits: Limits | None) -> Limits | None:
    if limits is not None and not isinstance(limits, Limits):
        raise SpecError("limits", limits, "must be a sandbox.Limits")
    return limits


def _check_binds(binds: Sequence[Bind]) -> tuple[Bind, ...]:
    out = check_items("binds", binds, "Bind, RoBind or DevBind")
    for i, b in enumerate(out):
        if not isinstance(b, Bind):
            raise SpecError(f"binds[{i}]", b, "must be a Bind, RoBind or DevBind")
        if b.optional:
            raise SpecError(f"binds[{i}]", b, "per-call binds cannot be optional")
    return out
