"""Shared fixtures for the native-core tests.

The tests exercise the installed package, never the source tree's uncompiled
`sandbox/`: `python -m pytest` run from a checkout puts the checkout first on
sys.path, so tests/_installed.py, imported first, takes it off again (unless
the checkout is what is installed, as with `pip install -e .`).

Two fixtures are autouse: `nothing_outlives_the_test` (tests/leakcheck.py),
which fails a test after which a process, a mount or a namespace fd it made
is left, and `foreground_signals`, which gives every test the signal state of
a run started from a terminal's foreground, whatever started this one (a
background job ignores SIGINT and SIGQUIT; a CI runner may block signals).
The others are requested by name.

- `SYSTEM_MOUNTS`, `BASE_MOUNTS`, `make_base_spec`: the one base world every
  test module builds on (the conformance suite takes SYSTEM_MOUNTS, the
  distribution's programs only; the others BASE_MOUNTS). Import them with
  `from conftest import ...`.
- `base_spec`: build a minimal working world (/usr read-only, the usual
  /bin, /lib, /lib64 links, /proc, /dev, a private /tmp) plus extras.
- `run_sh`: run a shell snippet in a native sandbox, return the
  CompletedProcess (text, captured).
- `no_leftovers`: a unique marker; after the test, no process whose cmdline
  carries it survives and the test process has no new children or zombies.
- `fd_count`: how many fds the test process has open.
- `procs`: helpers to look at processes through /proc (markers, children,
  /proc/PID/stat, polling with a deadline).
- `require_native`: skip when this host cannot run the native backend.
- `signal_state`: signal dispositions and this thread's mask, set while
  inside (what `foreground_signals` does for every test).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import _installed  # noqa: F401  (first: decides which `sandbox` the tests import)
import pytest
from leakcheck import nothing_outlives_the_test  # noqa: F401  (autouse: registered by being here)

import sandbox
from sandbox import Dev, Mount, Proc, RoBind, Spec, Symlink, Tmpfs, backends, netpool
from sandbox.netpool import FACTORY_MARKER

# The distribution's programs and libraries, read-only, and nothing else.
SYSTEM_MOUNTS: tuple[Mount, ...] = (
    RoBind("/usr"),
    Symlink("usr/bin", "/bin"),
    Symlink("usr/lib", "/lib"),
    Symlink("usr/lib64", "/lib64"),
)
# A world an ordinary command runs in: the above, /proc, /dev and a private /tmp.
BASE_MOUNTS: tuple[Mount, ...] = (*SYSTEM_MOUNTS, Proc(), Dev(), Tmpfs("/tmp"))
BASE_ENV = {"PATH": "/usr/bin:/bin"}
DEFAULT_TIMEOUT = 60.0


def make_base_spec(*extra: Mount, mounts: tuple[Mount, ...] | None = None, **fields: Any) -> Spec:
    """A Spec of the minimal world (BASE_MOUNTS, then `extra`), with `fields` set.

    `mounts=` replaces BASE_MOUNTS entirely; `env` defaults to a PATH only.
    """
    fields.setdefault("env", dict(BASE_ENV))
    base = BASE_MOUNTS if mounts is None else tuple(mounts)
    return Spec(mounts=(*base, *extra), **fields)


@pytest.fixture
def base_spec() -> Callable[..., Spec]:
    """`base_spec(*extra_mounts, **spec_fields) -> Spec`: the minimal working world.

    The result is an ordinary Spec, so `.replace(...)` works on it too.
    """
    return make_base_spec


def run_in_sandbox(script: str, spec: Spec | None = None, *, timeout: float | None = DEFAULT_TIMEOUT,
                   text: bool = True, **kwargs: Any) -> sandbox.CompletedProcess:
    """Run `sh -c script` in a native sandbox (default: the base world), captured."""
    if "stdout" not in kwargs and "stderr" not in kwargs:
        kwargs["capture_output"] = True
    return sandbox.run(["sh", "-c", script], spec if spec is not None else make_base_spec(),
                       timeout=timeout, text=text, backend="native", **kwargs)


@pytest.fixture
def run_sh() -> Callable[..., sandbox.CompletedProcess]:
    """`run_sh(script, spec=None, **run_kwargs) -> CompletedProcess`.

    Runs `sh -c script` in a native sandbox (the base world by default) with
    stdout/stderr captured as text and a 60 s timeout unless overridden.
    """
    return run_in_sandbox


# A preamble for a child Python: a seccomp filter that refuses the mount API,
# as a container runtime's or systemd's filter may; the native backend cannot
# run under it.
BLOCK_MOUNT_API = r"""
import ctypes
from sandbox.seccomp import Seccomp, compile_policy

