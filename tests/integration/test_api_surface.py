"""What a subprocess user reaches for first: exports, presets, run(cwd=, env=),
sandbox.probe, explain(), and errors worded alike on both backends."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox
from sandbox import presets

pytestmark = pytest.mark.integration

BACKENDS = ["native", pytest.param("bwrap", marks=pytest.mark.skipif(shutil.which("bwrap") is None,
                                                                    reason="bwrap is not installed"))]


# ---------------------------------------------------------------- the package's names

def test_seccomp_and_argrule_are_exported() -> None:
    from sandbox import ArgRule, Seccomp
    from sandbox.seccomp import ArgRule as A
    from sandbox.seccomp import Seccomp as P

    assert (ArgRule, Seccomp) == (A, P)
    assert {"ArgRule", "Seccomp", "presets", "explain"} <= set(sandbox.__all__)


def test_probe_is_the_module_and_calling_it_probes() -> None:
    module = importlib.import_module("sandbox.probe")
    import sandbox.probe as imported

    assert imported is module is sandbox.probe
    assert sandbox.probe() is module.probe() is sandbox.probe(refresh=False)
    assert isinstance(sandbox.probe(), module.ProbeResult)


def test_the_version_is_written_once() -> None:
    from importlib import metadata

    assert metadata.version("sandbox") == sandbox.__version__


# ---------------------------------------------------------------- presets

def test_minimal_system_runs_the_distributions_programs() -> None:
    r = sandbox.run(["sh", "-c", "ls /; test -e /etc/passwd || echo no-etc"], presets.minimal_system(),
                    capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    top = r.stdout.split()
    assert {"usr", "proc", "dev", "tmp", "bin"} <= set(top) and "home" not in top and "no-etc" in top


@pytest.mark.parametrize("preset", ["minimal_system", "python_interpreter", "host_view"])
def test_a_presets_tmp_has_a_fixed_size_whatever_the_hosts_ram(preset: str) -> None:
    # 512 MiB, not the kernel's half of the RAM; a bigger one is a Tmpfs of its own among the mounts
    df = ["stat", "-f", "-c", "%b %S", "/tmp"]
    r = sandbox.run(df, getattr(presets, preset)(), capture_output=True, text=True, timeout=60)
    blocks, size = map(int, r.stdout.split())
    assert r.returncode == 0, r.stderr
    assert blocks * size == presets.TMP_SIZE == 512 << 20
    bigger = presets.minimal_system(sandbox.Tmpfs("/tmp", size=1 << 30))
    blocks, size = map(int, sandbox.run(df, bigger, capture_output=True, text=True, timeout=60).stdout.split())
    assert blocks * size == 1 << 30


def test_minimal_system_adds_mounts_after_its_own(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("data")
    spec = presets.minimal_system(sandbox.RoBind(str(tmp_path), "/work"), cwd="/work")
    r = sandbox.run(["cat", "f"], spec, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "data"), r.stderr


def test_python_interpreter_runs_this_python_with_its_packages() -> None:
    import cffi  # a dependency: installed in this interpreter's environment

    code = "import sys, cffi; print(sys.prefix); print(cffi.__file__)"
    r = sandbox.run([sys.executable, "-c", code], presets.python_interpreter(), capture_output=True, text=True,
                    timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [sys.prefix, cffi.__file__]


def test_host_view_is_the_host_read_only(tmp_path: Path) -> None:
    spec = presets.host_view(writable=[str(tmp_path)])
    script = f"cat /etc/hostname; touch /etc/x 2>/dev/null || echo ro; touch {tmp_path}/w && echo rw; ls -A /tmp"
    r = sandbox.run(["sh", "-c", script], spec, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    # /tmp is private: it holds only the way to the writable bind
    in_tmp = [tmp_path.relative_to("/tmp").parts[0]] if tmp_path.is_relative_to("/tmp") else []
    assert r.stdout.splitlines() == [Path("/etc/hostname").read_text().strip(), "ro", "rw", *in_tmp]
    assert (tmp_path / "w").exists()


# ---------------------------------------------------------------- run(cwd=, env=)

@pytest.mark.parametrize("backend", BACKENDS)
def test_run_cwd_and_env_override_the_spec(backend: str) -> None:
    spec = presets.minimal_system(env={"PATH": "/usr/bin", "FROM_SPEC": "1"}, env_inherit=["HOME"], cwd="/tmp")
    r = sandbox.run(["sh", "-c", "pwd; env | sort"], spec, cwd="/usr", env={"PATH": "/usr/bin", "A": "b"},
                    capture_output=True, text=True, timeout=60, backend=backend)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if not line.startswith("PWD=")]  # bwrap adds PWD
    assert lines == ["/usr", "A=b", "PATH=/usr/bin"]


def test_spawn_cwd_must_exist_inside() -> None:
    with pytest.raises(sandbox.SetupError, match="Can't chdir to /nonexistent"):
        sandbox.spawn(["true"], presets.minimal_system(), cwd="/nonexistent")


def test_run_env_must_be_a_mapping() -> None:
    with pytest.raises(sandbox.SpecError, match="env"):
        sandbox.run(["true"], presets.minimal_system(), env=["A=b"])  # type: ignore[arg-type]


# ---------------------------------------------------------------- explain

def test_explain_describes_without_running(tmp_path: Path) -> None:
    spec = presets.minimal_system(sandbox.Bind(str(tmp_path), "/out"), limits=sandbox.Limits(nofile=32))
    text = sandbox.explain(spec, ["touch", "/out/x"])
    assert not (tmp_path / "x").exists()
    assert text.startswith("backend: ") and f"bind {tmp_path} at /out, writable" in text
    assert "RLIMIT_NOFILE 32 open files" in text and "\nbwrap --unshare-user" in text


# ---------------------------------------------------------------- errors worded alike

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("make", "message"), [
    (lambda d: [sandbox.RoBind(str(d / "file"), "/usr/bin")], "Can't create file at /usr/bin: Is a directory"),
    (lambda d: [sandbox.File("/x", b"1"), sandbox.RoBind(str(d), "/x")], "Can't mkdir /x: Not a directory"),
])
def test_a_bind_of_the_wrong_type_fails_alike(tmp_path: Path, backend: str, make, message: str) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(sandbox.SetupError) as info:
        sandbox.run(["true"], presets.minimal_system(*make(tmp_path)), backend=backend, stderr=subprocess.DEVNULL)
    assert str(info.value) == message


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare(1) is not installed")
def test_a_namespace_limit_says_what_to_change() -> None:
    code = "import sandbox; print(sandbox.probe().native_reason)"
    script = f'echo 0 > /proc/sys/user/max_user_namespaces || exit 77; exec "{sys.executable}" -P -c "{code}"'
    r = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "SANDBOX_NETNS_POOL": "0"})
    if r.returncode in (1, 77) and "unshare" in r.stderr or r.returncode == 77:
        pytest.skip(f"cannot lower the limit here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert "ENOSPC from clone" in r.stdout and "sysctl -w user.max_user_namespaces=" in r.stdout
