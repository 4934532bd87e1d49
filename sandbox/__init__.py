"""sandbox: start commands in Linux namespace sandboxes, fast, with bubblewrap's semantics.

    import sandbox
    spec = sandbox.Spec(mounts=[sandbox.RoBind("/usr"), sandbox.Symlink("usr/bin", "/bin"), ...])
    result = sandbox.run(["sh", "-c", "echo hi"], spec, capture_output=True)
"""

from __future__ import annotations

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
from .probe import ProbeResult, probe
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
    Namespaces,
    Proc,
    RemountRo,
    RoBind,
    Spec,
    Symlink,
    Tmpfs,
)

__version__ = "0.1.0"

__all__ = [
    "DEVNULL", "PIPE", "STDOUT", "Bind", "Chmod", "CompletedProcess", "Dev", "DevBind", "Dir", "ExecError",
    "ExecNotFoundError", "ExecPermissionError", "File", "IsolationError", "Limits", "Mount", "Namespaces",
    "ProbeResult", "Proc", "RemountRo", "RoBind", "SandboxError", "SandboxProcess", "SetupError", "Spec",
    "SpecError", "Symlink", "Tmpfs", "UnavailableError", "from_bwrap_args", "probe", "run", "spawn",
]
