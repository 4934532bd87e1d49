"""Setup steps made to fail by what the world holds, not by a filter: a prepared
obstacle per step, on every backend, in this process.

Each start must raise the typed error naming the step (and the path it
concerns), and this process must hold afterwards what it held before
(`ledger.Ledger`: fds, threads, children, mounts, namespace fds, the pool's
books), besides what tests/leakcheck.py checks after every test.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import make_base_spec
from ledger import Ledger, leaks

import sandbox
from sandbox import Bind, File, backends, netpool

BACKENDS = ("native", "bwrap", "blob")

def require(backend: str) -> None:
    ok, reason = backends.availability(backend)
    if not ok:
        pytest.skip(f"{backend} backend unavailable: {reason}")

@pytest.fixture
def world(tmp_path: Path) -> Path:
    """A host directory to bind at /data, holding a directory `sub` (mode 0777: the unprivileged run)."""
    tmp_path.chmod(0o777)
    (tmp_path / "sub").mkdir()
    return tmp_path

def start_fails(backend: str, argv: list[str], spec: sandbox.Spec) -> BaseException:
    """Start `argv` (after one good start, so one-time state is there) and return what it
    raised; fail if it ran or if this process holds anything more afterwards."""
    sandbox.run(["true"], make_base_spec(), backend=backend, capture_output=True, timeout=60)
    before = Ledger.take()
    with pytest.raises(sandbox.SandboxError) as info:
        sandbox.run(argv, spec, backend=backend, capture_output=True, timeout=60)
    assert leaks(before, Ledger.take()) == []
    return info.value

OBSTACLES: dict[str, Callable[[Path], tuple[list[str], sandbox.Spec, type, str | None, int, str | None]]] = {
    # name: world -> (argv, spec, exception class, step, errno, path)
    "a bind source that does not exist": lambda d: (
        ["true"], make_base_spec(Bind(str(d / "missing"), "/x")),
        sandbox.SetupError, "source", errno.ENOENT, str(d / "missing")),
    "a File whose destination is a directory": lambda d: (
        ["true"], make_base_spec(Bind(str(d), "/data"), File("/data/sub", b"x")),
        sandbox.SetupError, "file", errno.EISDIR, "/data/sub"),
    "a cwd that does not exist": lambda d: (
        ["true"], make_base_spec(cwd="/nowhere"), sandbox.SetupError, "cwd", errno.ENOENT, "/nowhere"),
    "a command that does not exist": lambda d: (
        ["no-such-command"], make_base_spec(), sandbox.ExecNotFoundError, None, errno.ENOENT, None),
    "a command that is not executable": lambda d: (
        ["/data/plain"], make_base_spec(Bind(str(d), "/data"), File("/data/plain", b"#!/bin/sh\n", perms=0o644)),
        sandbox.ExecPermissionError, None, errno.EACCES, None),
    "a probe path that is visible": lambda d: (
        ["true"], make_base_spec(probe_paths=("/usr",)), sandbox.IsolationError, None, errno.EEXIST, "/usr"),
}

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(OBSTACLES))
def test_an_obstacle_fails_its_step_with_a_typed_error(name: str, backend: str, world: Path) -> None:
    require(backend)
    argv, spec, klass, step, err, path = OBSTACLES[name](world)
    exc = start_fails(backend, argv, spec)
    assert isinstance(exc, klass), exc
    if step is not None:
        assert (exc.step, exc.errno, exc.path) == (step, err, path), exc
    else:
        assert exc.errno == err, exc
        if path is not None:
            assert exc.path == path, exc

def test_a_lease_whose_namespace_is_gone_fails_join_netns() -> None:
    """The next idle namespace of the pool replaced (under its fd) by something
    that is no namespace: the start fails at join_netns, the namespace is
    destroyed, not leased again, the pool refills, and nothing is left leased
    or open."""
    require("native")
    spec = make_base_spec(network="pool")
    sandbox.run(["true"], spec, backend="native", capture_output=True, timeout=60)
    pool = netpool.pool_for("pool")
    assert pool is not None
    before = Ledger.take()
    discarded = pool.stats()["destroyed_by_reason"].get("discarded", 0)
    devnull = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with pool._cond:
            os.dup2(devnull, pool._idle[0].netns_fd)  # what the pool leases next is no namespace
    finally:
        os.close(devnull)
    with pytest.raises(sandbox.SetupError) as info:
        sandbox.run(["true"], spec, backend="native", capture_output=True, timeout=60)
    assert (info.value.step, info.value.errno) == ("join_netns", errno.EINVAL)
    assert leaks(before, Ledger.take()) == []
    assert pool.stats()["destroyed_by_reason"].get("discarded", 0) == discarded + 1
    for _ in range(3):  # every namespace it leases now is a real one
        assert sandbox.run(["true"], spec, backend="native", capture_output=True, timeout=60).returncode == 0
