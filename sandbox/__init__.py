"""sandbox: start commands in Linux namespace sandboxes, fast, with bubblewrap's semantics.

    import sandbox
    spec = sandbox.presets.minimal_system()     # /usr read-only and its links, /proc, /dev, /tmp
    result = sandbox.run(["sh", "-c", "echo hi"], spec, capture_output=True)
    print(result.stdout, result.backend, result.backend_reason)

`sandbox.probe()` says what this host allows; `sandbox.explain(spec, argv)`
describes a sandbox without starting it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import presets
from .api import run, spawn
from .bwrap import from_bwrap_args
from .errors import (
    ExecError,
    ExecNotFoundError,
    ExecPermissionError,
    IsolationError,
    SandboxError,
    SetupError,
    SpecError,
    UnavailableError,
)
from .explain import explain
from .probe import ProbeResult
from .process import DEVNULL, PIPE, STDOUT, CompletedProcess, SandboxProcess
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
    Proc,
    RemountRo,
    RoBind,
    Spec,
    Symlink,
    Tmpfs,
)

if TYPE_CHECKING:
    from .probe import probe
    from .template import Template
    from .workerpool import WorkerPool
else:
    # The module sandbox.probe, callable: sandbox.probe() is sandbox.probe.probe().
    from . import probe
from .seccomp import ArgRule, Seccomp

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)


def __getattr__(name: str) -> object:
    """WorkerPool and Template are imported on first use (WorkerPool brings
    cloudpickle along; both need the compiled core, which `import sandbox`
    does not)."""
    if name == "WorkerPool":
        from .workerpool import WorkerPool

        return WorkerPool
    if name == "Template":
        from .template import Template

        return Template
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")


__all__ = [
    "DEVNULL", "PIPE", "STDOUT", "ArgRule", "Bind", "Chmod", "CompletedProcess", "Dev", "DevBind", "Dir",
    "ExecError", "ExecNotFoundError", "ExecPermissionError", "File", "IsolationError", "Limits", "Mount",
    "Mqueue", "Namespaces", "ProbeResult", "Proc", "RemountRo", "RoBind", "SandboxError", "SandboxProcess", "Seccomp",
    "SetupError", "Spec", "SpecError", "Symlink", "Template", "Tmpfs", "UnavailableError", "WorkerPool", "explain",
    "from_bwrap_args", "presets", "probe", "run", "spawn",
]
