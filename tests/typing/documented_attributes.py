"""The attributes the documentation names on what run() and task.run() return and raise, as a
user's type checker (mypy --strict) sees them; test_readme_examples.py checks this file with the
README's examples. Nothing here runs."""

from __future__ import annotations

from typing import Any

import sandbox
from sandbox import task


def a_timeout_says_what_ended_the_sandbox() -> None:
    try:
        sandbox.run(["sleep", "9"], sandbox.presets.minimal_system(), timeout=1)
    except sandbox.TimeoutExpired as exc:  # a subprocess.TimeoutExpired too
        killed_by: str | None = exc.killed_by
        cpu_s: float | None = exc.usage.cpu_s if exc.usage is not None else None
        print(killed_by, cpu_s, exc.output, exc.timeout)


def a_task_result_carries_its_record_and_usage() -> None:
    result = task.run(["true"], task.Sandbox(), capture_output=True)
    record: dict[str, Any] = result.record
    where: str | None = result.record_path
    confined: bool = result.confined
    killed_by: str | None = result.killed_by
    peak: float | None = result.usage.memory_peak_mb if result.usage is not None else None
    print(record, where, confined, killed_by, peak, result.returncode)
    try:
        task.run(["sleep", "9"], task.Sandbox(), timeout=1)
    except sandbox.TimeoutExpired as exc:
        print(exc.killed_by, exc.usage)
