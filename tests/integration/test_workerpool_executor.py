"""WorkerPool as a concurrent.futures.Executor: what CPython's own executor tests
(Lib/test/test_concurrent_futures.py) check of every executor, checked here.

Deliberate differences (docs/workerpool.md): a crashed task raises TaskError
and the pool goes on (ProcessPoolExecutor breaks); replies are loaded with an
allowlist; a BaseException that is not an Exception comes back as TaskExit;
there is no initializer (preload imports modules in the zygote instead).
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import os
import time
import weakref
from collections.abc import Iterator

import pytest
from conftest import make_base_spec

import sandbox

pytestmark = pytest.mark.integration


def mul(x: int, y: int) -> int:
    return x * y


def sleep_and_raise(t: float) -> None:
    time.sleep(t)
    raise Exception("this is an exception")


@pytest.fixture
def pool() -> Iterator[sandbox.WorkerPool]:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(), 4) as p:
        yield p


def finished(result: object = None, exception: BaseException | None = None) -> cf.Future[object]:
    future: cf.Future[object] = cf.Future()
    future.set_running_or_notify_cancel()
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)
    return future


def test_wait_first_completed(pool: sandbox.WorkerPool) -> None:
    quick, slow = pool.submit(mul, 21, 2), pool.submit(time.sleep, 1.5)
    cancelled: cf.Future[object] = cf.Future()
    cancelled.cancel()
    done, pending = cf.wait([cancelled, quick, slow], return_when=cf.FIRST_COMPLETED)
    assert done == {quick} and pending == {cancelled, slow}


def test_wait_first_exception(pool: sandbox.WorkerPool) -> None:
    ok, failing, slow = pool.submit(mul, 2, 21), pool.submit(sleep_and_raise, 0.5), pool.submit(time.sleep, 3)
    done, pending = cf.wait([ok, failing, slow], return_when=cf.FIRST_EXCEPTION)
    assert done == {ok, failing} and pending == {slow}
    already_failed = finished(exception=OSError())
    done, pending = cf.wait([already_failed, pool.submit(time.sleep, 2)], return_when=cf.FIRST_EXCEPTION)
    assert done == {already_failed}


def test_wait_all_completed(pool: sandbox.WorkerPool) -> None:
    futures = [finished(42), finished(exception=OSError()), pool.submit(divmod, 2, 0), pool.submit(mul, 2, 21)]
    done, pending = cf.wait(futures, return_when=cf.ALL_COMPLETED)
    assert done == set(futures) and not pending
    assert isinstance(futures[2].exception(), ZeroDivisionError) and futures[3].result() == 42


def test_as_completed_with_duplicates_and_timeout(pool: sandbox.WorkerPool) -> None:
    quick = pool.submit(mul, 2, 3)
    assert list(cf.as_completed([quick, quick], timeout=60)) == [quick]
    slow = pool.submit(time.sleep, 5)
    with pytest.raises(cf.TimeoutError):
        list(cf.as_completed([slow], timeout=0.2))


def test_map(pool: sandbox.WorkerPool) -> None:
    assert list(pool.map(pow, range(10), range(10))) == [pow(i, i) for i in range(10)]
    assert list(pool.map(pow, range(10), range(10), chunksize=3)) == [pow(i, i) for i in range(10)]
    results = pool.map(divmod, [1, 1, 1], [1, 0, 1])
    assert next(results) == (1, 0)
    with pytest.raises(ZeroDivisionError):
        next(results)
    with pytest.raises(cf.TimeoutError):
        list(pool.map(time.sleep, [0, 0, 5], timeout=1))
    assert list(pool.map(abs, [])) == []


def test_run_after_shutdown_raises(pool: sandbox.WorkerPool) -> None:
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(pow, 2, 5)


def test_shutdown_waits_for_every_submitted_task() -> None:
    """CPython's issue 12364: many tasks, then shutdown(): every one completes."""
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    pool = sandbox.WorkerPool(make_base_spec(), 2)
    futures = [pool.submit(time.sleep, 0.01) for _ in range(50)]
    pool.shutdown()
    assert [f.result(timeout=0) for f in futures] == [None] * 50


def test_shutdown_cancel_futures() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    pool = sandbox.WorkerPool(make_base_spec(), 1)
    futures = [pool.submit(time.sleep, 0.5) for _ in range(5)]
    pool.shutdown(cancel_futures=True)
    assert futures[0].result(timeout=0) is None
    assert sum(f.cancelled() for f in futures) >= 3


def test_a_dropped_pool_shuts_down() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    pool = sandbox.WorkerPool(make_base_spec(), 2)
    assert list(pool.map(abs, range(-3, 3))) == [3, 2, 1, 0, 1, 2]
    thread, zygote = pool._engine.thread, pool.pid
    ref = weakref.ref(pool)
    del pool
    gc.collect()
    assert ref() is None
    thread.join(timeout=30)
    assert not thread.is_alive()
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # its sandbox's pid 1 is reaped by the pool's thread
            os.kill(zygote, 0)
            time.sleep(0.05)


@pytest.mark.parametrize("count", [0, -1])
def test_max_workers_must_be_positive(count: int) -> None:
    with pytest.raises(ValueError):
        sandbox.WorkerPool(make_base_spec(), count)


def test_cancel_and_callbacks(pool: sandbox.WorkerPool) -> None:
    running = pool.submit(time.sleep, 0.5)
    seen: list[object] = []
    failing = pool.submit(divmod, 1, 0)
    failing.add_done_callback(lambda f: seen.append(type(f.exception())))
    assert not running.cancel()  # started at submit (a slot was free): too late to cancel
    assert running.result(timeout=60) is None
    cf.wait([failing], timeout=60)
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [ZeroDivisionError]
    later: list[object] = []
    failing.add_done_callback(lambda f: later.append(f))  # added after done: called at once
    assert later == [failing]
