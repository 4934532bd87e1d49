"""What the adversarial tests share: both backends, the base world, a shell inside.

Every test here attacks one hole an adversarial review found (issue 11) and
runs on every backend, and through a Template, as whoever runs the suite
(root, then unprivileged).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import pytest
from conftest import BASE_MOUNTS, child_pids, make_base_spec

import sandbox
from sandbox import backends

# template: sandbox.spawn through a Template kept for the Spec; template-recycle: a Template(recycle=True) per
# run, its standbys each recycled first (run() alone knows it: tests that spawn otherwise skip it)
BACKENDS = ("native", "bwrap", "template", "template-recycle")
PYTHON = "/usr/bin/python3"
IS_ROOT = os.geteuid() == 0


def require(backend: str) -> None:
    """Skip unless `backend` can run here."""
    if backend in ("template", "template-recycle"):
        ok, reason = backends.availability("template")
    else:
        result = sandbox.probe()
        ok, reason = (result.native, result.native_reason) if backend == "native" else (result.bwrap,
                                                                                         result.bwrap_reason)
    if not ok:
        pytest.skip(f"{backend} backend unavailable: {reason}")


def require_template_python() -> None:
    """require("template"), and skip where PYTHON, which the attack runs in the sandbox, is missing."""
    require("template")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")


def require_spawnable(backend: str) -> None:
    """require(backend), and skip a backend sandbox.spawn(backend=...) has not: a recycled Template's sandboxes are
    run() alone's."""
    require(backend)
    if backend == "template-recycle":
        pytest.skip("this attack spawns through sandbox.spawn(backend=...), which has no recycled Template")


def run(argv: list[str], spec: sandbox.Spec, backend: str, **kwargs: Any) -> sandbox.CompletedProcess:
    """sandbox.run on `backend`; a Spec a Template refuses skips the test with its reason."""
    try:
        if backend == "template-recycle":
            return run_recycled(argv, spec, **kwargs)
        return sandbox.run(argv, spec, backend=backend, **kwargs)
    except sandbox.UnavailableError as exc:
        if backend.startswith("template") and str(exc).startswith(("a Template ", "Template(recycle=True)")):
            pytest.skip(str(exc))
        raise


def run_recycled(argv: list[str], spec: sandbox.Spec, **kwargs: Any) -> sandbox.CompletedProcess:
    """`argv` in a recycled sandbox of a Template(spec, recycle=True): each standby has served and been reset first."""
    with sandbox.Template(spec, recycle=True) as t:
        for _ in range(2 * len(child_pids(t.pid))):  # its standbys: the template process's children
            with contextlib.suppress(sandbox.SandboxError):
                t.run(["/bin/true"], timeout=60)
            time.sleep(0.02)  # its reset, before the next request
        return t.run(argv, **kwargs)


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


__all__ = ["BACKENDS", "BASE_MOUNTS", "IS_ROOT", "make_base_spec", "require", "require_spawnable", "run", "run_py",
           "run_sh"]
