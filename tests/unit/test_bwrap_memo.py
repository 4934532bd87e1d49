"""sandbox.bwrap.memo: a command line's Spec remembered by its words, only where that is sound."""

from __future__ import annotations

import os

import pytest

from sandbox.bwrap import memo
from sandbox.bwrap.parse import parse_bwrap_args

BASE = ["--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--clearenv"]


@pytest.fixture
def enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memo, "_enabled", True)
    monkeypatch.setattr(memo, "_specs", type(memo._specs)())


def parse(args: list[str], env: dict[str, str] | None = None, cwd: str = "/") -> object:
    return parse_bwrap_args([*args, "true"], environ=env or {}, cwd=cwd, uid=1000, gid=1000)[0]


def args_fd(items: list[str]) -> str:
    r, w = os.pipe()
    os.write(w, b"".join(a.encode() + b"\0" for a in items))
    os.close(w)
    return str(r)  # parsing reads and closes it


def test_off_unless_enabled() -> None:
    assert parse(BASE) == parse(BASE) and parse(BASE) is not parse(BASE)


def test_the_same_words_and_caller_give_the_same_spec(enabled: None) -> None:
    first = parse(BASE, {"A": "1"}, "/tmp")
    assert parse(BASE, {"A": "1"}, "/tmp") is first
    assert parse_bwrap_args([*BASE, "other", "command"], environ={"A": "1"}, cwd="/tmp", uid=1000,
                            gid=1000)[0] is first  # the command is not the Spec's


@pytest.mark.parametrize("change", [
    lambda a, e, c: (a, {"A": "2"}, c),  # another environment (inherited without --clearenv)
    lambda a, e, c: (a, e, "/var"),  # another cwd (PWD, relative sources)
    lambda a, e, c: ([*a, "--tmpfs", "/tmp"], e, c),  # another option
    lambda a, e, c: (a[:-1], e, c),  # one fewer
])
def test_anything_else_is_built_again(enabled: None, change) -> None:
    args, env, cwd = [a for a in BASE if a != "--clearenv"], {"A": "1"}, "/tmp"
    first = parse(args, env, cwd)
    other = parse(*change(args, env, cwd))
    assert other is not first and other != first


def test_an_args_file_counts_by_its_content(enabled: None) -> None:
    first = parse(["--args", args_fd(BASE)])
    assert parse(["--args", args_fd(BASE)]) is first
    assert parse(BASE) is first  # the same options, whether from the file or the command line
    changed = parse(["--args", args_fd([*BASE, "--hostname", "x", "--unshare-uts"])])
    assert changed is not first and changed.hostname == "x"


@pytest.mark.parametrize("impure", [
    ["--file", "FD", "/etc/x"],  # reads an fd
    ["--ro-bind", "/usr/../usr", "/mnt"],  # '..' is resolved on the host now
    ["--info-fd", "FD"],
    ["--spec", "{}"],
])
def test_a_command_line_that_reads_the_moment_is_never_remembered(enabled: None, impure: list[str]) -> None:
    def once() -> object:
        items = [args_fd([]) if v == "FD" else v for v in impure]
        try:
            return parse([*BASE, *items])
        finally:
            for fd in (int(v) for v, was in zip(items, impure, strict=True) if was == "FD"):
                try:
                    os.close(fd)
                except OSError:
                    pass

    assert once() is not once()
    assert not memo._specs


def test_bounded(enabled: None) -> None:
    for i in range(memo.MAX_SPECS + 3):
        parse([*BASE, "--hostname", f"h{i}", "--unshare-uts"])
    assert len(memo._specs) == memo.MAX_SPECS
