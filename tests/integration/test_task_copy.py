"""Handoffs: a sanitized copy of what a sandbox wrote (links out, special files, setuid/setgid dropped)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from task_helpers import PY, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

from sandbox import task
from sandbox.task import Sandbox, sanitized_copy

pytestmark = pytest.mark.integration

PLANT = """
import os, socket, sys
out = sys.argv[1]
os.makedirs(out + "/sub")
open(out + "/result.txt", "w").write("42")
open(out + "/sub/s.py", "w").write("x")
os.chmod(out + "/sub/s.py", 0o6755)           # setuid + setgid
os.symlink("/etc/passwd", out + "/abs_link")   # out of the tree
os.symlink("../../x", out + "/sub/climb")      # climbs out
os.symlink("sub/s.py", out + "/inside_link")   # stays inside
os.symlink("../result.txt", out + "/sub/up")   # stays inside
os.mkfifo(out + "/fifo")
socket.socket(socket.AF_UNIX).bind(out + "/sock")
"""


def test_a_sanitized_copy_of_what_a_sandbox_wrote(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    r = task.run([PY, "-c", PLANT, str(out)], Sandbox(write=(str(out),)), backend=backend, capture_output=True)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.joinpath("sub/s.py").stat().st_mode) & 0o4000  # planted setuid
    report = sanitized_copy(str(out), str(tmp_path / "copy"))
    copy = tmp_path / "copy"
    names = sorted(str(p.relative_to(copy)) for p in copy.rglob("*"))
    assert names == ["inside_link", "result.txt", "sub", "sub/s.py", "sub/up"]
    assert (copy / "result.txt").read_text() == "42" and (copy / "inside_link").read_text() == "x"
    assert stat.S_IMODE((copy / "sub/s.py").stat().st_mode) & 0o7000 == 0
    dropped = dict(report.dropped)
    assert set(dropped) == {"abs_link", "sub/climb", "fifo", "sock"}


def test_the_destination_must_not_exist(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    with pytest.raises(FileExistsError):
        sanitized_copy(str(tmp_path / "src"), str(tmp_path / "dst"))
