"""Resource walls per sandbox (sandbox.cgroups): memory, processes and CPU, on every executor of sandbox.run.

Real limits need a cgroup the caller may write: root's own, or the delegated
subtree run-tests.sh gives the unprivileged run ($SANDBOX_CGROUP_PARENT).
Without one, the tests of real limits are skipped and the fallback's are run.
"""

from __future__ import annotations

import errno
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
from conftest import wait_until
from forkbomb import FORK_BOMB

import sandbox
from sandbox import Limits, UnavailableError
from sandbox.backends.template import BACKEND as template_backend
from sandbox.cgroups import PARENT_ENV, PREFIX, CgroupLimits, hierarchies_for, host_cgroups
from sandbox.presets import python_interpreter

INFO = host_cgroups()
needs = pytest.mark.skipif(INFO.controllers != {"memory", "pids", "cpu"},
                           reason=f"no cgroup limits for this caller: {INFO.reason}")
PY = sys.executable
NO_CPU_LIMIT = hierarchies_for(INFO, CgroupLimits(memory_bytes=64 << 20, pids=8))  # where such a sandbox's cgroups go


@pytest.fixture(params=["native", "bwrap", "template"])
def executor(request: pytest.FixtureRequest) -> Iterator[str]:
    """The backend sandbox.run uses (each places the sandbox in its cgroup its own way; "template": a
    Template per Spec, whose sandboxes enter the cgroup the caller made for their request)."""
    ok, why = sandbox.backends.availability(request.param)
    if not ok:
        pytest.skip(f"{request.param}: {why}")
    yield str(request.param)
    if request.param == "template":
        template_backend.close()  # the servers it keeps per Spec (and the pool's leases their standbys hold)

TOUCH = textwrap.dedent("""
    import ctypes, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    p = libc.mmap(None, 8 << 30, 3, 0x22 | 0x4000, -1, 0)  # 8 GB, private, anonymous, no reserve
    assert p not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    ctypes.memset(p, 1, int(sys.argv[1]) << 20)
    print("touched", sys.argv[1])
""")


def spec(**limits: object) -> sandbox.Spec:
    return python_interpreter(limits=Limits(**limits))  # type: ignore[arg-type]


def leftovers() -> list[str]:
    return [p for h in INFO.hierarchies for p in glob.glob(os.path.join(h.parent, PREFIX + "*"))]


def mine(paths: list[str], pid: int | None = None) -> list[str]:
    """The cgroups of `paths` that process `pid` (default: this one) made: never another job's."""
    return [p for p in paths if os.path.basename(p).startswith(f"{PREFIX}{pid or os.getpid()}-")]


def cgroup_of(p: sandbox.SandboxProcess, procs: object, marker: str) -> set[int]:
    """The pids in the cgroup of `p`, which runs INSIDE with `marker`: once it has said it holds no fd
    of its cgroup and its child runs."""
    assert p.stdout is not None
    assert p.stdout.readline() == b"[0, 1, 2]\n"  # no entry file of its cgroup, nothing of pid 1's
    assert wait_until(lambda: len(procs.with_marker(marker)) == 2, 10.0)  # type: ignore[attr-defined]
    walls = p._handle.walls  # type: ignore[attr-defined]
    assert walls is not None and walls.cgroup is not None
    return {int(pid) for _, path in walls.cgroup.dirs
            for pid in open(os.path.join(path, "cgroup.procs")).read().split()}


@pytest.fixture(autouse=True)
def no_cgroup_left() -> object:
    yield
    assert wait_until(lambda: not mine(leftovers()), 5.0), f"cgroups left behind: {mine(leftovers())}"


@needs
def test_reserving_8_gb_and_touching_10_mb_runs_under_memory_100(executor: str) -> None:
    r = sandbox.run([PY, "-c", TOUCH, "10"], spec(memory_mb=100), capture_output=True, backend=executor)
    assert (r.returncode, r.stdout, r.killed_by) == (0, b"touched 10\n", None), r.stderr
    assert r.usage is not None and r.usage.mechanism == INFO.mechanism
    assert r.usage.memory_peak_mb is not None and 10 <= r.usage.memory_peak_mb <= 100
    assert r.usage.cpu_s is not None and r.usage.cpu_s > 0


