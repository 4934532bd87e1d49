"""Attack: one message kills the sandbox.task broker (issue 36, breach 5).

The broker parsed each message with json.loads and caught ValueError only:
a deeply nested JSON array raised RecursionError in its one serving thread,
which died. Every later request of the sandbox went unanswered (a nested
start hung for good), and the requests queued behind it held the sandbox's
stdio in flight, so the trusted caller's `task.run(capture_output=True)`
never returned either.

Now a message is bounded in size and in nesting depth before it is parsed,
and any error of any one message is answered with a refusal naming the
problem; the broker keeps serving.
"""

from __future__ import annotations

import pytest
from conftest import new_marker, sleepers, wait_until

from sandbox.task import Sandbox

from .broker_helpers import CLIENT, pyrun, task_backend  # noqa: F401  (task_backend: the fixture `backend`)

pytestmark = pytest.mark.integration

REQ = '{"kind": "task", "argv": ["true"], "environ": {}, '
MESSAGES: dict[str, bytes] = {
    "deep array": b"[" * 200_000 + b"]" * 200_000,
    "deep in a request": (REQ + '"sandbox": {"read": ' + "[" * 50_000 + "]" * 50_000 + "}}").encode(),
    "deep in a string is not deep": (REQ + '"sandbox": {"read": ["/' + "[" * 50_000 + '"]}}').encode(),
    "oversized": (REQ + '"sandbox": {}, "pad": "' + "x" * (3 << 20) + '"}').encode(),
    "truncated": (REQ + '"sandbox": {"read": ["/us').encode(),
    "not UTF-8": (REQ + '"sandbox": {"read": ["/\xff\xfe"]}}').encode("latin-1"),
    "not an object": b"[1, 2, 3]",
    "null": b"null",
    "sandbox a list": (REQ + '"sandbox": [1]}').encode(),
    "read a number": (REQ + '"sandbox": {"read": 5}}').encode(),
    "argv a string": b'{"kind": "task", "argv": "true", "environ": {}, "sandbox": {}}',
    "environ a list": b'{"kind": "task", "argv": ["true"], "environ": [], "sandbox": {}}',
    "limits of text": (REQ + '"sandbox": {"limits": {"memory_mb": "lots"}}}').encode(),
    "bind of numbers": (REQ + '"sandbox": {"binds": [{"source": 1, "target": 2}]}}').encode(),
    "port infinite": (REQ + '"sandbox": {"ports": [1e999]}}').encode(),
    "a huge number": (REQ + '"sandbox": {"ports": [' + "9" * 5000 + "]}}").encode(),
    "a null byte": (REQ[:-2].replace('"true"', '"tr\\u0000ue"') + ', "sandbox": {}}').encode(),
}

ATTACK = CLIENT + '''
import os, sys, json
from sandbox import task
msgs = json.loads(sys.stdin.read())
null = os.open(os.devnull, os.O_RDWR)
for name, text in msgs.items():
    chan = raw(text.encode("latin-1"), (null, null, null))
    print(name, "->", answer(chan)[:200].replace("\\n", " "), flush=True)
    chan.close()
    print(name, "still serving", task.run(["true"], task.Sandbox()).returncode, flush=True)
'''


def test_no_message_stops_the_broker(backend: str) -> None:
    import json

    msgs = {name: data.decode("latin-1") for name, data in MESSAGES.items()}
    r = pyrun(ATTACK, Sandbox(), backend, input=json.dumps(msgs), timeout=150)
    lines = r.stdout.strip().split("\n")
    for name in MESSAGES:
        answer = next((line for line in lines if line.startswith(f"{name} -> ")), "none")
        assert answer.startswith(f'{name} -> {{"error": "SpecError"'), (answer, r.stdout[-3000:], r.stderr[-2000:])
        assert f"{name} still serving 0" in lines, (name, r.stdout[-3000:], r.stderr[-2000:])
    why = {name: next(line for line in lines if line.startswith(f"{name} -> ")) for name in MESSAGES}
    assert "deeper than" in why["deep array"] and "deeper than" in why["deep in a request"], why
    assert "larger than" in why["oversized"], why
    assert "not UTF-8" in why["not UTF-8"] and "not JSON" in why["truncated"], why
    assert '"message": "read=' in why["deep in a string is not deep"], why  # parsed, then checked as a path


HANG = CLIENT + '''
chan = raw(b"[" * 200_000 + b"]" * 200_000)
req = b'{"kind": "task", "argv": ["sleep", "1000", "MARKER"], "environ": {}, "sandbox": {}}'
raw(req, (0, 1, 2))
print("sent", flush=True)
'''


def test_the_trusted_callers_run_returns_after_a_killing_message(backend: str) -> None:
    """What the dead thread left: a request queued with the sandbox's stdout in flight, never read; the caller
    waits for the end of that stdout. Bounded here: on the code before, this timed out."""
    marker = new_marker()
    try:
        r = pyrun(HANG.replace("MARKER", marker), Sandbox(), backend, timeout=60)
        assert r.stdout.strip() == "sent", r.stdout + r.stderr
        assert wait_until(lambda: not sleepers(marker), timeout=10), "the nested sandbox outlived the request"
    finally:
        for pid in sleepers(marker):
            import os
            import signal

            os.kill(pid, signal.SIGKILL)


CONTROL = '''
import socket
from sandbox import task
p = task.spawn(["sleep", "1000", "MARKER"], task.Sandbox())
p._proc._handle._chan.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
for junk in (b"[" * 200_000 + b"]" * 200_000, b"\\xff", b"[1]", b'{"signal": "TERM"}', b'{"signal": 99999}'):
    p._proc._handle._chan.send(junk)  # the connection the broker relays signals and kill on
p.kill()
print("killed", p.wait(timeout=30), flush=True)
'''


def test_junk_on_a_running_requests_connection_leaves_its_control(backend: str) -> None:
    """After the start, the broker reads signals and kill on the request's connection: junk there is skipped,
    and a kill after it still ends the nested sandbox (before, the deep array killed that reading thread)."""
    marker = new_marker()
    try:
        r = pyrun(CONTROL.replace("MARKER", marker), Sandbox(), backend, timeout=90)
        assert r.stdout.strip() == "killed -9", r.stdout + r.stderr[-2000:]
    finally:
        for pid in sleepers(marker):
            import os
            import signal

            os.kill(pid, signal.SIGKILL)
