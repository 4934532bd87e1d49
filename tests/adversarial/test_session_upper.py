"""Attack: plants in a Session's kept upper directory (`upper=DIR`) that
would redirect the session's writes to a host directory of the plant's
choosing: a symlink (or a file) where a mount's subdirectory is made, a
symlink where overlayfs's upper/ is made in it, DIR writable by others or
owned by another user, and a link a session leaves in its layer for the
next session over the same directory.

Each case checks the victim directory stays empty, and the first shows the
naive use of the same plant (an Overlay whose kept upper is the planted
path, which csrc/core/mounts.c opens by path, links followed) writing into the
victim, so the test would fail on a Session that did not check the
directory (sandbox.session.cow.prepare_upper)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import make_base_spec  # tests/, on sys.path (rootdir)

import sandbox
from sandbox import Overlay, RoBind

pytestmark = pytest.mark.integration

SUB = "%2Fwork"  # the subdirectory of DIR that keeps the writes of the overlay at /work


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    (root / "f").write_text("lower\n")
    return root


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.mkdir()
    return path


@pytest.fixture
def kept(tmp_path: Path) -> Path:
    path = tmp_path / "kept"
    path.mkdir(mode=0o700)
    return path


def write_in(s: sandbox.Session, script: str) -> None:
    done = s.exec(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def refused(spec: sandbox.Spec, kept: Path, words: str) -> None:
    with pytest.raises(sandbox.SpecError) as info:
        sandbox.Session(spec, upper=kept)
    assert info.value.field == "upper" and words in info.value.problem


def test_planted_link_at_the_mount_subdirectory(require_native: None, tree: Path, victim: Path,
                                                kept: Path) -> None:
    (kept / SUB).symlink_to(victim)
    naive = make_base_spec(Overlay("/work", [tree], upper=kept / SUB))
    assert sandbox.run(["sh", "-c", "echo x > /work/new"], naive, backend="native").returncode == 0
    assert (victim / "upper" / "new").read_text() == "x\n"  # the plant works on a naive use
    for p in sorted(victim.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    refused(make_base_spec(RoBind(tree, "/work")), kept, "symlink")
    (kept / SUB).unlink()
    (kept / SUB).symlink_to(os.path.relpath(victim, kept))  # a relative link too
    refused(make_base_spec(RoBind(tree, "/work")), kept, "symlink")
    assert list(victim.iterdir()) == []


def test_planted_file_at_the_mount_subdirectory(require_native: None, tree: Path, kept: Path) -> None:
    (kept / SUB).write_text("")
    refused(make_base_spec(RoBind(tree, "/work")), kept, "not a directory")


def test_planted_link_at_upper_inside_it(require_native: None, tree: Path, victim: Path, kept: Path) -> None:
    (kept / SUB).mkdir()
    (kept / SUB / "upper").symlink_to(victim)
    with pytest.raises(sandbox.SetupError):  # overlayfs's upper/ and work/ are opened O_NOFOLLOW
        sandbox.Session(make_base_spec(RoBind(tree, "/work")), upper=kept)
    assert list(victim.iterdir()) == []


def test_directory_others_can_write(require_native: None, tree: Path, kept: Path) -> None:
    kept.chmod(0o777)
    refused(make_base_spec(RoBind(tree, "/work")), kept, "writable by others")
    kept.chmod(0o700)
    (kept / SUB).mkdir(mode=0o700)
    (kept / SUB).chmod(0o770)
    refused(make_base_spec(RoBind(tree, "/work")), kept, "writable by others")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_directory_of_another_user(require_native: None, tree: Path, kept: Path) -> None:
    os.chown(kept, 65534, 65534)
    refused(make_base_spec(RoBind(tree, "/work")), kept, "owned by uid 65534")


def test_link_left_in_the_layer_stays_inside(require_native: None, tree: Path, victim: Path, kept: Path) -> None:
    spec = make_base_spec(RoBind(tree, "/work"))
    with sandbox.Session(spec, upper=kept) as s:
        write_in(s, f"ln -s {victim} /work/out && ln -s ../../../../../../{victim} /work/rel")
    assert (kept / SUB / "upper" / "out").is_symlink()
    with sandbox.Session(spec, upper=kept) as s:
        for link in ("/work/out", "/work/rel"):
            done = s.exec(["sh", "-c", f"echo x > {link}/f"], capture_output=True, timeout=30)
            assert done.returncode != 0  # resolved in the session's root, where the victim's path is not
            with pytest.raises(FileNotFoundError):
                s.write_file(f"{link}/g", b"x")
    assert list(victim.iterdir()) == []


def test_two_sessions_never_share_the_directory(require_native: None, tree: Path, kept: Path) -> None:
    spec = make_base_spec(RoBind(tree, "/work"))
    with sandbox.Session(spec, upper=kept) as s:
        with pytest.raises(sandbox.SessionError, match="in use by another session"):
            sandbox.Session(spec, upper=kept)  # two overlays over one upper: undefined to the kernel
        write_in(s, "echo 1 > /work/f")
    with sandbox.Session(spec, upper=kept) as s:  # free again once closed
        assert s.read_file("/work/f") == b"1\n"
