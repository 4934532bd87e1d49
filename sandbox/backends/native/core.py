"""The compiled core (sandbox._native), checked against the ABI this code speaks."""

from __future__ import annotations

from pathlib import Path

try:
    from ..._native import ffi, lib
except ImportError as exc:  # pragma: no cover - depends on the build
    raise ImportError(
        f"sandbox: the compiled core (sandbox._native) is missing ({exc}); build it with `pip install .` "
        "or `pip install -e .` from the source tree"
    ) from exc

ABI_VERSION = 9
if lib.SBX_ABI_VERSION != ABI_VERSION:  # pragma: no cover - depends on the build
    raise ImportError(
        f"sandbox: the compiled core has ABI {lib.SBX_ABI_VERSION}, this Python code expects {ABI_VERSION}; "
        "rebuild it with `pip install .` (or `pip install -e .`) from the same source tree"
    )

BIN_DIR = Path(__file__).resolve().parents[2] / "_bin"
INIT_PATH = BIN_DIR / "sandbox-init"

__all__ = ["ABI_VERSION", "BIN_DIR", "INIT_PATH", "STAMP_NAMES", "STEP_NAMES", "ffi", "lib"]

STEP_NAMES = {getattr(lib, n): n[len("SBX_STEP_"):].lower() for n in dir(lib) if n.startswith("SBX_STEP_")}
STAMP_NAMES = {getattr(lib, n): n[len("SBX_T_"):].lower() for n in dir(lib) if n.startswith("SBX_T_")}
