"""Session.publish(): a Session of this process reached by `sandbox exec ID`
(what Inspect's connection() hands a person), gone with close()."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import make_base_spec  # tests/, on sys.path (rootdir)
from session_cli import cli, left_in

import sandbox

pytestmark = pytest.mark.integration


@pytest.fixture
def sessions_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A per-user directory of this test's own (the command lines below get it through the environment)."""
    path = tmp_path / "sessions"
    monkeypatch.setenv("SANDBOX_SESSION_DIR", str(path))
    yield str(path)


def test_a_published_session_is_reached_by_sandbox_exec(require_native: None, sessions_dir: str,
                                                         fd_count: Callable[[], int]) -> None:
    sandbox.Session(make_base_spec()).close()  # warm up: the backend keeps one fd of sandbox-init
    before = fd_count()
    with sandbox.Session(make_base_spec()) as session:
        ident = session.publish()
        session.write_file("/tmp/note", b"from the caller\n")
        done = cli("exec", ident, "--", "sh", "-c", "cat /tmp/note; echo made > /tmp/back; exit 7")
        assert (done.returncode, done.stdout) == (7, "from the caller\n"), done.stderr
        assert session.read_file("/tmp/back") == b"made\n"  # the same session, not a copy
        assert ident in cli("session", "list").stdout
        with pytest.raises(sandbox.SessionError):
            session.publish()
    assert left_in(sessions_dir) == []  # its socket went with close()
    assert fd_count() == before  # and every fd of its server: the directory's too
    assert cli("exec", ident, "--", "true").returncode != 0


def test_sandbox_session_stop_closes_a_published_session(require_native: None, sessions_dir: str) -> None:
    session = sandbox.Session(make_base_spec())
    try:
        ident = session.publish(name="mine")
        assert ident == "mine"
        assert cli("session", "stop", ident).returncode == 0
        with pytest.raises(sandbox.SessionError):
            session.exec(["true"])
    finally:
        session.close()
    assert left_in(sessions_dir) == []
