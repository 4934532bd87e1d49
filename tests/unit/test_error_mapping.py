"""The C core's failure records turned into exceptions and words
(csrc/core/messages.c through sandbox._core.report): fabricated
`struct sbx_result` records for every step and every op detail, mapped to
the exception class, the step name, the path and bwrap's wording. Nothing
runs in a namespace and nothing needs privileges."""

from __future__ import annotations

import base64
import errno as E
import os
import subprocess
from typing import Any

import pytest

from sandbox import Spec
from sandbox._core import blob as wire
from sandbox._core.binding import BIN_DIR, OP_KIND_NAMES, STEP_NAMES, ffi, lib
from sandbox._core.report import describe, setup_error
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.errors import ExecError, ExecNotFoundError, ExecPermissionError, IsolationError, SetupError
from sandbox.host import HostInfo
from sandbox.mounts import Bind, Chmod, Dev, Dir, File, Proc, RemountRo, RoBind, Symlink, Tmpfs
from sandbox.plan import OpKind, Plan, compile_plan

HOST = HostInfo(executor=NATIVE, uid=1000, gid=1000, cwd="/home/u", environ={"HOME": "/home/u"})
MOUNTS = (RoBind("/usr"), Bind("/srv/data", "/data"), Tmpfs("/tmp"), Proc(), Dev(), Dir("/d", perms=0o700),
          Symlink("target", "/l"), File("/f", data=b"x"), RemountRo("/usr"), Chmod("/d", 0o750))
STRICT = compile_plan(Spec(mounts=MOUNTS, probe_paths=("/etc/shadow", "/root"), cwd="/d"), HOST)
LOOSE = compile_plan(Spec(mounts=MOUNTS[:1]), HOST)  # cwd: the caller's, else "/"
ENOENT = os.strerror(E.ENOENT)


def blob(plan: Plan) -> bytes:
    return wire.serialize(plan, "/tmp")


def record(step: int, op: int = -1, err: int = E.ENOENT, detail: int = lib.SBX_D_NONE) -> Any:
    res = ffi.new("struct sbx_result *")
    res.step, res.op, res.err, res.detail = step, op, err, detail
    return res


def index(kind: OpKind, dest: str, plan: Plan = STRICT) -> int:
    return next(i for i, op in enumerate(plan.ops) if (op.kind, op.dest) == (kind, dest))


def error(step: int, op: int = -1, err: int = E.ENOENT, detail: int = lib.SBX_D_NONE,
          plan: Plan = STRICT) -> Any:
    return setup_error(record(step, op, err, detail), blob(plan), ["cmd", "arg"])


# ---------------------------------------------------------------- operations, detail by detail

BIND, DATA = index(OpKind.BIND, "/usr"), index(OpKind.BIND, "/data")
OP_CASES = [
    # (op index, detail, step name, path, message without ": reason")
    (DATA, lib.SBX_D_SOURCE, "bind", "/srv/data", "Can't find source path /srv/data"),
    (index(OpKind.TMPFS, "/tmp"), lib.SBX_D_SOURCE, "tmpfs", "/tmp", "Can't open /tmp"),
    (DATA, lib.SBX_D_PARENTS, "bind", "/data", "Can't mkdir parents for /data"),
    (index(OpKind.SYMLINK, "/l"), lib.SBX_D_EXISTS, "symlink", "/l",
     "Can't make symlink at /l: existing destination is not target"),
    (index(OpKind.DIR, "/d"), lib.SBX_D_CREATE, "dir", "/d", "Can't create directory at /d"),
    (index(OpKind.SYMLINK, "/l"), lib.SBX_D_CREATE, "symlink", "/l", "Can't create symlink at /l"),
    (index(OpKind.FILE, "/f"), lib.SBX_D_CREATE, "file", "/f", "Can't create file at /f"),
    (DATA, lib.SBX_D_CREATE, "bind", "/data", "Can't create mount point at /data"),
    (index(OpKind.PROC, "/proc"), lib.SBX_D_RESOLVE, "proc", "/proc", "Can't open /proc inside the sandbox"),
    (index(OpKind.FILE, "/f"), lib.SBX_D_WRITE, "file", "/f", "Can't write file at /f"),
    (index(OpKind.CHMOD, "/d"), lib.SBX_D_CHMOD, "chmod", "/d", "Can't chmod 750 /d"),
    (index(OpKind.REMOUNT_RO, "/usr"), lib.SBX_D_ATTR, "remount_ro", "/usr", "Can't remount readonly on /usr"),
    (BIND, lib.SBX_D_ATTR, "bind", "/usr", "Can't set mount flags on /usr"),
    (BIND, lib.SBX_D_MOUNT, "bind", "/usr", "Can't bind mount /usr on /usr"),
    (index(OpKind.TMPFS, "/tmp"), lib.SBX_D_MOUNT, "tmpfs", "/tmp", "Can't mount tmpfs on /tmp"),
    (index(OpKind.PROC, "/proc"), lib.SBX_D_MOUNT, "proc", "/proc", "Can't mount proc on /proc"),
    (index(OpKind.DEV, "/dev"), lib.SBX_D_NONE, "dev", "/dev", "Can't mount dev on /dev"),
    (index(OpKind.DIR, "/d"), lib.SBX_D_MOUNT, "dir", "/d", "Can't mount dir on /d"),
]


