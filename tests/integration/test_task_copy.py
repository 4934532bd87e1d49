"""Handoffs: a sanitized copy of what a sandbox wrote (links out, special files, setuid/setgid dropped)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from task_helpers import PY, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

from sandbox import SpecError, task
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


def test_the_destination_that_exists_is_replaced_whole(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "new.txt").write_text("second run")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "stale.txt").write_text("first run")
    report = sanitized_copy(src, dst)  # a second run of the same task: no crash, no merge
    assert sorted(p.name for p in dst.iterdir()) == ["new.txt"] and report.copied == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing staged is left
    # A destination that is a link is replaced itself; where it pointed is left alone.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("k")
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)
    sanitized_copy(src, linked)
    assert not linked.is_symlink() and (linked / "new.txt").exists() and (elsewhere / "keep").read_text() == "k"
    # A file over a directory, and the reverse.
    sanitized_copy(src / "new.txt", dst)
    assert dst.read_text() == "second run"
    with pytest.raises(SpecError, match="dst.*exists"):
        sanitized_copy(src, dst, replace=False)
    assert dst.read_text() == "second run"


def _tree(tmp_path: Path, links: dict[str, str]) -> Path:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "f").write_text("f")
    (src / "d" / "g").write_text("g")
    for name, target in links.items():
        (src / name).symlink_to(target)
    return src


def test_links_are_decided_on_the_real_tree(tmp_path: Path) -> None:
    src = _tree(tmp_path, {
        "a": ".",                      # the top itself: inside
        "b": "a/a/../../..",           # the example: out through `a`
        "b2": "a/a/../..",             # lexically the top itself, really its parent (through `a`)
        "c": "b",                      # inside by text, dangles once `b` is gone
        "e": "d/../f",                 # inside, through a real directory
        "h": "a/d/g",                  # inside, through `a`
        "loop1": "loop2", "loop2": "loop1",
        "thru_file": "f/../f",         # ENOTDIR for the kernel
        "missing": "nothing/here",
        "d/up": "../a/d/../..",        # from d: to the top through `a`, then out
    })
    report = sanitized_copy(src, tmp_path / "copy")
    copy = tmp_path / "copy"
    kept = sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_symlink())
    assert kept == ["a", "e", "h"]
    assert (copy / "h").read_text() == "g" and (copy / "e").read_text() == "f"
    assert {p for p, _ in report.dropped} == {"b", "b2", "c", "loop1", "loop2", "thru_file", "missing", "d/up"}
    assert all(not (copy / p).is_symlink() for p, _ in report.dropped)
    # Every link left resolves inside the copy, by the kernel's own lookup.
    for name in kept:
        assert (copy / name).resolve().is_relative_to(copy.resolve())
