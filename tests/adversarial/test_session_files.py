"""Attack: a process inside a Session plants links, FIFOs, devices and
directories where the caller's read_file/write_file will look, to make the
caller read or write the host, or block.

The file API resolves with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS) on
the session's root and opens O_PATH until fstat says "regular file". Each
case checks the host file the plant aims at (never read, written or
created), and the naive resolution (the caller opening
/proc/PID/root/<path>, where absolute links resolve against the caller's
root) is shown to fall for the same plant, so the test would fail on it.
"""

from __future__ import annotations

import errno as E
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import make_base_spec  # tests/, on sys.path (rootdir)

import sandbox

pytestmark = pytest.mark.integration

SECRET = b"host secret, never to be read through a session\n"


@pytest.fixture
def host(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o644)
    return tmp_path


@pytest.fixture
def session(require_native: None) -> Iterator[sandbox.Session]:
    with sandbox.Session(make_base_spec()) as s:
        yield s


def plant(s: sandbox.Session, script: str) -> None:
    done = s.exec(["sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def naive_read(s: sandbox.Session, path: str) -> bytes:
    """What a caller that joins /proc/PID/root and the path would read."""
    return Path(f"/proc/{s.pid}/root{path}").read_bytes()


def finishes(op: Callable[[], object], seconds: float = 5.0) -> BaseException | None:
    """Run `op` in a thread: the exception it raised (None if none); fails if it blocks."""
    raised: list[BaseException | None] = []

    def target() -> None:
        try:
            op()
            raised.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            raised.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "the file API blocked"
    return raised[0]


def test_planted_links_never_lead_out(session: sandbox.Session, host: Path) -> None:
    secret = host / "secret"
    depth = "../" * 12
    plant(session, f"ln -s {secret} /tmp/abs; ln -s {depth}{str(secret).lstrip('/')} /tmp/rel; "
                   f"mkdir -p /tmp/d; ln -s / /tmp/d/up; ln -s /proc/1/root{secret} /tmp/magic; "
                   "ln -s loop1 /tmp/loop2; ln -s loop2 /tmp/loop1")
    assert naive_read(session, "/tmp/abs") == SECRET  # the attack is real for a naive caller
    for path in ("/tmp/abs", "/tmp/rel", f"/tmp/d/up{secret}", f"/../../..{secret}", f"/tmp/d/../../..{secret}",
                 f"../../../../..{secret}"):
        with pytest.raises(FileNotFoundError):
            session.read_file(path)
    with pytest.raises(OSError) as info:
        session.read_file("/tmp/magic")
    assert info.value.errno in (E.ELOOP, E.ENOENT, E.EXDEV)
    with pytest.raises(OSError) as info:
        session.read_file("/tmp/loop1")
    assert info.value.errno == E.ELOOP


def test_planted_links_never_write_out(session: sandbox.Session, host: Path) -> None:
    secret, victim = host / "secret", host / "created"
    plant(session, f"ln -s {secret} /tmp/abs; ln -s {victim} /tmp/new; "
                   f"ln -s {'../' * 12}{str(host).lstrip('/')} /tmp/dir")
    for path in ("/tmp/abs", "/tmp/new", "/tmp/dir/created", f"/../..{victim}"):
        try:
            session.write_file(path, b"overwritten", parents=True)
        except OSError:
            pass
    assert secret.read_bytes() == SECRET
    assert not victim.exists()
    assert sorted(p.name for p in host.iterdir()) == ["secret"]
    # what did get written stayed inside the session, at the path the links name there
    assert session.read_file(str(victim)) == b"overwritten"
    assert naive_read(session, str(victim)) == b"overwritten"


def test_fifos_are_refused_without_opening_them(session: sandbox.Session) -> None:
    writer = session.start(["sh", "-c", "mkfifo /tmp/fifo /tmp/wfifo && echo ready && echo x > /tmp/fifo"],
                           stdout=sandbox.PIPE)
    assert writer.stdout is not None and writer.stdout.readline() == b"ready\n"
    for op in (lambda: session.read_file("/tmp/fifo"), lambda: session.read_file("/tmp/wfifo"),
               lambda: session.write_file("/tmp/wfifo", b"x"), lambda: session.write_file("/tmp/fifo", b"x")):
        exc = finishes(op)
        assert isinstance(exc, OSError) and exc.errno == E.EINVAL and "FIFO" in str(exc)
    assert writer.poll() is None, "the FIFO was opened: its writer was released"
    writer.kill()
    writer.wait()
    writer.stdout.close()


def test_devices_sockets_and_directories_are_refused(session: sandbox.Session) -> None:
    plant(session, "ln -s /dev/zero /tmp/zero; ln -s /usr /tmp/usr; "
                   "python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"/tmp/sock\")'")
    for path in ("/dev/zero", "/dev/null", "/tmp/zero", "/dev/tty", "/tmp/sock"):
        exc = finishes(lambda p=path: session.read_file(p))  # type: ignore[misc]
        assert isinstance(exc, OSError) and exc.errno in (E.EINVAL, E.ENOENT), (path, exc)
        exc = finishes(lambda p=path: session.write_file(p, b"x"))  # type: ignore[misc]
        assert isinstance(exc, OSError) and exc.errno in (E.EINVAL, E.ENOENT), (path, exc)
    for path in ("/tmp", "/tmp/usr", "/"):
        with pytest.raises(IsADirectoryError):
            session.read_file(path)
        with pytest.raises(IsADirectoryError):
            session.write_file(path, b"x")
