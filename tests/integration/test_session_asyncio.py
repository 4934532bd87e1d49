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


@pytest.mark.parametrize("mode", ["tail", "head", "kill", "raise"])
def test_aexec_caps_its_output(session: sandbox.Session, mode: str) -> None:
    """10 MiB printed under a 64 KiB cap, awaited: what was kept and what was dropped by each on_overflow
    (as Session.exec's); "kill" and "raise" end the command's tree, and the session serves the next call."""
    from sandbox.output import OutputLimitError

    cap = 64 << 10
    script = "import sys; sys.stdout.write('a' + 'x' * (10 << 20) + 'z'); sys.stdout.flush()"

    async def main() -> sandbox.CompletedProcess:
        return await session.aexec(["python3", "-c", script], capture_output=True, timeout=60, max_output=cap,
                                   on_overflow=mode)

    try:
        done = asyncio.run(main())
    except OutputLimitError as exc:
        assert mode == "raise" and exc.killed_by == "output"
        assert exc.stdout is not None and len(exc.stdout) == cap and exc.stdout.startswith(b"a")
        assert exc.returncode == -signal.SIGKILL
    else:
        assert mode != "raise"
        assert done.stdout is not None and len(done.stdout) == cap
        if mode == "tail":
            assert done.returncode == 0 and done.stdout.endswith(b"xz") and done.killed_by is None
            assert done.stdout_dropped == (10 << 20) + 2 - cap
        else:
            assert done.stdout.startswith(b"ax")
            assert (done.killed_by == "output") == (mode == "kill")
            assert (done.returncode == -signal.SIGKILL) == (mode == "kill")
    assert session.exec(["true"]).returncode == 0


def test_aexec_caps_text_and_stderr(session: sandbox.Session) -> None:
    """The cap holds per stream; text mode decodes what a cut left (U+FFFD, not an error)."""
    async def main() -> sandbox.CompletedProcess:
        return await session.aexec(["sh", "-c", "printf 'é%.0s' $(seq 100) >&2; echo out"], capture_output=True,
                                   text=True, max_output=7)

    done = asyncio.run(main())
    assert done.stdout == "out\n" and done.stdout_dropped == 0
    assert len(done.stderr.encode()) >= 7 and done.stderr.endswith("ééé") and done.stderr_dropped == 193


def test_astart_caps_communicate(session: sandbox.Session) -> None:
    async def main() -> tuple[bytes | None, int]:
        proc = await session.astart(["sh", "-c", "yes | head -c 100000"], stdout=subprocess.PIPE, max_output=10,
                                    on_overflow="head")
        out, _ = await proc.communicate()
        return out, proc.stdout_dropped

    assert asyncio.run(main()) == (b"y\ny\ny\ny\ny\n", 100000 - 10)


def test_bad_caps_are_refused_before_anything_runs(session: sandbox.Session) -> None:
    async def main() -> None:
        with pytest.raises(sandbox.SpecError, match="on_overflow"):
            await session.aexec(["true"], on_overflow="truncate")
        with pytest.raises(sandbox.SpecError, match="max_output"):
            await session.astart(["true"], max_output=0)

    asyncio.run(main())
