"""sandbox.arun and sandbox.aspawn: a fresh sandbox for asyncio, on each
backend. Results as run() gives them; no thread per call; a timeout, a
cancelled task and an output cap each end the whole sandbox."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Callable

import pytest
from conftest import (  # tests/, on sys.path
    child_pids,
    make_base_spec,
    new_marker,
    sleep_cmd,
    sleepers,
    usable_backend,
    wait_until,
)

import sandbox
from sandbox.output import OutputLimitError

pytestmark = pytest.mark.integration


@pytest.fixture(params=["native", "bwrap"])
def backend(request: pytest.FixtureRequest) -> str:
    return usable_backend(request.param)


def run_async(main: Callable[[], object]) -> object:
    return asyncio.run(main())  # type: ignore[arg-type]


def test_arun_reports_as_run_does(backend: str) -> None:
    async def main() -> sandbox.CompletedProcess:
        return await sandbox.arun(["sh", "-c", "cat; echo err >&2; exit 3"], make_base_spec(), input="fed",
                                  capture_output=True, text=True, backend=backend, timeout=60)

    done = run_async(main)
    assert isinstance(done, sandbox.CompletedProcess)
    assert (done.returncode, done.stdout, done.stderr, done.backend) == (3, "fed", "err\n", backend)
    with pytest.raises(subprocess.CalledProcessError):
        asyncio.run(sandbox.arun(["false"], make_base_spec(), check=True, backend=backend, timeout=60))


def test_aspawn_process_and_streams(backend: str) -> None:
    async def main() -> tuple[int, bytes | None, int]:
        proc = await sandbox.aspawn(["sh", "-c", "read x; echo got $x; exit 5"], make_base_spec(),
                                    stdin=sandbox.PIPE, stdout=sandbox.PIPE, backend=backend)
        assert proc.pid > 0 and proc.backend == backend
        out, _ = await proc.communicate(b"line\n")
        return proc.returncode or 0, out, await proc.wait()

    assert run_async(main) == (5, b"got line\n", 5)


def test_many_sandboxes_at_once_without_a_thread_each(backend: str) -> None:
    counts: list[int] = []

    async def one(i: int) -> bytes:
        proc = await sandbox.aspawn(["sh", "-c", f"sleep 0.3; echo {i}"], make_base_spec(), stdout=sandbox.PIPE,
                                    backend=backend)
        counts.append(threading.active_count())
        out, _ = await proc.communicate()
        counts.append(threading.active_count())
        return out or b""

    async def main() -> list[bytes]:
        return await asyncio.gather(*(one(i) for i in range(8)))

    before = threading.active_count()
    assert run_async(main) == [f"{i}\n".encode() for i in range(8)]
    assert max(counts) <= before + 1  # the native reaper or the netns pool may start one helper thread, once


def test_a_timeout_kills_the_whole_sandbox(backend: str) -> None:
    marker = new_marker()
    script = f"setsid {sleep_cmd(marker)} & {sleep_cmd(marker)}"
    with pytest.raises(subprocess.TimeoutExpired):
        asyncio.run(sandbox.arun(["sh", "-c", script], make_base_spec(), timeout=1, backend=backend))
    assert wait_until(lambda: not sleepers(marker), timeout=10)


def test_cancelling_the_task_kills_the_sandbox(backend: str) -> None:
    marker = new_marker()
    before = child_pids()

    async def main() -> None:
        task = asyncio.create_task(sandbox.arun(["sh", "-c", f"setsid {sleep_cmd(marker)} & {sleep_cmd(marker)}"],
                                                make_base_spec(), backend=backend))
        assert await asyncio.to_thread(wait_until, lambda: len(sleepers(marker)) == 2, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not sleepers(marker)
    assert not (child_pids() - before)  # reaped before the cancellation went on: no zombie is left


def test_an_output_cap_raises_and_kills(backend: str) -> None:
    marker = new_marker()

    async def main() -> None:
        await sandbox.arun(["sh", "-c", f"head -c 100000 /dev/zero; {sleep_cmd(marker)}"], make_base_spec(),
                           capture_output=True, max_output=1000, on_overflow="raise", backend=backend, timeout=60)

    with pytest.raises(OutputLimitError) as caught:
        asyncio.run(main())
    assert len(caught.value.stdout or b"") == 1000
    assert wait_until(lambda: not sleepers(marker), timeout=10)
