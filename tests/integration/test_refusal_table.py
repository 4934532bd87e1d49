"""The executors that refuse by the one table (sandbox.refusal.NEEDS): each refusal moved there from a list
of its own is tried on its executor with a real plan, and must be the typed error before anything runs.

- the blob executor (sandbox.backends.blob: sandbox-launch, and the CLI client's plan): a sandbox it runs,
  and what it refuses (forwarded ports, sync fds, a pooled network namespace, a cgroup of its own);
  `launcher_argv` of a Spec it refuses falls back to `python -m sandbox run`, which honours it;
- a Template: the caller's sync fds (once passed on to its server as numbers of the server's own fds);
  recycled (Template(recycle=True)): as_pid_1, cap_add; a call's limits that require cgroups.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Iterator

import pytest
from conftest import child_pids, make_base_spec, new_marker, sleep_cmd, sleepers, wait_until

import sandbox
from sandbox import backends, launcher
from sandbox.cliserver import fastpath
from sandbox.plan_cache import compiled_plan
from sandbox.sync import Sync

pytestmark = pytest.mark.integration


@pytest.fixture
def blob() -> None:
    ok, why = backends.availability("blob")
    if not ok:
        pytest.skip(f"the blob executor is unavailable: {why}")


@pytest.fixture
def template() -> None:
    ok, why = backends.availability("template")
    if not ok:
        pytest.skip(f"the template executor is unavailable: {why}")


@pytest.fixture
def sync_pipe() -> Iterator[int]:
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        yield w
    finally:
        os.close(r)
        os.close(w)


def _refused_before_anything_runs(match: str, **spawn: object) -> None:
    before = child_pids()
    with pytest.raises(sandbox.UnavailableError, match=match):
        sandbox.spawn(["/bin/true"], **spawn)  # type: ignore[arg-type]
    assert child_pids() == before


# ---------------------------------------------------------------- the blob executor

def test_the_blob_executor_runs_a_sandbox(blob: None) -> None:
    result = sandbox.run(["/bin/sh", "-c", "echo $$; cat /proc/self/uid_map | wc -l; echo $X"],
                         make_base_spec(env={"PATH": "/usr/bin:/bin", "X": "from the plan"}), backend="blob",
                         capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.backend) == (0, "blob"), result.stderr
    pid, maps, x = result.stdout.split("\n")[:3]
    assert pid == "2" and maps == "1" and x == "from the plan"  # under sandbox-init, in its own user namespace


def test_the_blob_executor_passes_the_exit_and_a_setup_failure_is_its_typed_error(blob: None) -> None:
    assert sandbox.run(["/bin/sh", "-c", "exit 7"], make_base_spec(), backend="blob", timeout=60).returncode == 7
    with pytest.raises(sandbox.SetupError, match="/no/such/source"):  # reported through --report-fd
        sandbox.run(["/bin/true"], make_base_spec(sandbox.RoBind("/no/such/source", "/mnt")), backend="blob",
                    capture_output=True, timeout=60)


@pytest.mark.parametrize("die_with_parent", [True, False])
def test_killing_a_blob_sandbox_ends_it_whole(blob: None, die_with_parent: bool) -> None:
    """sandbox-launch passes signals on; a SIGKILL would end it alone, so kill() reaches its sandbox first."""
    marker = new_marker()
    with sandbox.spawn(["/bin/sh", "-c", sleep_cmd(marker)], make_base_spec(die_with_parent=die_with_parent),
                       backend="blob") as proc:
        assert wait_until(lambda: len(sleepers(marker)) == 1, timeout=30)
        proc.kill()
        assert proc.wait(timeout=30) == -signal.SIGKILL
    assert wait_until(lambda: sleepers(marker) == [], timeout=10), "the sandbox outlived its kill()"


def test_the_blob_executor_refuses_forwarded_ports(blob: None) -> None:
    _refused_before_anything_runs("^sandbox-launch does not forward ports or check the network namespace",
                                  spec=make_base_spec(forward={8080: 80}), backend="blob")


def test_the_blob_executor_refuses_sync_fds(blob: None, sync_pipe: int) -> None:
    _refused_before_anything_runs(r"^sync.info_fd: sandbox-launch cannot report to or wait on the caller's sync fds",
                                  spec=make_base_spec(), backend="blob", sync=Sync(info_fd=sync_pipe))


def test_the_clients_plan_is_refused_by_the_blob_executors_traits(blob: None) -> None:
    """The CLI server compiles for the native backend: what that plan needs beyond the client is a worker's."""
    host = backends.host_for("native")
    pooled = compiled_plan(make_base_spec(network="pool"), host)
    assert pooled.network == "pool"
    with pytest.raises(fastpath.Worker, match="sandbox-launch cannot join a network namespace leased from the "):
        fastpath._check_runnable(pooled, host)
    alone = dataclasses.replace(host, pool=None)  # a pool serving "none" would take in a plan of network "none"
    fastpath._check_runnable(compiled_plan(make_base_spec(), alone), alone)  # nothing beyond it: no worker
    limited = compiled_plan(make_base_spec(limits=sandbox.Limits(nproc=64)), alone)
    if limited.cgroup is None:
        pytest.skip(f"no cgroups for this caller: {host.cgroups.reason}")
    with pytest.raises(fastpath.Worker, match="sandbox-launch cannot place the sandbox in a cgroup of its own"):
        fastpath._check_runnable(limited, alone)


