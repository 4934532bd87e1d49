"""Attack: a process that is not in a task sandbox is served by its broker through its pid's reuse.

The sandbox.task broker serves only processes of its own sandbox: it read each request's sender pid from
SCM_CREDENTIALS and walked that pid's parents in /proc up to the sandbox's first process. The pid is the
sender's when it sent: once the sender has ended and been reaped, a process of the sandbox may be given the
same pid before the broker reads the request, and /proc/PID then describes that process. So a stranger's
request (its stdio fds, its description) was judged by a sandbox process's identity, and served.

Now each message comes with a pidfd of its sender too (SO_PASSPIDFD, SCM_PIDFD), and the broker walks the
parents only while pidfds hold the processes it reads (_core/peer.py, Peer.descends_from): a sender that
has ended is refused, whatever its pid names now. The pid is reused at will in a pid namespace of the
test's own (ns_last_pid, writable by the namespace's root), so nothing outside it is touched; the broker
starts nothing (its start function only records a call).
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

# Pid 1 of a new pid namespace plays the broker's process. Its child S plays the sandbox's first process.
# A stranger (pid 1's other child, so not S's descendant) connects, sends a request and exits; pid 1 keeps
# the connection (to read the answer) and reaps the stranger, then S's next child is given the stranger's
# pid. Only then is the broker attached to S, so it reads the request after the reuse.
REUSE = textwrap.dedent("""
    import json, os, socket, sys, time
    from sandbox import task
    from sandbox.errors import UnavailableError
    from sandbox.task import wire
    from sandbox.task.broker import Broker

    started = []
    def start(args, sb, backend, env_in, popen, pinned=None):
        started.append(args)
        raise UnavailableError("STARTED for the request")

    sb = task.Sandbox()
    broker = Broker(sb, task.compile(sb), sys.argv[1], start=start)
    go_r, go_w = os.pipe()
    pid_r, pid_w = os.pipe()
    sandbox_pid = os.fork()
    if sandbox_pid == 0:
        os.read(go_r, 1)
        inner = os.fork()
        if inner == 0:
            time.sleep(60)
            os._exit(0)
        os.write(pid_w, str(inner).encode())
        time.sleep(60)
        os._exit(0)
    conn = wire.connect(broker.host_path)
    stranger = os.fork()
    if stranger == 0:
        wire.send(conn, {"kind": "task", "argv": ["true"], "environ": {}, "sandbox": {}}, (0, 1, 2))
        os._exit(0)
    os.waitpid(stranger, 0)
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(stranger - 1))
    os.write(go_w, b"x")
    inner = int(os.read(pid_r, 64))
    try:
        broker.attach(sandbox_pid)
        conn.settimeout(30)
        answer = json.loads(conn.recv(1 << 16))
        print("reused" if inner == stranger else "not-reused", "served" if started else "refused")
        print(answer.get("message"))
    finally:
        broker.close()
        conn.close()
        for pid in (inner, sandbox_pid):
            os.kill(pid, 9)
        os.waitpid(sandbox_pid, 0)
        os.waitpid(inner, 0)  # S's child, given to pid 1 when S ended
""")


def test_a_reused_pid_does_not_make_a_stranger_a_process_of_the_sandbox(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here")
    done = subprocess.run([unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount-proc",
                           sys.executable, "-c", REUSE, "native"],
                          capture_output=True, text=True, timeout=90, cwd=tmp_path,
                          env={**os.environ, "PYTHONSAFEPATH": "1"})
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"no user and pid namespace for the test: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    verdict, why = done.stdout.split("\n", 1)
    if verdict.split()[0] != "reused":
        pytest.skip("the sandbox's process was not given the stranger's pid")
    assert verdict == "reused refused", (why, done.stderr)
    assert "has ended: its pid may name another process now" in why, why
