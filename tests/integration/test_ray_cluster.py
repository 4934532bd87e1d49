"""sandbox.ray on a real two-node Ray cluster: a head and a second node, each started with `ray start`.

Both nodes run on this machine, as `ray start --block` children of the test
(each with one CPU and a small memory), on loopback addresses Ray does not
rewrite (it replaces 127.0.0.1 by the host's routable address, except in its
single-machine mode, which refuses a second node): the head on 127.0.0.2,
the second node on 127.0.0.3. Ray's own servers still listen on every
interface while the test runs (Ray has no option to bind them to the node's
address). Whatever happens, the fixture kills both nodes' whole process
trees (the test process is their subreaper meanwhile, so a Ray worker
orphaned by its raylet comes back to it rather than to init) and removes
their folder; it does not run `ray stop`, which would end every Ray process
on the host, another job's too.

What it shows: a node-side SetupError (a task's bind of a missing path)
reaches the driver as itself, its step, path and errno intact, from each
node; a node that dies (its processes killed) fails only the tasks it was
running, with BrokenWorkerPool, while the other node's finish and later
tasks go there.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import make_base_spec
from leakcheck import descendants, kill_trees

import sandbox
from sandbox import Dir, RoBind
from sandbox.workerpool import BrokenWorkerPool

pytestmark = pytest.mark.integration

if importlib.util.find_spec("ray") is None and not os.environ.get("CI"):  # CI installs the extra
    pytest.skip("Ray is not installed (pip install 'sandbox[ray]')", allow_module_level=True)

HEAD_IP, NODE_IP = "127.0.0.2", "127.0.0.3"
PR_SET_CHILD_SUBREAPER = 36
# Each node: one CPU, 512 MiB for tasks, Ray's smallest object store; the GCS notices a lost node in ~2 s.
NODE_ARGS = ("--block", "--num-cpus", "1", "--memory", str(512 << 20), "--object-store-memory", str(80 << 20),
             "--disable-usage-stats")
NODE_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_health_check_period_ms": "500",
            "RAY_health_check_failure_threshold": "3"}


@dataclass
class Cluster:
    ray: Any
    head: subprocess.Popen[bytes]
    node: subprocess.Popen[bytes]
    head_id: str
    node_id: str


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0, os.strerror(ctypes.get_errno())


def alive_nodes(ray: Any) -> dict[str, str]:
    """Node address -> node id of each alive node."""
    return {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    if not sandbox.probe().native:
        pytest.skip("native backend unavailable")
    cli = Path(sys.executable).with_name("ray")
    if not cli.exists():
        pytest.skip(f"no `ray` command beside {sys.executable}")
    temp = tempfile.mkdtemp(prefix="sbxrc")  # short: Ray's socket paths must fit 107 bytes
    monkeypatch.chdir(temp)  # Ray puts the driver's cwd on its workers' sys.path: not the checkout
    monkeypatch.setenv("HOME", temp)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"} | NODE_ENV
    port = free_port(HEAD_IP)
    before = descendants()
    subreaper(True)
    started: list[subprocess.Popen[bytes]] = []
    ray = importlib.import_module("ray")
    try:
        with open(Path(temp, "head.log"), "wb") as head_log, open(Path(temp, "node.log"), "wb") as node_log:
            started.append(subprocess.Popen(
                [str(cli), "start", "--head", "--port", str(port), "--node-ip-address", HEAD_IP,
                 "--include-dashboard", "false", "--temp-dir", temp, *NODE_ARGS],
                stdout=head_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=temp, env=env))
            started.append(subprocess.Popen(
                [str(cli), "start", "--address", f"{HEAD_IP}:{port}", "--node-ip-address", NODE_IP, *NODE_ARGS],
                stdout=node_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=temp, env=env))
        ray.init(address=f"{HEAD_IP}:{port}", _node_ip_address=HEAD_IP, log_to_driver=False, configure_logging=False)
        deadline = time.monotonic() + 45
        while set(alive_nodes(ray)) != {HEAD_IP, NODE_IP}:
            assert time.monotonic() < deadline, f"the cluster did not come up: {ray.nodes()}"
            assert all(p.poll() is None for p in started), Path(temp, "node.log").read_text()[-2000:]
            time.sleep(0.2)
        ids = alive_nodes(ray)
        yield Cluster(ray, started[0], started[1], ids[HEAD_IP], ids[NODE_IP])
    finally:
        try:
            ray.shutdown()
        finally:
            kill_trees({p.pid for p in started if p.poll() is None})
            for p in started:
                p.wait(timeout=10)
            kill_trees(descendants() - before)  # Ray workers orphaned by their raylet (reparented here)
            subreaper(False)
            shutil.rmtree(temp, ignore_errors=True)


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def read_data() -> str:
    with open("/data/input.txt") as f:
        return f.read()


def test_setup_errors_and_a_lost_node_on_a_two_node_cluster(cluster: Cluster, tmp_path: Path) -> None:
    from sandbox.ray import RayPool

    both = {cluster.head_id, cluster.node_id}
    with RayPool(make_base_spec(Dir("/data")), max_workers=2, timeout=30, startup_timeout=60) as pool:
        assert {a["node_id"] for a in pool.actors} == both

        # A node-side SetupError, from each node, is itself in the driver: class, step, path, errno.
        missing = str(tmp_path / "missing")
        failing = [pool.submit_task(read_data, binds=[RoBind(missing, "/data")]) for _ in range(2)]
        assert {f.node_id for f in failing} == both
        for future in failing:
            err = future.exception(timeout=60)
            assert type(err) is sandbox.SetupError, repr(err)
            assert (err.step, err.path, err.errno) == ("source", missing, errno.ENOENT)
            assert "Can't find source path" in str(err)
        (tmp_path / "input.txt").write_text("bound in")
        assert pool.submit_task(read_data, binds=[RoBind(str(tmp_path), "/data")]).result(timeout=60) == "bound in"

        # The second node dies while each node runs two tasks: only its own tasks fail.
        running = [pool.submit(nap, 3.0) for _ in range(4)]
        assert sorted(f.node_id for f in running) == sorted([*both, *both])
        time.sleep(0.5)
        kill_trees({cluster.node.pid})
        cluster.node.wait(timeout=10)
        for future in running:
            if future.node_id == cluster.node_id:
                assert isinstance(future.exception(timeout=60), BrokenWorkerPool)
            else:
                assert future.result(timeout=60) == 3.0
        later = [pool.submit(nap, 0.0) for _ in range(3)]
        assert [f.result(timeout=60) for f in later] == [0.0] * 3
        assert {f.node_id for f in later} == {cluster.head_id}
        assert [a["node_id"] for a in pool.actors] == [cluster.head_id]
