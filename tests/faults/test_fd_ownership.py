"""An fd is closed once, by its owner.

Closing an fd number twice is harmless in a single-threaded caller and a
hazard in a threaded one: between the two closes another thread may open
something under that number, and the second close takes it away from it (the
soak, benchmarks/soak.py, found a bwrap start waiting forever on a status
pipe closed that way). pyroute2's IPRoute(fileno=fd) closes `fd` when it is
closed, so whoever hands an fd to it must not close it again.
"""

from __future__ import annotations

import os

import pytest
from conftest import make_base_spec

import sandbox
from sandbox.backends.bwrap import outside


def test_the_forwarding_check_of_bwrap_closes_each_fd_once(monkeypatch: pytest.MonkeyPatch) -> None:
    result = sandbox.probe()
    if not result.bwrap:
        pytest.skip(f"bwrap backend unavailable: {result.bwrap_reason}")
    closed_twice: list[int] = []
    real_close = outside._close

    def close_once(fd: int) -> None:
        try:
            os.fstat(fd)
        except OSError:
            closed_twice.append(fd)
        real_close(fd)

    monkeypatch.setattr(outside, "_close", close_once)
    done = sandbox.run(["true"], make_base_spec(forward={8080: 9}), backend="bwrap", capture_output=True, timeout=60)
    assert done.returncode == 0
    assert closed_twice == []
