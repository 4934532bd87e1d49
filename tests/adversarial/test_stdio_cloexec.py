"""Attack: a close-on-exec fd at the number of a closed stdio fd reaches the sandbox as its stdio.

A caller that has closed its stdin (a daemon, a service started without one)
leaves fd 0 free, and the next fd anything opens takes it: the caller's own
secrets, or this library's sockets and pipes (every one close-on-exec), a
Template's request socket among them, through which a tenant could ask the
template process for sandboxes of its own making. A sandbox that inherits
its stdio must get what a command the caller exec'd would: fds open and not
close-on-exec (the native backend's sandbox and bwrap get that from the
kernel's exec; a Template sends its caller's fds over a socket, and must
leave such a slot out itself: sandbox/backends/template/server.py, _stdio).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .attack import BACKENDS, require

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1]

# The caller: stdin closed, then a close-on-exec fd of its own ("own") or of the library's ("library": the
# first sandbox's, a Template's socket or the pool's) takes fd 0; each sandbox says what its fd 0 is.
CALLER = """
import os, socket, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/adversarial"]
os.close(0)
from conftest import make_base_spec
from attack import run
what, backend = sys.argv[2], sys.argv[3]
if what == "own":
    secret, peer = socket.socketpair()  # close-on-exec, as Python makes every fd
    assert secret.fileno() == 0, secret.fileno()
seen = [run(["sh", "-c", "readlink /proc/self/fd/0 || echo closed"], make_base_spec(), backend,
            capture_output=True, text=True, timeout=60).stdout.strip() for _ in range(3)]
try:
    ours = os.readlink("/proc/self/fd/0")
except OSError:
    ours = "closed"
print(ours, *seen)
"""


@pytest.mark.parametrize("what", ["own", "library"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_close_on_exec_fd_is_not_the_sandboxs_stdin(backend: str, what: str) -> None:
    require(backend)
    caller = subprocess.run([sys.executable, "-c", CALLER, str(TESTS), what, backend], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=300)
    assert caller.returncode == 0, caller.stderr
    ours, *seen = caller.stdout.split()
    if what == "own":
        assert ours.startswith("socket:"), ours
    for theirs in seen:
        assert theirs == "closed" or theirs != ours, (ours, seen)
        assert not theirs.startswith(("socket:", "pipe:", "anon_inode:", "net:", "user:")), (ours, seen)
