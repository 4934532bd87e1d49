"""bwrap's exit codes and stderr lines, decoded without running bwrap."""

from __future__ import annotations

import errno

import pytest

from sandbox import Chmod, Dir, RemountRo, RoBind, SetupError, Spec, Tmpfs, UnavailableError
from sandbox.backends.bwrap.messages import _error_from, decode_exit_code, last_bwrap_line
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.host import HostInfo
from sandbox.plan import Plan, compile_plan


@pytest.mark.parametrize("code, expected", [(0, 0), (1, 1), (128, 128), (129, -1), (137, -9), (143, -15),
                                            (192, -64), (193, 193), (255, 255)])
def test_exit_code_mapping(code: int, expected: int) -> None:
    # bwrap reports death by signal N as 128+N; N runs up to 64 (SIGRTMAX).
    assert decode_exit_code(code) == expected


def test_last_bwrap_line() -> None:
    data = b"noise\nbwrap: first\nmore\nbwrap: Can't mkdir /x: Read-only file system\n"
    assert last_bwrap_line(data) == "Can't mkdir /x: Read-only file system"
    assert last_bwrap_line(b"nothing here\n") is None


@pytest.mark.parametrize("data", [
    # bwrap's init and its child both fail prctl(PR_SET_SECCOMP): their writes interleave (seen under load)
    b"bwrap: prctl(PR_SET_SECCOMP): Input/output error\nbwrap: prctl(PR_SET_SECCOMP)",  # child killed mid-line
    b"bwrap: prctl(PR_SET_SECCOMP)bwrap: : Input/output error\nprctl(PR_SET_SECCOMP): Input/output error\n",
    b"bwrap: bwrap: prctl(PR_SET_SECCOMP): Input/output error\nprctl(PR_SET_SECCOMP): Input/output error\n",
])
def test_two_bwraps_dying_at_once_still_name_step_and_errno(data: bytes) -> None:
    message = last_bwrap_line(data)
    assert message == "prctl(PR_SET_SECCOMP): Input/output error"
    error = _error_from(message, _plan(), ["true"], setup_done=True)
    assert (getattr(error, "step", None), getattr(error, "errno", None)) == ("seccomp", errno.EIO)


def _plan(*mounts: object) -> Plan:
    host = HostInfo(executor=NATIVE, uid=1000, gid=1000, cwd="/", environ={}, pool=None)
    return compile_plan(Spec(mounts=list(mounts)), host)


@pytest.mark.parametrize("message, step, path", [
    # the verb names the operation where several act on one path
    ("Can't chmod 0700 /usr: Read-only file system", "chmod", "/usr"),
    ("Can't bind mount /oldroot/usr on /newroot/usr: No such file or directory", "ro_bind", "/usr"),
    ("Can't remount readonly on /usr: Operation not permitted", "remount_ro", "/usr"),
    ("Can't mount tmpfs on /newroot/tmp: No space left on device", "tmpfs", "/tmp"),
    ("Can't find source path /nope: No such file or directory", "source", "/nope"),
    ("Can't mkdir /usr/new: Read-only file system", "dir", "/usr/new"),
    ("Can't chdir to /nowhere: No such file or directory", "cwd", "/nowhere"),
    ("Creating new namespace failed: Operation not permitted", "clone", None),
    # bwrap's words for the steps the native backend names (what tests/faults injects)
    ("Failed to make / slave: Input/output error", "mount_private", None),
    ("pivot_root: Input/output error", "pivot", None),
    ("unmount old root: Input/output error", "pivot", None),
    ("prctl: Input/output error", "pdeathsig", None),
    ("prctl(PR_SET_NO_NEW_PRIVS) failed: Input/output error", "no_new_privs", None),
    ("Dropping capability 0 from bounds: Input/output error", "caps", None),
    ("capset failed: Input/output error", "caps", None),
    ("setsid: Input/output error", "session", None),
    ("Creating newroot failed: Input/output error", "newroot", None),
])
def test_a_message_names_the_failed_step_and_path(message: str, step: str, path: str | None) -> None:
    plan = _plan(RoBind("/usr"), RemountRo("/usr"), Chmod("/usr", 0o700), Tmpfs("/tmp"), Dir("/usr/new"))
    err = _error_from(message, plan, ["true"], setup_done=False)
    expected_step = "bind" if step == "ro_bind" else step  # OpKind.BIND, read-only or not
    if step == "clone":  # bwrap cannot make namespaces here: the backend is unusable
        assert isinstance(err, UnavailableError)
        return
    assert isinstance(err, SetupError)
    assert (err.step, err.path, err.backend) == (expected_step, path, "bwrap")
