"""Resource walls on the executors beyond sandbox.run's backends (test_limits.py) and the WorkerPool
(test_workerpool_limits.py): the task layer (sandbox.task) and the CLI, run directly and through the
CLI server.

What each can express, and so what is tested here:
- the task layer: `task.Limits` has `memory_mb` (the sandbox's cgroup, as Spec's) but neither `nproc`
  nor `cpu_cores` (the task-sandbox format names exactly memory_mb, file_mb and cpu_s), and its results
  carry the sandbox's `usage` and `killed_by`: its memory cases are tested; a fork bomb and a CPU cap
  have no field to ask for them;
- the CLI: `--limit-memory`, `--limit-nproc` and `--limit-cpu-cores` are the sandbox's cgroup
  (`--limit-cpu` is RLIMIT_CPU seconds): its memory, fork-bomb and CPU cases are tested, both run
  directly and handed off to the CLI server. A served run takes the client's environment, and a
  client with any SANDBOX_ variable runs directly: a served run gets cgroups only where its caller
  has them without $SANDBOX_CGROUP_PARENT (root here; the unprivileged run's come from that variable,
  so its served cases are skipped, saying so).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import cli_helpers as cli
import pytest
from cli_helpers import SYSTEM, Installation, cli_install  # noqa: F401  (cli_install: the fixture `install`)
from conftest import usable_backend, wait_until
from test_limits import FORK_BOMB, INFO, TOUCH, leftovers, mine, needs, no_cgroup_left  # noqa: F401

from sandbox import task
from sandbox.cgroups import PARENT_ENV, detect

pytestmark = pytest.mark.integration
PY = sys.executable


# ---------------------------------------------------------------- the task layer

@pytest.fixture(params=["native", "bwrap"])
def backend(request: pytest.FixtureRequest) -> str:
    return usable_backend(request.param)


def task_box(**limits: int) -> task.Sandbox:
    return task.Sandbox(limits=task.Limits(**limits))


@needs
def test_a_task_touching_300_mb_under_memory_100_is_killed(backend: str) -> None:
    r = task.run([PY, "-c", TOUCH, "300"], task_box(memory_mb=100), backend=backend, capture_output=True,
                 timeout=60)
    assert r.returncode == -signal.SIGKILL and b"touched" not in r.stdout, r.stderr
    assert r.killed_by == "memory", (r.killed_by, r.usage)
    assert r.usage is not None and r.usage.memory_peak_mb is not None and 90 <= r.usage.memory_peak_mb <= 110


@needs
def test_a_task_that_ends_by_itself_reports_its_usage_and_no_limit(backend: str) -> None:
    with task.spawn([PY, "-c", TOUCH, "10"], task_box(memory_mb=100), backend=backend,
                    stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdout.read() == b"touched 10\n"
        assert proc.wait(timeout=60) == 0
    assert proc.killed_by is None
    assert proc.usage is not None and proc.usage.cpu_s is not None and proc.usage.cpu_s > 0


@needs
def test_a_task_reserving_8_gb_and_touching_10_mb_runs_under_memory_100(backend: str) -> None:
    r = task.run([PY, "-c", TOUCH, "10"], task_box(memory_mb=100), backend=backend, capture_output=True,
                 timeout=60)
    assert (r.returncode, r.stdout) == (0, b"touched 10\n"), r.stderr


# ---------------------------------------------------------------- the CLI

SYSTEM_PY = "/usr/bin/python3"  # in SYSTEM's /usr; the scripts need only its standard library


@pytest.fixture(params=["direct", "served"])
def cli_run(request: pytest.FixtureRequest, install: Installation,  # noqa: F811
            monkeypatch: pytest.MonkeyPatch) -> object:
    """`sandbox run ARGS` with the installed client: run directly, or handed off to a CLI server that
    has this run's cgroup parent ($SANDBOX_CGROUP_PARENT; a client with any SANDBOX_ variable runs
    directly, so the client itself goes without)."""
    served = request.param == "served"
    if served and detect(None).controllers != INFO.controllers:
        pytest.skip("a served run takes the client's environment, and a client with $SANDBOX_CGROUP_PARENT runs "
                    "directly: the CLI server reaches no cgroup that variable delegates (its limits would be "
                    "rlimits), and this caller has no other")
    if served:
        parent = os.environ.get(PARENT_ENV)
        base = cli.clean_env
        monkeypatch.setattr(cli, "clean_env", lambda **extra: base(**({PARENT_ENV: parent} if parent else {}),
                                                                    **extra))
        install.start_server()
        monkeypatch.setattr(cli, "clean_env", base)

    def run(*args: str) -> object:
        env = cli.clean_env() if served else cli.clean_env(SANDBOX_CLI_SERVER="0", **(
            {PARENT_ENV: os.environ[PARENT_ENV]} if PARENT_ENV in os.environ else {}))
        return install.run("run", *SYSTEM, *args, env=env)

    yield run
    if served:
        assert install.served() >= 1, install.notes()


@needs
def test_the_cli_stops_a_fork_bomb_at_limit_nproc(cli_run: object, procs: object) -> None:
    marker = procs.new_marker()  # type: ignore[attr-defined]
    r = cli_run("--limit-nproc", "32", "--", SYSTEM_PY, "-c", FORK_BOMB, marker)  # type: ignore[operator]
    assert r.returncode == 0, r.stderr
    assert 0 < int(r.stdout) <= 31, r.stdout  # the bomb itself counts
    assert wait_until(lambda: not procs.with_marker(marker), 5.0)  # type: ignore[attr-defined]


@needs
def test_the_cli_memory_limit_is_the_sandboxs_resident_memory(cli_run: object) -> None:
    r = cli_run("--limit-memory", "100", "--", SYSTEM_PY, "-c", TOUCH, "10")  # type: ignore[operator]
    assert (r.returncode, r.stdout) == (0, "touched 10\n"), r.stderr
    r = cli_run("--limit-memory", "100", "--", SYSTEM_PY, "-c", TOUCH, "300")  # type: ignore[operator]
    assert r.returncode == 128 + signal.SIGKILL and "touched" not in r.stdout, r.stderr


@needs
def test_the_cli_caps_a_busy_loop_near_half_a_cpu(cli_run: object) -> None:
    spin = "import time\nt = time.monotonic() + 2\nwhile time.monotonic() < t: pass\nprint(time.process_time())"
    start = time.monotonic()
    r = cli_run("--limit-cpu-cores", "0.5", "--", SYSTEM_PY, "-c", spin)  # type: ignore[operator]
    wall = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    assert 0.2 <= float(r.stdout) / wall <= 0.7, (r.stdout, wall)  # unbounded, a busy loop takes a whole CPU


@pytest.mark.parametrize("value", ["0", "-1", "half", "0.5.1", ""])
def test_the_cli_refuses_a_bad_cpu_cores_value(value: str, install: Installation) -> None:  # noqa: F811
    r = install.run("run", *SYSTEM, "--limit-cpu-cores", value, "--", "true",  # type: ignore[attr-defined]
                    env=cli.clean_env(SANDBOX_CLI_SERVER="0"))
    assert r.returncode != 0 and "--limit-cpu-cores takes a positive number of CPUs" in r.stderr, r.stderr

