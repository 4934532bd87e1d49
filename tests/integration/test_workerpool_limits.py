"""A WorkerPool task's resource walls (issue 23): the pool's Limits as a cgroup per task.

Each task's sandbox enters a cgroup of its own, made by this process (the
zygote cannot), at its fork; its usage and the limit that ended it come back
on its TaskFuture and TaskError; no cgroup is left after the pool, or after
its caller is SIGKILLed. Every test runs with spares (forked ahead, their
cgroups made ahead) and without (each task forked with its own). Real limits
need a cgroup the caller may write (root's own, or the delegated subtree
run-tests.sh gives the unprivileged run); without one they are skipped and
the fallback's are run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import make_base_spec, wait_until
from forkbomb import fork_bomb_counted
from test_limits import INFO, leftovers, mine, needs, no_cgroup_left  # noqa: F401  (no_cgroup_left: autouse)

import sandbox
from sandbox import Limits
from sandbox.cgroups import PARENT_ENV
from sandbox.workerpool import TaskError, TaskTimeoutError

pytestmark = [pytest.mark.skipif(not sandbox.probe().native, reason="native backend unavailable"),
              pytest.mark.parametrize("spares", [0, 2], ids=["fork-per-task", "spares"])]


def pool(spares: int, **limits: object) -> sandbox.WorkerPool:
    return sandbox.WorkerPool(make_base_spec(limits=Limits(**limits)), 2, spares=spares)  # type: ignore[arg-type]


def touch(mb: int) -> int:
    """Reserve 8 GB of address space (no swap reserve), touch `mb` MB of it."""
    import mmap

    m = mmap.mmap(-1, 8 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000)  # MAP_NORESERVE
    for i in range(0, mb << 20, 4096):
        m[i] = 1
    return mb


def spin(seconds: float) -> float:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


@needs
def test_reserving_8_gb_and_touching_10_mb_runs_under_memory_100(spares: int) -> None:
    with pool(spares, memory_mb=100) as p:
        f = p.submit(touch, 10)
        assert f.result(timeout=60) == 10
    assert f.killed_by is None
    assert f.usage is not None and f.usage.mechanism == INFO.mechanism
    assert f.usage.memory_peak_mb is not None and 10 <= f.usage.memory_peak_mb <= 100
    assert f.usage.cpu_s is not None and f.usage.cpu_s > 0


@needs
def test_touching_300_mb_under_memory_100_fails_killed_by_memory_and_the_pool_goes_on(spares: int) -> None:
    with pool(spares, memory_mb=100) as p:
        f = p.submit(touch, 300)
        with pytest.raises(TaskError, match="memory limit") as info:
            f.result(timeout=60)
        assert info.value.killed_by == "memory" and f.killed_by == "memory"
        assert info.value.returncode == -9
        assert info.value.usage is not None and info.value.usage.memory_peak_mb is not None
        assert info.value.usage.memory_peak_mb <= 100.5
        assert [p.submit(touch, 5).result(timeout=60) for _ in range(3)] == [5, 5, 5]


@needs
def test_a_fork_bomb_under_nproc_32_stays_at_32(spares: int) -> None:
    with pool(spares, nproc=32) as p:
        f = p.submit(fork_bomb_counted, 500)
        forked, seen = f.result(timeout=60)
    assert 0 < forked <= 31 and seen <= 32, (forked, seen)  # the task itself counts too
    assert f.usage is not None and f.usage.pids_peak is not None and f.usage.pids_peak <= 32
    assert f.killed_by == "pids"  # it returned, but the kernel refused its forks at the limit (sandbox.killedby)


@needs
def test_each_task_has_its_own_nproc_32(spares: int) -> None:
    with pool(spares, nproc=32) as p:
        futures = [p.submit(fork_bomb_counted, 20) for _ in range(4)]
        assert [f.result(timeout=60)[0] for f in futures] == [20] * 4  # 4 x 21 > 32: not one shared wall


@needs
def test_half_a_core_holds_a_busy_loop_near_half_a_cpu(spares: int) -> None:
    with pool(spares, cpu_cores=0.5) as p:
        start = time.monotonic()
        f = p.submit(spin, 1.5)
        f.result(timeout=60)
        wall = time.monotonic() - start
    assert f.usage is not None and f.usage.cpu_s is not None
    assert 0.2 <= f.usage.cpu_s / wall <= 0.75, (f.usage.cpu_s, wall)


@needs
def test_a_timeout_is_killed_by_timeout(spares: int) -> None:
    with pool(spares, memory_mb=64) as p:
        f = p.submit_task(time.sleep, (30,), timeout=0.5)
        with pytest.raises(TaskTimeoutError) as info:
            f.result(timeout=60)
    assert info.value.killed_by == "timeout"


@needs
def test_the_tasks_cgroups_are_removed_as_they_end(spares: int) -> None:
    with pool(spares, memory_mb=64, nproc=16) as p:
        for _ in range(10):
            assert p.submit(touch, 1).result(timeout=60) == 1
        # only those made ahead, for spares (and the first fork's) are left; no task's
        assert len(mine(leftovers())) <= (2 * max(spares, 1) + 1) * len(INFO.hierarchies)
    assert wait_until(lambda: not mine(leftovers()), 5.0)


@needs
def test_no_cgroup_is_left_after_the_caller_is_sigkilled(spares: int) -> None:
    caller = textwrap.dedent(f"""
        import sys, sandbox
        sys.path.insert(0, {os.path.dirname(os.path.dirname(__file__))!r})
        from conftest import make_base_spec
        from sandbox import Limits
        with sandbox.WorkerPool(make_base_spec(limits=Limits(memory_mb=64, nproc=8)), 2, spares={spares}) as p:
            f = p.submit(print, "started", flush=True)
            f.result()
            print(f.usage.mechanism, flush=True)
            import time
            p.submit(time.sleep, 60)
            sys.stdin.read()
    """)
    child = subprocess.Popen([sys.executable, "-c", caller], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == INFO.mechanism.encode()
    assert wait_until(lambda: bool(mine(leftovers(), child.pid)), 5.0)
    child.kill()
    child.wait()
    # the next cgroup made (another process's) sweeps what a dead owner left
    later = subprocess.run([sys.executable, "-c", "import sandbox\nfrom sandbox import Limits\n"
                            "from sandbox.presets import python_interpreter\n"
                            f"sandbox.run([{sys.executable!r}, '-c', 'pass'], "
                            "python_interpreter(limits=Limits(nproc=8)))"], timeout=60)
    assert later.returncode == 0
    assert wait_until(lambda: not mine(leftovers(), child.pid), 10.0), mine(leftovers(), child.pid)


def test_without_cgroups_a_task_has_rlimits_and_says_so(spares: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PARENT_ENV, "/nonexistent/cgroup")

    def data_limit() -> int:
        import resource

        return resource.getrlimit(resource.RLIMIT_DATA)[0] >> 20

    with pool(spares, memory_mb=300) as p:
        f = p.submit(data_limit)
        assert f.result(timeout=60) == 300
    assert f.usage is not None and f.usage.mechanism == "rlimit" and f.killed_by is None


def test_a_closed_pool_never_writes_to_its_old_wake_fd(spares: int) -> None:
    """A pool's finalizer (shutdown) after its I/O thread closed the wake pipe
    wrote a byte to that fd number, which a later pool's control socket could
    hold by then (its zygote read a truncated message and exited)."""
    p = pool(spares)
    old = p._engine.wake_w
    p.shutdown()
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        os.dup2(w, old)  # what a later socket or pipe would get
        p._engine.shutdown(False)  # as the pool's finalizer does
        with pytest.raises(BlockingIOError):
            os.read(r, 1)
    finally:
        os.close(old)
        os.close(r)
        os.close(w)


@needs
def test_many_tasks_at_once_each_in_its_own_cgroup(spares: int) -> None:
    """Spares taken, spares claimed while set up, forks per task: every task
    is walled and counted, and no cgroup outlives the pool."""
    with pool(spares, memory_mb=64, nproc=16) as p:
        futures = [p.submit(fork_bomb_counted, 3) for _ in range(12)]
        assert [f.result(timeout=60)[0] for f in futures] == [3] * 12
        usages = [f.usage for f in futures]
    assert all(u is not None and u.mechanism == INFO.mechanism and u.pids_peak == 4 for u in usages), usages


@needs
def test_a_task_with_binds_of_its_own_is_walled_too(spares: int, tmp_path: object) -> None:
    work = str(tmp_path)
    os.chmod(work, 0o777)
    with sandbox.WorkerPool(make_base_spec(sandbox.Dir("/work"), limits=Limits(memory_mb=100)), 2,
                            spares=spares) as p:
        f = p.submit_task(touch, (300,), binds=[sandbox.Bind(work, "/work")])
        with pytest.raises(TaskError) as info:
            f.result(timeout=60)
        assert info.value.killed_by == "memory"
        assert p.submit_task(touch, (5,), binds=[sandbox.Bind(work, "/work")]).result(timeout=60) == 5


def test_require_cgroups_without_them_refuses_the_pool(spares: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PARENT_ENV, "/nonexistent/cgroup")
    with pytest.raises(sandbox.UnavailableError, match="require_cgroups"):
        pool(spares, memory_mb=100, require_cgroups=True)


def open_files() -> list[str]:
    import os

    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


@needs
def test_a_task_holds_no_cgroup_fd_of_its_own_or_of_a_later_task(spares: int) -> None:
    """The zygote holds the cgroup.procs fds of cgroups made ahead (later
    spares'): a task, forked from it, keeps none, nor its own (written and closed
    in its setup): it cannot move itself, or anything, between cgroups."""
    with pool(spares, memory_mb=64, nproc=16) as p:
        for _ in range(3):
            files = p.submit(open_files).result(timeout=60)
            assert not [f for f in files if "cgroup" in f or "sbx-" in f], files
