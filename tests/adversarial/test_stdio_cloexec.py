"""Attack: a close-on-exec fd at the number of a closed stdio fd reaches the sandbox as its stdio.

A caller that has closed its stdin or stdout (a daemon, a service started
without one) leaves that number free, and the next fd anything opens takes
it: the caller's own secrets, or this library's sockets and pipes (every one
close-on-exec), a Template's request socket among them, through which a
tenant could send the template process requests of its own. A
sandbox that inherits its stdio must get what a command the caller exec'd
would: fds open and not close-on-exec. The native backend's sandbox and bwrap
get that from the kernel's exec; a Template sends its caller's fds over a
socket, and `stderr=STDOUT` copies fd 1 to 2 before any exec, so both must
leave such an fd out themselves (sandbox.api.inheritable).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .attack import BACKENDS, PYTHON, require

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1]

# The caller: its stdin (or stdout) closed, then a close-on-exec fd of its own ("own") or of the library's
# ("library": the pool factory's channel, say; "later", closed once the library has run a sandbox: a new
# Template's own request socket, say) takes that number; each sandbox says
# what its fd of that number is (and, for stdout, its stderr: stderr=STDOUT), into the file argv[4].
CALLER = r"""
import os, socket, subprocess, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/adversarial"]
what, backend, out = sys.argv[2], sys.argv[3], sys.argv[4]
n = 1 if what == "stdout" else 0
if what != "later":
    os.close(n)
from conftest import make_base_spec
from attack import PYTHON, run
if what == "later":  # the library's pool and helpers made first: a later socket takes the number (a Template's own)
    run(["true"], make_base_spec(), backend, timeout=60)
    os.close(n)
PROBE = "import os, sys\n" \
        "def link(fd):\n" \
        "    try:\n" \
        "        return os.readlink(f'/proc/self/fd/{fd}')\n" \
        "    except OSError:\n" \
        "        return 'closed'\n" \
        "os.write(int(sys.argv[1]), ' '.join(link(int(fd)) for fd in sys.argv[2:]).encode())"
if what not in ("library", "later"):
    secret, peer = socket.socketpair()  # close-on-exec, as Python makes every fd
    assert secret.fileno() == n, secret.fileno()
r, w = os.pipe()
seen = []
for _ in range(3):
    # a probe that opens nothing before it looks (a shell's own pipes would take a closed number)
    run([PYTHON, "-I", "-S", "-c", PROBE, str(w), *(["1", "2"] if n else ["0"])], make_base_spec(), backend,
        stderr=subprocess.STDOUT if n else None, pass_fds=[w], timeout=60)
    seen.append(os.read(r, 4096).decode().split())
try:
    ours = os.readlink(f"/proc/self/fd/{n}")
except OSError:
    ours = "closed"
with open(out, "w") as f:
    print(ours, seen, file=f)
"""


@pytest.mark.parametrize("what", ["own", "library", "later", "stdout"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_close_on_exec_fd_is_not_the_sandboxs_stdio(backend: str, what: str, tmp_path: Path) -> None:
    require(backend)
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")
    out = tmp_path / "seen"
    caller = subprocess.run([sys.executable, "-c", CALLER, str(TESTS), what, backend, str(out)],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert caller.returncode == 0, caller.stderr
    ours, seen = out.read_text().split(" ", 1)
    if what not in ("library", "later"):
        assert ours.startswith("socket:"), ours
    assert ours not in seen, (ours, seen)
    for kind in ("socket:", "pipe:", "anon_inode:", "net:", "user:"):
        assert f"'{kind}" not in seen, (ours, seen)
