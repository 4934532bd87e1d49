"""backend="auto" falls back to bwrap when the native path is refused, and never runs unconfined.

Each scenario runs in a fresh Python child (the host probe is cached per
process), which tries `sandbox.run` with backend "auto" and "native" and
prints what happened as JSON. The sandboxed command tries to write a marker
file at a host path that is not visible inside: if it ever appears, the
command ran unconfined.

Scenarios, the first two refused for real:
- the mount API blocked by a seccomp filter in the child: native refused,
  bwrap (classic mount(2)) works, so "auto" runs on bwrap;
- user.max_user_namespaces=0 in a user namespace of the child's own (set by
  its root with `unshare --user --map-root-user`): both backends refused,
  UnavailableError names both reasons;
- the documented switch SANDBOX_DISABLE_NATIVE=1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import BLOCK_MOUNT_API  # tests/, on sys.path (rootdir)

import sandbox

pytestmark = pytest.mark.integration

CHILD = r"""
import json, sys
import sandbox

spec = sandbox.Spec(
    mounts=[sandbox.RoBind("/usr"), sandbox.Symlink("usr/bin", "/bin"), sandbox.Symlink("usr/lib", "/lib"),
            sandbox.Symlink("usr/lib64", "/lib64"), sandbox.Proc()],
    env={"PATH": "/usr/bin:/bin"})
marker = sys.argv[1]


def attempt(backend):
    try:
        r = sandbox.run(["sh", "-c", 'cat /proc/self/uid_map; echo ran > "$0"', marker], spec,
                        capture_output=True, backend=backend, timeout=60)
    except sandbox.SandboxError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return {"backend": r.backend, "reason": r.backend_reason, "returncode": r.returncode,
            "uid_map": r.stdout.decode().split(), "stderr": r.stderr.decode()}


print(json.dumps({"probe": str(sandbox.probe()), "auto": attempt("auto"), "native": attempt("native")}))
"""


def run_child(marker: Path, prefix: list[str] | None = None, env: dict[str, str] | None = None,
              preamble: str = "") -> dict[str, Any]:
    argv = [*(prefix or []), sys.executable, "-c", preamble + CHILD, str(marker)]
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(sandbox.__file__).parent.parent),
                                                             child_env.get("PYTHONPATH")]))
    proc = subprocess.run(argv, capture_output=True, text=True, env=child_env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def assert_sandboxed(result: dict[str, Any], marker: Path) -> None:
    """The command ran in a user namespace of its own and could not reach the host path."""
    assert "error" not in result, result
    assert result["uid_map"][2] == "1", result  # a one-id map: a user namespace, not the host's
    assert result["returncode"] != 0, "the host path must not be writable from inside"
    assert not marker.exists()


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    tmp_path.chmod(0o777)
    return tmp_path / "ran-unconfined"


def require_bwrap() -> None:
    if not sandbox.probe().bwrap:
        pytest.skip(f"bwrap missing: {sandbox.probe().bwrap_reason}")


def test_mount_api_blocked_falls_back_to_bwrap(marker: Path) -> None:
    require_bwrap()
    out = run_child(marker, preamble=BLOCK_MOUNT_API)
    auto, native = out["auto"], out["native"]
    assert auto.get("backend") == "bwrap", out
    assert auto["reason"].startswith("auto: native refused (")
    assert "mount API" in auto["reason"] or "EPERM" in auto["reason"], auto["reason"]
    assert_sandboxed(auto, marker)
    assert native["error"] == "UnavailableError", native
    assert native["message"].startswith("native backend unavailable: ")
    assert not marker.exists()


def test_disable_switch_falls_back_to_bwrap(marker: Path) -> None:
    require_bwrap()
    out = run_child(marker, env={"SANDBOX_DISABLE_NATIVE": "1"})
    auto, native = out["auto"], out["native"]
    assert auto.get("backend") == "bwrap", out
    assert "SANDBOX_DISABLE_NATIVE=1" in auto["reason"]
    assert_sandboxed(auto, marker)
    assert native["error"] == "UnavailableError"
    assert "SANDBOX_DISABLE_NATIVE=1" in native["message"]
    assert not marker.exists()


def userns_with_no_more_userns() -> list[str]:
    """A command prefix running the rest in a user namespace where no further one can be made."""
    unshare = shutil.which("unshare")
    if not unshare:
        pytest.skip("util-linux unshare is missing")
    probe = subprocess.run([unshare, "--user", "--map-root-user", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a user namespace here: {probe.stderr.decode().strip()}")
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    return [unshare, "--user", "--map-root-user", "sh", "-c", script, "sh"]


def test_no_user_namespaces_refuses_both_backends(marker: Path) -> None:
    require_bwrap()
    out = run_child(marker, prefix=userns_with_no_more_userns())
    auto, native = out["auto"], out["native"]
    assert "sysctl user.max_user_namespaces = 0" in out["probe"], out["probe"]
    assert native["error"] == "UnavailableError", native
    assert "max_user_namespaces=0" in native["message"]
    assert auto["error"] == "UnavailableError", auto
    assert "native: user namespaces:" in auto["message"] and "max_user_namespaces=0" in auto["message"]
    assert "bwrap: Creating new namespace failed" in auto["message"]
    assert not marker.exists()


def test_unknown_backend_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="backend='docker': must be"):
        sandbox.probe().choose("docker")
