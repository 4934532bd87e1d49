"""Task descriptions run as WorkerPool tasks: each call in a fresh task sandbox (native backend)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import sandbox
from sandbox import SpecError
from sandbox.task import Sandbox, worker_pool

pytestmark = pytest.mark.integration


def look(paths: list[str]) -> dict[str, object]:
    import os as _os

    out: dict[str, object] = {p: _os.path.exists(p) for p in paths}
    try:
        import cffi

        out["cffi.FFI"] = hasattr(cffi, "FFI")
    except ImportError:
        out["cffi.FFI"] = False
    out["env"] = sorted(_os.environ)
    with open("/tmp/mine", "a") as f:  # each task has a /tmp of its own
        f.write("x")
    out["tmp"] = _os.path.getsize("/tmp/mine")
    return out


def write(path: str) -> str:
    with open(path, "w") as f:
        f.write("from a task")
    return path


@pytest.fixture
def native() -> None:
    if not sandbox.probe().native:
        pytest.skip("WorkerPool needs the native backend")


@pytest.mark.usefixtures("native")
def test_each_call_runs_in_a_fresh_task_sandbox(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    sb = Sandbox(hide=("cffi",), write=(str(tmp_path / "out"),), env={"MODEL": "m"})
    with worker_pool(sb, max_workers=2) as pool:
        first, second = (pool.submit(look, ["/root", "/home", str(tmp_path)]).result(timeout=60) for _ in range(2))
        written = pool.submit(write, str(tmp_path / "out" / "r.txt")).result(timeout=60)
        # beside the grant lies the task's own /tmp: what it writes there stays there
        pool.submit(write, str(tmp_path / "elsewhere.txt")).result(timeout=60)
        with pytest.raises(OSError):
            pool.submit(write, "/usr/x").result(timeout=60)
    assert first["/root"] is False and first["/home"] is False and first[str(tmp_path)] is True
    assert first["cffi.FFI"] is False  # hidden in the workers too
    assert "MODEL" in first["env"] and "SANDBOX_HIDE" in first["env"]
    assert first["tmp"] == 1 and second["tmp"] == 1
    assert Path(written).read_text() == "from a task"
    assert not (tmp_path / "elsewhere.txt").exists()


@pytest.mark.usefixtures("native")
def test_forwarding_is_refused_for_workers() -> None:
    with pytest.raises(SpecError, match="WorkerPool"):
        worker_pool(Sandbox(ports=(8080,)))
    assert os.environ.get("SANDBOX_HIDE") is None


# A harness's venv under the temporary directory whose interpreter leads through a link outside both the
# venv and /usr (a uv- or pyenv-managed Python, a CI runner's tool cache): the venv shown as a directory
# holds links to a path a bind of its own would reach before that path is mounted.
IN_VENV = """
import sys
from sandbox import task

def answer():
    return 42

with task.worker_pool(task.Sandbox(), max_workers=1) as pool:
    print(pool.submit(answer).result(timeout=60))
done = task.run([sys.executable, "-c", "print(43)"], task.Sandbox(read=(sys.prefix,)), capture_output=True)
print(done.stdout.decode().strip())
"""


@pytest.mark.usefixtures("native")
def test_worker_pool_of_a_venv_whose_python_links_elsewhere(tmp_path: Path) -> None:
    base = tmp_path / "python" / "bin"
    base.mkdir(parents=True)
    (base / "python3").symlink_to(os.path.realpath(sys.executable))
    venv = tmp_path / "venv"
    subprocess.run([str(base / "python3"), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = subprocess.run([str(venv / "bin" / "python"), "-c", purelib], check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()
    installed = Path(sandbox.__file__).resolve().parents[1]  # this package, cloudpickle and cffi
    Path(site, "installed.pth").write_text(f"{installed}\n")
    assert os.readlink(venv / "bin" / "python3") == str(base / "python3")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", IN_VENV], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["42", "43"]
