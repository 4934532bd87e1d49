"""killed_by (issue 39, item 2): one decision (sandbox.killedby), the same on every executor.

The same event gives the same answer under sandbox.run's backends (native,
bwrap, a Template) and as a WorkerPool task: "cpu" (RLIMIT_CPU), "memory"
(the cgroup's OOM killer), "pids" (a fork refused at the limit), "timeout",
"output" (the output cap's kill). Every test runs with a CPU hog beside it
(a busy process the test starts and ends): the CPU rule once failed under
load, accepting only 0.05 s between the cgroup's CPU time and the limit.
The kernel's limit hits count whatever the exit status: a command that
exits 0 after one of its processes was OOM-killed reports "memory". A
sandbox without a cgroup reports the kernel's rusage of its processes
(CPU time, peak RSS), with counted_by "rusage" (bwrap excepted: see docs/limits.md).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from forkbomb import FORK_BOMB, fork_bomb

import sandbox
from sandbox import Limits
from sandbox.cgroups import host_cgroups
from sandbox.presets import python_interpreter
from sandbox.workerpool import TaskError, TaskTimeoutError

pytestmark = pytest.mark.integration
INFO = host_cgroups()
needs_cgroups = pytest.mark.skipif(INFO.controllers != {"memory", "pids", "cpu"},
                                   reason=f"no cgroup limits for this caller: {INFO.reason}")
PY = sys.executable
SPIN = "while True: pass"
TOUCH = "x = b'x' * (300 << 20)\nprint('touched')"  # 300 MB, every page written


@pytest.fixture(autouse=True)
def cpu_hog() -> Iterator[None]:
    """A busy process beside the test (load), ended by the test."""
    hog = subprocess.Popen([PY, "-c", SPIN], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


@pytest.fixture(params=["native", "bwrap", "template"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ok, why = sandbox.backends.availability(request.param)
    if not ok:
        pytest.skip(f"{request.param}: {why}")
    yield str(request.param)
    if request.param == "template":
        from sandbox.backends.template import BACKEND

        BACKEND.close()


def spec(**limits: object) -> sandbox.Spec:
    return python_interpreter(limits=Limits(**limits))  # type: ignore[arg-type]


def run(backend: str, argv: list[str], sp: sandbox.Spec, **kw: object) -> sandbox.CompletedProcess:
    return sandbox.run(argv, sp, backend=backend, capture_output=True, timeout=120, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- sandbox.run's backends

@pytest.mark.parametrize("walls", ["rlimits", "cgroup"])
def test_cpu_limit_under_load(backend: str, walls: str) -> None:
    if walls == "cgroup" and INFO.controllers != {"memory", "pids", "cpu"}:
        pytest.skip(INFO.reason)
    extra = {"memory_mb": 512} if walls == "cgroup" else {}
    for _ in range(3):  # each run on a loaded host: the rule must hold every time
        r = run(backend, [PY, "-c", SPIN], spec(cpu_s=1, **extra))
        assert r.returncode in (-signal.SIGKILL, -signal.SIGXCPU), r
        assert r.killed_by == "cpu", (r.killed_by, r.usage)


@needs_cgroups
def test_memory(backend: str) -> None:
    r = run(backend, [PY, "-c", TOUCH], spec(memory_mb=100))
    assert (r.returncode, r.killed_by) == (-signal.SIGKILL, "memory"), (r, r.usage)


@needs_cgroups
def test_memory_after_exit_0(backend: str) -> None:
    r = run(backend, ["sh", "-c", f"{PY} -c \"{TOUCH}\"; ls / >/dev/null"], spec(memory_mb=100))
    assert r.returncode == 0 and b"touched" not in r.stdout, r
    assert r.killed_by == "memory", r.usage


@needs_cgroups
def test_pids(backend: str) -> None:
    r = run(backend, [PY, "-c", FORK_BOMB], spec(nproc=8))
    assert r.returncode == 0 and 0 < int(r.stdout) < 8, r
    assert r.killed_by == "pids", r.usage


def test_timeout(backend: str) -> None:
    with pytest.raises(subprocess.TimeoutExpired) as info:
        sandbox.run(["sleep", "30"], spec(), backend=backend, capture_output=True, timeout=0.5)
    assert info.value.killed_by == "timeout"  # type: ignore[attr-defined]


def test_output(backend: str) -> None:
    r = run(backend, [PY, "-c", "import sys\nwhile True: sys.stdout.write('x' * 65536)"], spec(),
            max_output=1 << 20, on_overflow="kill")
    assert (r.returncode, r.killed_by, len(r.stdout)) == (-signal.SIGKILL, "output", 1 << 20)


def test_a_plain_end_is_no_limit_and_usage_counts_without_cgroups(backend: str) -> None:
    code = "x = b'x' * (40 << 20)\nt = sum(range(3_000_000))"
    r = run(backend, [PY, "-c", code], spec(cpu_s=30))  # rlimits only: no cgroup
    assert (r.returncode, r.killed_by) == (0, None)
    assert r.usage is not None and r.usage.mechanism == "rlimit"
    if backend == "bwrap":  # bwrap's monitor exits before the sandbox's pid 1 is reaped: nothing counts it
        assert r.usage.counted_by is None
        return
    assert r.usage.counted_by == "rusage"
    assert r.usage.cpu_s is not None and r.usage.cpu_s > 0.01
    assert r.usage.memory_peak_mb is not None and 40 <= r.usage.memory_peak_mb < 400


def test_the_callers_kill_is_no_limit(backend: str) -> None:
    with sandbox.spawn([PY, "-c", SPIN], spec(cpu_s=30), backend=backend) as proc:
        proc.kill()
    assert (proc.returncode, proc.killed_by) == (-signal.SIGKILL, None)


# ---------------------------------------------------------------- a WorkerPool task: the same answers

def spin() -> None:
    while True:
        pass


def touch() -> int:
    return len(b"x" * (300 << 20))


def touch_in_a_child() -> str:
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", "x = b'x' * (300 << 20)"], check=False)
    return "survived"


def loud() -> None:
    import sys

    while True:
        sys.stdout.write("x" * 65536)


@pytest.fixture
def pool_of() -> Iterator[object]:
    if not sandbox.probe().native:
        pytest.skip("WorkerPool needs the native backend")
    made: list[sandbox.WorkerPool] = []

    def make(**kw: object) -> sandbox.WorkerPool:
        limits = {k: kw.pop(k) for k in ("cpu_s", "memory_mb", "nproc") if k in kw}
        made.append(sandbox.WorkerPool(spec(**limits), 1, **kw))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for p in made:
        p.shutdown()


@pytest.mark.parametrize("walls", ["rlimits", "cgroup"])
def test_workerpool_cpu(pool_of: object, walls: str) -> None:
    if walls == "cgroup" and INFO.controllers != {"memory", "pids", "cpu"}:
        pytest.skip(INFO.reason)
    pool = pool_of(cpu_s=1, **({"memory_mb": 512} if walls == "cgroup" else {}))  # type: ignore[operator]
    for _ in range(3):
        f = pool.submit(spin)
        with pytest.raises(TaskError) as info:
            f.result(timeout=120)
        assert info.value.killed_by == f.killed_by == "cpu", (info.value, f.usage)


@needs_cgroups
def test_workerpool_memory_also_after_a_normal_return(pool_of: object) -> None:
    pool = pool_of(memory_mb=100)  # type: ignore[operator]
    f = pool.submit(touch)
    with pytest.raises(TaskError) as info:
        f.result(timeout=120)
    assert info.value.killed_by == "memory"
    g = pool.submit(touch_in_a_child)
    assert g.result(timeout=120) == "survived" and g.killed_by == "memory", g.usage


@needs_cgroups
def test_workerpool_pids(pool_of: object) -> None:
    f = pool_of(nproc=8).submit(fork_bomb)  # type: ignore[operator]
    assert 0 < f.result(timeout=120) < 8
    assert f.killed_by == "pids", f.usage  # as under sandbox.run's backends (test_pids)


def test_workerpool_timeout_and_output(pool_of: object) -> None:
    pool = pool_of(max_output=1 << 20, on_overflow="kill")  # type: ignore[operator]
    f = pool.submit_task(spin, timeout=0.5)
    with pytest.raises(TaskTimeoutError) as timed:
        f.result(timeout=120)
    assert timed.value.killed_by == f.killed_by == "timeout"
    g = pool.submit(loud)
    with pytest.raises(TaskError) as loud_info:
        g.result(timeout=120)
    assert loud_info.value.killed_by == g.killed_by == "output" and len(g.stdout) == 1 << 20


def allocate() -> int:
    x = b"x" * (40 << 20)
    return sum(range(3_000_000)) + len(x)


def test_workerpool_usage_counts_without_cgroups(pool_of: object) -> None:
    f = pool_of(cpu_s=30).submit(allocate)  # type: ignore[operator]  # rlimits only: no cgroup
    assert f.result(timeout=120) > 0 and f.killed_by is None
    assert f.usage is not None and (f.usage.mechanism, f.usage.counted_by) == ("rlimit", "rusage"), f.usage
    assert f.usage.cpu_s is not None and f.usage.cpu_s > 0.01
    assert f.usage.memory_peak_mb is not None and 40 <= f.usage.memory_peak_mb < 400