@needs
def test_touching_300_mb_under_memory_100_is_killed_by_memory(executor: str) -> None:
    r = sandbox.run([PY, "-c", TOUCH, "300"], spec(memory_mb=100), capture_output=True, backend=executor)
    assert r.returncode == -signal.SIGKILL and r.killed_by == "memory", (r.returncode, r.stderr)
    assert r.stdout == b""
    assert r.usage is not None and r.usage.memory_peak_mb is not None and r.usage.memory_peak_mb <= 100.5


@needs
def test_a_fork_bomb_under_nproc_32_stays_at_32(executor: str, procs: object) -> None:
    marker = procs.new_marker()  # type: ignore[attr-defined]
    r = sandbox.run([PY, "-c", FORK_BOMB, marker], spec(nproc=32), capture_output=True, backend=executor,
                    timeout=60)
    forked = int(r.stdout)
    # sandbox-init and the bomb itself count too
    assert 0 < forked <= 30, r.stdout
    assert r.usage is not None and r.usage.pids_peak is not None and r.usage.pids_peak <= 32
    # nothing of the sandbox is left: every fork of the bomb carries the marker (not a count of the
    # host's processes, where other work comes and goes)
    assert wait_until(lambda: not procs.with_marker(marker), 5.0)  # type: ignore[attr-defined]


@needs
def test_nproc_1_beside_the_sandbox_pid_1_fails_with_a_hint(executor: str) -> None:
    with pytest.raises(sandbox.SetupError) as info:
        sandbox.run(["true"], spec(nproc=1), capture_output=True, backend=executor, timeout=60)
    assert info.value.errno == errno.EAGAIN and "Limits.nproc counts every process" in str(info.value)
    assert "as_pid_1=True" in str(info.value)
    # as the hint says: with the command as pid 1, one process is enough for it
    r = sandbox.run(["true"], spec(nproc=1).replace(as_pid_1=True), capture_output=True, backend=executor,
                    timeout=60)
    assert r.returncode == 0, r.stderr


@needs
def test_a_fork_bomb_that_fails_is_killed_by_pids(executor: str) -> None:
    bomb = FORK_BOMB + "raise SystemExit(3)\n"
    r = sandbox.run([PY, "-c", bomb], spec(nproc=8), capture_output=True, backend=executor, timeout=60)
    assert (r.returncode, r.killed_by) == (3, "pids")


@needs
def test_half_a_core_holds_a_busy_loop_near_half_a_cpu(executor: str) -> None:
    spin = "import time\nt = time.monotonic() + 2\nwhile time.monotonic() < t: pass\n"
    start = time.monotonic()
    r = sandbox.run([PY, "-c", spin], spec(cpu_cores=0.5), capture_output=True, backend=executor, timeout=30)
    wall = time.monotonic() - start
    assert r.returncode == 0 and r.usage is not None and r.usage.cpu_s is not None
    share = r.usage.cpu_s / wall
    # Unbounded, a busy loop takes a whole CPU. The cap is an upper bound only: on a loaded host
    # (tools/loaded-tests.sh) the loop gets less than half a CPU whatever the sandbox does.
    assert 0 < share <= 0.7, (r.usage.cpu_s, wall)


@needs
def test_kill_reaches_every_process_of_the_cgroup_without_a_pid_namespace(executor: str, procs: object) -> None:
    if executor == "template":
        pytest.skip("a Template's sandboxes always have a pid namespace of their own")
    marker = procs.new_marker()  # type: ignore[attr-defined]
    script = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\ntime.sleep(60)\n"
    s = python_interpreter(limits=Limits(nproc=16), namespaces=sandbox.Namespaces(pid=False))
    with sandbox.spawn([PY, "-c", script, marker], s, backend=executor) as p:
        assert wait_until(lambda: len(procs.with_marker(marker)) == 2, 10.0)  # type: ignore[attr-defined]
        p.kill()
    assert wait_until(lambda: not procs.with_marker(marker), 5.0)  # type: ignore[attr-defined]
    assert p.killed_by is None  # the caller's kill, not a limit


@needs
def test_a_timeout_is_reported_as_killed_by_timeout(executor: str) -> None:
    with pytest.raises(subprocess.TimeoutExpired) as info:
        sandbox.run([PY, "-c", "import time; time.sleep(30)"], spec(memory_mb=64), timeout=0.5, backend=executor)
    assert info.value.killed_by == "timeout"  # type: ignore[attr-defined]


