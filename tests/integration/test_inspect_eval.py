"""A whole Inspect eval on `nsbox`: 20 samples, a scripted solver (no model) that
calls Inspect's own tools in each sample's sandbox: text_editor writes and edits
a file, bash_session (Inspect's JSON-RPC server, started by one call and used by
the next) reads it back and computes, bash and python run commands. Each sample
has its own sandbox: a file one writes is not seen by the next. Afterwards no
session is left open and nothing the eval started is alive (tests/leakcheck.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai import Task, eval  # noqa: E402
from inspect_ai.dataset import Sample  # noqa: E402
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Scorer, Target, accuracy, scorer  # noqa: E402
from inspect_ai.solver import Generate, Solver, TaskState, solver  # noqa: E402
from inspect_ai.tool import bash, bash_session, python, text_editor  # noqa: E402

from sandbox.inspect import lifecycle  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("require_native")]

SAMPLES = 20


@solver
def scripted() -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        n = int(state.metadata["n"])
        editor, shell = text_editor(), bash_session()
        earlier = await bash()(command="cat /workspace/mark.txt 2>/dev/null || echo fresh")
        await editor(command="create", path="/workspace/mark.txt", file_text=f"value {n}\n")
        await editor(command="str_replace", path="/workspace/mark.txt", old_str="value", new_str="number")
        await shell(action="type_submit", input="cd /workspace && X=$(cut -d' ' -f2 mark.txt)")
        doubled = await shell(action="type_submit", input="echo doubled=$((X * 2))")  # the shell kept X
        product = await python()(code="print(6 * 7)")
        state.output.completion = f"{earlier}|{doubled}|{product}"
        return state

    return solve


@scorer(metrics=[accuracy()])
def contains_all() -> Scorer:
    async def score(state: TaskState, target: Target) -> Score:
        ok = all(t in state.output.completion for t in target.target)
        return Score(value=CORRECT if ok else INCORRECT, explanation=state.output.completion)

    return score


def test_eval_of_20_samples_with_bash_session_and_text_editor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):  # Inspect's traces, not the user's HOME
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    dataset = [Sample(input="go", target=["fresh", f"doubled={2 * n}", "42"], metadata={"n": n}, id=n)
               for n in range(SAMPLES)]
    task = Task(dataset=dataset, solver=scripted(), scorer=contains_all(), sandbox="nsbox")
    (log,) = eval(task, model="mockllm/model", display="none", log_dir=str(tmp_path), max_samples=4)
    assert log.status == "success", log.error
    assert log.samples is not None and len(log.samples) == SAMPLES
    wrong = {s.id: (s.error, s.scores) for s in log.samples if s.error or s.scores is None
             or s.scores["contains_all"].value != CORRECT}
    assert not wrong
    assert lifecycle.open_count() == 0
