"""Session.aexec and astart: results, concurrency without a thread per
call, timeouts and cancellation ending the command's whole tree."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
from collections.abc import Iterator

import pytest
from conftest import make_base_spec, new_marker, sleep_cmd, sleepers, wait_until  # tests/, on sys.path (rootdir)

import sandbox

pytestmark = pytest.mark.integration


@pytest.fixture
def session(require_native: None) -> Iterator[sandbox.Session]:
    with sandbox.Session(make_base_spec()) as s:
        yield s


def test_aexec_reports_like_exec(session: sandbox.Session) -> None:
    async def main() -> sandbox.CompletedProcess:
        return await session.aexec(["sh", "-c", "cat; echo err >&2; exit 4"], input="in", capture_output=True,
                                   text=True)

    done = asyncio.run(main())
    assert (done.returncode, done.stdout, done.stderr) == (4, "in", "err\n")


def test_many_calls_at_once_without_a_thread_each(session: sandbox.Session) -> None:
    threads: list[int] = []

    async def one(i: int) -> bytes:
        threads.append(threading.active_count())
        done = await session.aexec(["sh", "-c", f"sleep 0.2; echo {i}"], capture_output=True)
        return done.stdout  # type: ignore[no-any-return]

    async def main() -> list[bytes]:
        return await asyncio.gather(*(one(i) for i in range(20)))

    before = threading.active_count()
    assert asyncio.run(main()) == [f"{i}\n".encode() for i in range(20)]
    assert max(threads) == before


def test_astart_process(session: sandbox.Session) -> None:
    async def main() -> tuple[int, bytes | None]:
        proc = await session.astart(["sh", "-c", "read x; echo got $x; kill -USR1 $$"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE)
        assert proc.pid > 0
        out, _ = await proc.communicate(b"line\n")
        return await proc.wait(), out

    assert asyncio.run(main()) == (-signal.SIGUSR1, b"got line\n")


def test_cancellation_kills_the_tree(session: sandbox.Session) -> None:
    marker = new_marker()
    script = f"{sleep_cmd(marker)} & setsid {sleep_cmd(marker)} & wait"

    async def main() -> None:
        task = asyncio.create_task(session.aexec(["sh", "-c", script]))
        for _ in range(500):
            if len(sleepers(marker)) == 2:
                break
            await asyncio.sleep(0.01)
        assert len(sleepers(marker)) == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_until(lambda: not sleepers(marker), 5)
    assert session.exec(["true"]).returncode == 0


def test_a_timeout_kills_the_tree(session: sandbox.Session) -> None:
    marker = new_marker()

    async def main() -> None:
        with pytest.raises(subprocess.TimeoutExpired):
            await session.aexec(["sh", "-c", f"setsid {sleep_cmd(marker)} & wait"], timeout=0.5)

    asyncio.run(main())
    assert wait_until(lambda: not sleepers(marker), 5)


def test_exec_failures_are_raised_awaited(session: sandbox.Session) -> None:
    session.write_file("/tmp/noexec", b"#!/bin/sh\n", mode=0o644)

    async def main() -> int:
        with pytest.raises(sandbox.ExecPermissionError):
            await session.aexec(["/tmp/noexec"])
        return (await session.aexec(["no-such-command"], capture_output=True)).returncode

    assert asyncio.run(main()) == 127
