"""Attack: a nested sandbox keeps the trusted caller's task.run waiting (issue 36, the broker's release).

`task.run(capture_output=True)` read the sandbox's stdout to its end and
only then waited for the sandbox, whose end closed the broker and killed the
nested sandboxes still running. Every process of the sandbox dies with it;
but a nested sandbox runs beside it, with the stdio its requester gave it,
and died only when its requester's socket closed. A requester that hands
that very socket to the nested sandbox (through a Unix socket given as its
stdin) keeps it open from outside: the nested sandbox, holding the outer
sandbox's stdout, outlived it, and the trusted caller waited forever.

Now the broker watches the sandbox's first process (a pidfd): when the
sandbox ends, the broker stops and kills every nested sandbox at once,
whatever still holds their sockets or the sandbox's pipes.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from conftest import new_marker, sleepers, wait_until

from sandbox.task import Sandbox

from .broker_helpers import PY, pyrun, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

pytestmark = pytest.mark.integration

HOLDER = """
import array, socket, time
s = socket.socket(fileno=0)
msg, anc, _, _ = s.recvmsg(16, socket.CMSG_SPACE(4))
print("holding", len(anc), flush=True)
import subprocess
subprocess.run(["sleep", "1000", "{marker}"])
"""

REQUESTER = """
import array, socket, sys
from sandbox import task
mine, theirs = socket.socketpair()
p = task.spawn([{py!r}, "-c", {holder!r}], task.Sandbox(), stdin=theirs.fileno())
theirs.close()
# the socket to the broker on which the nested sandbox's end would be seen, handed to the nested sandbox itself
chan = p._proc._handle._chan
mine.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [chan.fileno()]).tobytes())])
print("handed", flush=True)
import time
time.sleep(1)
"""


def test_the_callers_run_returns_when_the_sandbox_ends(backend: str) -> None:
    marker = new_marker()
    code = REQUESTER.format(py=PY, holder=HOLDER.format(marker=marker))
    try:
        start = time.monotonic()
        r = pyrun(code, Sandbox(), backend, timeout=60)
        took = time.monotonic() - start
        assert r.stdout.split() == ["handed", "holding", "1"], r.stdout + r.stderr
        assert took < 30, took
        assert wait_until(lambda: not sleepers(marker), timeout=10), "the nested sandbox outlived its parent"
    finally:
        for pid in sleepers(marker):
            os.kill(pid, signal.SIGKILL)
