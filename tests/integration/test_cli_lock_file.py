"""`--lock-file` taken as bwrap takes it: by the sandbox's pid 1, inside its mount namespace, before the command exists.

bwrap's pid 1 opens each lock file (a path inside the sandbox) and holds a
read lock (fcntl F_SETLK, F_RDLCK) on it for the sandbox's life; Flatpak
passes one on nearly every app start, and reads it from outside to tell
whether an instance runs. The CLI once took it from outside, through
/proc/PID/root, after the start: a command that had exited already made
the run fail, and a command could run before the lock was held. Here the
command itself looks first (another process's lock must be there), a
command that exits at once never fails, a process outside sees the lock
while the command runs and not after, and a missing file fails in bwrap's
words (before the command runs on the native backend; bwrap itself lets its
child exec while its pid 1 opens the lock files). Through `python -m sandbox run` on both
backends, and through the installed client its server answers.
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import SYSTEM, TIMEOUT, Installation, clean_env, cli_install, cli_served  # noqa: F401
from test_bwrap_dropin import backend  # noqa: F401

pytestmark = pytest.mark.integration

FLOCK = "hhqqi4x"  # struct flock on 64-bit Linux
# The command's first act: is another process's read lock on /lk/file? ("held" or "free")
LOOK = ("import fcntl, struct, os; fd = os.open('/lk/file', os.O_RDWR); "
        "r = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 0, 0)); "
        "print('held' if struct.unpack('hhqqi4x', r)[0] == fcntl.F_RDLCK else 'free')")


def _held_outside(path: Path) -> bool:
    """Whether a process holds a lock that a write lock on `path` would conflict with."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(FLOCK, fcntl.F_WRLCK, 0, 0, 0, 0))
        return struct.unpack(FLOCK, got)[0] != fcntl.F_UNLCK
    finally:
        os.close(fd)


def _world(tmp_path: Path) -> tuple[list[str], Path]:
    lk = tmp_path / "lk"
    lk.mkdir()
    lk.chmod(0o777)
    (lk / "file").write_bytes(b"")
    (lk / "file").chmod(0o666)
    return [*SYSTEM, "--bind", str(lk), "/lk", "--unshare-pid", "--lock-file", "/lk/file"], lk / "file"


def _python_cli(backend: str, *args: str, **kw) -> subprocess.CompletedProcess[str]:  # noqa: F811
    return subprocess.run([sys.executable, "-m", "sandbox", "run", "--backend", backend, *args], capture_output=True,
                          text=True, timeout=TIMEOUT, cwd="/", **kw)


def test_the_lock_is_held_before_the_command_and_while_it_runs(backend: str, tmp_path: Path) -> None:  # noqa: F811
    world, lock = _world(tmp_path)
    result = _python_cli(backend, *world, "python3", "-I", "-c", LOOK)
    assert (result.returncode, result.stdout) == (0, "held\n"), result.stderr
    proc = subprocess.Popen([sys.executable, "-m", "sandbox", "run", "--backend", backend, *world, "sh", "-c",
                             "echo running; read x; exit 0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd="/")
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "running\n"
        assert _held_outside(lock)
    finally:
        proc.communicate("", timeout=TIMEOUT)
    assert proc.returncode == 0 and not _held_outside(lock)


def test_a_command_that_exits_at_once_never_fails(backend: str, tmp_path: Path) -> None:  # noqa: F811
    world, lock = _world(tmp_path)
    results = [_python_cli(backend, *world, "true") for _ in range(40)]
    assert [r.returncode for r in results] == [0] * 40, {r.stderr for r in results}
    assert not _held_outside(lock)


def test_a_missing_lock_file_fails_before_the_command(backend: str, tmp_path: Path) -> None:  # noqa: F811
    world, _ = _world(tmp_path)
    world[-1] = "/lk/missing"
    result = _python_cli(backend, *world, "sh", "-c", "echo ran")
    assert result.returncode != 0, result
    # bwrap's pid 1 opens the lock files while its child goes on to exec: with bwrap itself the
    # command can print before pid 1 dies of the missing file (and the kernel kills the command)
    assert result.stdout in (("", "ran\n") if backend == "bwrap" else ("",)), result
    assert "/lk/missing" in result.stderr and "lock file" in result.stderr, result.stderr


def test_served_forty_times(served: Installation, tmp_path: Path) -> None:
    world, lock = _world(tmp_path)
    for _ in range(40):
        result = served.run(*world, "true", name="bwrap")
        assert result.returncode == 0, result.stderr
    result = served.run(*world, "python3", "-I", "-c", LOOK, name="bwrap")
    assert (result.returncode, result.stdout) == (0, "held\n"), result.stderr
    assert served.served() == 41 and not _held_outside(lock)
