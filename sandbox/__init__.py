"""sandbox: start commands in Linux namespace sandboxes, fast, with bubblewrap's semantics.

    import sandbox
    spec = sandbox.presets.minimal_system()     # /usr read-only and its links, /proc, /dev, /tmp
    result = sandbox.run(["sh", "-c", "echo hi"], spec, capture_output=True)
    print(result.stdout, result.backend, result.backend_reason)

`sandbox.probe()` says what this host allows; `sandbox.explain(spec, argv)`
describes a sandbox without starting it.

`import sandbox` imports nothing else: each name of `__all__` is imported
the first time it is used (PEP 562), so a program that needs only a part of
the package (the command line, a Spec, the errors) pays only for that part.
A submodule is also reached as an attribute (`sandbox.spec`, `sandbox.plan`).
"""


TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (type checkers read the name)
if TYPE_CHECKING:
    from . import presets
    from .aio import AsyncProcess, arun, aspawn
    from .api import run, spawn
    from .bwrap import from_bwrap_args
    from .errors import (
        ExecError,
        ExecNotFoundError,
        ExecPermissionError,
        IsolationError,
        SandboxError,
        SessionError,
        SessionUserError,
        SetupError,
        SpecError,
        TimeoutExpired,
        UnavailableError,
    )
    from .explain import explain
    from .probe import ProbeResult, probe
    from .process import DEVNULL, PIPE, STDOUT, CompletedProcess, SandboxProcess
    from .seccomp import ArgRule, Seccomp
    from .session import Session
    from .spec import (
        Bind,
        Chmod,
        Dev,
        DevBind,
        Dir,
        File,
        Limits,
        Mount,
        Mqueue,
        Namespaces,
        Overlay,
        Proc,
        RemountRo,
        RoBind,
        Spec,
        Symlink,
        Tmpfs,
    )
    from .template import Template
    from .workerpool import WorkerPool

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

# Where each public name is defined: name -> (submodule, its attribute; None: the submodule itself).
# `probe` is the submodule, which can be called (sandbox.probe() is sandbox.probe.probe()); so can the
# submodule `explain`, in case it is imported before the function is asked for here.
_EXPORTS: dict[str, tuple[str, str | None]] = {
    **{name: ("api", name) for name in ("run", "spawn")},
    **{name: ("aio", name) for name in ("AsyncProcess", "arun", "aspawn")},
    "from_bwrap_args": ("bwrap", "from_bwrap_args"),
    **{name: ("errors", name) for name in (
        "ExecError", "ExecNotFoundError", "ExecPermissionError", "IsolationError", "SandboxError", "SessionError",
        "SessionUserError", "SetupError", "SpecError", "TimeoutExpired", "UnavailableError")},
    "explain": ("explain", "explain"),
    "presets": ("presets", None),
    "probe": ("probe", None),
    "ProbeResult": ("probe", "ProbeResult"),
    **{name: ("process", name) for name in ("DEVNULL", "PIPE", "STDOUT", "CompletedProcess", "SandboxProcess")},
    **{name: ("seccomp", name) for name in ("ArgRule", "Seccomp")},
    **{name: ("spec", name) for name in (
        "Bind", "Chmod", "Dev", "DevBind", "Dir", "File", "Limits", "Mount", "Mqueue", "Namespaces", "Overlay",
        "Proc", "RemountRo", "RoBind", "Spec", "Symlink", "Tmpfs")},
    "Session": ("session", "Session"),
    "Template": ("template", "Template"),
    "WorkerPool": ("workerpool", "WorkerPool"),
}


def __getattr__(name: str) -> object:
    """A name of `__all__`, imported on first use (then kept here), or a submodule."""
    where = _EXPORTS.get(name)
    if where is None:
        if name.startswith("__"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        try:
            return _submodule(name)  # the import system binds it here too
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    module, attribute = where
    value = _submodule(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def _submodule(name: str) -> object:
    """The submodule `name`, imported (with __import__: importlib would be one more import)."""
    import sys

    __import__(f"{__name__}.{name}")
    return sys.modules[f"{__name__}.{name}"]


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "DEVNULL", "PIPE", "STDOUT", "ArgRule", "AsyncProcess", "Bind", "Chmod", "CompletedProcess", "Dev", "DevBind",
    "Dir", "ExecError", "ExecNotFoundError", "ExecPermissionError", "File", "IsolationError", "Limits", "Mount",
    "Mqueue", "Namespaces", "Overlay", "ProbeResult", "Proc", "RemountRo", "RoBind", "SandboxError", "SandboxProcess",
    "Seccomp", "Session", "SessionError", "SessionUserError", "SetupError", "Spec", "SpecError", "Symlink",
    "Template", "TimeoutExpired", "Tmpfs", "UnavailableError", "WorkerPool", "explain", "from_bwrap_args", "presets",
    "probe", "arun", "aspawn", "run", "spawn",
]
