"""Attack: links planted for the CLI server's own files (issue 36, breach 1).

The server's lock, notes and socket sit in one directory, and were opened
by path: the lock with O_CREAT, the notes truncated at each start, and
appended to by each worker, which opened them again by name for each line.
For root that directory was in the shared /tmp when /run/user/0 is absent,
and a sandbox given a writable bind of it could replace those files with
links: the next start created one file and truncated another, the next
worker appended to a third, wherever the links pointed (as root: any file).

Each link here points at a file the test owns. The server must create
nothing through a link, truncate nothing and append to nothing but its own
notes; a directory it did not make (a link, a mode other than 0700) is
refused; and root's sockets are not in the shared temporary directory.
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .cli_deputy import (  # noqa: F401  (cli_install, cli_served: the fixtures `install`, `served`)
    BIN,
    IS_ROOT,
    SYSTEM,
    TIMEOUT,
    Installation,
    clean_env,
    cli_install,
    cli_served,
    start_server,
)

pytestmark = pytest.mark.integration

PRECIOUS = "a file of the test's, never the server's\n"


def _serve(inst: Installation) -> subprocess.CompletedProcess[str] | None:
    """Start the server; its end if it refused to start (None: it serves, and the fixture ends it)."""
    inst.server = subprocess.Popen(
        [str(inst.root / "sandbox-py"), "serve", "--socket", inst.socket, "--client", inst.identity(), "--log",
         str(inst.log), "--idle", "60"],
        env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(inst.socket):
        if inst.server.poll() is not None:
            _, err = inst.server.communicate()
            return subprocess.CompletedProcess(inst.server.args, inst.server.returncode, "", err)
        assert time.monotonic() < deadline, "the server neither listened nor ended"
        time.sleep(0.02)
    return None


def _lock(inst: Installation) -> Path:
    return Path(inst.socket.removesuffix(".sock") + ".lock")


def test_a_link_planted_for_the_lock_creates_nothing(install: Installation, tmp_path: Path) -> None:
    os.makedirs(os.path.dirname(install.socket), mode=0o700, exist_ok=True)
    victim = tmp_path / "created-through-the-lock"
    _lock(install).symlink_to(victim)
    ended = _serve(install)
    assert not victim.exists(), "the server's lock was created through a planted link"
    assert ended is not None and ended.returncode == 125 and "lock" in ended.stderr, ended


def test_a_hard_link_planted_for_the_lock_is_refused(install: Installation) -> None:
    os.makedirs(os.path.dirname(install.socket), mode=0o700, exist_ok=True)
    victim = Path(str(_lock(install)) + ".victim")  # the test's, on the lock's filesystem
    victim.write_text(PRECIOUS)
    try:
        os.link(victim, _lock(install))
        ended = _serve(install)
        assert ended is not None and ended.returncode == 125, "the server took another file of the user's as its lock"
        assert victim.read_text() == PRECIOUS
    finally:
        victim.unlink()


def test_a_link_planted_for_the_notes_is_not_truncated(install: Installation, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    install.log.symlink_to(victim)
    assert _serve(install) is None
    assert install.run("run", *SYSTEM, "true").returncode == 0
    assert victim.read_text() == PRECIOUS, "the server's start truncated the file a planted link named"
    assert not install.log.is_symlink() and install.plans() == 1  # its own notes, made afresh


def test_a_link_planted_for_the_notes_while_serving_gets_no_line(served: Installation, tmp_path: Path) -> None:
    """Each worker wrote its lines by opening the notes by name: a link put there meanwhile got them."""
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    served.log.unlink()
    served.log.symlink_to(victim)
    # --sync-fd: a worker's (the Python CLI holds the fd while its sandbox runs)
    result = served.run("run", *SYSTEM, "--sync-fd", "2", "sh", "-c", "echo ran")
    assert (result.returncode, result.stdout) == (0, "ran\n"), result.stderr
    assert victim.read_text() == PRECIOUS, "a worker appended its notes to the file a planted link named"


def test_the_socket_is_never_open_to_others(install: Installation) -> None:
    """Its mode comes from the umask at bind, whatever the server's caller left (no chmod after)."""
    start_server(install, preexec=lambda: os.umask(0))
    assert stat.S_IMODE(os.lstat(install.socket).st_mode) == 0o600


@pytest.mark.parametrize("hostile", ["a link", "mode 0755"])
def test_a_hostile_directory_is_refused(tmp_path: Path, hostile: str) -> None:
    """A socket directory that is a link to ours, or open to others: the server makes nothing in it."""
    ours = tmp_path / "ours"
    ours.mkdir(mode=0o700)
    directory = tmp_path / "sockets"
    if hostile == "a link":
        directory.symlink_to(ours)
    else:
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)
    sock = directory / "cli.sock"
    result = subprocess.run(
        [str(BIN / "sandbox-py"), "serve", "--socket", str(sock), "--log", str(directory / "cli.log"), "--idle", "1"],
        env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT, cwd="/")
    assert result.returncode == 125, result
    assert "not a directory of ours" in result.stderr or "Too many levels" in result.stderr, result.stderr
    assert sorted(os.listdir(ours)) == [] and (hostile == "a link" or os.listdir(directory) == [])


@pytest.mark.skipif(not IS_ROOT, reason="root's socket directory")
def test_roots_sockets_are_not_in_the_shared_temporary_directory() -> None:
    from sandbox.cliserver import socket_dir

    where = Path(socket_dir())
    shared = {Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")}
    assert where.parent not in shared, f"root's sockets are in {where.parent}"
    st = os.stat(where.parent)
    assert st.st_uid == 0 and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH), "its parent is writable by others"


@pytest.mark.skipif(not IS_ROOT, reason="root's socket directory")
def test_roots_socket_directory_planted_as_a_link_is_not_used(install: Installation, tmp_path: Path) -> None:
    """The client makes and uses its directory only if it is ours, 0700, and not a link."""
    from sandbox.cliserver import socket_dir

    where = socket_dir()
    if os.path.lexists(where):
        pytest.skip(f"{where} exists (a server of another installation may be in it)")
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    os.symlink(target, where)
    try:
        result = install.run("run", *SYSTEM, "sh", "-c", "echo direct")
        assert (result.returncode, result.stdout) == (0, "direct\n"), result.stderr
        assert os.listdir(target) == [], "a server was started in the planted directory"
    finally:
        os.unlink(where)
