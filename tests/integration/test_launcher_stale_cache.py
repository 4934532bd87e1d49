"""A native-probe success cached on disk (sandbox.launcher.native_ok) is not
trusted by a process that is confined where the caching one was not.

Each step runs in a fresh Python child sharing one XDG_CACHE_HOME: the first,
unconfined, probes and caches its success; the next one first installs a
seccomp filter that refuses the mount API (as a container runtime's or
systemd's filter refuses namespaces), then asks the launcher. Trusting the
cached success there handed the harness a `sandbox-launch` command line that
exited 125 ("Can't find source path /: Operation not permitted") on every
command; it must probe again and choose what works (bwrap through
`python -m sandbox run`), or refuse at construction with SandboxUnavailable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import BLOCK_MOUNT_API  # tests/, on sys.path (rootdir)

import sandbox

pytestmark = pytest.mark.integration


# Asks the launcher as a harness does (compat.avatar's native mode), runs
# `true` through the command line it got, and says whether it probed.
CHILD = r"""
import json, subprocess, sys
from sandbox import backends, launcher
from sandbox.compat import avatar

probed = []
real = backends.availability
backends.availability = lambda name, refresh=False: probed.append(name) or real(name, refresh)
out = {"native_ok": launcher.native_ok(), "probed": probed, "launcher": launcher.launcher_path()}
try:
    exe = avatar.make_sandbox("native").prepare(["true"], sys.argv[1])
except avatar.SandboxUnavailable as exc:
    out["unavailable"] = str(exc)
else:
    r = subprocess.run(exe.argv, env=exe.env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    out.update(argv0=exe.argv[0], returncode=r.returncode, stderr=r.stderr[-300:])
print(json.dumps(out))
"""


def ask(cache: Path, cwd: Path, preamble: str = "") -> dict[str, Any]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    env.pop("SANDBOX_DISABLE_NATIVE", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(sandbox.__file__).parent.parent),
                                                       env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", preamble + CHILD, str(cwd)], capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture
def cached(tmp_path: Path) -> tuple[Path, Path]:
    """(cache home, work dir) after an unconfined child cached a native success."""
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    first = ask(cache, work)
    if not first["native_ok"] or first.get("argv0") != first["launcher"]:
        pytest.skip(f"the native launcher does not run here: {first}")
    assert first["returncode"] == 0, first
    assert (cache / "sandbox" / f"native-probe-{os.getuid()}.json").exists()
    return cache, work


def test_an_unchanged_process_uses_the_cached_success(cached: tuple[Path, Path]) -> None:
    again = ask(*cached)
    assert again["native_ok"] and again["probed"] == [], again  # the cache is what the next test distrusts
    assert again["returncode"] == 0, again


def test_a_confined_process_probes_again_instead_of_exiting_125(cached: tuple[Path, Path]) -> None:
    confined = ask(*cached, preamble=BLOCK_MOUNT_API)
    assert confined["probed"], f"the cached success was trusted under a seccomp filter: {confined}"
    assert not confined["native_ok"], confined
    if "unavailable" in confined:  # no bwrap either: refused by name at construction, nothing run
        assert "native" in confined["unavailable"], confined
        return
    assert confined["argv0"] != confined["launcher"], confined
    assert confined["returncode"] == 0, confined
    # the unconfined cache is still good for unconfined processes
    assert ask(*cached)["probed"] == []
