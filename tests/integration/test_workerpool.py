"""sandbox.WorkerPool: results, errors, timeouts, crashes, per-task options, the Executor API.

The functions the tasks run are defined in this module, which the sandbox
cannot import: they travel by value (cloudpickle), as __main__ functions do.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_base_spec

import sandbox
from sandbox import Bind, Dir, RoBind, SpecError, Tmpfs
from sandbox.workerpool import RemoteError, RemoteTraceback, TaskError, TaskExit, TaskTimeoutError, UnsafeResultError

pytestmark = pytest.mark.integration


@pytest.fixture
def pool() -> Iterator[sandbox.WorkerPool]:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(Dir("/work")), preload=["json"], max_workers=4) as p:
        yield p


class Boom(Exception):
    """An exception class the caller has, rebuilt from its args."""

    def __init__(self, code: int) -> None:
        super().__init__(f"boom {code}")
        self.code = code


def double(x: int) -> int:
    return 2 * x


def raise_value_error() -> None:
    raise ValueError("bad value")


def raise_boom() -> None:
    raise Boom(7)


def shout(text: str) -> str:
    print(text)
    print("to stderr", file=sys.stderr)
    return text.upper()


def exit_with(code: int) -> None:
    os._exit(code)


def segfault() -> None:
    import ctypes

    ctypes.string_at(0)


def identity_and_env() -> tuple[int, int, str | None, str]:
    return os.getpid(), os.getuid(), os.environ.get("TASK_VAR"), os.getcwd()


def write_file(path: str, text: str) -> str:
    Path(path).write_text(text)
    return Path(path).read_text()


def test_results_and_map(pool: sandbox.WorkerPool) -> None:
    assert pool.submit(double, 21).result(timeout=60) == 42
    assert list(pool.map(double, range(10))) == [2 * i for i in range(10)]
    assert pool.submit(lambda a, b=1: a + b, 1, b=2).result(timeout=60) == 3


def test_closure(pool: sandbox.WorkerPool) -> None:
    factor = 3

    def scaled(x: int) -> int:
        return factor * x

    assert pool.submit(scaled, 5).result(timeout=60) == 15


def test_exception_with_remote_traceback(pool: sandbox.WorkerPool) -> None:
    fut = pool.submit(raise_value_error)
    with pytest.raises(ValueError, match="bad value") as info:
        fut.result(timeout=60)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in raise_value_error" in cause.tb and "ValueError: bad value" in cause.tb


def test_exception_of_a_caller_class(pool: sandbox.WorkerPool) -> None:
    with pytest.raises(Boom) as info:
        pool.submit(raise_boom).result(timeout=60)
    assert info.value.code == 7
    assert "raise_boom" in info.value.__cause__.tb  # type: ignore[union-attr]


def test_stdout_and_stderr_per_task(pool: sandbox.WorkerPool) -> None:
    futs = [pool.submit(shout, f"task {i}") for i in range(4)]
    for i, fut in enumerate(futs):
        assert fut.result(timeout=60) == f"TASK {i}"
        assert fut.stdout == f"task {i}\n".encode()
        assert fut.stderr == b"to stderr\n"


def test_task_is_pid_1_with_the_callers_ids_env_and_cwd(pool: sandbox.WorkerPool) -> None:
    pid, uid, var, cwd = pool.submit_task(identity_and_env, env={"TASK_VAR": "x"}).result(timeout=60)
    assert (pid, uid, var) == (1, os.getuid(), "x")
    assert pool.submit(identity_and_env).result(timeout=60)[2] is None  # env is per task


def test_exit_crash_and_hang_do_not_harm_the_pool(pool: sandbox.WorkerPool) -> None:
    with pytest.raises(TaskError) as info:
        pool.submit(exit_with, 3).result(timeout=60)
    assert info.value.returncode == 3
    with pytest.raises(TaskError) as info:
        pool.submit(segfault).result(timeout=60)
    assert info.value.returncode == -11
    start = time.monotonic()
    with pytest.raises(TaskTimeoutError) as timed_out:
        pool.submit_task(time.sleep, (100,), timeout=0.5).result(timeout=60)
    assert time.monotonic() - start < 30 and timed_out.value.returncode == -9
    with pytest.raises(TaskExit) as raised:  # never SystemExit itself: it would end the caller's loop
        pool.submit(sys.exit, 4).result(timeout=60)
    assert isinstance(raised.value.exception, SystemExit) and raised.value.exception.code == 4
    assert pool.submit(double, 1).result(timeout=60) == 2


def die_of(how: str) -> None:
    import signal as _signal

    if how == "abort":
        os.abort()
    elif how == "raise-segv":
        _signal.raise_signal(_signal.SIGSEGV)
    elif how == "kill-term":
        os.kill(os.getpid(), _signal.SIGTERM)
    time.sleep(5)  # not reached: each of these ends the task


@pytest.mark.parametrize(("how", "signum"), [("abort", 6), ("raise-segv", 11), ("kill-term", 15)])
def test_a_task_dies_of_the_signal_it_raises(pool: sandbox.WorkerPool, how: str, signum: int) -> None:
    """A task is pid 1 of its sandbox, which the kernel never lets die of its own signals: it still
    reports the one it died of (os.abort() gave -11, a raised SIGSEGV did nothing)."""
    with pytest.raises(TaskError) as info:
        pool.submit(die_of, how).result(timeout=60)
    assert info.value.returncode == -signum, info.value
    assert pool.submit(double, 2).result(timeout=60) == 4


def test_timeout_kills_the_whole_task_sandbox(pool: sandbox.WorkerPool, procs) -> None:
    marker = procs.new_marker()

    def spawn_and_hang() -> None:
        subprocess.Popen(["sleep", "1000", marker], start_new_session=True)
        time.sleep(1000)

    with pytest.raises(TaskTimeoutError):
        pool.submit_task(spawn_and_hang, timeout=1.0).result(timeout=60)
    assert procs.wait_until(lambda: not procs.sleepers(marker), timeout=10)


def test_per_task_binds(pool: sandbox.WorkerPool, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out = pool.submit_task(write_file, ("/work/out.txt", "hello"), binds=[Bind(str(work), "/work")])
    assert out.result(timeout=60) == "hello"
    assert (work / "out.txt").read_text() == "hello"
    with pytest.raises(OSError):
        pool.submit_task(write_file, ("/work/again.txt", "x"), binds=[RoBind(str(work), "/work")]).result(timeout=60)
    assert not (work / "again.txt").exists()
    with pytest.raises(FileNotFoundError):  # without the bind, /work is the Spec's empty, read-only Dir
        pool.submit(Path("/work/out.txt").read_text).result(timeout=60)
    missing = str(tmp_path / "missing")
    with pytest.raises(sandbox.SetupError, match="Can't find source path"):
        pool.submit_task(double, (1,), binds=[Bind(missing, "/work")])
    assert pool.submit_task(double, (1,), binds=[Bind(missing, "/work", optional=True)]).result(timeout=60) == 2


def test_asyncio_run_in_executor(pool: sandbox.WorkerPool) -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        return list(await asyncio.gather(*(loop.run_in_executor(pool, double, i) for i in range(5))))

    assert asyncio.run(main()) == [0, 2, 4, 6, 8]


def test_random_is_reseeded_in_every_task() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(), preload=["random"], max_workers=2) as p:
        values = list(p.map(lambda _: random.random(), range(8)))
    assert len(set(values)) == len(values)


def frozen_heap() -> tuple[int, int, bool]:
    import gc

    return gc.get_freeze_count(), len(gc.get_objects(generation=2)), "json" in sys.modules


def test_the_zygotes_heap_is_frozen_before_it_forks(pool: sandbox.WorkerPool) -> None:
    """What the zygote imported (cloudpickle, the preload) is in the
    collector's permanent generation when it forks: no collection in a task
    scans those objects, which would write (copy) their pages."""
    frozen, gen2, preloaded = pool.submit(frozen_heap).result()
    assert preloaded
    assert frozen > 5_000, f"only {frozen} objects frozen"
    assert gen2 < frozen // 10, f"{gen2} objects left for the collector to scan in the oldest generation"


def test_results_are_loaded_safely() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")

    def namespace() -> object:
        import types

        return types.SimpleNamespace(a=1)

    with sandbox.WorkerPool(make_base_spec(), max_workers=1) as p:
        with pytest.raises(UnsafeResultError, match="not rebuilt without trust"):
            p.submit(namespace).result(timeout=60)
        import datetime
        import decimal

        value = {"a": [1, 2.5, "x", b"y", None, True], "d": decimal.Decimal("1.5"), "t": datetime.date(2024, 1, 2)}
        assert p.submit(lambda: value).result(timeout=60) == value
    with sandbox.WorkerPool(make_base_spec(), max_workers=1, trust_results=True) as p:
        assert p.submit(namespace).result(timeout=60).a == 1  # type: ignore[attr-defined]


def test_unknown_exception_class_comes_back_by_name(pool: sandbox.WorkerPool) -> None:
    def raise_local() -> None:
        class Local(Exception):
            pass

        raise Local("only in the task")

    with pytest.raises(RemoteError, match="Local: only in the task") as info:
        pool.submit(raise_local).result(timeout=60)
    assert isinstance(info.value.__cause__, RemoteTraceback)


def test_max_workers_queue_and_shutdown_cancel() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    p = sandbox.WorkerPool(make_base_spec(), max_workers=1)
    first = p.submit(time.sleep, 1.0)
    queued = [p.submit(double, i) for i in range(3)]
    p.shutdown(wait=True, cancel_futures=True)
    assert first.result(timeout=0) is None
    assert all(f.cancelled() for f in queued)
    with pytest.raises(RuntimeError):
        p.submit(double, 1)


def test_concurrency_is_bounded_by_max_workers() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(), max_workers=2) as p:
        start = time.monotonic()
        list(p.map(time.sleep, [0.5] * 4))
        elapsed = time.monotonic() - start
    assert 0.95 < elapsed < 30


def test_main_module_functions_work(tmp_path: Path) -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import sandbox
        from sandbox import Dev, Proc, RoBind, Spec, Symlink, Tmpfs

        def square(x):
            return x * x

        class Acc:
            def __init__(self):
                self.n = 1
            def add(self, k):
                return self.n + k

        if __name__ == "__main__":
            spec = Spec(mounts=[RoBind("/usr"), Symlink("usr/lib", "/lib"), Symlink("usr/lib64", "/lib64"),
                                Proc(), Dev(), Tmpfs("/tmp")])
            with sandbox.WorkerPool(spec, max_workers=2) as pool:
                print(list(pool.map(square, range(5))), pool.submit(Acc().add, 2).result())
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[0, 1, 4, 9, 16] 3"


@pytest.mark.parametrize("spec_fields,field", [
    ({"network": "host"}, "network"),
    ({"mounts": (RoBind("/usr"), Tmpfs("/tmp"))}, "mounts"),
    ({"die_with_parent": False}, "die_with_parent"),
])
def test_what_tasks_cannot_be_given_is_refused(spec_fields: dict, field: str) -> None:
    mounts = spec_fields.pop("mounts", None)
    spec = make_base_spec(mounts=mounts, **spec_fields) if mounts else make_base_spec(**spec_fields)
    with pytest.raises(SpecError) as info:
        sandbox.WorkerPool(spec)
    assert info.value.field == field


def test_a_broken_preload_fails_the_start() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with pytest.raises(sandbox.SandboxError, match="no_such_module"):
        sandbox.WorkerPool(make_base_spec(), preload=["no_such_module"])


def test_a_spec_whose_tasks_cannot_start_fails_the_start() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with pytest.raises(sandbox.IsolationError, match="/usr"):
        sandbox.WorkerPool(make_base_spec(probe_paths=["/usr/bin"]))


def test_futures_are_concurrent_futures(pool: sandbox.WorkerPool) -> None:
    futs = [pool.submit(double, i) for i in range(6)]
    done = {f.result() for f in concurrent.futures.as_completed(futs, timeout=60)}
    assert done == {0, 2, 4, 6, 8, 10}


def task_identity() -> tuple[int, int, int, int]:
    import ctypes
    import resource

    libc = ctypes.CDLL(None, use_errno=True)
    userns = 0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno()  # CLONE_NEWUSER
    return os.getuid(), os.getgid(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], userns


@pytest.mark.parametrize("fields,expect", [
    ({"uid": 0, "gid": 0}, lambda r: r[:2] == (0, 0)),
    ({"uid": 1234, "gid": 1234}, lambda r: r[:2] == (1234, 1234)),
    ({"limits": sandbox.Limits(nofile=64)}, lambda r: r[2] == 64),
    ({"seccomp": None}, lambda r: r[3] == 0),  # without the policy a task may make a user namespace ...
    ({"seccomp": None, "disable_userns": True}, lambda r: r[3] != 0),  # ... unless disable_userns
    ({"landlock": "best-effort"}, lambda r: r[0] == os.getuid()),
])
def test_the_specs_ids_limits_and_hardening_reach_every_task(fields: dict, expect) -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(**fields), max_workers=1) as p:
        result = p.submit(task_identity).result(timeout=60)
    assert expect(result), result


# ---------------------------------------------------------------- what concurrent.futures promises

EXIT_SCRIPT = """
import sys, time
import sandbox
from sandbox import Dev, Proc, RoBind, Spec, Symlink, Tmpfs