@pytest.mark.parametrize(("op", "detail", "step", "path", "text"), OP_CASES)
def test_op_failures(op: int, detail: int, step: str, path: str, text: str) -> None:
    e = error(lib.SBX_STEP_OP, op, E.EROFS, detail)
    assert type(e) is SetupError
    assert (e.step, e.path, e.errno, e.backend) == (step, path, E.EROFS, "native")
    assert str(e) == f"{text}: {os.strerror(E.EROFS)}"


@pytest.mark.parametrize(("op", "err", "text"), [
    (DATA, E.EISDIR, "Can't create file at /data"),  # a file bound where a directory is: bwrap's ensure_file
    (DATA, E.ENOTDIR, "Can't mkdir /data"),  # a directory bound where a file is: bwrap's ensure_dir
    (index(OpKind.TMPFS, "/tmp"), E.ENOTDIR, "Can't mkdir /tmp"),
    (index(OpKind.DIR, "/d"), E.ENOTDIR, "Can't create directory at /d"),
])
def test_a_mount_point_of_the_wrong_type_is_worded_as_bwrap_words_it(op: int, err: int, text: str) -> None:
    e = error(lib.SBX_STEP_OP, op, err, lib.SBX_D_CREATE)
    assert (type(e), str(e), e.errno) == (SetupError, f"{text}: {os.strerror(err)}", err)


def test_every_op_detail_is_worded_for_every_op() -> None:
    for op in range(len(STRICT.ops)):
        for detail in range(lib.SBX_D_NONE, lib.SBX_D_EXISTS + 1):
            e = error(lib.SBX_STEP_OP, op, E.EIO, detail)
            assert type(e) is SetupError and e.step == OP_KIND_NAMES[STRICT.ops[op].kind]
            assert str(e).startswith("Can't ") and str(e).endswith(f": {os.strerror(E.EIO)}"), str(e)
            assert e.path in (STRICT.ops[op].dest, STRICT.ops[op].src)


def test_a_bind_source_that_cannot_be_opened() -> None:
    e = error(lib.SBX_STEP_SOURCE, DATA, E.ENOENT, lib.SBX_D_SOURCE)
    assert (e.step, e.path, str(e)) == ("source", "/srv/data", f"Can't find source path /srv/data: {ENOENT}")
    e = error(lib.SBX_STEP_SOURCE, DATA, E.EPERM, lib.SBX_D_ATTR)
    assert (e.step, e.path) == ("source", "/data")
    assert str(e) == f"Can't set mount flags on /data: {os.strerror(E.EPERM)}"