prog = compile_policy(Seccomp(deny=("open_tree", "move_mount", "fsopen", "fsmount", "fsconfig", "fspick",
                                    "mount_setattr")))
buf = ctypes.create_string_buffer(prog, len(prog))


class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


libc = ctypes.CDLL(None, use_errno=True)
fprog = Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
assert libc.prctl(38, 1, 0, 0, 0) == 0, "PR_SET_NO_NEW_PRIVS"
assert libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0, "PR_SET_SECCOMP"
"""

# ---------------------------------------------------------------- signals

# What Python sets at its start from a terminal's foreground, for the signals a
# starter may have changed: a child it spawns inherits every ignored one (exec keeps
# SIG_IGN; a handler becomes SIG_DFL) and the spawning thread's mask.
FOREGROUND_SIGNALS: dict[signal.Signals, Any] = {
    signal.SIGINT: signal.default_int_handler,  # ignored in a background job (sh: `cmd &`)
    signal.SIGQUIT: signal.SIG_DFL,  # likewise
}  # (not SIGHUP, which nohup ignores: a test that needs it sets it, and nohup's run survives a hangup)


@contextlib.contextmanager
def signal_state(handlers: Mapping[int, Any], how: int, mask: Iterable[int]) -> Iterator[None]:
    """While inside: the dispositions `handlers` set, and this thread's mask changed by
    pthread_sigmask(how, mask); both as they were again after."""
    saved = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    old_mask = signal.pthread_sigmask(how, mask)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def foreground_signals() -> Iterator[None]:
    """The test runs with FOREGROUND_SIGNALS and no signal blocked; what was
    set before is restored after it."""
    with signal_state(FOREGROUND_SIGNALS, signal.SIG_SETMASK, set()):
        yield


class BytesPath:
    """An os.PathLike of bytes: not a path the public constructors take."""

    def __fspath__(self) -> bytes:
        return b"/tmp"


class BadPath:
    """An os.PathLike whose __fspath__ returns neither str nor bytes."""

    def __fspath__(self) -> int:
        return 3


# ---------------------------------------------------------------- processes

def usable_backend(name: str) -> str:
    """`name`, for a fixture that runs each test on several backends; the test is skipped where the backend
    cannot run here (sandbox.backends.availability says why)."""
    ok, why = backends.availability(name)
    if not ok:
        pytest.skip(f"{name} backend unavailable: {why}")
    return name


def new_marker() -> str:
    """A unique token that is also a valid `sleep` operand (GNU sleep sums its
    arguments), so `sleep 1000 <marker>` carries it in its own cmdline."""
    return f"0.{secrets.randbelow(10**15):015d}7"


def sleep_cmd(marker: str, seconds: int = 1000) -> str:
    """A shell command that sleeps and shows `marker` in its cmdline."""
    return f"sleep {seconds} {marker}"


def pids_with_marker(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose cmdline contains `marker`."""
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(name))
    return found


def sleepers(marker: str) -> list[int]:
    """Pids of live `sleep ... <marker>` processes (see `sleep_cmd`)."""
    out = []
    for pid in pids_with_marker(marker):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0"):
                out.append(pid)
        except OSError:
            pass
    return out


