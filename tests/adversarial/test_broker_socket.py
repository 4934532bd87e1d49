"""The broker reachable the way SSH_AUTH_SOCK is (issue 36): a socket inside the sandbox, named by a variable.

The broker's socket was an inherited fd: a framework process that started its helper with
subprocess.run (which closes inherited fds by default) left the helper no way to start a nested
sandbox (it exited 125, with a hint to pass broker_fds()). Now SANDBOX_TASK_BROKER names a socket
bound inside the sandbox, so any process of the sandbox may ask: the broker's narrowing rule is what
protects, and these attacks ask from such a process for more than the sandbox has.

The socket is reachable only inside its own sandbox: its host path is gone once the sandbox is up
(made in a private directory of the caller's, mode 0700), and it is not an abstract socket (those are
named per network namespace, which a sandbox with the host's network shares with the host).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from sandbox import task
from sandbox.task import Sandbox
from sandbox.task.broker_socket import INSIDE

from .broker_helpers import PY, pyrun, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

pytestmark = pytest.mark.integration

GRANDCHILD = """
from sandbox import task
r = task.run(["cat", {mine!r}], task.Sandbox(read=[{mine!r}]), capture_output=True, text=True)
print("mine", r.returncode, r.stdout.strip())
for name, sb in (("read", task.Sandbox(read=[{theirs!r}])), ("write", task.Sandbox(write=[{mine!r}])),
                 ("network", task.Sandbox(network="open")), ("env_allow", task.Sandbox(env_allow=["*"]))):
    try:
        task.run(["true"], sb)
        print(name, "STARTED")
    except Exception as e:
        print(name, "->", type(e).__name__, getattr(e, "field", None))
"""

FRAMEWORK = """
import subprocess, sys
# a framework's helper, started as frameworks do: inherited fds closed (close_fds=True is the default)
r = subprocess.run([sys.executable, "-c", {code!r}], capture_output=True, text=True, close_fds=True)
print(r.stdout, r.stderr[-1500:], "helper exit", r.returncode)
"""


def test_a_helper_started_with_close_fds_asks_and_can_only_narrow(backend: str, tmp_path: Path) -> None:
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.write_text("granted\n")
    theirs.write_text("not granted\n")
    tmp_path.chmod(0o755)
    code = GRANDCHILD.format(mine=str(mine), theirs=str(theirs))
    r = pyrun(FRAMEWORK.format(code=code), Sandbox(read=[str(mine)]), backend, timeout=120)
    lines = [line.strip() for line in r.stdout.strip().split("\n") if line.strip()]
    assert lines == ["mine 0 granted", "read -> SpecError read", "write -> SpecError write",
                     "network -> SpecError network", "env_allow -> SpecError env_allow", "helper exit 0"], \
        r.stdout + r.stderr


SHOW = ("import os, sys; where = os.environ['SANDBOX_TASK_BROKER']; print(where, os.stat(where).st_ino, flush=True); "
        "sys.stdin.read()")


def test_the_socket_is_inside_the_sandbox_only(backend: str) -> None:
    proc = task.spawn([PY, "-c", SHOW], Sandbox(), backend=backend, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        where, inode = proc.stdout.readline().decode().split()
        assert where == INSIDE
        broker = proc._broker  # type: ignore[union-attr]
        assert broker is not None
        host = broker.host_path
        assert not os.path.lexists(host) and not os.path.lexists(os.path.dirname(host)), host
        name = broker._socket.sock.getsockname()
        assert isinstance(name, str) and name == host, name  # a path (never abstract: no leading NUL)
        # Nowhere else: another sandbox (a sibling, even one on the host's network) has its own broker only.
        r = task.run(["sh", "-c", f"ls -i {INSIDE}"], Sandbox(network="open"), backend=backend,
                     capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.split()[0] != inode, (r.stdout, inode)
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                f.close()


def test_the_sockets_directory_is_private_until_it_is_gone() -> None:
    from sandbox.task.broker_socket import BrokerSocket

    sock = BrokerSocket()
    try:
        mode = os.stat(os.path.dirname(sock.path)).st_mode
        assert stat.S_IMODE(mode) == 0o700, oct(mode)
        assert stat.S_IMODE(os.stat(sock.path).st_mode) == 0o600
    finally:
        sock.close()
    assert not os.path.lexists(os.path.dirname(sock.path))


def test_a_long_temporary_directory_still_makes_a_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from sandbox.task.broker_socket import BrokerSocket

    long = tmp_path / ("d" * 100)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))  # as TMPDIR would
    sock = BrokerSocket()
    try:
        assert len(sock.path) <= 107 and stat.S_ISSOCK(os.stat(sock.path).st_mode), sock.path
    finally:
        sock.close()
