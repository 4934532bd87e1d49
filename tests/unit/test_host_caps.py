"""sandbox.host's reading of the caller's capabilities (planning reads it before every spawn)."""

from __future__ import annotations

import threading

from sandbox.host import effective_caps_mask


def _status_capeff() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)


def test_the_effective_set_is_what_proc_shows() -> None:
    assert effective_caps_mask() == _status_capeff()


def test_each_thread_reads_its_own_answer() -> None:
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.extend(effective_caps_mask() for _ in range(500)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results) == {_status_capeff()}
