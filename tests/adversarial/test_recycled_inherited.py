"""Attack: a tenant of a recycled Template sandbox changes what the next tenant's command inherits.

A recycled sandbox's commands are children of a process that outlives each
of them (its pid 1, csrc/template_recycle.c). The kernel lets a process of
the same uid change some of another process's attributes without any
capability, and a child inherits them: its resource limits (prlimit), its
nice value, scheduling policy, CPU affinity and I/O priority (where the
target holds no capability the caller lacks), and (where the command's uid
owns the target's /proc files: a root caller's) its OOM score adjustment
and core dump filter. Request N changes one of them on every other process
it sees (pid 1 is the sandbox's), both standbys in turn; request N+1, served
by a recycled sandbox, must still start with a fresh sandbox's values (a
changed maker ends, and a fresh standby replaces it:
csrc/template_inherited.c). As root and unprivileged, with the default
seccomp policy (which refuses some of these calls) and none.
"""

from __future__ import annotations

import json
import os
import textwrap
import time

import pytest

import sandbox
from sandbox import Dev, Tmpfs

from .attack import PYTHON, make_base_spec, require

pytestmark = pytest.mark.integration

# One change to pid 1 per run; prints whether it was allowed and which pid 1 it was (its start time).
# One change to every other process it sees (pid 1, and whatever else outlives the command); prints
# whether one was allowed and which sandbox it was.
CHANGE = textwrap.dedent("""
    import ctypes, json, os, resource, sys
    what = sys.argv[1]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def ioprio(pid):  # ioprio_set(IOPRIO_WHO_PROCESS, pid, the idle class)
        if libc.syscall(251, 1, pid, 3 << 13) < 0:
            raise OSError(ctypes.get_errno(), "ioprio_set")

    def write(pid, name, value):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(value)

    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    change = {
        "rlimit": lambda pid: resource.prlimit(pid, resource.RLIMIT_STACK, (1 << 20, hard)),
        "hard rlimit": lambda pid: resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0)),
        "nice": lambda pid: os.setpriority(os.PRIO_PROCESS, pid, 7),
        "policy": lambda pid: os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0)),
        "affinity": lambda pid: os.sched_setaffinity(pid, {min(os.sched_getaffinity(0))}),
        "ioprio": ioprio,
        "oom": lambda pid: write(pid, "oom_score_adj", "500"),
        "coredump": lambda pid: write(pid, "coredump_filter", "0x1"),
    }[what]
    done = []
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            change(pid)
            done.append(pid)
        except OSError:
            pass
    init = os.readlink("/proc/self/ns/mnt")  # which sandbox: a recycled one keeps its mount namespace
    print(json.dumps({"done": done, "init": init, "pid": os.getpid()}))
""")

LOOK = textwrap.dedent("""
    import ctypes, json, os, resource
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    limits = {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")}
    print(json.dumps({"pid": os.getpid(), "limits": limits, "nice": os.getpriority(os.PRIO_PROCESS, 0),
                      "policy": os.sched_getscheduler(0), "affinity": sorted(os.sched_getaffinity(0)),
                      "ioprio": libc.syscall(252, 1, 0),
                      "oom": open("/proc/self/oom_score_adj").read().strip(),
                      "coredump": open("/proc/self/coredump_filter").read().strip()}))
""")

CHANGES = ("rlimit", "hard rlimit", "nice", "policy", "affinity", "ioprio", "oom", "coredump")


def spec(**fields: object) -> sandbox.Spec:
    return make_base_spec(Tmpfs("/var/scratch"), Dev("/dev"), **fields)  # type: ignore[arg-type]


def look(t: sandbox.Template, recycled: bool) -> dict[str, object]:
    """What a command starts with; `recycled`: in a recycled sandbox (its command is not pid 2)."""
    for _ in range(100):
        r = t.run([PYTHON, "-I", "-S", "-c", LOOK], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        seen: dict[str, object] = json.loads(r.stdout)
        if not recycled or seen["pid"] != 2:
            return seen
        time.sleep(0.02)
    raise AssertionError("no request was served by a recycled sandbox")


@pytest.mark.parametrize("seccomp", ["default", "none"])
def test_a_tenant_cannot_change_what_the_next_command_inherits(seccomp: str) -> None:
    require("template")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed inside the sandbox")
    fields = {"seccomp": None} if seccomp == "none" else {}
    changed = []
    with sandbox.Template(spec(**fields), recycle=True) as t:
        baseline = look(t, recycled=False)
        for what in CHANGES:
            attacked: set[str] = set()
            for _ in range(10):  # until both standbys' pid 1 have been changed
                r = t.run([PYTHON, "-I", "-S", "-c", CHANGE, what], capture_output=True, text=True, timeout=60)
                assert r.returncode == 0, r.stderr
                out = json.loads(r.stdout)
                if not out["done"]:
                    break  # not this uid's to change here (or the filter refuses it)
                attacked.add(out["init"])
                if len(attacked) == 2:
                    break
            if not attacked:
                continue
            changed.append(what)
            seen = look(t, recycled=True)
            for key, value in baseline.items():
                if key != "pid":
                    assert seen[key] == value, (what, key, seen[key], value)
    assert "rlimit" in changed, changed  # prlimit on a process of one's own uid needs no capability
