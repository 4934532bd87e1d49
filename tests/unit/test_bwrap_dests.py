"""dests.py on real host trees (no bwrap runs): what is refused, what is done outside, what is verified."""

from __future__ import annotations

import errno as E
import os
from pathlib import Path

import pytest

from sandbox import Bind, Chmod, Dir, File, RoBind, SetupError, Spec, Symlink, Tmpfs
from sandbox.backends.bwrap import TRAITS as BWRAP
from sandbox.backends.bwrap import dests
from sandbox.backends.bwrap.render import render_plan
from sandbox.host import HostInfo
from sandbox.plan import OpKind, Plan, compile_plan

HOST = HostInfo(executor=BWRAP, uid=os.getuid(), gid=os.getgid(), cwd="/", environ={}, pool=None)


def plan_of(*mounts: object) -> Plan:
    return compile_plan(Spec(mounts=list(mounts)), HOST)


@pytest.fixture
def box(tmp_path: Path) -> Path:
    (tmp_path / "box").mkdir()
    (tmp_path / "victim").mkdir()
    return tmp_path / "box"


@pytest.mark.parametrize("target", ["../../oldroot/x", "/oldroot/x", "../victim"])
@pytest.mark.parametrize("op", [File("/box/config/evil", b"x"), Dir("/box/config/d"), Tmpfs("/box/config/t"),
                                Chmod("/box/config/f", 0o700), Symlink("a", "/box/config/l")])
def test_a_link_on_the_way_is_refused_by_name(box: Path, target: str, op: object) -> None:
    (box / "config").symlink_to(target)
    with pytest.raises(SetupError) as info:
        dests.prepare(plan_of(Bind(str(box), "/box"), op))
    dest = op.path if isinstance(op, Chmod) else op.dest  # type: ignore[attr-defined]
    assert info.value.errno == E.ELOOP and info.value.path == dest
    assert "/box/config is a symbolic link inside a bound directory" in str(info.value)
    assert list((box.parent / "victim").iterdir()) == []


@pytest.mark.parametrize("op", [File("/box/config", b"x"), Chmod("/box/config", 0o700), Tmpfs("/box/config")])
def test_a_final_link_is_refused_where_the_op_follows_it(box: Path, op: object) -> None:
    (box / "config").symlink_to("/oldroot/etc/passwd")
    with pytest.raises(SetupError):
        dests.prepare(plan_of(Bind(str(box), "/box"), op))


def test_a_symlink_op_on_an_identical_link_is_fine_another_is_refused(box: Path) -> None:
    (box / "l").symlink_to("a")
    assert dests.prepare(plan_of(Bind(str(box), "/box"), Symlink("a", "/box/l"))).done == {1}
    with pytest.raises(SetupError, match="File exists"):
        dests.prepare(plan_of(Bind(str(box), "/box"), Symlink("b", "/box/l")))


def test_writes_are_done_outside_and_not_rendered(box: Path) -> None:
    plan = plan_of(Bind(str(box), "/box"), File("/box/a/b/f", b"data", perms=0o640), Dir("/box/d", perms=0o710),
                   Symlink("t", "/box/l"), Chmod("/box/a", 0o750), Tmpfs("/t"), File("/t/x", b"y"))
    guard = dests.prepare(plan)
    assert guard.done == {1, 2, 3, 4}
    assert (box / "a/b/f").read_bytes() == b"data"
    assert (box / "a/b/f").stat().st_mode & 0o7777 == 0o640
    assert (box / "a").stat().st_mode & 0o7777 == 0o750
    assert (box / "d").stat().st_mode & 0o7777 == 0o710
    assert os.readlink(box / "l") == "t"
    with render_plan(plan, skip=guard.done) as args:
        assert "/box/a/b/f" not in args and "/box/d" not in args and "/t/x" in args


def test_a_read_only_tree_refuses_writes_like_bwrap(box: Path) -> None:
    (box / "existing").mkdir()
    assert dests.prepare(plan_of(RoBind(str(box), "/box"), Dir("/box/existing"))).done == {1}
    for op in (File("/box/f", b"x"), Dir("/box/new"), Chmod("/box/existing", 0o700), Tmpfs("/box/new")):
        with pytest.raises(SetupError) as info:
            dests.prepare(plan_of(RoBind(str(box), "/box"), op))
        assert info.value.errno == E.EROFS
    assert sorted(p.name for p in box.iterdir()) == ["existing"]


def test_mount_points_are_made_and_the_mounts_verified(box: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    guard = dests.prepare(plan_of(Bind(str(box), "/box"), Tmpfs("/box/m/t"), RoBind(str(tmp_path / "file"), "/box/f")))
    assert (box / "m/t").is_dir() and (box / "f").is_file()
    assert [(op.kind, tree) for op, tree in guard.verify] == [(OpKind.TMPFS, "/box"), (OpKind.BIND, "/box")]


def test_nothing_inside_a_tree_nothing_to_do() -> None:
    guard = dests.prepare(plan_of(Tmpfs("/tmp"), Dir("/tmp/d"), File("/tmp/f", b"x")))
    assert guard == dests.Guard()
