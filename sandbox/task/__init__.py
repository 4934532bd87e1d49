"""sandbox.task: a drop-in backend for a framework's sandbox layer.

    from sandbox import task
    sb = task.Sandbox(read=("/data/split",), write=("/runs/1",), env_allow=("MWM_*",), ports=(8080,))
    result = task.run(["python3", "agent.py"], sb, capture_output=True)

One frozen description (`Sandbox`, with a JSON form) compiled into a Spec
(compile.py), commands translated between host and sandbox paths
(translate.py), an allowlist proxy (proxy.py), records (records.py), a
sanitized copy for handoffs (copy.py), the launcher `python -m sandbox.task
SPEC -- CMD...` (launcher.py), warm workers (workers.py), and nested
sandboxes: inside a task sandbox, spawn() and run() ask the broker of that
sandbox (broker.py, on the trusted side) for a narrower one (nested.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..validate import StrPath, as_text, check_items, check_mapping, check_text
from .compile import Compiled, compile_task
from .copy import sanitized_copy
from .description import Bind, Layout, Limits, Proxy, Sandbox, check_sandbox
from .facts import Facts
from .narrow import narrowed
from .nested import broker_fds
from .run import NestedProcess, TaskProcess, TaskResult, run, spawn
from .translate import Translator
from .workers import worker_pool, worker_spec

__all__ = ["Bind", "Compiled", "Facts", "Layout", "Limits", "NestedProcess", "Proxy", "Sandbox", "TaskProcess",
           "TaskResult", "Translator", "broker_fds", "compile", "compile_task", "narrowed", "outside", "relative",
           "run", "sanitized_copy", "spawn", "translate", "worker_pool", "worker_spec"]


def compile(sb: Sandbox, environ: Mapping[str, str] | None = None) -> Compiled:  # noqa: A001
    """`sb` compiled for this host (facts read now) without starting anything."""
    import os

    check_sandbox(sb)
    check_mapping("environ", environ)
    env = dict(os.environ if environ is None else environ)
    return compile_task(sb, Facts.gather(sb, env), env)


def translate(sb: Sandbox, argv: Sequence[StrPath]) -> list[str]:
    """`argv` with host paths rewritten as the sandbox of `sb` sees them."""
    words = [check_text(f"argv[{i}]", as_text(a)) for i, a in enumerate(check_items("argv", argv, "strings"))]
    return Translator.of(sb).argv(words)


def relative(sb: Sandbox, host_path: StrPath) -> str:
    """`host_path` relative to the layout's inside root, as a learner is told it."""
    return Translator.of(sb).relative(check_text("host_path", as_text(host_path)))


def outside(sb: Sandbox, inside_path: StrPath) -> str:
    """The host path for a path the learner names; SpecError if it is under no bind or escapes."""
    return Translator.of(sb).outside(check_text("inside_path", as_text(inside_path)))
