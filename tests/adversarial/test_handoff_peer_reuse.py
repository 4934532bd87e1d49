"""Attack: a process that is not the harness's child passes the handoff server's peer check by its pid's reuse.

The handoff server (sandbox.compat.handoff) closes, unanswered, a connection whose peer is not a child of the
harness process. It read the peer's pid from SO_PEERCRED and that pid's parent from /proc/PID/stat. The pid is
the connecting process's when it connected: once that process has ended and been reaped, a child of the
harness may be given the same pid, and /proc/PID then describes that child. So a process that was never the
harness's child (here a grandchild) passed the check after its pid was reused.

The check reads /proc through the peer's pidfd (SO_PEERPIDFD) and confirms the peer is alive afterwards:
a reused pid is another process, and the check fails. The pid is reused at will in a pid namespace of the
test's own (ns_last_pid, writable by the namespace's root), so nothing outside it is touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# Pid 1 of a new pid namespace plays the harness: a grandchild connects and exits, is reaped, and the harness's
# next child is given its pid; then the harness asks its handoff server's check about the connection.
REUSE = textwrap.dedent("""
    import os, socket, sys, time
    from sandbox.compat.handoff import _our_child
    path = sys.argv[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen()
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:
        attacker = os.fork()
        if attacker == 0:
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).connect(path)
            os._exit(0)
        os.waitpid(attacker, 0)
        os.write(w, str(attacker).encode())
        os._exit(0)
    os.waitpid(middle, 0)
    attacker = int(os.read(r, 64))
    conn, _ = listener.accept()
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(attacker - 1))
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    try:
        print("reused" if child == attacker else "not-reused", "served" if _our_child(conn) else "refused")
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)
""")


def test_a_reused_pid_does_not_make_a_stranger_the_harnesss_child(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here")
    done = subprocess.run([unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount-proc",
                           sys.executable, "-c", REUSE, str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONSAFEPATH": "1"})
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"no user and pid namespace for the test: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    reused, verdict = done.stdout.split()
    if reused != "reused":
        pytest.skip("the harness's child was not given the attacker's pid")
    assert verdict == "refused"
