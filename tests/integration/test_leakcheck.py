"""Tests that fail on purpose mid-sandbox leave nothing behind (tests/leakcheck.py).

An inner pytest session, in a private mount namespace of its own, runs tests
that start sandboxes (through the CLI without --die-with-parent, as the CLI
tests do, and through the API on each backend), keep them referenced, and
fail halfway; others leave a mount or a namespace fd. The autouse fixture
must report each as an error, and kill the processes while the inner session
still runs: its last test checks that none is left, and this test checks
again, from outside, that no process still holds one of the sandboxes'
namespaces.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import new_marker, pids_with_marker

import sandbox

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1]
UNSHARE = shutil.which("unshare")

INNER = '''
import json, os, subprocess, sys, time
import pytest
import sandbox

MARK = os.environ["LEAK_MARKER"]
KEEP = []  # the failing tests' sandboxes stay referenced, as a user's would
SYSTEM = ["--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
          "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev"]


def marked(n):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = [p for p in os.listdir("/proc") if p.isdigit() and MARK.encode() in _cmdline(p)
                and _cmdline(p).startswith(b"sleep")]
        if len(pids) >= n:
            return [int(p) for p in pids]
        time.sleep(0.01)
    raise AssertionError("the sandbox did not start")


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def record(pid):
    with open(os.environ["LEAK_RECORD"], "a") as f:
        f.write(json.dumps({n: os.readlink(f"/proc/{pid}/ns/{n}") for n in ("mnt", "pid", "net", "ipc", "uts")})
                + "\\n")


def test_cli_sandbox_fails_midway():
    proc = subprocess.Popen([sys.executable, "-P", "-m", "sandbox", "run", *SYSTEM, "--unshare-all", "--",
                             "sh", "-c", f"echo ready; exec sleep 1000 {MARK}"], stdout=subprocess.PIPE, text=True)
    KEEP.append(proc)
    assert proc.stdout.readline() == "ready\\n"
    record(marked(1)[0])
    assert False, "failing on purpose mid-sandbox"


@pytest.mark.parametrize("backend", ["native", "bwrap"])
def test_api_sandbox_fails_midway(backend):
    if backend == "bwrap" and not sandbox.probe().bwrap:
        pytest.skip("no bwrap")
    spec = sandbox.presets.minimal_system()
    KEEP.append(sandbox.spawn(["sh", "-c", f"sleep 1000 {MARK} & exec sleep 1000 {MARK} 2"], spec, backend=backend))
    for pid in marked(2):
        record(pid)
    raise RuntimeError("failing on purpose mid-sandbox")


def test_namespace_fd_kept():
    with sandbox.spawn(["sleep", "1000", MARK, "3"], sandbox.presets.minimal_system()) as proc:
        KEEP.append(os.open(f"/proc/{proc.pid}/ns/mnt", os.O_RDONLY))
        proc.kill()
    assert False, "failing on purpose with a namespace fd open"


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_mount_left(tmp_path):
    subprocess.run(["mount", "-t", "tmpfs", "leakcheck-test", str(tmp_path)], check=True)


def test_zz_nothing_is_left():
    assert not [p for p in os.listdir("/proc") if p.isdigit() and MARK.encode() in _cmdline(p)]
'''


def inner_session(tmp_path: Path, marker: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text("from leakcheck import nothing_outlives_the_test  # noqa: F401\n")
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "LEAK_MARKER": marker, "LEAK_RECORD": str(tmp_path / "namespaces.jsonl"),
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(Path(sandbox.__file__).resolve().parents[1])]),
           "COLUMNS": "1000"}  # the short summary's lines whole
    # A private mount namespace: the mount the inner session leaves ends with it.
    private = [UNSHARE, "--mount", "--propagation", "private"] if os.geteuid() == 0 else []
    return subprocess.run([*private, sys.executable, "-P", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(UNSHARE is None and os.geteuid() == 0, reason="unshare(1) is not installed")
def test_a_test_failing_midway_leaves_nothing(tmp_path: Path) -> None:
    marker = new_marker()
    result = inner_session(tmp_path, marker)
    out = result.stdout
    summary = out.strip().splitlines()[-1]
    bwrap = bool(sandbox.probe().bwrap)
    root = os.geteuid() == 0
    failed = 3 + bwrap
    assert re.search(rf"\b{failed} failed\b", summary), out
    assert re.search(rf"\b{failed + root} errors?\b", summary), out
    assert f"{1 + root} passed" in summary, out  # test_zz: nothing marked was left while the session still ran
    errors = [line for line in out.splitlines() if line.startswith("ERROR ")]
    for name in ("test_cli_sandbox_fails_midway", "test_api_sandbox_fails_midway[native]"):
        assert any(name in line and "processes outlived the test (now killed)" in line for line in errors), out
    assert any("test_namespace_fd_kept" in line and "namespace fds outlived the test" in line and "mnt:[" in line
               for line in errors), out
    if root:
        assert any("test_mount_left" in line and "mounts outlived the test" in line for line in errors), out
    assert not pids_with_marker(marker)
    recorded = [json.loads(line) for line in (tmp_path / "namespaces.jsonl").read_text().splitlines()]
    assert len(recorded) >= 3
    held: list[int] = []
    for _ in range(50):  # the kernel frees a namespace once its last process is reaped
        held = _processes_in(recorded)
        if not held:
            break
        time.sleep(0.1)
    assert not held, f"processes still in the failed tests' sandboxes' namespaces: {held}"


NAMESPACES = ("mnt", "pid", "net", "ipc", "uts")


def _processes_in(recorded: list[dict[str, str]]) -> list[int]:
    """The processes this test can see that are in every namespace of one
    recorded sandbox. A namespace's name is its inode number, which the
    kernel reuses once the namespace is freed: another process (another
    test's, another user's) may hold a new namespace under an old name, but
    not five of them under the five names one sandbox had."""
    wanted = [tuple(ns[name] for name in NAMESPACES) for ns in recorded]
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = tuple(os.readlink(f"/proc/{pid}/ns/{name}") for name in NAMESPACES)
        except OSError:
            continue
        if links in wanted:
            found.append(int(pid))
    return found


def test_a_passing_test_leaves_the_snapshot_unchanged() -> None:
    from leakcheck import Snapshot, check

    before = Snapshot.take()
    with sandbox.spawn(["sleep", "1000", new_marker()], sandbox.presets.minimal_system()) as proc:
        proc.kill()
    assert check(before) == []


def test_only_the_tests_own_directories_count_for_mounts(tmp_path: Path) -> None:
    # another job's mount (a fuse mount in its folder, a loop beside the suite) is not this test's leak
    import tempfile

    from leakcheck import own

    tmp = tempfile.gettempdir()
    assert own(str(tmp_path / "m")) and own(f"{tmp}/sandbox-task-x/empty") and own(f"{tmp}/sbxray1/m")
    assert not own(f"{tmp}/loaded-tests.abc/shared/m") and not own("/home/someone/fuse") and not own(tmp)
    assert not own(f"{tmp}/pytest-of-other/pytest-1/m")  # another session's basetemp
