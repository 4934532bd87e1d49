"""docs/backends.md's table of what each executor refuses is the executors' own Traits, row for row.

An executor refuses a Plan that needs a capability its `Traits` leave out (sandbox/refusal.py), so the
table is made from those declarations here and compared with the page: a capability added, or an executor
that gains or loses one, fails this test until the page says so (its message gives the table to paste).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.backends.blob import TRAITS as BLOB
from sandbox.backends.brokered import TRAITS as BROKERED
from sandbox.backends.bwrap import TRAITS as BWRAP
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.backends.template import RECYCLE_TRAITS
from sandbox.backends.template import TRAITS as TEMPLATE
from sandbox.capabilities import Capability, Traits
from sandbox.refusal import NEEDS
from sandbox.workerpool.pool import TRAITS as WORKERPOOL

PAGE = Path(__file__).resolve().parents[2] / "docs" / "backends.md"
EXECUTORS: tuple[Traits, ...] = (NATIVE, BWRAP, TEMPLATE, RECYCLE_TRAITS, WORKERPOOL, BLOB, BROKERED)
BEGIN, END = "<!-- refusals: generated from the executors' Traits -->", "<!-- /refusals -->"
REFUSED = {capability for capability, _, _ in NEEDS}
# what planning does instead for an executor without the capability (sandbox/host.py): it is refused only
# where a plan made for another executor is offered to it (the CLI client's, sandbox.cliserver.fastpath)
INSTEAD = {Capability.JOIN_POOLED_NETNS: "a fresh network namespace instead of a leased one",
           Capability.CGROUPS: "cgroup limits become rlimits"}


def cell(traits: Traits, capability: Capability) -> str:
    """One executor's answer for a Plan that needs `capability`."""
    if traits.can(capability):
        return "yes"
    because = traits.because.get(capability)
    if capability in INSTEAD:  # planning works around it: such a plan is never made for this executor
        return f"no: {because or INSTEAD[capability]}"
    return f"refused: {because}" if because else "refused"


def refusal_table() -> list[str]:
    """The Markdown table: a row per capability some executor lacks, a column per executor."""
    rows = ["| a Plan that needs an executor which ... | " + " | ".join(t.title for t in EXECUTORS) + " |",
            "|---|" + "---|" * len(EXECUTORS)]
    for capability in Capability:
        if all(t.can(capability) for t in EXECUTORS):
            continue
        rows.append(f"| {capability.value} | " + " | ".join(cell(t, capability) for t in EXECUTORS) + " |")
    return rows


def test_the_page_holds_the_executors_refusals() -> None:
    if not PAGE.is_file():
        pytest.skip(f"{PAGE} is not beside the tests (a copy of tests/ alone)")
    text = PAGE.read_text()
    assert BEGIN in text and END in text, f"docs/backends.md has lost its markers {BEGIN!r} ... {END!r}"
    documented = text.split(BEGIN, 1)[1].split(END, 1)[0].strip().splitlines()
    expected = refusal_table()
    assert documented == expected, "docs/backends.md's refusal table should read:\n" + "\n".join(expected)


def test_every_capability_an_executor_lacks_is_a_refusal() -> None:
    for capability in Capability:
        if any(not t.can(capability) for t in EXECUTORS):
            assert capability in REFUSED, f"{capability.name}: not a refusal (refusal.NEEDS)"