@pytest.mark.parametrize("op", [-1, len(STRICT.ops), 1 << 30])
def test_an_op_index_out_of_range(op: int) -> None:
    for step in (lib.SBX_STEP_OP, lib.SBX_STEP_SOURCE):
        e = error(step, op, E.EINVAL, lib.SBX_D_MOUNT)
        assert type(e) is SetupError and e.path is None
        assert e.step == ("source" if step == lib.SBX_STEP_SOURCE else "op")
        assert str(e) == f"Can't apply a mount operation: {os.strerror(E.EINVAL)}"


# ---------------------------------------------------------------- the other steps

def test_exec_failures_are_exec_errors() -> None:
    for err, klass in ((E.ENOENT, ExecNotFoundError), (E.EACCES, ExecPermissionError),
                       (E.EPERM, ExecPermissionError), (E.ENOEXEC, ExecError), (0, ExecNotFoundError)):
        e = error(lib.SBX_STEP_EXEC, err=err)
        assert type(e) is klass and e.filename == "cmd"


def test_isolation_failures() -> None:
    e = error(lib.SBX_STEP_ISOLATION, 1, E.EEXIST, lib.SBX_D_EXISTS)
    assert type(e) is IsolationError and (e.path, e.errno) == ("/root", E.EEXIST)
    assert str(e) == "isolation check failed: probe path /root is visible inside the sandbox"
    e = error(lib.SBX_STEP_ISOLATION, 0, E.EACCES)
    assert (type(e), e.path) == (IsolationError, "/etc/shadow")
    assert str(e) == f"isolation check failed: probe path /etc/shadow cannot be proven absent ({os.strerror(E.EACCES)})"
    e = error(lib.SBX_STEP_ISOLATION, 2, E.EEXIST)
    assert (type(e), e.path) == (IsolationError, None)
    assert str(e) == "isolation check failed: probe path ? is visible inside the sandbox"


def test_cwd_failures() -> None:
    e = error(lib.SBX_STEP_CWD, 0, E.ENOENT)
    assert (e.step, e.path, str(e)) == ("cwd", "/d", f"Can't chdir to /d: {ENOENT}")
    e = error(lib.SBX_STEP_CWD, 0, E.ENOENT, plan=LOOSE)
    assert (e.step, e.path) == ("cwd", None)
    assert str(e) == f"Can't chdir to any of {', '.join(LOOSE.cwd_candidates)}: {ENOENT}"
    assert len(LOOSE.cwd_candidates) > 1


@pytest.mark.parametrize(("step", "name", "text"), [
    (lib.SBX_STEP_UID_MAP, "uid_map", "setting up uid map"),
    (lib.SBX_STEP_GID_MAP, "gid_map", "setting up gid map"),
    (lib.SBX_STEP_SETGROUPS, "setgroups", "setting up setgroups"),
    (lib.SBX_STEP_CONFIG, "config", "The serialized plan is malformed"),
    (lib.SBX_STEP_PIVOT, "pivot", "Can't set up the sandbox (pivot)"),
    (lib.SBX_STEP_NESTED_USERNS, "nested_userns", "Can't set up the sandbox (nested userns)"),
    (lib.SBX_STEP_EXEC_INIT, "exec_init", "Can't set up the sandbox (exec init)"),
    (lib.SBX_STEP_FORWARD, "forward", "Can't set up the sandbox (forward)"),
    (99, "step 99", "Can't set up the sandbox (step 99)"),
    (-1, "step -1", "Can't set up the sandbox (step -1)"),
])
def test_setup_steps(step: int, name: str, text: str) -> None:
    e = error(step, err=E.EPERM)
    assert type(e) is SetupError and (e.step, e.path, e.errno) == (name, None, E.EPERM)
    assert str(e) == f"{text}: {os.strerror(E.EPERM)}"


