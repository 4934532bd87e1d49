"""What the adversarial tests share: both backends, the base world, a shell inside.

Every test here attacks one hole an adversarial review found (issue 11) and
runs on every backend, and through a Template, as whoever runs the suite
(root, then unprivileged).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from conftest import BASE_MOUNTS, make_base_spec

import sandbox
from sandbox import backends

BACKENDS = ("native", "bwrap", "template")  # template: sandbox.spawn through a Template kept for the Spec
PYTHON = "/usr/bin/python3"
IS_ROOT = os.geteuid() == 0


def require(backend: str) -> None:
    """Skip unless `backend` can run here."""
    if backend == "template":
        ok, reason = backends.availability("template")
    else:
        result = sandbox.probe()
        ok, reason = (result.native, result.native_reason) if backend == "native" else (result.bwrap,
                                                                                         result.bwrap_reason)
    if not ok:
        pytest.skip(f"{backend} backend unavailable: {reason}")


def run(argv: list[str], spec: sandbox.Spec, backend: str, **kwargs: Any) -> sandbox.CompletedProcess:
    """sandbox.run on `backend`; a Spec a Template refuses skips the test with its reason."""
    try:
        return sandbox.run(argv, spec, backend=backend, **kwargs)
    except sandbox.UnavailableError as exc:
        if backend == "template" and str(exc).startswith("a Template "):
            pytest.skip(str(exc))
        raise


def run_sh(backend: str, script: str, spec: sandbox.Spec | None = None, **kwargs: Any) -> sandbox.CompletedProcess:
    """`sh -c script` in a sandbox of `backend` (the base world by default), captured as text."""
    kwargs.setdefault("timeout", 60)
    return run(["sh", "-c", script], spec if spec is not None else make_base_spec(), backend, capture_output=True,
               text=True, **kwargs)


def run_py(backend: str, code: str, spec: sandbox.Spec | None = None, *args: str,
           **kwargs: Any) -> sandbox.CompletedProcess:
    """Debian's python3 running `code` in a sandbox of `backend`, captured as text."""
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")
    kwargs.setdefault("timeout", 60)
    return run([PYTHON, "-I", "-S", "-c", code, *args], spec if spec is not None else make_base_spec(), backend,
               capture_output=True, text=True, **kwargs)


__all__ = ["BACKENDS", "BASE_MOUNTS", "IS_ROOT", "make_base_spec", "require", "run_py", "run_sh"]
