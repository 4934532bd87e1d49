"""sbx_fork_sandbox_ns refuses a lease it cannot join, before any task exists.

The zygote's call (sandbox.workerpool.forkcall), made here in the test
process with a real task plan: a netns fd without its owner's is a plan
error (SBX_STEP_CONFIG, EINVAL, no clone); fds that are not namespaces make
the joiner's setns() fail (SBX_STEP_JOIN_NETNS with its errno), and the
joiner exits before it clones anything. Either way the call returns -1 and
no process is left. Needs no privileges (the joiner is a plain CLONE_VM
child of this process that never gets into a namespace).
"""

from __future__ import annotations

import errno
import os

from sandbox import Dev, Proc, RoBind, Spec, Symlink, Tmpfs
from sandbox._core.binding import ffi, lib
from sandbox._core.blob import serialize
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.host import HostInfo
from sandbox.plan import compile_plan
from sandbox.warm_plan import task_plan, zygote_plan
from sandbox.workerpool import forkcall

USER = HostInfo(executor=NATIVE, uid=1000, gid=1001, cwd="/home/u", environ={})
MOUNTS = (RoBind("/usr"), Symlink("usr/bin", "/bin"), Proc(), Dev(), Tmpfs("/tmp"))


def fork_call() -> tuple[forkcall.ForkCall, bytes]:
    plan = compile_plan(Spec(mounts=MOUNTS), USER)
    blob = serialize(task_plan(plan, zygote_plan(plan)), "/")
    import sandbox._native as native

    return forkcall.ForkCall(ffi, lib, native.__file__, blob, 0), blob


def children() -> set[int]:
    path = f"/proc/self/task/{os.getpid()}/children"
    with open(path) as f:
        return {int(pid) for pid in f.read().split()}


def test_a_netns_without_its_owner_is_refused_before_any_clone() -> None:
    fork, blob = fork_call()
    fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        before = children()
        pid, res = fork(blob, [-1, -1, -1], 0, [], [], [-1, fd])
    finally:
        os.close(fd)
    assert pid == -1 and (res.step, res.err) == (lib.SBX_STEP_CONFIG, errno.EINVAL)
    assert children() == before


def test_fds_that_are_not_namespaces_fail_the_join() -> None:
    fork, blob = fork_call()
    fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        before = children()
        pid, res = fork(blob, [-1, -1, -1], 0, [], [], [fd, fd])
    finally:
        os.close(fd)
    assert pid == -1 and (res.step, res.err) == (lib.SBX_STEP_JOIN_NETNS, errno.EINVAL)
    assert children() == before