@needs
def test_no_cgroup_is_left_after_the_caller_is_sigkilled(tmp_path: object) -> None:
    caller = textwrap.dedent(f"""
        import sys, sandbox
        from sandbox import Limits
        from sandbox.presets import python_interpreter
        p = sandbox.spawn([{PY!r}, "-c", "import time; time.sleep(60)"],
                          python_interpreter(limits=Limits(memory_mb=64, nproc=8)), backend="native")
        print(p.pid, flush=True)
        sys.stdin.read()
    """)
    made = _kill_the_caller_once_started(caller)
    assert len(made) == len(NO_CPU_LIMIT)
    _next_start_sweeps(made, 5.0)


def _kill_the_caller_once_started(caller: str) -> set[str]:
    """Run `caller` (a script that starts a sandbox and prints its pid), SIGKILL it once it has: the
    cgroups it made."""
    child = subprocess.Popen([PY, "-c", caller], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline().strip().isdigit()
    made = set(mine(leftovers(), child.pid))  # its own (other jobs make cgroups beside it)
    child.kill()
    child.wait()
    child.stdout.close()
    child.stdin.close()  # type: ignore[union-attr]
    return made


def _next_start_sweeps(made: set[str], within: float) -> None:
    """The next start (another process's first cgroup) sweeps what a dead owner left."""
    later = subprocess.run([PY, "-c", "import sandbox, sys\nfrom sandbox import Limits\n"
                            "from sandbox.presets import python_interpreter\n"
                            f"sandbox.run([{PY!r}, '-c', 'pass'], python_interpreter(limits=Limits(nproc=8)))"],
                           timeout=60)
    assert later.returncode == 0
    assert wait_until(lambda: not (made & set(leftovers())), within), made & set(leftovers())


def test_require_cgroups_without_them_names_why(executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PARENT_ENV, "/nonexistent/cgroup")
    with pytest.raises(UnavailableError, match="require_cgroups.*memory_mb"):
        sandbox.run([PY, "-c", "pass"], spec(memory_mb=100, require_cgroups=True), backend=executor)


def test_without_cgroups_memory_falls_back_to_rlimit_data(executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PARENT_ENV, "/nonexistent/cgroup")
    show = "import resource; print(resource.getrlimit(resource.RLIMIT_DATA)[0] >> 20)"
    r = sandbox.run([PY, "-c", show], spec(memory_mb=300), capture_output=True, backend=executor)
    assert (r.returncode, r.stdout) == (0, b"300\n")
    assert r.usage is not None and r.usage.mechanism == "rlimit" and r.killed_by is None


@needs
@pytest.mark.parametrize("binds", [False, True], ids=["standby", "per-call-bind"])
def test_a_template_calls_limits_get_a_cgroup_of_its_own(binds: bool, tmp_path: object) -> None:
    """Per-call limits on a Template: taken by a standby, or (with a per-call bind) cloned by the server."""
    call = {"binds": [sandbox.RoBind(str(tmp_path), "/tmp")]} if binds else {}
    with sandbox.Template(python_interpreter()) as t:
        free = t.run([PY, "-c", "pass"], **call)  # type: ignore[arg-type]
        assert free.usage is not None and free.usage.mechanism == "rlimit"  # no limits: no cgroup
        r = t.run([PY, "-c", TOUCH, "300"], limits=Limits(memory_mb=100), capture_output=True,
                  **call)  # type: ignore[arg-type]
        assert (r.returncode, r.killed_by) == (-signal.SIGKILL, "memory"), r.stderr
        r = t.run([PY, "-c", FORK_BOMB], limits=Limits(nproc=8), capture_output=True, timeout=60,
                  **call)  # type: ignore[arg-type]
        assert 0 < int(r.stdout) <= 7 and r.usage is not None and r.usage.pids_peak is not None
        assert r.usage.pids_peak <= 8 and r.usage.mechanism == INFO.mechanism


INSIDE = textwrap.dedent("""
    import os, sys, time
    def is_open(fd):
        try:
            os.fstat(fd)
            return True
        except OSError:
            return False
    print(sorted(fd for fd in map(int, os.listdir("/proc/self/fd")) if is_open(fd)), flush=True)  # not listdir's
    if os.fork() == 0:
        os.setsid()
        time.sleep(30)
    time.sleep(30)
""")


@needs
@pytest.mark.parametrize("as_pid_1", [False, True], ids=["reaper", "as-pid-1"])
def test_every_process_of_a_template_sandbox_is_in_its_cgroup_and_holds_no_fd_of_it(as_pid_1: bool,
                                                                                   procs: object) -> None:
    marker = procs.new_marker()  # type: ignore[attr-defined]
    with sandbox.Template(python_interpreter(limits=Limits(nproc=16), as_pid_1=as_pid_1)) as t:
        with t.spawn([PY, "-c", INSIDE, marker], stdout=subprocess.PIPE) as p:
            inside = cgroup_of(p, procs, marker)
            assert set(procs.with_marker(marker)) <= inside  # type: ignore[attr-defined]
            assert len(inside) == (2 if as_pid_1 else 3)  # and its resident pid 1, if it has one
            p.kill()
        assert p.returncode == -signal.SIGKILL and p.killed_by is None
    assert wait_until(lambda: not procs.with_marker(marker), 5.0)  # type: ignore[attr-defined]


def _populated(path: str) -> list[int]:
    return [int(pid) for pid in open(os.path.join(path, "cgroup.procs")).read().split()]


@needs
def test_a_template_with_spec_limits_keeps_its_standbys_in_cgroups_made_ahead() -> None:
    """Cgroup mode: each standby lives in a cgroup of its own, with the Spec's limits written, before any
    request; a call takes one like any other, with no cgroup made or entered on its path."""
    with sandbox.Template(python_interpreter(limits=Limits(memory_mb=100, nproc=16))) as t:
        placed = t._server.placed  # type: ignore[attr-defined]
        assert placed is not None and t._server.standby  # type: ignore[attr-defined]
        assert wait_until(lambda: sum(bool(_populated(c.dirs[0][1])) for c in placed._sent.values()) == 2, 10.0)
        waiting = {c.dirs[0][1] for c in placed._sent.values() if _populated(c.dirs[0][1])}
        for cgroup in placed._sent.values():
            h, path = next((h, p) for h, p in cgroup.dirs if "pids" in h.controllers)
            assert open(os.path.join(path, "pids.max")).read().strip() == "16"  # written ahead
        with t.spawn([PY, "-c", "import time; time.sleep(30)"]) as p:
            walls = p._handle.walls  # type: ignore[attr-defined]
            assert walls.cgroup.dirs[0][1] in waiting  # a standby's, made and entered before the call
            assert p.pid in {pid for _, path in walls.cgroup.dirs for pid in _populated(path)}
            p.kill()
        r = t.run([PY, "-c", TOUCH, "300"], capture_output=True)
        assert (r.returncode, r.killed_by) == (-signal.SIGKILL, "memory"), r.stderr
        r = t.run([PY, "-c", FORK_BOMB], capture_output=True, timeout=60)
        assert 0 < int(r.stdout) <= 15 and r.usage is not None and r.usage.pids_peak == 16
        # a call with other limits: a standby moves into a cgroup made for them, and its own goes
        assert wait_until(lambda: sum(bool(_populated(c.dirs[0][1])) for c in placed._sent.values()) == 2, 10.0)
        standbys = {pid for c in placed._sent.values() for pid in _populated(c.dirs[0][1])}
        with t.spawn([PY, "-c", "import time; time.sleep(30)"], limits=Limits(memory_mb=50, nproc=8)) as p:
            walls = p._handle.walls  # type: ignore[attr-defined]
            assert p.pid in standbys and walls.cgroup.dirs[0][1] not in waiting
            h, path = next((h, p_) for h, p_ in walls.cgroup.dirs if "pids" in h.controllers)
            assert open(os.path.join(path, "pids.max")).read().strip() == "8"
            assert p.pid in _populated(path)
            p.kill()
        assert wait_until(lambda: len(placed._sent) == 2, 5.0), len(placed._sent)  # the one it left, removed
        r = t.run([PY, "-c", TOUCH, "60"], limits=Limits(memory_mb=40), capture_output=True)
        assert (r.returncode, r.killed_by) == (-signal.SIGKILL, "memory"), r.stderr
        r = t.run([PY, "-c", TOUCH, "150"], limits=Limits(memory_mb=300), capture_output=True)
        assert r.returncode == 0 and r.usage is not None and r.usage.memory_peak_mb is not None
        assert r.usage.memory_peak_mb >= 150


@needs
def test_a_failed_call_does_not_leave_its_standbys_cgroup_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby whose request fails reports no cgroup: its empty, used set is found and removed."""
    from sandbox.backends.template import placed as placed_module
    monkeypatch.setattr(placed_module, "SCAN_EVERY_S", 0.05)
    with sandbox.Template(python_interpreter(limits=Limits(nproc=16))) as t:
        placed = t._server.placed  # type: ignore[attr-defined]
        for _ in range(3):
            with pytest.raises(sandbox.SandboxError):
                t.run(["/nonexistent/command"])
        assert t.run([PY, "-c", "pass"]).returncode == 0
        assert wait_until(lambda: len(placed._sent) == 2, 10.0), len(placed._sent)  # the standbys' alone


@needs
def test_no_template_cgroup_is_left_after_the_caller_is_sigkilled() -> None:
    caller = textwrap.dedent(f"""
        import sys, sandbox
        from sandbox import Limits
        from sandbox.presets import python_interpreter
        t = sandbox.Template(python_interpreter(limits=Limits(memory_mb=64, nproc=8)))
        p = t.spawn([{PY!r}, "-c", "import time; time.sleep(60)"])
        print(p.pid, flush=True)
        sys.stdin.read()
    """)
    made = _kill_the_caller_once_started(caller)
    assert len(made) >= 3 * len(NO_CPU_LIMIT)  # the sandbox's, the standbys', those made ahead
    _next_start_sweeps(made, 10.0)


@needs
def test_a_sandbox_without_a_cpu_limit_skips_a_cpu_only_hierarchy() -> None:
    """On v1 with cpu and cpuacct apart (this VM), the cpu hierarchy serves only cpu_cores: a sandbox
    without one is not placed there (its entry is the costliest), and its CPU time still comes from cpuacct."""
    cpu_only = [h for h in INFO.hierarchies if h.version == 1 and h.controllers == {"cpu"}]
    if not cpu_only:
        pytest.skip("no v1 hierarchy of the cpu controller alone here")
    show = "print(open('/proc/self/cgroup').read())"
    r = sandbox.run([PY, "-c", show], spec(nproc=8), capture_output=True)
    line = next(x for x in r.stdout.decode().splitlines() if x.split(":")[1] == "cpu")
    assert PREFIX not in line and r.usage is not None and r.usage.cpu_s  # counted all the same
    r = sandbox.run([PY, "-c", show], spec(nproc=8, cpu_cores=0.5), capture_output=True)
    line = next(x for x in r.stdout.decode().splitlines() if x.split(":")[1] == "cpu")
    assert PREFIX in line


def test_sandbox_init_enters_cgroups_or_exits_124(tmp_path: object) -> None:
    """The bwrap backend starts bwrap through `sandbox-init --enter-cgroups FDS`: it writes "0" to each
    entry file and closes it before the exec; an fd it cannot write stops it with 124 (nothing runs)."""
    from sandbox.backends.bwrap.driver import ENTER_FAILED, SIGNAL_RESETTER
    r, w = os.pipe()
    try:
        out = subprocess.run([str(SIGNAL_RESETTER), "--enter-cgroups", str(w), "/bin/sh", "-c",
                              f"ls /proc/self/fd/{w} 2>/dev/null; echo ran"], pass_fds=(w,), capture_output=True)
        assert (out.returncode, out.stdout) == (0, b"ran\n")  # wrote "0" to the pipe, closed it, ran
        assert os.read(r, 8) == b"0"
        out = subprocess.run([str(SIGNAL_RESETTER), "--enter-cgroups", "99", "/bin/sh", "-c", "echo ran"],
                             capture_output=True)
        assert (out.returncode, out.stdout) == (ENTER_FAILED, b"")
    finally:
        os.close(r)
        os.close(w)


@needs
def test_a_call_on_a_closed_template_with_spec_limits_leaves_no_cgroup() -> None:
    t = sandbox.Template(python_interpreter(limits=Limits(nproc=16)))
    assert t.run([PY, "-c", "pass"]).returncode == 0
    t.close()
    with pytest.raises(sandbox.SandboxError):
        t.run([PY, "-c", "pass"])
    with pytest.raises(sandbox.SandboxError):
        t.run([PY, "-c", "pass"], limits=Limits(nproc=8))
    # no_cgroup_left: neither the sets made ahead nor those made for the calls are left


def test_probe_says_whether_memory_mb_holds_swap_too() -> None:
    """`sandbox probe` names the limits a cgroup enforces here and, for memory_mb, whether swap is
    accounted with it (this host's memory hierarchy has memsw / memory.swap.max, or not)."""
    report = sandbox.probe().limits
    info = host_cgroups()
    if "memory" not in info.controllers:
        assert "memory_mb by RLIMIT_DATA" in report
    elif info.swap:
        assert "memory_mb holds memory and swap together" in report
    else:
        assert "swap is not accounted here" in report
