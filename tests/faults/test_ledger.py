"""The leak accounting the fault tests and the soak rely on finds what leaks."""

from __future__ import annotations

import mmap
import os
import subprocess
import threading

from ledger import Ledger, leaks


def test_nothing_held_is_no_leak() -> None:
    before = Ledger.take()
    assert leaks(before, Ledger.take()) == []


def test_an_fd_a_thread_and_a_child_are_leaks() -> None:
    before = Ledger.take()
    fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    child = subprocess.Popen(["sleep", "60"])
    try:
        found = leaks(before, Ledger.take(wait=False))
        assert any(line.startswith("fds grew by 1") for line in found), found
        assert any(line.startswith("threads grew") for line in found), found
        assert any(str(child.pid) in line for line in found if line.startswith("child processes")), found
    finally:
        os.close(fd)
        stop.set()
        thread.join()
        child.kill()
        child.wait()
    assert leaks(before, Ledger.take()) == []


def test_rss_growth_past_the_bound_is_a_leak() -> None:
    before = Ledger.take()
    # Fresh pages of an anonymous mapping of its own, touched: resident. (A bytearray may reuse heap
    # memory earlier tests freed but malloc kept, already resident: no growth to see.)
    ballast = mmap.mmap(-1, 8 << 20)
    for offset in range(0, len(ballast), mmap.PAGESIZE):
        ballast[offset] = 1
    found = leaks(before, Ledger.take(wait=False), rss_bound_kb=1024)
    assert any(line.startswith("RSS grew") for line in found), found
    ballast.close()
