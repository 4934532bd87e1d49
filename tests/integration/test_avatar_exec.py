"""The harness backends of sandbox.compat.avatar, run for real the way the harness runs them.

No traffic leaves the machine: the network checks only read /proc/net/dev.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sandbox.compat.avatar import (
    Bwrap,
    ExecSpec,
    HermeticEnv,
    NoSandbox,
    RLimits,
    Sandbox,
)

pytestmark = pytest.mark.integration

TIMEOUT = 60
RIGGED_CHECK = ["/bin/sh", "-c", 'test "$RIGGED" = 1']  # 0 only when RIGGED=1 is inherited


def harness_run(
    sandbox: Sandbox, argv: list[str], cwd: Path, timeout: float = TIMEOUT, *, preexec: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run `argv` exactly as the harness does (`preexec` False: the prepared launch has no preexec_fn)."""
    spec = sandbox.prepare(argv, cwd)
    assert isinstance(spec, ExecSpec)
    assert preexec or spec.preexec_fn is None
    return subprocess.run(spec.argv, cwd=cwd, env=spec.env, preexec_fn=spec.preexec_fn, timeout=timeout,
                          capture_output=True, text=True, check=False)


def interfaces(net_dev: str) -> set[str]:
    """Interface names listed in a /proc/net/dev text."""
    return {line.split(":", 1)[0].strip() for line in net_dev.splitlines()[2:] if ":" in line}


# ---------------------------------------------------------------- RLimits.preexec

