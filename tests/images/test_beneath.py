"""sandbox.images.beneath: a file opened beneath a directory fd, never through a link, never blocking;
with openat2, and without it (a seccomp filter answering ENOSYS, as on a kernel before 5.6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.images import beneath

# Runs CHECKS on the directory argv[1], after a filter makes openat2 fail with ENOSYS when argv[2] is "enosys".
CHECKS = r"""
import ctypes, errno, json, os, sys
from sandbox.images import beneath
if sys.argv[2] == "enosys":
    from sandbox.seccomp import Seccomp
    from sandbox.seccomp.compile import compile_policy
    program = compile_policy(Seccomp(errnos={"openat2": "ENOSYS"}))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buf = ctypes.create_string_buffer(program, len(program))
    prog = Fprog(len(program) // 8, ctypes.addressof(buf))
    assert libc.syscall(317, 1, 0, ctypes.byref(prog)) == 0, ctypes.get_errno()  # seccomp(SET_MODE_FILTER)
    how = (ctypes.c_uint64 * 3)(0, 0, 0)
    assert libc.syscall(437, -100, b"/", ctypes.byref(how), 24) == -1 and ctypes.get_errno() == errno.ENOSYS
top = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
out = {}
for name in ("file", "sub/file", "link", "sub/../file", "linkdir/file", "../outside", "/etc/passwd", "fifo", "sub"):
    try:
        fd = beneath.open_regular(top, name)
        out[name] = os.read(fd, 100).decode()
        os.close(fd)
    except beneath.NotRegularError as exc:
        out[name] = "not regular: " + exc.strerror
    except OSError as exc:
        out[name] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    top = tmp_path / "top"
    (top / "sub").mkdir(parents=True)
    (top / "file").write_text("file\n")
    (top / "sub" / "file").write_text("sub file\n")
    (tmp_path / "outside").write_text("outside\n")
    (top / "link").symlink_to("file")  # a link that stays beneath: refused all the same
    (top / "linkdir").symlink_to("sub")
    os.mkfifo(top / "fifo")
    return top


@pytest.mark.parametrize("mode", ["openat2", "enosys"])
def test_open_regular(tree: Path, mode: str) -> None:
    done = subprocess.run([sys.executable, "-c", CHECKS, str(tree), mode], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["file"] == "file\n" and out["sub/file"] == "sub file\n"
    assert out["link"] == "ELOOP" and out["linkdir/file"] == "ELOOP"
    assert out["../outside"] == "EXDEV" and out["/etc/passwd"] == "EXDEV"
    assert out["fifo"] == "not regular: a FIFO, not a regular file"  # at once: the test has a timeout
    assert out["sub"] == "not regular: a directory, not a regular file"
    # `..` that stays beneath: openat2 takes it, the walk by hand refuses every `..`
    assert out["sub/../file"] == ("file\n" if mode == "openat2" else "EXDEV")


def test_open_beneath_creates_without_following(tree: Path) -> None:
    top = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.symlink(str(tree.parent / "created"), tree / "dangling")
        with pytest.raises(OSError) as caught:
            beneath.open_beneath(top, "dangling", os.O_RDWR | os.O_CREAT, 0o600)
        assert caught.value.errno == 40  # ELOOP
        assert not (tree.parent / "created").exists()
        os.close(beneath.open_beneath(top, "new", os.O_RDWR | os.O_CREAT, 0o640))
        assert (tree / "new").stat().st_mode & 0o777 == 0o640 & ~_umask()
    finally:
        os.close(top)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
