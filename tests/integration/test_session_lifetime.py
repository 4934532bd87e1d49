"""A Session ends with its caller: SIGKILL the caller and nothing of the
session is left (processes, mounts, files); a session made in a thread that
has exited lives on while its caller does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import BASE_ENV, new_marker, sleepers, wait_until  # tests/, on sys.path (rootdir)

import sandbox

pytestmark = pytest.mark.integration

CALLER = """
import sys, time
import sandbox
from sandbox import Dev, Proc, RoBind, Spec, Symlink, Tmpfs
marker = sys.argv[1]
spec = Spec(mounts=(RoBind("/usr"), Symlink("usr/bin", "/bin"), Symlink("usr/lib", "/lib"),
                    Symlink("usr/lib64", "/lib64"), Proc(), Dev(), Tmpfs("/tmp")), env={"PATH": "/usr/bin:/bin"})
s = sandbox.Session(spec)
s.start(["sh", "-c", f"sleep 1000 {marker} & setsid sleep 1000 {marker} & sleep 1000 {marker}"])
s.exec(["sh", "-c", f"sleep 1000 {marker} >/dev/null 2>&1 &"])
s.write_file("/tmp/state", b"x")
print(s.pid, flush=True)
time.sleep(1000)
"""


def mountinfo() -> list[str]:
    return Path("/proc/self/mountinfo").read_text().splitlines()


def test_the_callers_death_ends_the_session(require_native: None, tmp_path: Path) -> None:
    marker = new_marker()
    before = mountinfo()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    caller = subprocess.Popen([sys.executable, "-c", CALLER, marker], stdout=subprocess.PIPE, cwd=tmp_path, env=env)
    try:
        assert caller.stdout is not None
        pid1 = int(caller.stdout.readline())
        assert wait_until(lambda: len(sleepers(marker)) == 4, 10)
        caller.send_signal(signal.SIGKILL)
        caller.wait()
        assert wait_until(lambda: not sleepers(marker), 10), "the session outlived its caller"
        assert wait_until(lambda: not os.path.exists(f"/proc/{pid1}"), 10), "the session's pid 1 outlived its caller"
    finally:
        caller.kill()
        caller.wait()
        if caller.stdout is not None:
            caller.stdout.close()
    assert mountinfo() == before
    assert list(tmp_path.iterdir()) == []


def test_a_session_made_in_a_thread_outlives_the_thread(require_native: None) -> None:
    made: list[sandbox.Session] = []
    spec = sandbox.presets.minimal_system(env=BASE_ENV)
    worker = threading.Thread(target=lambda: made.append(sandbox.Session(spec)))
    worker.start()
    worker.join()
    with made[0] as s:
        assert s.exec(["true"]).returncode == 0  # the spawning thread's exit did not end it
        assert s.exec(["sh", "-c", "echo alive"], capture_output=True).stdout == b"alive\n"


def cgroup_dirs(pid: int) -> list[Path]:
    """The cgroup directories of `pid` made for a sandbox (v1 per controller, or v2)."""
    found = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "/sbx-" not in path:
            continue
        for name in (controllers.split(",") if controllers else [""]):
            where = Path("/sys/fs/cgroup", name.removeprefix("name="), path.lstrip("/"))
            if where.is_dir():
                found.append(where)
    return found


def test_close_removes_the_sessions_cgroups(require_native: None) -> None:
    spec = sandbox.presets.minimal_system(env=BASE_ENV, limits=sandbox.Limits(memory_mb=256, nproc=64))
    s = sandbox.Session(spec)
    try:
        dirs = cgroup_dirs(s.pid)
        if not dirs:
            pytest.skip("no cgroup of its own here (not delegated): the limits are rlimits")
        assert s.exec(["sh", "-c", "sleep 1000 & true"]).returncode == 0
        inside = s.exec(["cat", "/proc/self/cgroup"], capture_output=True, text=True).stdout
        assert all(d.name in inside for d in dirs)  # every command is counted in the session's cgroups
    finally:
        s.close()
    # removed once pid 1 is reaped, which the wait for its status does not wait for (as with spawn)
    assert wait_until(lambda: not [d for d in dirs if d.exists()], 10), "close() left a cgroup behind"
