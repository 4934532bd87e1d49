"""cliserver/rehearse.py: a spare makes the previous command line ready, and stops for a client."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from sandbox.bwrap import memo
from sandbox.bwrap.parse import parse_bwrap_args
from sandbox.cliserver import peer, rehearse

ARGV = ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--clearenv"]


@pytest.fixture
def memo_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo, "_enabled", True)
    monkeypatch.setattr(memo, "_specs", type(memo._specs)())
    monkeypatch.setattr(peer, "_own", None)  # rehearse() reads this process's fingerprint


def test_the_learned_command_line_is_ready(memo_on: None, tmp_path: Path) -> None:
    here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        rehearse.rehearse(json.dumps({"argv": ARGV, "cwd": str(tmp_path), "env": {"A": "1"}}).encode())
    finally:
        os.fchdir(here)
        os.close(here)
    assert len(memo._specs) == 1
    ready = next(iter(memo._specs.values()))
    assert parse_bwrap_args([*ARGV, "sh"], environ={"A": "1"}, cwd=str(tmp_path))[0] is ready
    assert parse_bwrap_args([*ARGV, "sh"], environ={"A": "2"}, cwd=str(tmp_path))[0] is not ready


def test_a_bad_learned_message_is_no_error(memo_on: None) -> None:
    rehearse.rehearse(b"{not json")
    rehearse.rehearse(json.dumps({"argv": ["--no-such-option"], "cwd": "/", "env": {}}).encode())
    assert not memo._specs


def test_a_client_ends_the_rehearsal_at_once(tmp_path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(tmp_path / "s"))
    listener.listen(1)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    flags = fcntl.fcntl(listener.fileno(), fcntl.F_GETFL)
    before = signal.getsignal(signal.SIGIO)
    steps = []

    def work() -> None:
        for _ in range(500):  # 5 s unless interrupted
            steps.append(1)
            time.sleep(0.01)

    connect = threading.Timer(0.2, client.connect, (str(tmp_path / "s"),))
    connect.start()
    try:
        started = time.monotonic()
        rehearse.until_client(listener, work)
        assert time.monotonic() - started < 3 and 0 < len(steps) < 300
        assert fcntl.fcntl(listener.fileno(), fcntl.F_GETFL) == flags  # O_ASYNC is off again
        assert signal.getsignal(signal.SIGIO) == before
        conn, _ = listener.accept()  # the client is still there to be served
        conn.close()
    finally:
        connect.join()
        client.close()
        listener.close()


def test_a_client_waiting_already_skips_it(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener, \
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as client:
        listener.bind(str(tmp_path / "s"))
        listener.listen(1)
        client.connect(str(tmp_path / "s"))
        ran = []
        rehearse.until_client(listener, lambda: ran.append(1))
        assert not ran