def test_fsize_limit_stops_a_large_write(tmp_path: Path) -> None:
    preexec = RLimits(cpu_seconds=1000, fsize_bytes=4096).preexec()
    assert preexec is not None
    write = "open('big', 'wb').write(b'x' * (1 << 20))"
    proc = subprocess.run([sys.executable, "-c", write], cwd=tmp_path, preexec_fn=preexec, timeout=TIMEOUT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "File too large" in proc.stderr
    assert (tmp_path / "big").stat().st_size <= 4096


def test_fsize_limit_also_stops_a_shell_write(tmp_path: Path) -> None:
    preexec = RLimits(cpu_seconds=1000, fsize_bytes=4096).preexec()
    proc = subprocess.run(["/bin/sh", "-c", "head -c 1048576 /dev/zero > big"], cwd=tmp_path, preexec_fn=preexec,
                          timeout=TIMEOUT, check=False)
    assert proc.returncode != 0
    assert (tmp_path / "big").stat().st_size <= 4096


def test_preexec_lowers_soft_limits_and_keeps_hard_ones(tmp_path: Path) -> None:
    import resource

    hard_cpu = resource.getrlimit(resource.RLIMIT_CPU)[1]
    hard_fsize = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    show = ("import resource; print(*resource.getrlimit(resource.RLIMIT_CPU), "
            "*resource.getrlimit(resource.RLIMIT_FSIZE))")
    proc = subprocess.run([sys.executable, "-c", show], preexec_fn=RLimits(cpu_seconds=77, fsize_bytes=8192).preexec(),
                          capture_output=True, text=True, timeout=TIMEOUT, check=True)
    assert [int(x) for x in proc.stdout.split()] == [77, hard_cpu, 8192, hard_fsize]


def test_preexec_uses_the_hard_limit_when_it_is_lower(tmp_path: Path) -> None:
    # In a child: lower the hard limits first, then apply RLimits' preexec there.
    code = (
        "import resource\n"
        "from sandbox.compat.avatar import RLimits\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (50, 60))\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 2048))\n"
        "RLimits(cpu_seconds=1000, fsize_bytes=4096).preexec()()\n"
        "print(*resource.getrlimit(resource.RLIMIT_CPU), *resource.getrlimit(resource.RLIMIT_FSIZE))\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=TIMEOUT,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert [int(x) for x in proc.stdout.split()] == [60, 60, 2048, 2048]


def test_preexec_never_raises(tmp_path: Path) -> None:
    absurd = RLimits(cpu_seconds=2**70, fsize_bytes=2**70).preexec()
    proc = subprocess.run(["/bin/sh", "-c", "echo ran > out"], cwd=tmp_path, preexec_fn=absurd, timeout=TIMEOUT,
                          check=False)
    assert proc.returncode == 0
    assert (tmp_path / "out").read_text() == "ran\n"


# ---------------------------------------------------------------- environment

def test_rigged_env_passes_only_without_a_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGGED", "1")
    assert harness_run(NoSandbox(), RIGGED_CHECK, tmp_path).returncode == 0
    assert harness_run(HermeticEnv(), RIGGED_CHECK, tmp_path).returncode == 1
    assert harness_run(HermeticEnv(rlimits=RLimits()), RIGGED_CHECK, tmp_path).returncode == 1


def test_hermetic_env_child_sees_only_hermetic_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    monkeypatch.setenv("LD_PRELOAD", "")
    monkeypatch.setenv("LC_TIME", "C")
    proc = harness_run(HermeticEnv(), ["/usr/bin/env"], tmp_path)
    assert proc.returncode == 0
    names = {line.split("=", 1)[0] for line in proc.stdout.splitlines()}
    assert "SECRET_TOKEN" not in names
    assert "LD_PRELOAD" not in names
    assert {"PATH", "LC_TIME"} <= names


# ---------------------------------------------------------------- bwrap, for real

def bwrap_works() -> bool:
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-net", "true"], capture_output=True,
                           timeout=TIMEOUT, check=False)
    return probe.returncode == 0


needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bwrap is missing or cannot create namespaces here")


@needs_bwrap
def test_bwrap_write_under_cwd_lands_on_host(tmp_path: Path) -> None:
    proc = harness_run(Bwrap(), ["/bin/sh", "-c", "pwd; echo hello > made-inside"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path)
    assert (tmp_path / "made-inside").read_text() == "hello\n"


@needs_bwrap
def test_bwrap_write_to_usr_fails(tmp_path: Path) -> None:
    target = Path("/usr") / f"avatar-test-{uuid.uuid4().hex}"
    try:
        proc = harness_run(Bwrap(), ["/bin/sh", "-c", f"echo x > {target}"], tmp_path)
        assert proc.returncode != 0
        assert "Read-only file system" in proc.stderr
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)


@needs_bwrap
def test_bwrap_tmp_is_private(tmp_path: Path) -> None:
    name = f"avatar-test-{uuid.uuid4().hex}"
    proc = harness_run(Bwrap(), ["/bin/sh", "-c", f"echo x > /tmp/{name} && cat /tmp/{name}"], tmp_path)
    try:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "x\n"
        assert not (Path("/tmp") / name).exists()
    finally:
        (Path("/tmp") / name).unlink(missing_ok=True)


@needs_bwrap
def test_bwrap_has_only_loopback_without_network(tmp_path: Path) -> None:
    proc = harness_run(Bwrap(), ["cat", "/proc/net/dev"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert interfaces(proc.stdout) == {"lo"}


@needs_bwrap
def test_bwrap_sees_the_host_interfaces_with_network(tmp_path: Path) -> None:
    host = interfaces(Path("/proc/net/dev").read_text())
    proc = harness_run(Bwrap(allow_network=True), ["cat", "/proc/net/dev"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert interfaces(proc.stdout) == host


@needs_bwrap
def test_bwrap_applies_rlimits_through_preexec(tmp_path: Path) -> None:
    sandbox = Bwrap(rlimits=RLimits(cpu_seconds=1000, fsize_bytes=4096))
    proc = harness_run(sandbox, ["/bin/sh", "-c", "head -c 1048576 /dev/zero > big"], tmp_path)
    assert proc.returncode != 0
    assert (tmp_path / "big").stat().st_size <= 4096


@needs_bwrap
def test_bwrap_strips_rigged_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGGED", "1")
    assert harness_run(Bwrap(), RIGGED_CHECK, tmp_path).returncode == 1


@needs_bwrap
def test_bwrap_passes_the_exit_code(tmp_path: Path) -> None:
    assert harness_run(Bwrap(), ["/bin/sh", "-c", "exit 42"], tmp_path).returncode == 42
