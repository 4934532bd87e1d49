"""sandbox.host.HostInfo.current: the facts that can change while a process runs are the moment's,
though an unchanged state gives back the same HostInfo (and so the plan cache's key, hashed once)."""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sandbox import Spec
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.host import HostInfo, HostKey, effective_caps_mask
from sandbox.plan_cache import compiled_plan

CAP_NET_ADMIN = 12


def test_an_unchanged_state_gives_the_same_hostinfo_and_key() -> None:
    first = HostInfo.current(NATIVE)
    again = HostInfo.current(NATIVE)
    assert again is first and again.key is first.key
    assert again.cwd == os.getcwd() and again.uid == os.getuid() and again.effective_caps == effective_caps_mask()


def test_equal_facts_make_equal_keys() -> None:
    host = HostInfo.current(NATIVE)
    copy = HostInfo(uid=host.uid, gid=host.gid, cwd=host.cwd, environ=host.environ, executor=host.executor,
                    hard_limits=dict(host.hard_limits), is_root=host.is_root, pool=host.pool,
                    core_missing=host.core_missing, effective_caps=host.effective_caps, cgroups=host.cgroups)
    assert copy is not host and copy.key == host.key and hash(copy.key) == hash(host.key)
    assert HostKey((1, 2)) != HostKey((1, 3)) and HostKey((1, 2)) != (1, 2)


def test_a_chdir_is_seen_by_the_next_call_and_its_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = Spec()
    before = HostInfo.current(NATIVE)
    monkeypatch.chdir(tmp_path)
    after = HostInfo.current(NATIVE)
    assert after.cwd == str(tmp_path) != before.cwd
    assert compiled_plan(spec, after).cwd_candidates[0] == str(tmp_path)
    os.rmdir(tmp_path)  # getcwd fails now: no cwd at all, not the last one read
    try:
        assert HostInfo.current(NATIVE).cwd is None
    finally:
        os.chdir("/")


def test_an_inherited_variable_changed_in_os_environ_reaches_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = Spec(env_inherit=("SANDBOX_TEST_HOSTINFO",))
    monkeypatch.setenv("SANDBOX_TEST_HOSTINFO", "one")
    first = compiled_plan(spec, HostInfo.current(NATIVE))
    monkeypatch.setenv("SANDBOX_TEST_HOSTINFO", "two")
    second = compiled_plan(spec, HostInfo.current(NATIVE))
    assert "SANDBOX_TEST_HOSTINFO=one" in first.env and "SANDBOX_TEST_HOSTINFO=two" in second.env


# The child reads its hard NOFILE limit through HostInfo.current, then again once the parent
# has lowered it with prlimit(2): a change no call of the child's made.
_CHILD = """
import resource, sys
from sandbox.backends.native import TRAITS
from sandbox.host import HostInfo
print(HostInfo.current(TRAITS).hard_limits.get(resource.RLIMIT_NOFILE, -1), flush=True)
sys.stdin.readline()
print(HostInfo.current(TRAITS).hard_limits.get(resource.RLIMIT_NOFILE, -1), flush=True)
"""


def test_a_hard_limit_lowered_by_another_process_is_seen() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 512) if hard == resource.RLIM_INFINITY else min(soft, hard - 1)
    with subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True, cwd="/") as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            first = int(child.stdout.readline())
            assert first == (-1 if hard == resource.RLIM_INFINITY else hard)
            resource.prlimit(child.pid, resource.RLIMIT_NOFILE, (lowered, lowered))
            child.stdin.write("\n")
            child.stdin.flush()
            assert int(child.stdout.readline()) == lowered
        finally:
            child.kill()


def test_a_thread_that_dropped_a_capability_sees_its_own_set() -> None:
    """Capabilities are per thread: a thread that lowered its effective set gets its own HostInfo,
    and the main thread, whose set is unchanged, its own again."""
    if not effective_caps_mask() >> CAP_NET_ADMIN & 1:
        pytest.skip("needs CAP_NET_ADMIN in the effective set (root)")
    mine = HostInfo.current(NATIVE)
    seen: list[int] = []

    def drop_and_read() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        assert libc.capget(header, data) == 0
        data[0] &= ~(1 << CAP_NET_ADMIN)  # effective, bits 0-31; the permitted set keeps it
        assert libc.capset(header, data) == 0, os.strerror(ctypes.get_errno())
        seen.append(HostInfo.current(NATIVE).effective_caps)  # the thread ends, and its set with it

    thread = threading.Thread(target=drop_and_read)
    thread.start()
    thread.join()
    assert seen == [mine.effective_caps & ~(1 << CAP_NET_ADMIN)]
    assert HostInfo.current(NATIVE).effective_caps == mine.effective_caps == effective_caps_mask()
