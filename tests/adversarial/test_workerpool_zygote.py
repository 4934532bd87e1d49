"""Attack: a WorkerPool task against the zygote that forked it, which serves in C.

The zygote forks, reports and reaps in a C loop (csrc/core/zygote.c) that holds
the control socket to the caller, a socket to every spare it has not yet
handed over, a pidfd of every sandbox, the slots' cgroup.procs and
namespace fds; a spare holds its socket until its task arrives. A task is a
fork of that process: it must leave with none of them, only its stdio and
its own channel (close-on-exec: not even its own subprocesses inherit it),
so that it can neither forge a control message (SPAWN, KILL, TAKEN, SLOT),
nor take another spare's task, nor signal a sandbox by pidfd. The task
below looks at every fd it has, writes a forged KILL and SPAWN to every fd
number it can, and runs a subprocess that looks too; the pool's other
tasks go on.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

import sandbox
from sandbox._core.binding import ffi, lib

from .attack import make_base_spec

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def native() -> None:
    if not sandbox.probe().native:
        pytest.skip("WorkerPool needs the native backend")


def forged(kind: int) -> bytes:
    """A control message as the zygote reads it: `kind` for every task id the test's pool uses."""
    message = ffi.new("struct sbx_zmsg *", {"kind": kind, "id": 1, "slot": -1})
    return bytes(ffi.buffer(message))


def probe_fds(messages: list[bytes]) -> dict[str, Any]:
    """In the task: its fds and what they are; a forged message written to
    every other fd number up to 1024; what a subprocess of it holds."""
    import os
    import stat
    import subprocess
    import sys

    fds = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue  # the listing's own fd
        kind = "socket" if stat.S_ISSOCK(mode) else "fifo" if stat.S_ISFIFO(mode) else "other"
        fds[fd] = (kind, os.readlink(f"/proc/self/fd/{fd}"), os.get_inheritable(fd))
    reached = []
    for fd in range(3, 1024):
        if fd in fds:
            continue
        for message in messages:
            try:
                os.write(fd, message)
                reached.append(fd)
            except OSError:
                pass
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(map(int, os.listdir('/proc/self/fd'))))"],
                           capture_output=True, text=True, close_fds=False)
    return {"fds": fds, "reached": reached, "child_fds": child.stdout.strip()}


@pytest.mark.parametrize("spares", [0, 2], ids=["zygote-forked", "spares"])
def test_a_task_holds_nothing_of_the_zygote_or_another_sandbox(spares: int) -> None:
    with sandbox.WorkerPool(make_base_spec(), 2, spares=spares) as pool:
        before = pool.submit(os.getpid).result(timeout=60)
        for _ in range(3):  # the spares' turn comes round
            seen = pool.submit(probe_fds, [forged(lib.SBX_Z_KILL), forged(lib.SBX_Z_SPAWN)]).result(timeout=60)
            fds = seen["fds"]
            assert set(fds) == {0, 1, 2, max(fds)}, fds
            channel = fds[max(fds)]
            assert channel[0] == "socket" and not channel[2], f"its channel, close-on-exec: {channel}"
            assert fds[1][0] == fds[2][0] == "fifo", fds  # its own output pipes to the caller
            assert not any("pidfd" in link or "cgroup" in link for _, link, _ in fds.values()), fds
            assert seen["reached"] == [], f"a forged control message was written to fds {seen['reached']}"
            assert seen["child_fds"] == "[0, 1, 2, 3]", seen["child_fds"]  # 3: its own listing
        # the pool goes on: nothing was killed or spawned by the forgeries
        assert [pool.submit(pow, 2, n).result(timeout=60) for n in range(4)] == [1, 2, 4, 8]
        assert pool.submit(os.getpid).result(timeout=60) == before




def test_the_zygote_lives_in_no_sandboxs_network_namespace() -> None:
    """The zygote joins its leases' owner once and clones each sandbox from
    the lease's namespace, then goes back to a namespace of its own: it never
    stays in one a sandbox runs in (what it makes there, the next spare's
    socket, would count as that tenant's when the pool checks it)."""
    with sandbox.WorkerPool(make_base_spec(), 2, spares=2) as pool:
        for _ in range(8):
            pool.submit(os.getpid).result(timeout=60)
        time.sleep(0.5)  # the spares set up: a sandbox just cloned is in the zygote's namespace until it leaves
        (zygote,) = open(f"/proc/{pool.pid}/task/{pool.pid}/children").read().split()
        try:
            home = os.readlink(f"/proc/{zygote}/ns/net")
        except PermissionError as exc:
            pytest.skip(f"this user cannot see the zygote's namespaces: {exc}")
        sandboxes = set()
        for pid in open(f"/proc/{zygote}/task/{zygote}/children").read().split():
            try:
                sandboxes.add(os.readlink(f"/proc/{pid}/ns/net"))
            except FileNotFoundError:
                pass  # a task that has just ended
    assert sandboxes, "the spares are its children"
    assert home not in sandboxes, f"the zygote stays in a sandbox's network namespace {home}"