def test_clone_failures_hint_at_blocked_user_namespaces() -> None:
    hint = " (user namespaces blocked? see `python -m sandbox probe`)"
    for err in (E.EPERM, E.EACCES):
        assert str(error(lib.SBX_STEP_CLONE, err=err)) == f"Creating new namespace failed{hint}: {os.strerror(err)}"
    limit = str(error(lib.SBX_STEP_CLONE, err=E.ENOSPC))
    assert limit.startswith("Creating new namespace failed (a namespace limit was reached: raise the "
                            "user.max_*_namespaces sysctl at its limit, e.g. `sysctl -w user.max_user_namespaces=N`")
    assert limit.endswith(f": {os.strerror(E.ENOSPC)}")
    e = error(lib.SBX_STEP_CLONE, err=E.EINVAL)
    assert (e.step, str(e)) == ("clone", f"Creating new namespace failed: {os.strerror(E.EINVAL)}")


def test_every_step_maps_to_one_class_and_its_name() -> None:
    assert len(STEP_NAMES) == lib.sbx_n_steps and STEP_NAMES[lib.SBX_STEP_UID_MAP] == "uid_map"
    for step, name in STEP_NAMES.items():
        e = error(step, 0, E.EIO, lib.SBX_D_MOUNT)
        expected = {lib.SBX_STEP_EXEC: ExecError, lib.SBX_STEP_ISOLATION: IsolationError}.get(step, SetupError)
        assert isinstance(e, expected), step
        if expected is SetupError:
            assert e.step == {lib.SBX_STEP_OP: "bind"}.get(step, name)
            if step != lib.SBX_STEP_CRASHED:  # its .err is a signal, named below
                assert str(e).endswith(f": {os.strerror(E.EIO)}")


def test_a_crashed_setup_names_the_signal_not_an_errno() -> None:
    e = error(lib.SBX_STEP_CRASHED, err=31)
    assert (e.step, e.errno) == ("crashed", 0)
    assert str(e) == "the sandbox's setup process was killed by SIGSYS before the command ran"


def test_no_errno_and_unknown_errno() -> None:
    assert str(error(lib.SBX_STEP_PIVOT, err=0)) == "Can't set up the sandbox (pivot): unknown error"
    assert str(error(lib.SBX_STEP_PIVOT, err=9999)) == f"Can't set up the sandbox (pivot): {os.strerror(9999)}"


# ---------------------------------------------------------------- the C function itself

def test_without_a_valid_blob_nothing_is_named() -> None:
    res = record(lib.SBX_STEP_OP, 0, E.ENOENT, lib.SBX_D_SOURCE)
    assert describe(res, b"") == (f"Can't apply a mount operation: {ENOENT}", None)
    assert describe(res, blob(STRICT)[:-1]) == (f"Can't apply a mount operation: {ENOENT}", None)
    assert describe(record(lib.SBX_STEP_EXEC), b"", "cmd") == (f"execvp cmd: {ENOENT}", None)


def test_non_utf8_paths_round_trip() -> None:
    plan = compile_plan(Spec(mounts=(Bind(os.fsdecode(b"/srv/\xff"), "/x"),)), HOST)
    e = setup_error(record(lib.SBX_STEP_SOURCE, 0, E.ENOENT, lib.SBX_D_SOURCE), blob(plan), ["cmd"])
    assert e.path == os.fsdecode(b"/srv/\xff") and e.path in str(e)


def test_the_message_is_truncated_to_the_buffer() -> None:
    res, data = record(lib.SBX_STEP_OP, DATA, E.ENOENT, lib.SBX_D_MOUNT), blob(STRICT)
    for size in (1, 2, 10):
        buf = ffi.new("char[]", size)
        out = lib.sbx_format_error(res, ffi.from_buffer(data), len(data), ffi.NULL, buf, size)
        assert out == buf and ffi.string(buf) == b"Can't bind mount /srv/data on /data"[:size - 1]


def test_the_launcher_dies_with_one_line_and_125() -> None:
    launcher = BIN_DIR / "sandbox-launch"
    if not launcher.exists():
        pytest.skip("sandbox-launch was not built")
    bad = base64.b64encode(b"not a plan").decode()
    done = subprocess.run([str(launcher), "--plan", bad, "--", "true"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (125, f"sandbox: the plan given to {launcher} is malformed\n")
    done = subprocess.run([str(launcher)], capture_output=True, text=True, check=False)
    assert done.returncode == 125 and done.stderr.startswith("sandbox: usage: ")