def proc_stat(pid: int | str) -> tuple[str, list[str]] | None:
    """(state, fields after the command name) of /proc/PID/stat, or None if gone.

    fields[0] is the state, fields[1] the ppid, fields[2] the pgrp, fields[3]
    the session, fields[4] the tty_nr.
    """
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = data[data.rindex(")") + 2:].split()
    return rest[0], rest


def child_pids(parent: int | None = None) -> set[int]:
    """Pids (zombies included) whose parent is `parent` (default: this process),
    except the shared network namespace pool's factory (a long-lived helper of
    the process, started on first use; tests/integration/test_netpool.py checks it)."""
    me = os.getpid() if parent is None else parent
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(name)
        if st is not None and int(st[1][1]) == me and not _is_pool_factory(name):
            out.add(int(name))
    return out


def _is_pool_factory(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return FACTORY_MARKER.encode() in f.read().split(b"\0")
    except OSError:
        return False


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.01) -> bool:
    """Poll `predicate` until it is true or `timeout` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return predicate()
        time.sleep(interval)


@pytest.fixture
def no_leftovers() -> Iterator[str]:
    """Yield a unique marker (see `new_marker`); afterwards fail if a process
    with the marker in its cmdline survives, or if this process has gained
    children (running or zombie). Survivors are SIGKILLed so they do not leak
    into later tests."""
    marker = new_marker()
    before = child_pids()
    yield marker

    def clean() -> bool:
        return not pids_with_marker(marker) and not (child_pids() - before)

    if wait_until(clean, timeout=5.0):
        return
    survivors = pids_with_marker(marker)
    children = sorted(child_pids() - before)
    details = {pid: (proc_stat(pid) or ("gone", []))[0] for pid in children}
    for pid in survivors:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    pytest.fail(f"leftovers: processes with marker {marker}: {survivors}; new children (pid: state): {details}")


class Procs:
    """Process helpers for tests, handed out by the `procs` fixture."""

    new_marker = staticmethod(new_marker)
    sleep_cmd = staticmethod(sleep_cmd)
    with_marker = staticmethod(pids_with_marker)
    sleepers = staticmethod(sleepers)
    stat = staticmethod(proc_stat)
    children = staticmethod(child_pids)
    wait_until = staticmethod(wait_until)


@pytest.fixture
def procs() -> type[Procs]:
    """Helpers over /proc: `new_marker()`, `sleep_cmd(marker)`, `with_marker(marker)`,
    `sleepers(marker)`, `stat(pid)`, `children()`, `wait_until(predicate, timeout)`."""
    return Procs


# ---------------------------------------------------------------- fds

def count_fds() -> int:
    """Open fds of this process (listing /proc/self/fd opens one itself, every
    time), once the shared namespace pool, whose fds come and go as it
    recycles and refills in the background, is full and idle again."""
    pool = netpool.shared_pool()
    if pool is not None:
        wait_until(lambda: _pool_at_rest(pool.stats()), timeout=15.0)
    return len(os.listdir("/proc/self/fd"))


def _pool_at_rest(stats: dict[str, Any]) -> bool:
    """Full, and leased only to long holders (a Template's standbys: `reserved`)."""
    return stats["idle"] == stats["size"] and stats["in_use"] == stats["reserved"] and stats["unchecked"] == 0


@pytest.fixture
def fd_count() -> Callable[[], int]:
    """`fd_count() -> int`: the number of fds this process has open.

    The native backend keeps one O_PATH fd of sandbox-init open for the life of
    the process; run one sandbox before taking the "before" count.
    """
    return count_fds


# ---------------------------------------------------------------- host

@pytest.fixture
def require_native() -> None:
    """Skip the test when the native backend cannot run on this host."""
    result = sandbox.probe()
    if not result.native:
        pytest.skip(f"native backend unavailable: {result.native_reason}")
