"""Attack: a FIFO planted where the next run's Spec has a File hangs its setup.

A command leaves a FIFO in its writable bind where a later Spec puts a
`File`; setup opened it for writing and blocked forever (timeout= only
counts once the command runs), with every signal blocked, so even killing
the caller left the setup process behind. Setup must refuse what is not a
regular file (SetupError naming the path) without blocking, reader or not,
and must die with its caller whatever step it is in.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from leakcheck import children

import sandbox
from sandbox import Bind, File, Tmpfs

from .attack import BACKENDS, make_base_spec, require_spawnable, run_sh

pytestmark = pytest.mark.integration

# The next run, in its own process: if setup blocks, the test kills it (and
# its setup must then go with it) instead of hanging.
NEXT_RUN = """
import pickle, sys, sandbox
spec = pickle.loads(bytes.fromhex(sys.argv[1]))
try:
    sandbox.run(["true"], spec, backend=sys.argv[2], timeout=30)
except sandbox.SetupError as exc:
    print("SetupError", exc.path, exc)
else:
    print("ran")
"""


def _box(tmp_path: Path) -> Path:
    box = tmp_path / "box"
    box.mkdir()
    return box


@pytest.mark.parametrize("reader", [False, True], ids=["no-reader", "reader"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_planted_fifo_fails_fast(backend: str, reader: bool, tmp_path: Path) -> None:
    require_spawnable(backend)
    box = _box(tmp_path)
    planted = run_sh(backend, "mkfifo /box/config", make_base_spec(Bind(str(box), "/box")))
    assert planted.returncode == 0, planted.stderr
    holder = None
    if reader:  # a sandbox still running on the same bind holds it open: a non-blocking open succeeds
        holder = sandbox.spawn(["sh", "-c", "exec 3<>/box/config; echo open; exec sleep 60"],
                               make_base_spec(Bind(str(box), "/box")), backend=backend, stdout=subprocess.PIPE)
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
    spec = make_base_spec(Bind(str(box), "/box"), File("/box/config", b"payload\n"))
    try:
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-c", NEXT_RUN, pickle.dumps(spec).hex(), backend],
                              capture_output=True, text=True, timeout=30)
        elapsed = time.monotonic() - start
    except subprocess.TimeoutExpired:
        pytest.fail("setup blocked on the planted FIFO")
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("SetupError /box/config "), done.stdout
    assert elapsed < 20


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _inner(pid: int) -> bool:
    """Whether `pid` runs in a pid namespace of its own (bwrap's sandbox side, not its monitor)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return any(len(line.split()) > 2 for line in status.splitlines() if line.startswith("NSpid:"))


def _describe(pidfd: int) -> str:
    """The pid, name, namespace pids and capabilities of the process behind `pidfd`."""
    pid = next(int(line.split()[1]) for line in Path(f"/proc/self/fdinfo/{pidfd}").read_text().splitlines()
               if line.startswith("Pid:"))
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return f"pid {pid} (gone)"
    keep = ("Name:", "State:", "PPid:", "NSpid:", "CapEff:")
    return f"pid {pid}: " + "; ".join(" ".join(line.split()) for line in status if line.startswith(keep))


def _in_setup(pid: int) -> bool:
    """Whether `pid` is a native setup child past its first step and before its last ones.

    Its first step arms SIGKILL as its parent-death signal (a child stopped
    before that is ended by its own check of the spawner's pidfd once it
    runs again, not while stopped); the next writes its id maps, which is
    how we see it from here. After dropping its capabilities it arms the
    reaper's catchable signal instead, and only no-new-privs, Landlock,
    seccomp and the exec remain: nothing that can block, so a SIGSTOP is the
    only way to hold it there, and it ends when continued (sandbox-init
    sees the pending signal and its caller gone).
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        mapped = Path(f"/proc/{pid}/uid_map").read_text().strip() != ""
    except OSError:
        return False
    caps = any(line.startswith("CapEff:") and int(line.split()[1], 16) != 0 for line in status.splitlines())
    return mapped and caps and _comm(pid) not in ("", "sandbox-init", "true")


def _stop_a_setup(caller: subprocess.Popen[bytes], backend: str) -> list[int]:
    """SIGSTOP the sandbox processes of `caller` while one is still setting up
    (native: the setup child, not yet exec'd; bwrap: its processes inside the
    new namespaces, which set up there; its monitor outside is left running,
    as a stopped one would not notice its caller's death); their pidfds."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        procs = children(caller.pid)
        for _ in range(2):  # native: caller, its sandbox-template, the setup child
            procs = sorted(set(procs + [g for k in procs for g in children(k)]))
        if backend == "native":
            procs = [p for p in procs if _inner(p) and _comm(p) not in ("", "sandbox-init", "true")]
        else:
            procs = [p for p in procs if _comm(p) == "bwrap" and _inner(p)]
        if not procs:
            continue
        time.sleep(0.002)  # past the first steps (its parent-death signal is armed after clone)
        fds = []
        for p in procs:
            try:
                fds.append(os.pidfd_open(p))
                signal.pidfd_send_signal(fds[-1], signal.SIGSTOP)
            except ProcessLookupError:
                pass
        if backend == "bwrap" or all(_in_setup(p) for p in procs):
            return fds  # stopped in setup, its parent-death signal armed
        for fd in fds:
            with contextlib.suppress(ProcessLookupError):  # it may have ended in the meantime
                signal.pidfd_send_signal(fd, signal.SIGCONT)
        for fd in fds:
            os.close(fd)
    pytest.fail("never caught a sandbox in setup")


@pytest.mark.parametrize("backend", BACKENDS)
def test_caller_killed_during_setup_leaves_nothing(backend: str) -> None:
    require_spawnable(backend)
    if backend == "template":
        pytest.skip("a Template's sandboxes set up ahead, in its process's pid namespace: they end with it, and "
                    "it with its caller (test_template.py::test_caller_death_ends_template_and_sandboxes)")
    if backend == "bwrap":
        # A bwrap sandbox side stopped by us outlives its caller: bwrap's own
        # monitor does not end it then. Under bwrap nothing planted can block
        # setup any longer (bound destinations are opened by the caller,
        # non-blocking: test_planted_fifo_fails_fast), so no stuck setup.
        pytest.xfail("bwrap (0.8.0): a stopped sandbox side outlives a SIGKILLed caller")
    # Many File ops in a tmpfs: a setup long enough to be caught.
    files = [File(f"/t/f{i}", b"x") for i in range(1000)]
    spec = make_base_spec(Tmpfs("/t"), *files)
    caller = subprocess.Popen([sys.executable, "-c", "import pickle, sys, sandbox\n"
                               "spec = pickle.load(sys.stdin.buffer)\n"
                               "while True:\n    sandbox.run(['true'], spec, backend=sys.argv[1], timeout=30)\n",
                               backend], stdin=subprocess.PIPE)
    assert caller.stdin is not None
    caller.stdin.write(pickle.dumps(spec))
    caller.stdin.close()
    fds: list[int] = []
    try:
        fds = _stop_a_setup(caller, backend)
        caller.kill()
        caller.wait()
        for fd in fds:
            gone = select.select([fd], [], [], 10)[0]
            if not gone:
                what = _describe(fd)
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                pytest.fail(f"a setup process outlived its SIGKILLed caller: {what}")
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        for fd in fds:
            os.close(fd)

