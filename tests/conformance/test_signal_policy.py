"""Plan.reset_signals=False, which compile_plan never chooses, on every backend:
the command keeps the caller's ignored signals and the spawning thread's mask,
as across fork and exec."""

from __future__ import annotations

import dataclasses
import signal
from typing import Any

import pytest

import sandbox.api
from sandbox import spec as S
from sandbox.plan import Plan

from .cases import CALLER_SIGNALS
from .model import Case
from .test_conformance import backend, ctx, report_of, run_case  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration


def bits(*signals: int) -> str:
    return f"{sum(1 << (s - 1) for s in set(signals)):016x}"


@pytest.mark.parametrize("spec", [{}, {"as_pid_1": True}, {"namespaces": S.Namespaces(pid=False)}],
                         ids=["reaper", "as-pid-1", "no-pid-namespace"])
def test_signals_kept_when_the_plan_says_so(spec: dict[str, Any], backend: str, ctx: dict[str, Any],  # noqa: F811
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    if backend in ("template", "template-recycle"):
        pytest.skip("a Template's sandboxes are cloned by its server: the caller's signal state cannot be kept")
    if backend == "workerpool":
        pytest.skip("a WorkerPool's tasks are forks of its zygote, a fresh interpreter: the caller's signal state "
                    "cannot be kept")
    compiled_plan = sandbox.api.compiled_plan  # type: ignore[attr-defined]  # (imported there, not exported)

    def keeping_signals(*args: Any) -> Plan:
        return dataclasses.replace(compiled_plan(*args), reset_signals=False)

    monkeypatch.setattr(sandbox.api, "compiled_plan", keeping_signals)
    case = Case("keep_signals", mounts=(S.Proc(),), spec=spec, **CALLER_SIGNALS)
    result, _ = run_case(case, backend, ctx, monkeypatch)
    assert result.returncode == 0, result.stderr
    status = report_of(result)["status"]
    assert status["SigIgn"] == bits(signal.SIGPIPE, signal.SIGXFSZ, *CALLER_SIGNALS["host_ignores"])
    assert status["SigBlk"] == bits(*CALLER_SIGNALS["host_blocks"])
