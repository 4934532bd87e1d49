"""Attack: reconfigure the host kernel, or read what only its root may, through /proc.

A root caller's sandbox runs as uid 0 of the host, without capabilities:
mode bits alone let it write the sysctls (kernel.core_pattern set to
"|program" runs that program as real root on the next crash) and read the
0400 files (kernel memory layout, timers). Every Proc gets the plan's covers
(plan.proc_covers) on both backends: the entries that configure the kernel
read-only, the root-only ones masked (those of the running kernel, found by
mode: a kernel build may add one no list names). Unprivileged callers must see the same.
"""

from __future__ import annotations

import os

import pytest

from sandbox import Namespaces
from sandbox.host import root_only_proc_files
from sandbox.proc_covers import Cover, proc_covers

from .attack import BACKENDS, make_base_spec, require, run_py, run_sh

pytestmark = pytest.mark.integration

PID_NS = pytest.mark.parametrize("pid_ns", [True, False], ids=["pidns", "no-pidns"])

# Write core_pattern's own value back: harmless if it works, and it must not.
REWRITE_CORE_PATTERN = ('v=$(cat /proc/sys/kernel/core_pattern); '
                        'printf "%s" "$v" > /proc/sys/kernel/core_pattern && echo wrote')

# Every root-only (not world-readable) file at the top of /proc that opens for reading.
READ_ROOT_ONLY = """
import os, stat
for name in sorted(os.listdir("/proc")):
    path = "/proc/" + name
    try:
        st = os.lstat(path)
        if name.isdigit() or not stat.S_ISREG(st.st_mode) or st.st_mode & 0o004:
            continue
        with open(path, "rb") as f:
            f.read(1)
        print(path)
    except OSError:
        pass
print("scanned")
"""

# For each path: "ro" (a read-only mount of itself), "masked" (a read-only mount of a
# device node, /dev/null, that cannot be opened), "open" (no cover) or "absent".
COVER_STATE = """
import os, sys
mounts = {}
with open("/proc/self/mountinfo") as f:
    for line in f:
        fields = line.split()
        mounts[fields[4]] = ("ro" in fields[5].split(","), fields[3])
for path in sys.argv[1:]:
    if not os.path.lexists(path):
        state = "absent"
    elif mounts.get(path, (False,))[0]:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
            state = "open"
        except PermissionError:
            state = "masked"
        if mounts[path][1] != "/null":
            state = "ro"
    else:
        state = "open"
    print(path, state)
"""


@PID_NS
@pytest.mark.parametrize("backend", BACKENDS)
def test_sysctl_write_fails(backend: str, pid_ns: bool) -> None:
    require(backend)
    done = run_sh(backend, REWRITE_CORE_PATTERN, make_base_spec(namespaces=Namespaces(pid=pid_ns)))
    assert "wrote" not in done.stdout, f"the sandbox wrote a host sysctl ({backend})"
    assert "Read-only file system" in done.stderr, done.stderr


@PID_NS
@pytest.mark.parametrize("backend", BACKENDS)
def test_root_only_proc_files_unreadable(backend: str, pid_ns: bool) -> None:
    require(backend)
    done = run_py(backend, READ_ROOT_ONLY, make_base_spec(namespaces=Namespaces(pid=pid_ns)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["scanned"], f"root-only /proc files readable inside: {done.stdout}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_cover_applies(backend: str) -> None:
    """Each cover the plan lists and this kernel has is there: read-only entries
    are read-only mounts (a masked one also cannot be opened)."""
    require(backend)
    covers = proc_covers(os.getuid(), root_only_proc_files())
    paths = ["/proc/" + path for path, _ in covers]
    done = run_py(backend, COVER_STATE, make_base_spec(), *paths)
    assert done.returncode == 0, done.stderr
    seen = dict(line.split() for line in done.stdout.splitlines())
    for path, cover in covers:
        host_has = os.path.lexists("/proc/" + path)
        want = ("masked" if cover is Cover.MASK else "ro") if host_has else "absent"
        assert seen["/proc/" + path] == want, (path, seen)
