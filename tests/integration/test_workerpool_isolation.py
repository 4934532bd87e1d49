"""sandbox.WorkerPool isolation: a task cannot see another task's files, processes,
IPC objects or sockets, nor the zygote; nothing is left behind; the caller's death
ends everything. Each attack runs while the victim task is alive."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from conftest import child_pids, make_base_spec, pids_with_marker, proc_stat, wait_until

import sandbox
from sandbox import Bind, Dir

pytestmark = pytest.mark.integration


@pytest.fixture
def pool() -> Iterator[sandbox.WorkerPool]:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(), preload=["socket", "ctypes"], max_workers=4) as p:
        yield p


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (through /proc/PID/task/*/children)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = Path(f"/proc/{parent}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for kid in map(int, kids):
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def settled(measure: Callable[[], object], quiet: float = 0.3, timeout: float = 20.0) -> object:
    """`measure()` once it has not changed for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last, since = measure(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = measure()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def zygote_pid(pool: sandbox.WorkerPool) -> int:
    children = set()
    for p in descendants(pool.pid):
        st = proc_stat(p)  # once: a task may exit between two reads
        if st is not None and int(st[1][1]) == pool.pid:
            children.add(p)
    (pid,) = children
    return pid


# ---------------------------------------------------------------- victims (run in one task) and attacks (in another)

def victim(seconds: float) -> str:
    """Leave traces of every kind, then stay alive."""
    import ctypes
    import socket

    Path("/tmp/victim").write_text("secret")
    Path("/dev/shm/victim").write_text("secret")
    libc = ctypes.CDLL(None, use_errno=True)
    shm_id = libc.shmget(0x5B7, 4096, 0o1666)  # IPC_CREAT | 0666
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 47123))
    tcp.listen()
    unix = socket.socket(socket.AF_UNIX)
    unix.bind("\0sandbox-victim")
    unix.listen()
    sleeper = subprocess.Popen(["sleep", "1000"])
    time.sleep(seconds)
    sleeper.kill()
    return f"victim alive, shm {shm_id}"