def test_launcher_argv_of_a_spec_sandbox_launch_refuses_runs_the_python_cli(blob: None) -> None:
    assert launcher.launcher_argv(make_base_spec(), ["/bin/true"], "/")[0] == launcher.launcher_path()
    argv = launcher.launcher_argv(make_base_spec(forward={8080: 80}), ["/bin/true"], "/")
    assert argv[:5] == [sys.executable, "-m", "sandbox", "run", "--close-fds"]  # it forwards the port
    # namespaces without a user namespace: root's to make, natively or through sandbox-launch alike
    no_userns = launcher.launcher_argv(make_base_spec(namespaces=sandbox.Namespaces(user=False)), ["/bin/true"], "/")
    assert (no_userns[0] == launcher.launcher_path()) == (os.geteuid() == 0)


# ---------------------------------------------------------------- a Template, recycled or not

def test_a_template_refuses_sync_fds(template: None, sync_pipe: int) -> None:
    _refused_before_anything_runs(r"^sync.info_fd: a Template cannot report to or wait on the caller's sync fds",
                                  spec=make_base_spec(), backend="template", sync=Sync(info_fd=sync_pipe))


@pytest.mark.parametrize(("fields", "words"), [
    ({"as_pid_1": True}, "Template(recycle=True) cannot run the command as pid 1 of its sandbox: as_pid_1=True "
                         "(a recycled sandbox's pid 1 is the reaper that resets it)"),
    ({"cap_add": ("CAP_NET_RAW",)}, "Template(recycle=True) cannot let the command keep a capability: cap_add "
                                    "(a command that keeps a capability is cloned per request, never by a standby)"),
])
def test_a_recycled_template_refuses_what_its_pid_1_cannot_reset(template: None, fields: dict[str, object],
                                                                 words: str) -> None:
    before = child_pids()
    with pytest.raises(sandbox.UnavailableError) as refused:
        sandbox.Template(make_base_spec(**fields), recycle=True)
    assert str(refused.value) == words
    assert child_pids() == before
    with sandbox.Template(make_base_spec(**fields)) as t:  # not recycled: it runs
        assert t.run(["/bin/true"], timeout=60).returncode == 0


def test_a_calls_limits_that_require_cgroups_are_refused_where_there_are_none(template: None) -> None:
    limits = sandbox.Limits(memory_mb=256, require_cgroups=True)
    with sandbox.Template(make_base_spec()) as t:
        if "memory" in backends.host_for("template").cgroups.controllers:
            assert t.run(["/bin/true"], limits=limits, timeout=60).returncode == 0
            return
        with pytest.raises(sandbox.UnavailableError, match=r"^limits.require_cgroups: no cgroup for memory_mb with "
                                                          "a Template here"):
            t.run(["/bin/true"], limits=limits, timeout=60)
