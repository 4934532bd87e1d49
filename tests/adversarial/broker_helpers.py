"""What the attacks on the sandbox.task broker share: both backends, a Python inside, a raw client.

The broker (sandbox/task/broker.py) runs in the trusted process that started a task sandbox and starts
nested sandboxes for the processes inside. These attacks talk to it as untrusted code inside can: with
raw messages of their own making (CLIENT, pasted into the script run inside), not through sandbox.task.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import sandbox
from sandbox import task

PY = sys.executable  # the framework's interpreter: shown inside as installed, with this sandbox package


@pytest.fixture(name="backend", params=["native", "bwrap"])
def task_backend(request: pytest.FixtureRequest) -> str:
    """Each attack runs on both backends."""
    probe = sandbox.probe()
    if request.param == "bwrap" and not probe.bwrap:
        pytest.skip(f"bwrap is not available: {probe.bwrap_reason}")
    if request.param == "native" and not probe.native:
        pytest.skip(f"the native backend is not available: {probe.native_reason}")
    return str(request.param)


def pyrun(code: str, sb: task.Sandbox, backend: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`python -c code` under `sb` on `backend`, captured as text, as the trusted caller runs it."""
    kw.setdefault("timeout", 60)
    r: subprocess.CompletedProcess[str] = task.run([PY, "-c", code], sb, backend=backend, capture_output=True,
                                                   text=True, **kw)
    return r


# A raw client of the broker, run inside: `raw(data, stdio)` sends `data` (bytes of its choosing) as a request
# goes, with `stdio` (fds) attached, and returns the socket the answer comes back on; `answer(chan)` reads it.
# SANDBOX_TASK_BROKER names a socket inside the sandbox (a path); before, it named an inherited fd, to which a
# request went with a socket of its own for the answer, first among its fds.
CLIENT = '''
import array, os, socket
def _anc(fds):
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
def raw(data, stdio=()):
    where = os.environ["SANDBOX_TASK_BROKER"]
    if where.isdigit():
        chan, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with socket.socket(fileno=os.dup(int(where))) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            s.sendmsg([data], _anc([theirs.fileno(), *stdio]))
        theirs.close()
        return chan
    chan = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    chan.connect(where)
    chan.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    chan.sendmsg([data], _anc(list(stdio)))
    return chan
def answer(chan, timeout=10):
    chan.settimeout(timeout)
    try:
        return chan.recv(1 << 20).decode(errors="replace") or "closed"
    except socket.timeout:
        return "no answer"
    except OSError as e:
        return f"error {e}"
'''
