"""Shared helpers of the task-sandbox integration tests (sandbox.task)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import sandbox
from sandbox import task

PY = sys.executable  # the framework's interpreter: shown inside as installed


@pytest.fixture(name="backend", params=["native", "bwrap"])
def task_backend(request: pytest.FixtureRequest) -> str:
    """Each test runs on both backends."""
    if request.param == "bwrap" and not sandbox.probe().bwrap:
        pytest.skip("bwrap is not available")
    if request.param == "native" and not sandbox.probe().native:
        pytest.skip("the native backend is not available")
    return request.param


def trun(script: str, sb: task.Sandbox, backend: str, *extra: str, **kw: Any) -> subprocess.CompletedProcess:
    """`sh -c script` under `sb` on `backend`, captured as text."""
    kw.setdefault("timeout", 60)
    return task.run(["sh", "-c", script, "sh", *extra], sb, backend=backend, capture_output=True, text=True, **kw)


def pyrun(code: str, sb: task.Sandbox, backend: str, **kw: Any) -> subprocess.CompletedProcess:
    """`python -c code` (this interpreter) under `sb` on `backend`, captured as text."""
    kw.setdefault("timeout", 60)
    return task.run([PY, "-c", code], sb, backend=backend, capture_output=True, text=True, **kw)
