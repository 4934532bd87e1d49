"""A recycled Template (Template(spec, recycle=True)) with Spec limits: each
request's command enters a cgroup made for that request alone, its
sandbox's pid 1 staying out (it outlives the request, and resets the
sandbox for the next); the limits hold as in a sandbox of its own, are
reported (killed_by, usage), and the next request runs in the same sandbox,
reset, in a fresh cgroup."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import wait_until
from test_limits import FORK_BOMB, INSIDE, TOUCH, cgroup_of, leftovers, mine, needs, no_cgroup_left  # noqa: F401

import sandbox
from sandbox import Limits
from sandbox.presets import python_interpreter

pytestmark = pytest.mark.integration
PY = sys.executable
PID_NS = ["readlink", "/proc/self/ns/pid"]


def recycled(**limits: int) -> sandbox.Template:
    return sandbox.Template(python_interpreter(limits=Limits(**limits)), recycle=True)  # type: ignore[arg-type]


def served_again(t: sandbox.Template, seen: set[str]) -> bool:
    """Whether a few more requests land in a sandbox that served one of `seen` (pid namespaces): recycled."""
    for _ in range(6):
        ns = t.run(PID_NS, capture_output=True, text=True, timeout=60).stdout
        if ns in seen:
            return True
        seen.add(ns)
    return False


@needs
def test_memory_limit_holds_is_reported_and_the_sandbox_serves_on() -> None:
    with recycled(memory_mb=100) as t:
        seen = {t.run(PID_NS, capture_output=True, text=True, timeout=60).stdout}
        r = t.run([PY, "-c", TOUCH, "300"], capture_output=True, timeout=60)
        assert r.returncode == -signal.SIGKILL and b"touched" not in r.stdout, r.stderr
        assert r.killed_by == "memory", (r.killed_by, r.usage)
        assert r.usage is not None and r.usage.memory_peak_mb is not None and 90 <= r.usage.memory_peak_mb <= 110
        ok = t.run([PY, "-c", TOUCH, "10"], capture_output=True, timeout=60)
        assert ok.returncode == 0 and ok.killed_by is None, ok.stderr
        # a fresh cgroup: the last request's peak is not this one's
        assert ok.usage is not None and ok.usage.memory_peak_mb is not None and ok.usage.memory_peak_mb < 60
        assert served_again(t, seen)


@needs
def test_process_limit_holds_as_in_a_sandbox_of_its_own() -> None:
    spawned = sandbox.run([PY, "-c", FORK_BOMB], python_interpreter(limits=Limits(nproc=12)), capture_output=True,
                          timeout=60)
    with recycled(nproc=12) as t:
        for _ in range(3):  # in a sandbox recycled after the first
            r = t.run([PY, "-c", FORK_BOMB], capture_output=True, timeout=60)
            # its pid 1 counts, as sandbox-init does in a sandbox of its own: the bomb forks as many
            assert int(r.stdout) == int(spawned.stdout) and 0 < int(r.stdout) <= 10, (r.stdout, spawned.stdout)
            # the command's cgroup: its processes, pid 1 not among them
            assert r.usage is not None and r.usage.pids_peak is not None and r.usage.pids_peak <= 11, r.usage
        seen = {t.run(PID_NS, capture_output=True, text=True, timeout=60).stdout}
        assert served_again(t, seen)


@needs
def test_a_calls_own_limits_hold_in_a_recycled_sandbox() -> None:
    with recycled(memory_mb=200) as t:
        r = t.run([PY, "-c", TOUCH, "150"], limits=Limits(memory_mb=100), capture_output=True, timeout=60)
        assert r.returncode == -signal.SIGKILL and r.killed_by == "memory", (r.killed_by, r.usage)
        ok = t.run([PY, "-c", TOUCH, "150"], capture_output=True, timeout=60)
        assert ok.returncode == 0 and ok.killed_by is None, ok.stderr


@needs
def test_only_the_command_is_in_its_cgroup_and_it_holds_no_fd_of_it(procs: object) -> None:
    marker = procs.new_marker()  # type: ignore[attr-defined]
    with recycled(nproc=16) as t:
        t.run(["true"], timeout=60)
        with t.spawn([PY, "-c", INSIDE, marker], stdout=subprocess.PIPE) as p:
            inside = cgroup_of(p, procs, marker)
            assert inside == set(procs.with_marker(marker))  # type: ignore[attr-defined]
            p.kill()
        assert p.returncode == -signal.SIGKILL and p.killed_by is None
        assert t.run(["true"], timeout=60).returncode == 0
    assert wait_until(lambda: not procs.with_marker(marker), 5.0)  # type: ignore[attr-defined]


@needs
def test_each_requests_cgroup_goes_when_it_ends_not_when_the_template_does() -> None:
    with recycled(memory_mb=100, nproc=16) as t:
        t.run(["true"], timeout=60)
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(20):
            assert t.run(["true"], timeout=60).returncode == 0
        # its pid 1 lives on: nothing of a request may wait for it to exit (its cgroup, a pidfd)
        assert wait_until(lambda: not mine(leftovers()), 5.0), f"cgroups of ended requests: {mine(leftovers())}"
        assert len(os.listdir("/proc/self/fd")) <= fds
