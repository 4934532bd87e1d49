"""Session.read_file and write_file: contents, the errors Python users
expect, modes, owners, parents, relative paths and read-only mounts."""

from __future__ import annotations

import errno as E
from collections.abc import Iterator

import pytest
from conftest import make_base_spec  # tests/, on sys.path (rootdir)

import sandbox
from sandbox import File

pytestmark = pytest.mark.integration


@pytest.fixture
def session(require_native: None) -> Iterator[sandbox.Session]:
    with sandbox.Session(make_base_spec(File("/etc/conf", b"x=1\n", perms=0o644), cwd="/tmp")) as s:
        yield s


def sh(s: sandbox.Session, script: str) -> str:
    done = s.exec(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout  # type: ignore[no-any-return]


def test_round_trip_with_commands(session: sandbox.Session) -> None:
    session.write_file("/tmp/a", b"bytes\0here")
    assert sh(session, "od -c /tmp/a | head -1").split()[1:4] == ["b", "y", "t"]
    sh(session, "printf made > /tmp/b")
    assert session.read_file("/tmp/b") == b"made"
    assert session.read_file("/etc/conf") == b"x=1\n"
    session.write_file("rel", "text")  # relative to the session's cwd
    assert session.read_file("/tmp/rel") == b"text" and session.read_file("rel") == b"text"
    big = bytes(range(256)) * 4096
    session.write_file("/tmp/big", big)
    assert session.read_file("/tmp/big") == big
    session.write_file("/tmp/big", b"short")  # truncated in place
    assert session.read_file("/tmp/big") == b"short"


def test_mode_owner_and_parents(session: sandbox.Session) -> None:
    session.write_file("/tmp/x/y/z", b"deep", mode=0o600, parents=True)
    assert sh(session, "stat -c '%a %u %g' /tmp/x/y/z /tmp/x/y").split("\n")[:2] == [
        f"600 {sh(session, 'id -u').strip()} {sh(session, 'id -g').strip()}",
        f"755 {sh(session, 'id -u').strip()} {sh(session, 'id -g').strip()}"]
    sh(session, "echo more >> /tmp/x/y/z")  # the session's user owns what was written for it
    with pytest.raises(FileNotFoundError):
        session.write_file("/tmp/none/f", b"")


def test_errors(session: sandbox.Session) -> None:
    with pytest.raises(FileNotFoundError):
        session.read_file("/tmp/missing")
    with pytest.raises(IsADirectoryError):
        session.read_file("/tmp")
    with pytest.raises(IsADirectoryError):
        session.write_file("/tmp", b"")
    session.write_file("/tmp/file", b"1234567890")
    with pytest.raises(NotADirectoryError):
        session.read_file("/tmp/file/below")
    with sandbox.Session(make_base_spec(), writable_root=False) as readonly:
        with pytest.raises(PermissionError):
            readonly.write_file("/usr/new", b"")  # a read-only bind
        with pytest.raises(PermissionError):
            readonly.write_file("/usr/bin/sh", b"")
    with pytest.raises(OSError) as info:
        session.read_file("/tmp/file", max_bytes=4)
    assert info.value.errno == E.EFBIG
    assert session.read_file("/tmp/file", max_bytes=10) == b"1234567890"
    with pytest.raises(sandbox.SpecError):
        session.read_file("")
    with pytest.raises(sandbox.SpecError):
        session.write_file("/tmp/f", 3)  # type: ignore[arg-type]
