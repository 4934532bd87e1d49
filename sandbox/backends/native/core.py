"""The compiled core (sandbox._native), checked against the ABI this code speaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from ..._native import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        f"sandbox: the compiled core (sandbox._native) is missing ({exc}); build it with `pip install .` "
        "or `pip install -e .` from the source tree"
    ) from exc

ABI_VERSION = 16
if lib.SBX_ABI_VERSION != ABI_VERSION:  # pragma: no cover - depends on the build
    raise ImportError(
        f"sandbox: the compiled core has ABI {lib.SBX_ABI_VERSION}, this Python code expects {ABI_VERSION}; "
        "rebuild it with `pip install .` (or `pip install -e .`) from the same source tree"
    )

BIN_DIR = Path(__file__).resolve().parents[2] / "_bin"
INIT_PATH = BIN_DIR / "sandbox-init"

__all__ = ["ABI_VERSION", "BIN_DIR", "INIT_PATH", "OP_KIND_NAMES", "STAMP_NAMES", "STEP_NAMES", "ffi", "lib"]


def _names(table: Any, count: int) -> dict[int, str]:
    """A generated C name table (value -> name, NULL where no value) as a dict."""
    return {i: ffi.string(table[i]).decode() for i in range(count) if table[i] != ffi.NULL}


STEP_NAMES = _names(lib.sbx_step_names, lib.sbx_n_steps)  # "uid_map", ...: the names in csrc/sandbox.h
OP_KIND_NAMES = _names(lib.sbx_op_kind_names, lib.sbx_n_op_kinds)  # "bind", "tmpfs", ...
STAMP_NAMES = {getattr(lib, n): n[len("SBX_T_"):].lower() for n in dir(lib) if n.startswith("SBX_T_")}
