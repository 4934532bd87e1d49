"""Attack: a tenant of a recycled Template sandbox changes what the next tenant's command inherits.

A recycled sandbox's commands are children of a process that outlives each
of them (its pid 1, csrc/template/template_recycle.c). The kernel lets a process of
the same uid change some of another process's attributes without any
capability, and a child inherits them: its resource limits (prlimit), its
nice value, scheduling policy, CPU affinity and I/O priority (where the
target holds no capability the caller lacks), and (where the command's uid
owns the target's /proc files: a root caller's) its OOM score adjustment
and core dump filter. Request N changes one of them on every other process
it sees (pid 1 is the sandbox's), each standby in turn; request N+1, served
by a recycled sandbox, must still start with a fresh sandbox's values (a
changed maker ends, and a fresh standby replaces it:
csrc/template/template_inherited.c). As root and unprivileged, with the default
seccomp policy (which refuses some of these calls) and none.
"""

from __future__ import annotations

import json
import textwrap
import threading

import pytest

import sandbox
from sandbox import Dev, Tmpfs

from .attack import make_base_spec, require_template_python
from .recycled import Tenants

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
    print(init, json.dumps(done))
""")

LOOK = textwrap.dedent("""
    import ctypes, json, os, resource
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    limits = {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")}
    print(os.readlink("/proc/self/ns/mnt"), json.dumps({"limits": limits, "nice": os.getpriority(os.PRIO_PROCESS, 0),
                      "policy": os.sched_getscheduler(0), "affinity": sorted(os.sched_getaffinity(0)),
                      "ioprio": libc.syscall(252, 1, 0),
                      "oom": open("/proc/self/oom_score_adj").read().strip(),
                      "coredump": open("/proc/self/coredump_filter").read().strip()}))
""")

CHANGES = ("rlimit", "hard rlimit", "nice", "policy", "affinity", "ioprio", "oom", "coredump")


def spec(**fields: object) -> sandbox.Spec:
    return make_base_spec(Tmpfs("/var/scratch"), Dev("/dev"), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("seccomp", ["default", "none"])
def test_a_tenant_cannot_change_what_the_next_command_inherits(seccomp: str) -> None:
    require_template_python()
    fields = {"seccomp": None} if seccomp == "none" else {}
    changed = []
    with sandbox.Template(spec(**fields), recycle=True) as t:
        tenants = Tenants(t)
        baseline = json.loads(tenants.run(LOOK)[1])
        for what in CHANGES:
            if not any(json.loads(done) for done in tenants.in_each(CHANGE, what)):
                continue  # not this uid's to change here (or the filter refuses it)
            changed.append(what)
            seen = json.loads(tenants.recycled(LOOK))
            for key, value in baseline.items():
                assert seen[key] == value, (what, key, seen[key], value)
    assert "rlimit" in changed, changed  # prlimit on a process of one's own uid needs no capability


# Signals to every other process it sees: queued real-time ones (each counts against the uid's pending
# signals, the next tenant's too), a stop, or a kill; prints what it reached.
SIGNAL = textwrap.dedent("""
    import json, os, signal, sys
    what = sys.argv[1]
    done = []
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()):
        try:
            if what == "queued":
                for _ in range(64):
                    os.kill(pid, signal.SIGRTMIN)
            else:
                os.kill(pid, signal.SIGSTOP if what == "stop" else signal.SIGKILL)
            done.append(pid)
        except OSError:
            pass
    print(os.readlink("/proc/self/ns/mnt"), json.dumps(done))
""")

PENDING = textwrap.dedent("""
    import json, os
    sigq = [line.split()[1] for line in open("/proc/self/status") if line.startswith("SigQ:")][0]
    print(os.readlink("/proc/self/ns/mnt"), json.dumps({"queued": int(sigq.split("/")[0])}))
""")


@pytest.mark.parametrize("what", ["queued", "stop", "kill"])
def test_signals_to_what_outlives_a_command_reach_no_later_tenant(what: str) -> None:
    """Whatever a command signals that outlives it (a recycled sandbox's pid 1, its command maker),
    the next tenants' commands start and run: no signal queued for their uid, nothing stopped."""
    require_template_python()
    seen: list[object] = []

    def later_tenants() -> None:
        for _ in range(4):  # the standbys serve again
            seen.append(json.loads(tenants.recycled(PENDING)))

    with sandbox.Template(spec(), recycle=True) as t:
        tenants = Tenants(t)
        for done in tenants.in_each(SIGNAL, what):
            assert json.loads(done), done  # it reached at least one (the maker, where there is one)
        # a stopped process that makes the commands would leave their requests waiting: not forever here
        waiting = threading.Thread(target=later_tenants, daemon=True)
        waiting.start()
        waiting.join(30)
        assert not waiting.is_alive(), f"the next tenants' requests are still waiting ({len(seen)} served)"
    assert seen == [{"queued": 0}] * 4, seen
