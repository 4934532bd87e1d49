"""The warm NativeSandbox of the handoff's tests (tests/integration/test_avatar_handoff.py) and of its
attacks (tests/adversarial/test_handoff_peer.py): sandbox-launch handing off to a Template in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.compat import handoff
from sandbox.compat.avatar import NativeSandbox, SandboxUnavailable
from sandbox.errors import SandboxError


@pytest.fixture(name="box")
def warm_box(ws: Path) -> Iterator[NativeSandbox]:
    """A warm NativeSandbox with its Template for `ws` (the test module's workspace fixture) built;
    the handoff server (and its Templates) closed afterwards."""
    try:
        warm = NativeSandbox(warm=True)
        warm.prewarm(ws)
    except (SandboxUnavailable, SandboxError) as exc:
        handoff.close()
        pytest.skip(f"no warm template here: {exc}")
    try:
        yield warm
    finally:
        handoff.close()


def served() -> int:
    """How many launches the handoff server has served."""
    return handoff.handoff().served