def slow(x):
    import time
    time.sleep(0.3)
    return x * 10

spec = Spec(mounts=[RoBind("/usr"), Symlink("usr/lib", "/lib"), Symlink("usr/lib64", "/lib64"), Proc(), Dev(),
                    Tmpfs("/tmp")])
pool = sandbox.WorkerPool(spec, 2)
for x in range(4):
    pool.submit(slow, x).add_done_callback(lambda f: print("done", f.result(), flush=True))
if sys.argv[1] == "shutdown-nowait":
    pool.shutdown(wait=False)
print("exiting", flush=True)
"""


@pytest.mark.parametrize("how", ["no-shutdown", "shutdown-nowait"])
def test_submitted_tasks_are_awaited_at_interpreter_exit(tmp_path: Path, how: str) -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    out = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "exiting" and sorted(lines[1:]) == [f"done {x * 10}" for x in range(4)], out.stdout


def test_max_workers_is_the_first_argument() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(), 2, preload=["json"]) as p:
        assert p.submit(double, 4).result(timeout=60) == 8
    with pytest.raises(SpecError) as info:
        sandbox.WorkerPool(make_base_spec(), ["json"])  # type: ignore[arg-type]
    assert info.value.field == "max_workers"


def test_an_unpicklable_call_raises_from_submit_and_the_pool_goes_on() -> None:
    """What pickling a call raises is submit()'s, whether the task would
    start at once (a spare ready) or wait behind a busy worker; nothing of it
    reaches a sandbox, and the pool goes on."""
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    import threading

    with sandbox.WorkerPool(make_base_spec(), 1, spares=2) as p:
        first = p.submit(double, 1)
        assert first.result(timeout=60) == 2
        first.usage  # noqa: B018 - its sandbox has ended: the worker is free
        for _ in range(3):  # a spare ready, the worker free
            with pytest.raises(TypeError, match="pickle"):
                p.submit(double, threading.Lock())
        busy = p.submit(time.sleep, 0.5)
        with pytest.raises(TypeError, match="pickle"):  # the worker busy
            p.submit(double, threading.Lock())
        busy.result(timeout=60)
        assert [p.submit(double, x).result(timeout=60) for x in range(3)] == [0, 2, 4]


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_shutdown_leaves_no_fd_open() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(), 1) as p:  # the first pool of a process loads what stays loaded
        p.submit(double, 1).result(timeout=60)
    before = open_fds()
    p = sandbox.WorkerPool(make_base_spec(), 2)
    assert [p.submit(double, x).result(timeout=60) for x in range(3)] == [0, 2, 4]
    p.shutdown(wait=True)
    assert open_fds() <= before


class Payload:
    """A result the caller keeps a weak reference to (trust_results: a class sent by value)."""


def make_payload() -> Payload:
    return Payload()


def test_a_done_result_is_collectable_once_its_future_is_dropped() -> None:
    import gc
    import weakref

    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(), 1, trust_results=True, spares=0) as p:
        future = p.submit(time.sleep, 0)
        future.result(timeout=60)
        holders: list[list[str]] = []
        future = p.submit(make_payload)
        # when the future completes, the pool's own record of the task no longer points at it
        future.add_done_callback(lambda f: holders.append([type(r).__name__ for r in gc.get_referrers(f)]))
        ref = weakref.ref(future.result(timeout=60))
        del future
        gc.collect()
        assert ref() is None, gc.get_referrers(ref())
        assert holders and "Task" not in holders[0], holders


def boom_here(x: int) -> None:
    y = x + 1
    raise ValueError(f"bad {y}")


def test_a_remote_traceback_shows_the_source_of_code_sent_by_value(pool: sandbox.WorkerPool) -> None:
    """This module is sent by value (the sandbox cannot import it), and cloudpickle names its code
    "<dynamic-code>": the caller gives each such frame its file and source line back."""
    with pytest.raises(ValueError) as info:
        pool.submit(boom_here, 1).result(timeout=60)
    tb = str(info.value.__cause__)
    assert "<dynamic-code>" not in tb
    assert f'File "{__file__}"' in tb and 'raise ValueError(f"bad {y}")' in tb, tb


def test_what_the_sandbox_cannot_import_by_name_is_sent_by_value(tmp_path: Path) -> None:
    """A module is sent by reference only if the zygote can import it by its name: a checkout's
    module beside an editable install of this package (whose directory the sandbox shows) cannot."""
    import json
    import types

    from sandbox.workerpool.interpreter import importable_inside

    assert importable_inside(json) and importable_inside(sys.modules["sandbox.workerpool"])
    stray = types.ModuleType("stray_module_of_a_checkout")
    stray.__file__ = str(Path(sandbox.__file__).parent / "tools" / "stray_module_of_a_checkout.py")  # shown inside
    sys.modules[stray.__name__] = stray
    try:
        assert not importable_inside(stray)
    finally:
        del sys.modules[stray.__name__]
    assert not importable_inside(sys.modules[__name__])
