"""sandbox.ray: 200 sandboxed tasks across two WorkerPool actors of a local Ray instance.

Ray runs on loopback only, in a temporary folder of its own, started and
shut down inside the one test, so the leak check sees every Ray process end.
Ray replaces a node address of 127.0.0.1 by the host's routable address
unless it believes it runs a single-machine (Windows/macOS-style) instance:
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, set before Ray is imported, keeps every
Ray socket on 127.0.0.1 (checked below); no dashboard, no usage report. Ray is
an optional extra: without it the test skips, except in CI (CI set), which
installs it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_base_spec

import sandbox
from sandbox import Dir, RoBind
from sandbox.workerpool import BrokenWorkerPool, RemoteTraceback, TaskTimeoutError

pytestmark = pytest.mark.integration

LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
if importlib.util.find_spec("ray") is None and not os.environ.get("CI"):  # CI installs the extra
    pytest.skip("Ray is not installed (pip install 'sandbox[ray]')", allow_module_level=True)


def whereami(i: int) -> tuple[int, int, str, bool]:
    """A task: its number, its pid, its hostname, and whether it sees the host's /etc."""
    import socket

    return i, os.getpid(), socket.gethostname(), os.path.exists("/etc/passwd")


def fail(i: int) -> None:
    raise ValueError(f"task {i} failed")


def linger() -> None:
    time.sleep(60)


def noisy() -> str:
    print("from the sandbox")
    return os.environ.get("RAY_TASK_VAR", "")


def read_work() -> str:
    with open("/work/input.txt") as f:
        return f.read()


@pytest.fixture
def local_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    for name, value in LOOPBACK_ONLY.items():
        monkeypatch.setenv(name, value)  # read when Ray is imported, and by every Ray process
    ray = importlib.import_module("ray")
    temp = tempfile.mkdtemp(prefix="sbxray")  # short: Ray's socket paths must fit 107 bytes
    # Ray puts the driver's cwd on every worker's sys.path: not the checkout, whose
    # uncompiled sandbox/ would shadow the installed package there.
    monkeypatch.chdir(temp)
    monkeypatch.setenv("HOME", temp)  # Ray writes its auth token to ~/.ray: the test's own folder
    try:
        ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=temp,
                 object_store_memory=80 * 1024 * 1024, log_to_driver=False, configure_logging=False)
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def test_200_tasks_across_two_actors(local_ray: Any, tmp_path: Path) -> None:
    ray = local_ray
    from sandbox.ray import RayPool

    spec = make_base_spec(Dir("/work"), hostname="task")
    with RayPool(spec, max_workers=4, actors_per_node=2, timeout=30) as pool:
        assert len(pool.actors) == 2
        futures = [pool.submit(whereami, i) for i in range(200)]
        results = [f.result(timeout=120) for f in futures]
        assert [r[0] for r in results] == list(range(200))
        # each in a sandbox: its own uts and pid namespaces, the Spec's root (no /etc)
        assert {(r[2], r[3]) for r in results} == {("task", False)}
        assert max(r[1] for r in results) < 10, "tasks ran in the host's pid namespace"

        # results through map, exceptions with their remote traceback, stdout and env, timeouts
        assert list(pool.map(whereami, range(5)))[4][0] == 4
        err = pool.submit(fail, 3).exception(timeout=60)
        assert isinstance(err, ValueError) and str(err) == "task 3 failed"
        assert isinstance(err.__cause__, RemoteTraceback) and "in fail" in err.__cause__.tb
        out = pool.submit_task(noisy, env={"RAY_TASK_VAR": "seen"})
        assert out.result(timeout=60) == "seen" and out.stdout == b"from the sandbox\n"
        assert out.node_id == ray.get_runtime_context().get_node_id()
        (tmp_path / "input.txt").write_text("bound in")
        assert pool.submit_task(read_work, binds=[RoBind(str(tmp_path), "/work")]).result(timeout=60) == "bound in"
        with pytest.raises(FileNotFoundError):
            pool.submit(read_work).result(timeout=60)  # the bind was that task's only
        started = time.monotonic()
        with pytest.raises(TaskTimeoutError):
            pool.submit_task(linger, timeout=1).result(timeout=60)
        assert time.monotonic() - started < 30

        # an actor that dies (a lost node) fails its tasks in flight; the other pool takes the rest
        ray.kill(pool._members[0].actor)
        lost = [pool.submit_task(linger, timeout=5) for _ in range(2)]
        errors = {type(f.exception(timeout=60)) for f in lost}
        assert errors <= {BrokenWorkerPool, TaskTimeoutError} and BrokenWorkerPool in errors, errors
        assert len(pool.actors) == 1
        assert [f.result(timeout=60)[0] for f in [pool.submit(whereami, i) for i in range(10)]] == list(range(10))

    # the consecutive-tenant attack (tests/adversarial/test_warm_tenants.py) through an actor's pool
    from adversarial.test_warm_tenants import hand_over

    with RayPool(make_base_spec(), 1, actors_per_node=1, spares=0) as pool:
        found = hand_over(pool, tmp_path)
    assert found == [], f"a Ray task found an earlier task's secrets: {found}"


def test_bad_arguments_are_refused_before_ray_starts() -> None:
    from sandbox.ray import RayPool

    with pytest.raises(sandbox.SpecError, match="spec"):
        RayPool("not a spec")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="actors_per_node"):
        RayPool(make_base_spec(), actors_per_node=0)

