"""A WorkerPool task against starting a Python per task: bwrap, sandbox.run and a bare exec.

Every variant does the same work: a Python with json, asyncio and subprocess
imported returns a small value. The WorkerPool imports them once in its zygote
(preload) and forks a sandbox per task; the others start `python -I -c 'import
json,asyncio,subprocess'` each time, under bwrap with the same mounts (the
Spec's plus the interpreter's, read-only), under sandbox.run (native), and
bare; and the WorkerPool once more with every task in a fresh network
namespace (SANDBOX_WORKERPOOL_NETNS_POOL=0) rather than one leased from the
pool's own supply. Variants run interleaved in one process (round-robin), so machine noise
hits them alike; the table reports median and p99 in ms and each median as a
ratio to bwrap's. Then tasks per second with 2 callers (threads submitting
and waiting back to back), and for pool.map over many tasks; and where a
task's CPU goes during the 2-caller run (`cpu_per_task`): this process (the
callers and the pool's I/O thread), the zygote itself (its forks' page-table
copies, the copy-on-write faults it takes after each, its messages) and the
sandboxes it forked and reaped (their setup, the task, their exit and the
teardown of their namespaces), with the minor faults of each. The kernel's
asynchronous work (a network namespace's cleanup, in kworkers) is not in
those figures: the machine's busy time per task (/proc/stat, every process,
so only meaningful on an otherwise idle machine) is printed beside them.
Then, one task at a time, how much CPU a task's sandbox has used when its
function starts (setup, CPython's after-fork work, its channel, unpickling)
against all it uses (reaped), and where its latency goes (critical_path:
the caller until the task's channels are sent, until its function starts,
until its reply is in and loaded, until result() returns); and the floor: a
bare fork and exit of an interpreter with the same imports, as os.fork()
does it, with its at-fork hooks' list emptied, and without CPython's
after-fork work in the child.

    python benchmarks/workerpool.py [-n 100] [--seconds 5] [--json out.json]
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import sandbox
from sandbox.workerpool.interpreter import zygote_spec
from sandbox.workerpool.pool import LEASE_ENV

if __package__:
    from .timing import arguments, calls_per_second, measure, p99, write_json
else:  # run as a script: benchmarks/ is sys.path[0]
    from timing import arguments, calls_per_second, measure, p99, write_json

PRELOAD = ["json", "asyncio", "subprocess"]
CODE = "import json, asyncio, subprocess"
MOUNTS = [
    sandbox.RoBind("/usr"), sandbox.Symlink("usr/lib", "/lib"), sandbox.Symlink("usr/lib64", "/lib64"),
    sandbox.Symlink("usr/bin", "/bin"), sandbox.Symlink("usr/sbin", "/sbin"), sandbox.RoBind("/etc/ld.so.cache"),
    sandbox.Proc("/proc"), sandbox.Dev("/dev"), sandbox.Tmpfs("/tmp"),
]


def small_task() -> dict[str, int]:
    """What each WorkerPool task runs: a small value back."""
    return {"answer": 42}


def bwrap_args(spec: sandbox.Spec) -> list[str]:
    """bwrap options for the mounts of `spec` (the zygote's: the Spec's plus the interpreter's)."""
    args: list[str] = []
    for m in spec.mounts:
        if isinstance(m, sandbox.RoBind):
            args += ["--ro-bind", m.src, m.dest_path()]
        elif isinstance(m, sandbox.Symlink):
            args += ["--symlink", m.target_path, m.dest]
        elif isinstance(m, sandbox.Proc):
            args += ["--proc", m.dest]
        elif isinstance(m, sandbox.Dev):
            args += ["--dev", m.dest]
        elif isinstance(m, sandbox.Tmpfs):
            args += ["--tmpfs", m.dest]
        else:
            raise ValueError(f"no bwrap rendering here for {m!r}")
    return [*args, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv", "--chdir", "/"]


def variants(pool: sandbox.WorkerPool, no_spares: sandbox.WorkerPool, fresh: sandbox.WorkerPool,
             spec: sandbox.Spec) -> dict[str, Callable[[], object]]:
    """name -> one run of the work."""
    argv = [sys.executable, "-I", "-c", CODE]
    full = zygote_spec(spec).replace(cwd="/")
    out: dict[str, Callable[[], object]] = {
        "WorkerPool task (preloaded, default spares)": lambda: pool.submit(small_task).result(),
        "WorkerPool task (preloaded, spares=0)": lambda: no_spares.submit(small_task).result(),
        "WorkerPool task (default spares, a fresh netns per task)": lambda: fresh.submit(small_task).result(),
        "sandbox.run python -c (native)": lambda: sandbox.run(argv, full, backend="native", check=True),
        "bare python -c": lambda: subprocess.run(argv, check=True),
    }
    bwrap = shutil.which("bwrap")
    if bwrap:
        args = [bwrap, *bwrap_args(full), *argv]
        out["bwrap + python -c (same mounts)"] = lambda: subprocess.run(args, check=True)
    return out


def fresh_netns_pool(spec: sandbox.Spec) -> sandbox.WorkerPool:
    """A WorkerPool like the default one whose tasks each make a fresh network namespace (as before leases)."""
    os.environ[LEASE_ENV] = "0"
    try:
        return sandbox.WorkerPool(spec, preload=PRELOAD, max_workers=4)
    finally:
        del os.environ[LEASE_ENV]


def sustained(pool: sandbox.WorkerPool, seconds: float, callers: int = 2) -> float:
    """Tasks per second with `callers` threads, each submitting and waiting back to back."""
    return calls_per_second(lambda: pool.submit(small_task).result(), callers, seconds)


TICK = os.sysconf("SC_CLK_TCK")


def _zygote_pid(pool: sandbox.WorkerPool) -> int:
    """The zygote's host pid: the only child of the pool's pid 1 (sandbox-init)."""
    with open(f"/proc/{pool.pid}/task/{pool.pid}/children") as f:
        return int(f.read().split()[0])


def _proc_cpu(pid: int) -> tuple[float, float, int, int]:
    """(own CPU s, its reaped children's CPU s, own minor faults, its reaped children's) of `pid`."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # fields[0] is stat's 3rd field (state)
    minflt, cminflt = int(fields[7]), int(fields[8])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / TICK, (cutime + cstime) / TICK, minflt, cminflt


def _busy_seconds() -> float:
    """The machine's busy CPU seconds so far (every state but idle and iowait)."""
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICK


def cpu_per_task(pool: sandbox.WorkerPool, seconds: float, callers: int = 2) -> dict[str, float]:
    """The 2-caller sustained run, with where its CPU went, per task: ms of CPU
    of this process, of the zygote, of the sandboxes it forked (reaped), their
    sum, the machine's busy time, and the minor faults of the zygote and of
    each sandbox. Spares forked and not yet reaped at either end blur the
    figures by a task or two."""
    zygote = _zygote_pid(pool)
    z0, me0, busy0 = _proc_cpu(zygote), resource.getrusage(resource.RUSAGE_SELF), _busy_seconds()
    start = time.monotonic()
    rate = sustained(pool, seconds, callers)
    tasks = rate * (time.monotonic() - start)
    z1, me1, busy1 = _proc_cpu(zygote), resource.getrusage(resource.RUSAGE_SELF), _busy_seconds()
    me = me1.ru_utime + me1.ru_stime - me0.ru_utime - me0.ru_stime
    out = {"tasks/s": rate, "caller ms": me, "zygote ms": z1[0] - z0[0], "sandboxes ms": z1[1] - z0[1],
           "busy ms": busy1 - busy0, "zygote faults": z1[2] - z0[2], "sandbox faults": z1[3] - z0[3]}
    for key in out:
        if key != "tasks/s":
            out[key] = out[key] / tasks * (1e3 if key.endswith("ms") else 1)
    out["total ms"] = out["caller ms"] + out["zygote ms"] + out["sandboxes ms"]
    return out


FORK_FLOOR = """
import ctypes, gc, os, resource, sys, threading
import cloudpickle
for name in sys.argv[2:]:
    __import__(name)
# the interpreter's at-fork hooks (os.register_at_fork's after_in_child list): emptied for one
# variant, to tell PyOS_AfterFork_Child's own work from theirs (a measurement only; found before
# gc.freeze(), as get_referrers does not search the permanent generation)
hooks = next(r for r in gc.get_referrers(threading._after_fork) if type(r) is list)
saved = list(hooks)
gc.collect(); gc.freeze()
n = int(sys.argv[1])
print(",".join(f"{h.__module__}.{h.__qualname__}" for h in saved))
fork = ctypes.PyDLL(None).fork  # PyDLL: the GIL is kept across the call, as os.fork keeps it
def loop(how):
    for _ in range(n):
        pid = os.fork() if how != "bare" else fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
cpu = lambda a, b: (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) / n * 1e3
for how in ("os.fork", "no hooks", "bare"):
    hooks[:] = [] if how == "no hooks" else saved
    me0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    loop(how)
    me1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(cpu(me0, me1), cpu(kids0, kids1), (kids1.ru_minflt - kids0.ru_minflt) / n)
hooks[:] = saved
"""

Floor = tuple[float, float, float]  # ms of CPU in the parent, in the child, the child's minor faults


def fork_floor(n: int = 300) -> tuple[str, Floor, Floor, Floor]:
    """What a bare fork and os._exit(0) of an interpreter with the zygote's
    imports (cloudpickle and PRELOAD) costs, outside any sandbox: the names
    of its at-fork hooks, then (ms of CPU in the parent, in the child, the
    child's minor faults) as os.fork() does it (the child runs CPython's
    after-fork work: PyOS_AfterFork_Child and those hooks, threading's and
    the preload's), with the hooks' list emptied (PyOS_AfterFork_Child's own
    work), and without any of it (the kernel's fork and exit alone): the
    floor of a forked task, and what the interpreter's after-fork adds."""
    out = subprocess.run([sys.executable, "-I", "-c", FORK_FLOOR, str(n), *PRELOAD], check=True,
                         capture_output=True, text=True).stdout.split("\n")
    rows = [tuple(float(x) for x in line.split()) for line in out[1:4]]
    return out[0], (rows[0][0], rows[0][1], rows[0][2]), (rows[1][0], rows[1][1], rows[1][2]), \
        (rows[2][0], rows[2][1], rows[2][2])


def started_at() -> int:
    """What each task of the critical-path run returns: when its function
    started (CLOCK_MONOTONIC, which a task and its caller share)."""
    import time

    return time.monotonic_ns()


PATH = ("caller: submit -> its channels sent", "sent -> its function starts", "function -> reply in and loaded",
        "-> result() returns")


def critical_path(pool: sandbox.WorkerPool, n: int) -> dict[str, float]:
    """n tasks one after another (2 ms apart, the spares set up): the median
    µs of each part of a task's path (PATH), and of all of it: what the
    caller does before the task's channels go to its sandbox (pickling the
    call, the channels; TaskFuture.timings' queued), until its function runs
    (the sandbox's wake-up, reading the call, unpickling it), until its
    reply is in the caller and loaded (timings' done), until result() returns."""
    parts: list[list[float]] = [[] for _ in range(len(PATH) + 1)]
    for _ in range(n):
        time.sleep(0.002)
        t_submit = time.monotonic_ns()
        future = pool.submit(started_at)
        t_fn = future.result()
        t_result = time.monotonic_ns()
        t_sent = t_submit + future.timings["queued"] * 1e3
        t_done = t_sent + future.timings["done"] * 1e3
        for k, span in enumerate((t_sent - t_submit, t_fn - t_sent, t_done - t_fn, t_result - t_done,
                                  t_result - t_submit)):
            parts[k].append(span / 1e3)
    return {name: statistics.median(xs) for name, xs in zip((*PATH, "in all"), parts, strict=True)}


def own_cpu() -> tuple[float, int]:
    """What a task's function finds when it starts: (ms of CPU its sandbox
    has used since its fork, its minor faults)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1e3, usage.ru_minflt


def task_split(pool: sandbox.WorkerPool, n: int) -> tuple[float, float, float]:
    """n tasks one after another: (median ms of CPU a task's sandbox has used
    when its function starts: its setup, CPython's after-fork, its channel and
    the unpickling of its call; its minor faults then; ms of CPU per sandbox
    in all, reaped: the rest is its reply, its exit and the teardown of its
    namespaces)."""
    zygote = _zygote_pid(pool)
    before = _proc_cpu(zygote)
    futures = [pool.submit(own_cpu) for _ in range(1)]
    for _ in range(n - 1):
        futures[-1].result()
        futures.append(pool.submit(own_cpu))
    starts = [f.result() for f in futures]
    for f in futures:
        f.usage  # noqa: B018 - waits for the sandbox's end: its CPU is then its parent's, the zygote's
    after = _proc_cpu(zygote)
    return (statistics.median(s[0] for s in starts), statistics.median(s[1] for s in starts),
            (after[1] - before[1]) / n * 1e3)


def mapped(pool: sandbox.WorkerPool, n: int) -> float:
    """Tasks per second of pool.map over n tasks (the pool keeps max_workers in flight)."""
    start = time.monotonic()
    for _ in pool.map(lambda _: small_task(), range(n)):
        pass
    return n / (time.monotonic() - start)


def table(times: dict[str, list[float]]) -> str:
    """A Markdown table with medians, p99s and ratios to bwrap and to the WorkerPool."""
    med = {k: statistics.median(v) for k, v in times.items()}
    bw = med.get("bwrap + python -c (same mounts)")
    rows = ["| variant | median ms | p99 ms | / bwrap |", "|---|---|---|---|"]
    for name, xs in times.items():
        rows.append(f"| {name} | {med[name]:.2f} | {p99(xs):.2f} | {f'{med[name] / bw:.3f}x' if bw else '-'} |")
    return "\n".join(rows)


def main() -> int:
    ap = arguments(__doc__, 100)
    ap.add_argument("--seconds", type=float, default=5.0, help="length of the sustained run (default 5)")
    args = ap.parse_args()
    print(f"# {CODE!r} per task, n={args.n}, uid={os.getuid()}, python {sys.version.split()[0]}, "
          f"kernel {os.uname().release}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    spec = sandbox.Spec(mounts=MOUNTS)
    with sandbox.WorkerPool(spec, preload=PRELOAD, max_workers=4) as pool, \
            sandbox.WorkerPool(spec, preload=PRELOAD, max_workers=4, spares=0) as no_spares, \
            fresh_netns_pool(spec) as fresh:
        times = measure(variants(pool, no_spares, fresh, spec), args.n, warmup=5)
        print(table(times))
        print()
        for name, p in (("default spares", pool), ("spares=0", no_spares), ("default spares, fresh netns", fresh)):
            cpu = cpu_per_task(p, args.seconds)
            print(f"{name}: sustained, 2 callers: {cpu['tasks/s']:.0f} tasks/s; "
                  f"pool.map of 1000 tasks (max_workers=4): {mapped(p, 1000):.0f} tasks/s")
            print(f"  CPU per task (2 callers), ms: this process {cpu['caller ms']:.2f}, zygote "
                  f"{cpu['zygote ms']:.2f}, its sandboxes {cpu['sandboxes ms']:.2f}; sum {cpu['total ms']:.2f} "
                  f"(machine busy {cpu['busy ms']:.2f}); minor faults per task: zygote "
                  f"{cpu['zygote faults']:.0f}, sandbox {cpu['sandbox faults']:.0f}")
        at_start, faults_then, in_all = task_split(pool, args.n)
        print(f"default spares, one task at a time: a sandbox's CPU when its function starts {at_start:.2f} ms "
              f"({faults_then:.0f} minor faults), in all (reaped) {in_all:.2f} ms")
        path = critical_path(pool, args.n)
        print("default spares, one task at a time, its path (median µs): "
              + "; ".join(f"{name} {us:.0f}" for name, us in path.items()))
    names, full, own, bare = fork_floor()
    print(f"fork + os._exit(0) of an interpreter with cloudpickle and the preload imported (its at-fork hooks: "
          f"{names}), ms of CPU in the parent, in the child (minor faults): as os.fork() does it "
          f"{full[0]:.2f}, {full[1]:.2f} ({full[2]:.0f}); without the hooks, PyOS_AfterFork_Child's own work only "
          f"{own[0]:.2f}, {own[1]:.2f} ({own[2]:.0f}); without CPython's after-fork {bare[0]:.2f}, {bare[1]:.2f} "
          f"({bare[2]:.0f})")
    write_json(args.json, times)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
