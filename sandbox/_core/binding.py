"""The C core's binding: the compiled module (sandbox._native), checked against the ABI this code speaks,
its executables' directory, and the names of its steps, ops and stamps."""

from __future__ import annotations

import os
from typing import Any

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without the import (type checkers read the name)
if TYPE_CHECKING:
    from pathlib import Path

    BIN_DIR: Path  # the package's _bin directory, and sandbox-init in it, as pathlib Paths (made on first use:
    INIT_PATH: Path  # pathlib costs a run of the command line more than everything this module does)

try:
    from .._native import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        f"sandbox: the compiled core (sandbox._native) is missing ({exc}); build it with `pip install .` "
        "or `pip install -e .` from the source tree"
    ) from exc

ABI_VERSION = 17
if lib.SBX_ABI_VERSION != ABI_VERSION:  # pragma: no cover - depends on the build
    raise ImportError(
        f"sandbox: the compiled core has ABI {lib.SBX_ABI_VERSION}, this Python code expects {ABI_VERSION}; "
        "rebuild it with `pip install .` (or `pip install -e .`) from the same source tree"
    )

BIN_DIR_STR = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "_bin")
INIT_PATH_STR = os.path.join(BIN_DIR_STR, "sandbox-init")


def __getattr__(name: str) -> object:
    """BIN_DIR and INIT_PATH, as pathlib Paths of the two strings above, made on first use."""
    if name not in ("BIN_DIR", "INIT_PATH"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from pathlib import Path

    value = Path(BIN_DIR_STR if name == "BIN_DIR" else INIT_PATH_STR)
    globals()[name] = value
    return value


__all__ = ["ABI_VERSION", "BIN_DIR", "BIN_DIR_STR", "INIT_PATH", "INIT_PATH_STR", "OP_KIND_NAMES", "STAMP_NAMES",
           "STEP_NAMES", "ffi", "lib"]


def _names(table: Any, count: int) -> dict[int, str]:
    """A generated C name table (value -> name, NULL where no value) as a dict."""
    return {i: ffi.string(table[i]).decode() for i in range(count) if table[i] != ffi.NULL}


STEP_NAMES = _names(lib.sbx_step_names, lib.sbx_n_steps)  # "uid_map", ...: the names in csrc/core/sandbox.h
OP_KIND_NAMES = _names(lib.sbx_op_kind_names, lib.sbx_n_op_kinds)  # "bind", "tmpfs", ...
STAMP_NAMES = {getattr(lib, n): n[len("SBX_T_"):].lower() for n in dir(lib) if n.startswith("SBX_T_")}
