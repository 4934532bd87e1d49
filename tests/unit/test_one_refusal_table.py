"""One refusal table: what an executor refuses is a row of sandbox.refusal.NEEDS, nowhere else.

Every executor (the registry's, the WorkerPool, a recycled Template, a Session) declares its capabilities in its
`Traits`; each capability one of them lacks is a row of NEEDS (or planning never makes such a plan for
it), and every function that compiles a Plan asks refusal(). A decision that refuses a Plan by testing
its fields anywhere else in sandbox/ (a list of its own, as the CLI server's fast path and Template
recycling once had) fails the scan below. Pure: reads the source and the declarations, runs nothing.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from sandbox import backends
from sandbox.backends.template import RECYCLE_TRAITS
from sandbox.capabilities import Capability, Traits
from sandbox.plan import Plan
from sandbox.refusal import NEEDS
from sandbox.session.launch import session_traits
from sandbox.workerpool.traits import TRAITS as WORKERPOOL

PACKAGE = Path(__file__).resolve().parents[2] / "sandbox"
# a walk of the ops is no refusal list; the Spec a Plan came from (`source`) is no decision
PLAN_FIELDS = {f.name for f in dataclasses.fields(Plan)} - {"ops", "source"}
COMPILERS = {"compile_plan", "compiled_plan"}  # warm_plan.plan_for_call asks refusal() itself
# a capability planning leaves out for an executor that lacks it (sandbox.host: no pool, no cgroups) rather
# than refusing: such a plan is refused only where it was made for another executor
PLANNED_AROUND = {Capability.JOIN_POOLED_NETNS, Capability.CGROUPS}
# code that tests a Plan's fields and raises, and why it is no refusal list (or whose it is to move)
NOT_REFUSALS: dict[str, str] = {}
# functions that compile a Plan without refusing it, and why
UNREFUSED = {
    "plan_cache.py:compiled_plan": "the cache of compile_plan itself",
    "session/launch.py:_spawn": "sandbox/session/'s: the Session's plan with its sync fds, refused by plan_for",
    "session/session.py:_options": "sandbox/session/'s: reads a call's cwd and env from a plan, runs none",
}


def executors() -> list[Traits]:
    """Every executor's declaration: the registry's, the WorkerPool's, a recycled Template's, a Session's."""
    declared = [backends.get(name).traits for name in (*backends.NAMES, *backends.EXPLICIT)]
    return [*declared, WORKERPOOL, RECYCLE_TRAITS, session_traits(backends.get("native").traits)]


@pytest.mark.parametrize("traits", executors(), ids=lambda t: t.name)
def test_every_capability_an_executor_lacks_is_a_row_of_needs(traits: Traits) -> None:
    rows = {capability for capability, _, _ in NEEDS}
    for capability in Capability:
        if not traits.can(capability):
            assert capability in rows or capability in PLANNED_AROUND, f"{traits.name} lacks {capability.name}"
    assert rows >= PLANNED_AROUND  # offered a plan made for another executor, it is refused all the same


def _plan_fields(node: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in ("plan", "p") and n.attr in PLAN_FIELDS} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr == "require_cgroups"}


REFUSING = {"UnavailableError", "SpecError", "Worker"}  # what a refusal raises (the fast path's Worker: "not here")


def _refuses(body: list[ast.stmt], reasons: bool) -> bool:
    """Whether `body` raises a refusal's error, or (`reasons`: in a function that returns a reason or None)
    returns words, at its own level or in an `if` of it."""
    for stmt in body:
        if isinstance(stmt, ast.Raise) and stmt.exc is not None:
            call = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
            if getattr(call, "id", getattr(call, "attr", "")) in REFUSING:
                return True
        if reasons and isinstance(stmt, ast.Return) and isinstance(stmt.value, (ast.Constant, ast.JoinedStr)):
            return stmt.value.value is not None if isinstance(stmt.value, ast.Constant) else True
        if isinstance(stmt, ast.If) and _refuses(stmt.body, reasons):
            return True
    return False


def _returns_a_reason(function: ast.FunctionDef) -> bool:
    return function.returns is not None and ast.unparse(function.returns).replace(" ", "") in ("str|None",
                                                                                           "Optional[str]")


def refusal_lists(root: Path) -> list[str]:
    """Where a module of `root` other than refusal.py refuses a Plan by its fields: `path:line`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        if where == "refusal.py" or where in NOT_REFUSALS:
            continue
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            reasons = _returns_a_reason(function)
            for node in ast.walk(function):
                header = node.test if isinstance(node, ast.If) else node.iter if isinstance(node, ast.For) else None
                if header is not None and _plan_fields(header) and _refuses(node.body, reasons):  # type: ignore
                    found.append(f"{where}:{node.lineno}")
    return sorted(set(found), key=found.index)


def test_no_refusal_list_outside_refusal_py() -> None:
    if not PACKAGE.is_dir():
        pytest.skip("the sources are not beside the tests")
    assert refusal_lists(PACKAGE) == [], "refuse by a capability and a row of sandbox.refusal.NEEDS instead"


def test_every_function_that_compiles_a_plan_asks_refusal() -> None:
    if not PACKAGE.is_dir():
        pytest.skip("the sources are not beside the tests")
    unrefused = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            called = {n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", "")
                      for n in ast.walk(node) if isinstance(n, ast.Call)}
            where = f"{path.relative_to(PACKAGE).as_posix()}:{node.name}"
            if called & COMPILERS and "refusal" not in called and where not in UNREFUSED:
                unrefused.append(where)
    assert unrefused == []


def test_the_scan_finds_the_lists_that_were(tmp_path: Path) -> None:
    """The scan sees what it must: the fast path's list, recycle_refusal's, plan_for_call's check."""
    source = '''
def _check_runnable(plan):
    for why, needs in (("a pooled network namespace", plan.network == "pool"),):
        if needs:
            raise Worker(why)

def recycle_refusal(plan) -> str | None:
    if not plan.reaper:
        return "as_pid_1: a recycled sandbox's pid 1 is the reaper that resets it"
    return None

def plan_for_call(limits, fallback):
    if limits.require_cgroups and fallback:
        raise UnavailableError("limits.require_cgroups")
'''
    (tmp_path / "old.py").write_text(source)
    assert refusal_lists(tmp_path) == ["old.py:3", "old.py:8", "old.py:13"]
