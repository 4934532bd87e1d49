"""Inspect's own conformance suite for sandbox providers, run against `nsbox`.

`inspect_ai/util/_sandbox/self_check.py` holds plain async test functions
over a fixture named `sandbox_env` (its docstring says how a provider runs
them); importing them here puts them in this module's collection. Each gets
a fresh sample's environment (sample_init, then sample_cleanup whatever the
test did), so every check also shows that a sample leaves nothing behind
(tests/leakcheck.py). Checks the provider cannot pass yet are in `XFAIL`,
each with its reason (docs/inspect.md lists them too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.util import SandboxEnvironment  # noqa: E402
from inspect_ai.util._sandbox.self_check import *  # noqa: E402, F403

from sandbox.inspect import NsboxSandboxEnvironment  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.usefixtures("require_native")]

XFAIL: dict[str, str] = {}  # test name -> why the provider cannot pass it (none now)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def sandbox_env(request: pytest.FixtureRequest) -> AsyncIterator[SandboxEnvironment]:
    reason = XFAIL.get(request.node.originalname)
    if reason:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    environments = await NsboxSandboxEnvironment.sample_init("selfcheck", None, {})
    try:
        yield environments["default"]
    finally:
        await NsboxSandboxEnvironment.sample_cleanup("selfcheck", None, environments, False)
