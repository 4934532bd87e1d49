"""cliserver/server.py: the server's notes (one line per client) stay bounded for a server that serves for days."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.cliserver import server


def test_the_notes_start_afresh_past_their_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "NOTES_MAX", 200)
    import os

    log = tmp_path / "notes.log"
    notes = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    s = server.Server(os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), "s.sock", None, notes=notes)
    try:
        for i in range(100):
            s.note(f"pid {i}: runs the plan itself")
            assert log.stat().st_size <= 200 + 40
        lines = log.read_text().splitlines()
        assert lines and lines[-1] == "pid 99: runs the plan itself"  # the latest are kept
        assert all(line.endswith(": runs the plan itself") for line in lines)  # whole lines, from the start
    finally:
        s.close()