def attack() -> dict[str, object]:
    """Look for the victim's traces from another task."""
    import socket

    seen: dict[str, object] = {
        "files": [p for p in ("/tmp/victim", "/dev/shm/victim") if os.path.exists(p)],
        "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "ppid": os.getppid(),
        "sysv_shm": Path("/proc/sysvipc/shm").read_text().splitlines()[1:],
        "links": sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else None,
    }
    for name, family, address in (("tcp", socket.AF_INET, ("127.0.0.1", 47123)),
                                  ("unix", socket.AF_UNIX, "\0sandbox-victim")):
        with socket.socket(family) as s:
            seen[name] = s.connect_ex(address)
    try:
        Path("/rootfile").write_text("x")
        seen["root_writable"] = True
    except OSError:
        seen["root_writable"] = False
    status = dict(line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":\t" in line)
    seen["status"] = {k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")}
    return seen


def start_victim(pool: sandbox.WorkerPool, seconds: float = 4.0) -> Future:
    fut = pool.submit(victim, seconds)
    time.sleep(1.0)  # its traces are made by now (it only needs a few ms)
    assert not fut.done(), fut.exception() if fut.done() else None
    return fut


def test_a_task_sees_nothing_of_another(pool: sandbox.WorkerPool) -> None:
    victim_future = start_victim(pool)
    seen = pool.submit(attack).result(timeout=60)
    assert victim_future.result(timeout=60).startswith("victim alive")
    assert seen["files"] == []
    assert seen["pids"] == [1] and seen["ppid"] == 0  # its own pid namespace: no zygote, no victim
    assert seen["sysv_shm"] == []
    assert seen["tcp"] != 0 and seen["unix"] != 0  # ECONNREFUSED: its own network namespace
    assert seen["root_writable"] is False
    assert seen["status"] == {"CapEff": "0000000000000000", "CapPrm": "0000000000000000",
                              "CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"}


def test_a_task_cannot_signal_others(pool: sandbox.WorkerPool) -> None:
    victim_future = start_victim(pool, seconds=3.0)

    def kill_everything() -> str:
        try:
            os.kill(-1, signal.SIGKILL)  # every process this task may signal, but itself
        except ProcessLookupError:
            return "no process to signal"
        return "signalled some"

    assert pool.submit(kill_everything).result(timeout=60) == "no process to signal"
    assert victim_future.result(timeout=60).startswith("victim alive")
    assert pool.submit(int, "5").result(timeout=60) == 5


def test_a_task_cannot_make_user_namespaces_but_the_zygote_could(pool: sandbox.WorkerPool) -> None:
    def unshare_user() -> int:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return 0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno()

    assert pool.submit(unshare_user).result(timeout=60) == 1  # EPERM: the Spec's seccomp policy


def test_the_zygote_is_a_fresh_interpreter(pool: sandbox.WorkerPool) -> None:
    pid = zygote_pid(pool)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[0] == sys.executable.encode() and argv[1] == b"-I" and argv[2].endswith(b"zygote.py")
    assert b"PYTEST_CURRENT_TEST" not in Path(f"/proc/{pid}/environ").read_bytes()


def test_tasks_leave_nothing_behind() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    with sandbox.WorkerPool(make_base_spec(), max_workers=4, spares=2) as p:
        assert p.submit(abs, -1).result(timeout=60) == 1
        zygote = zygote_pid(p)

        def footprint() -> tuple[int, int, int, int]:
            return (len(os.listdir("/proc/self/fd")), len(os.listdir(f"/proc/{zygote}/fd")),
                    len(Path(f"/proc/{zygote}/mountinfo").read_text().splitlines()), len(descendants(p.pid)))

        # the zygote, its network namespace factory and its two spares, each set up and waiting for a task
        assert wait_until(lambda: len(descendants(p.pid)) == 4, timeout=10)
        before = settled(footprint)
        results = list(p.map(abs, range(-1000, 0)))
        assert results == list(range(1000, 0, -1))
        # No task process is left, and neither the caller nor the zygote holds
        # an fd or a mount more: nothing can hold a task's namespaces alive.
        assert wait_until(lambda: footprint() == before, timeout=20), (before, footprint())
    # the pool's pid 1 reported its end before its own exit: reaped in the background (sandbox.reaper)
    assert not descendants(p.pid) and wait_until(lambda: proc_stat(p.pid) is None)
    assert not child_pids() & {p.pid, zygote}


def _alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (read once: it may end between two reads)."""
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z"


def test_killing_the_caller_kills_the_zygote_and_every_task(tmp_path: Path) -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    marker = f"0.{time.time_ns() % 10**12:012d}7"
    ready = tmp_path / "ready"
    ready.mkdir()
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        import sandbox
        from sandbox import Bind, Dev, Dir, Proc, RoBind, Spec, Symlink, Tmpfs

        def hang(i):
            subprocess.Popen(["sleep", "1000", {marker!r}])
            open(f"/ready/{{i}}", "w").close()
            time.sleep(1000)

        spec = Spec(mounts=[RoBind("/usr"), Symlink("usr/bin", "/bin"), Symlink("usr/lib", "/lib"),
                            Symlink("usr/lib64", "/lib64"), Proc(), Dev(), Tmpfs("/tmp"), Dir("/ready")],
                    env={{"PATH": "/usr/bin"}})
        pool = sandbox.WorkerPool(spec, max_workers=2)
        futs = [pool.submit_task(hang, (i,), binds=[Bind({str(ready)!r}, "/ready")]) for i in range(2)]
        print(pool.pid, flush=True)
        time.sleep(1000)
    """))
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert caller.stdout is not None
        pool_pid = int(caller.stdout.readline())
        assert wait_until(lambda: len(os.listdir(ready)) == 2 and len(pids_with_marker(marker)) >= 2, timeout=30)
        doomed = descendants(pool_pid) | {pool_pid}
        assert len(doomed) >= 6  # the reaper, the zygote, two tasks, two sleeps
    finally:
        caller.kill()
        caller.wait()
    assert wait_until(lambda: not any(_alive(pid) for pid in doomed), timeout=10)
    assert not pids_with_marker(marker)


def test_landlock_and_per_task_binds(tmp_path: Path) -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    shared = tmp_path / "shared"
    shared.mkdir()

    def work() -> str:
        Path("/tmp/scratch").write_text("ok")
        Path("/data/out").write_text(Path("/usr/lib/os-release").read_text()[:4])
        return Path("/data/out").read_text()

    spec = make_base_spec(Dir("/data"), landlock="best-effort")
    with sandbox.WorkerPool(spec, max_workers=1) as p:
        out = p.submit_task(work, binds=[Bind(str(shared), "/data")]).result(timeout=60)
    assert out == (shared / "out").read_text() == Path("/usr/lib/os-release").read_text()[:4]


def test_the_zygote_dying_breaks_the_pool_not_the_caller() -> None:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    from sandbox.workerpool import BrokenWorkerPool

    p = sandbox.WorkerPool(make_base_spec(), max_workers=2)
    try:
        running = p.submit(time.sleep, 100)
        time.sleep(0.5)
        os.kill(zygote_pid(p), signal.SIGKILL)
        with pytest.raises(BrokenWorkerPool):
            running.result(timeout=30)
        assert wait_until(lambda: not descendants(p.pid), timeout=10)  # its tasks went with it
        with pytest.raises(BrokenWorkerPool):
            p.submit(abs, 1)
    finally:
        p.shutdown(wait=True)
    assert wait_until(lambda: proc_stat(p.pid) is None)
