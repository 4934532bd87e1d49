"""Paths between host and sandbox: argv/env/chdir rewriting, relative(), outside()."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox import SpecError
from sandbox.task import Bind, Layout, Sandbox, Translator, outside, relative, translate

SB = Sandbox(binds=(Bind("/a/b", "/w"), Bind("/a/b/deep", "/d"), Bind("/data", "/in")),
             read=("/a/b/deep/own",), layout=Layout("/a/b", "/w"))


@pytest.mark.parametrize(("word", "expected"), [
    ("/a/b", "/w"), ("/a/b/x.py", "/w/x.py"), ("/a/bc/x", "/a/bc/x"),  # by component
    ("/a/b/deep/f", "/d/f"),  # the longest source wins
    ("/a/b/deep/own/f", "/a/b/deep/own/f"),  # a grant at its own location is more specific still
    ("--out=/a/b/r.json", "--out=/w/r.json"), ("/a/b/x:/data/y:/usr/bin", "/w/x:/in/y:/usr/bin"),
    ("PYTHONPATH=/a/b/src:/data", "PYTHONPATH=/w/src:/in"), ("relative/a/b", "relative/a/b"),
    ("http://127.0.0.1:8080/a/b", "http://127.0.0.1:8080/a/b"), ("/a/b/", "/w/"),
])
def test_words(word: str, expected: str) -> None:
    assert translate(SB, [word]) == [expected]


def test_env_values_are_rewritten() -> None:
    assert Translator.of(SB).env({"DATA": "/data/x", "N": "3"}) == {"DATA": "/in/x", "N": "3"}


def test_relative() -> None:
    assert relative(SB, "/a/b/src/m.py") == "src/m.py"
    with pytest.raises(SpecError):
        relative(SB, "/elsewhere/x")
    with pytest.raises(SpecError, match="layout"):
        relative(Sandbox(), "/x")


def test_outside(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (tmp_path / "secret").write_text("s")
    os.symlink(str(tmp_path / "secret"), ws / "link")
    sb = Sandbox(binds=(Bind(str(ws), "/w", writable=True),), layout=Layout(str(ws), "/w"))
    assert outside(sb, "sub/f.txt") == str(ws / "sub" / "f.txt")
    assert outside(sb, "/w/sub/../f") == str(ws / "f")
    with pytest.raises(SpecError, match="escapes"):
        outside(sb, "../secret")
    with pytest.raises(SpecError, match="escapes"):
        outside(sb, "/w/../etc/passwd")
    with pytest.raises(SpecError, match="link"):
        outside(sb, "link")
    with pytest.raises(SpecError, match="no bind"):
        outside(sb, "/etc/passwd")
