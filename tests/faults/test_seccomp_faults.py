"""Every setup step made to fail in turn, on every backend, by a seccomp filter.

For each fault of table.FAULTS a helper process (inject.py) starts a
sandbox once normally, then installs a filter failing one syscall with
EIO and starts it again: the native setup child, bwrap and sandbox-launch
(the blob executor) inherit the filter, so exactly that step fails. The helper reports what was raised and
its own ledger before and after (fds, threads, children, mounts, namespace
fds, the pool's books). Here we check: the right typed error naming the
step and the errno, nothing leaked in the helper, the command never ran and
nothing with its marker survives the helper.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import new_marker, pids_with_marker, wait_until
from table import FAULTS, Fault

from sandbox import backends

HELPER = Path(__file__).with_name("inject.py")
BACKENDS = ("native", "bwrap", "blob")


def inject(fault: Fault, backend: str, marker: str) -> dict:
    """Run the helper for `fault` on `backend`; its JSON report."""
    proc = subprocess.run([sys.executable, str(HELPER), json.dumps(fault.request(backend, marker))],
                          capture_output=True, text=True, timeout=180, cwd=HELPER.parent,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, f"helper failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def require(backend: str) -> None:
    ok, reason = backends.availability(backend)
    if not ok:
        pytest.skip(f"{backend} backend unavailable: {reason}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_a_failing_step_raises_its_typed_error_and_leaks_nothing(fault: Fault, backend: str) -> None:
    require(backend)
    marker = new_marker()
    report = inject(fault, backend, marker)
    if "skip" in report:
        pytest.skip(report["skip"])
    expect = fault.expect(backend)
    assert report["leaks"] == [], report
    assert wait_until(lambda: not pids_with_marker(marker), timeout=5.0), "a process of the sandbox survived"
    if expect is None:  # this backend never makes the call: the start must just work
        assert report["raised"] is None and report["returncode"] == 0, report
        return
    klass, step = expect
    assert report["raised"] == klass, report
    assert report["typed"], report
    if klass == "SetupError":
        assert report["step"] == step, report
        assert report["errno"] == fault.expected_errno(backend), report
    elif step == "refused":  # by capability (sandbox.refusal), before anything ran: it names the executor
        assert report["message"].startswith(backends.get(backend).traits.title + " "), report
    elif klass == "ExecError":
        assert report["errno"] == fault.expected_errno(backend), report
