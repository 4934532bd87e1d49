"""Nothing a test starts may outlive it: processes, mounts, namespaces.

`nothing_outlives_the_test` (autouse, imported by conftest.py) takes a
snapshot before each test and compares after it, whether the test passed or
failed midway:

- processes: the test process's descendants (through every thread's
  /proc/PID/task/TID/children, recursively). A new one still alive after a
  grace period is a leak: the whole tree is stopped (SIGSTOP, so nothing
  forks or escapes while it is collected), then killed, and the test errors
  naming each one. Killing happens with PR_SET_CHILD_SUBREAPER set, so what
  the kills orphan comes back to this process and is reaped, not to init.
- mounts: a new line in this process's /proc/self/mountinfo at or below the
  test's own directories (a sandbox whose mounts propagated back, an nsfs
  bind left behind): this session's pytest basetemp (every tmp_path) and the
  package's and the tests' folders in the temporary directory (`OWN_PREFIXES`).
  Never the host's whole table: another job's mount (a fuse mount, a loop
  mounting beside the suite) comes and goes there.
- namespaces: a new namespace fd of this process (/proc/self/fd -> "mnt:[...]"),
  other than the network namespace pools' own (they keep pre-made
  namespaces across tests by design; see sandbox.netpool).

Only this process's own descendants are ever looked at or signalled, never
another process on the host. Long-lived helpers of the library that start
on first use and stay for the process's life are
recognised by a marker in their command line (the pool's factory, the
template processes sandbox.spawn(backend="template") keeps): add a helper's
marker to `LONG_LIVED_MARKERS`. A process orphaned to init during the test (its parent
exited) is out of reach of this check; the `no_leftovers` marker fixture covers those
tests.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sandbox.backends.template import KEPT_MARKER
from sandbox.netpool import FACTORY_MARKER
from sandbox.netpool import pool as netpool_pool

LONG_LIVED_MARKERS = (FACTORY_MARKER, KEPT_MARKER)
GRACE_S = 2.0  # a sandbox being torn down as the test ends gets this long to go
# Folders the package (mkdtemp prefix "sandbox-...") and the tests ("sbx...") make in the temporary directory.
OWN_PREFIXES = ("sandbox-", "sbx")
OWN_ROOTS: list[str] = []  # this session's pytest basetemp, once the fixture has run
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Snapshot:
    """What may not grow across a test."""

    processes: frozenset[int]
    mounts: frozenset[str]
    namespaces: frozenset[str]  # "fd -> nsfs target" of this process's namespace fds

    @classmethod
    def take(cls) -> Snapshot:
        return cls(frozenset(descendants()), frozenset(mount_lines()), frozenset(namespace_fds()))


# ---------------------------------------------------------------- reading /proc

def children(pid: int) -> list[int]:
    """The children of every thread of `pid` (empty when it is gone)."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def state(pid: int) -> str | None:
    """The one-letter state of `pid` ("Z" for a zombie), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(")") + 2]


def _long_lived(pid: int) -> bool:
    args = cmdline(pid).split(b"\0")
    return any(marker.encode() in args for marker in LONG_LIVED_MARKERS)


def descendants(root: int | None = None) -> set[int]:
    """Live (non-zombie) descendants of `root` (default: this process), leaving out
    the long-lived helpers and their subtrees."""
    found: set[int] = set()
    todo = children(os.getpid() if root is None else root)
    while todo:
        pid = todo.pop()
        if pid in found or _long_lived(pid):
            continue
        if state(pid) not in (None, "Z"):
            found.add(pid)
        todo += children(pid)
    return found


def mount_lines() -> list[str]:
    """This process's mounts at or below the test's own directories (`own`),
    without the mount ids (which only ever grow)."""
    with open("/proc/self/mountinfo") as f:
        lines = [line.split(" ", 2)[2] for line in f]
    return [line for line in lines if own(_unescape(line.split(" ")[2]))]


def own(path: str) -> bool:
    """Whether `path` lies in OWN_ROOTS or in a folder of OWN_PREFIXES in the temporary directory."""
    if any(path == root or path.startswith(root + "/") for root in OWN_ROOTS):
        return True
    tmp = tempfile.gettempdir().rstrip("/") + "/"
    return path.startswith(tmp) and path[len(tmp):].startswith(OWN_PREFIXES)


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (of space, tab, newline and backslash)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def namespace_fds() -> set[str]:
    """"FD -> TARGET" for each fd of this process that holds a namespace."""
    out = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.endswith("]") and ":[" in target and not target.startswith(("socket:", "pipe:", "anon_inode:")):
            out.add(f"{name} -> {target}")
    return out


def pool_namespace_fds() -> set[str]:
    """The namespace fds the network namespace pools of this process hold now."""
    fds: set[int] = set()
    for pool in list(netpool_pool._POOLS):
        with pool._cond:
            held = [*pool._idle, *pool._leased]
        fds |= {ns.netns_fd for ns in held} | {ns.userns_fd for ns in held if ns.userns_fd is not None}
        factory = pool._factory
        if factory is not None and factory.userns_fd is not None:
            fds.add(factory.userns_fd)
    out = set()
    for fd in fds:
        try:
            out.add(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    return out


# ---------------------------------------------------------------- what leaked

def leaked_processes(before: Snapshot) -> set[int]:
    return descendants() - before.processes


def leaked_namespaces(before: Snapshot) -> set[str]:
    """New namespace fds that no pool holds; a pool busy refilling gets time to settle."""
    deadline = time.monotonic() + GRACE_S
    while True:
        extra = namespace_fds() - before.namespaces - pool_namespace_fds()
        if not extra or time.monotonic() >= deadline:
            return extra
        time.sleep(0.05)


def describe(pid: int) -> str:
    args = cmdline(pid).replace(b"\0", b" ").decode(errors="replace").strip()
    return f"{pid} ({args or '?'})"


# ---------------------------------------------------------------- ending them

def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)


def kill_trees(pids: set[int]) -> None:
    """SIGSTOP `pids` and every descendant (until no new one appears), SIGKILL them
    all, and reap those that end up as this process's children."""
    _set_subreaper(True)
    try:
        stopped: set[int] = set()
        todo = set(pids)
        while todo:
            for pid in todo:
                _signal(pid, signal.SIGSTOP)
            stopped |= todo
            todo = {c for pid in todo for c in descendants(pid)} - stopped
        for pid in stopped:
            _signal(pid, signal.SIGKILL)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(state(pid) not in (None, "Z") for pid in stopped):
            time.sleep(0.01)
        for pid in stopped:
            _reap(pid)
    finally:
        _set_subreaper(False)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """Reap `pid` if it is this process's child (else its own parent does)."""
    deadline = time.monotonic() + 1.0
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            return
        if done or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


# ---------------------------------------------------------------- the fixture

def check(before: Snapshot) -> list[str]:
    """What outlived the test started after `before` (each leaked process killed)."""
    problems = []
    deadline = time.monotonic() + GRACE_S
    leaked = leaked_processes(before)
    while leaked and time.monotonic() < deadline:
        time.sleep(0.02)
        leaked = leaked_processes(before)
    if leaked:
        names = ", ".join(describe(pid) for pid in sorted(leaked))
        kill_trees(leaked)
        problems.append(f"processes outlived the test (now killed): {names}")
    mounts = set(mount_lines()) - before.mounts
    if mounts:
        problems.append("mounts outlived the test: " + "; ".join(sorted(m.strip() for m in mounts)))
    namespaces = leaked_namespaces(before)
    if namespaces:
        problems.append("namespace fds outlived the test: " + ", ".join(sorted(namespaces)))
    return problems


@pytest.fixture(autouse=True)
def nothing_outlives_the_test(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After every test, passed or failed: no new process, mount or namespace fd remains."""
    if not OWN_ROOTS:
        OWN_ROOTS.append(str(tmp_path_factory.getbasetemp().resolve()))
    before = Snapshot.take()
    yield
    problems = check(before)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
