"""What a sandbox's own cgroup (sandbox.cgroups) costs: spawn+wait of /bin/true with limits off and on.

Rows, interleaved round-robin in one process (as benchmarks/latency.py), each round starting one row
later than the one before:
- sandbox.spawn, no limits;
- sandbox.spawn, rlimits only (nofile: nothing to make);
- sandbox.spawn, cgroup limits (memory_mb, nproc, cpu_cores): a cgroup made per sandbox in every
  hierarchy this caller has (mkdir, limits written, cgroup.procs opened), entered by the child, read
  and removed after the end;
- the same limits with no cgroup for the caller ($SANDBOX_CGROUP_PARENT pointing nowhere: rlimits);
- posix_spawn /bin/true, the floor;
- the bwrap backend without limits and with the cgroup limits (bwrap started inside them, through
  sandbox-init --enter-cgroups);
- a sandbox.Template without limits and with the cgroup limits in its Spec (cgroup mode: its standbys
  wait in cgroups made ahead, so a call makes and enters none), with those limits and no cgroup
  (rlimits), and a Template without limits in its Spec called with them (a cgroup made per call, sent
  with the request, entered by the standby that takes it).
Besides, the cgroup's own steps timed alone in the caller (make with limits, read usage, remove).

With --workerpool, a WorkerPool task (submit, result) instead, each pool
alone in blocks (its background spare forks stay off the others' calls):
pools with spares=2 and spares=0, without limits, with the same cgroup limits
(a cgroup per task: made ahead for a spare, with SPAWN otherwise; its usage
read and the cgroup removed when the task ends, which the future then
waits for), and with those limits and no cgroup (rlimits).

With --template, Templates alone (no other executor's background work between
their calls): without limits, with the cgroup limits in the Spec (placed), with
memory and nproc only (placed), with the same limits as rlimits, and a placed
Template called with other limits (a standby moves into the call's cgroup).

    python benchmarks/limits.py [-n 300] [--gap-ms MS] [--workerpool | --template] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from latency import MOUNTS  # noqa: E402
from timing import measure, p99  # noqa: E402

import sandbox  # noqa: E402
from sandbox import cgroups  # noqa: E402
from sandbox.backends.native import TRAITS as NATIVE
from sandbox.plan_cache import compiled_plan  # noqa: E402

LIMITS = sandbox.Limits(memory_mb=256, nproc=64, cpu_cores=1.0)
T = TypeVar("T")


def spec(limits: sandbox.Limits) -> sandbox.Spec:
    return sandbox.Spec(mounts=MOUNTS, limits=limits, env={"PATH": "/usr/bin"})


def run_true(s: sandbox.Spec, backend: str = "native") -> None:
    with sandbox.spawn(["/bin/true"], s, backend=backend) as p:
        pass
    if p.returncode != 0:
        raise RuntimeError(f"/bin/true exited {p.returncode}")


def template_true(t: sandbox.Template, limits: sandbox.Limits | None = None) -> None:
    with t.spawn(["/bin/true"], **({"limits": limits} if limits is not None else {})) as p:
        pass
    if p.returncode != 0:
        raise RuntimeError(f"/bin/true exited {p.returncode}")


def without_cgroups(fn: Callable[[], T]) -> T:
    """fn() with no cgroup for the caller ($SANDBOX_CGROUP_PARENT pointing nowhere)."""
    saved = os.environ.get(cgroups.PARENT_ENV)
    os.environ[cgroups.PARENT_ENV] = "/nonexistent"
    try:
        return fn()
    finally:
        if saved is None:
            del os.environ[cgroups.PARENT_ENV]
        else:
            os.environ[cgroups.PARENT_ENV] = saved


def no_cgroup(s: sandbox.Spec) -> None:
    without_cgroups(lambda: run_true(s))


def cgroup_steps(n: int) -> dict[str, float]:
    """Median µs of each step of a sandbox's cgroup, in the caller, with no process in it."""
    info = cgroups.host_cgroups()
    plan = compiled_plan(spec(LIMITS), sandbox.host.HostInfo.current(NATIVE))
    assert plan.cgroup is not None
    make, read, remove = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        cg = cgroups.SandboxCgroup(info, plan.cgroup)
        t1 = time.perf_counter()
        cg.close_fds()
        cg.usage()
        t2 = time.perf_counter()
        cg.remove()
        t3 = time.perf_counter()
        make.append((t1 - t0) * 1e6)
        read.append((t2 - t1) * 1e6)
        remove.append((t3 - t2) * 1e6)
    return {"make (mkdir, limits, open)": statistics.median(make), "read usage": statistics.median(read),
            "remove (rmdir)": statistics.median(remove)}


def entry_steps(n: int) -> dict[str, tuple[float, float]]:
    """(median, 90th percentile) µs of a fresh process writing itself into each hierarchy's cgroup (its
    entry as a sandbox's first process makes it), by the hierarchy's controllers."""
    info = cgroups.host_cgroups()
    plan = compiled_plan(spec(LIMITS), sandbox.host.HostInfo.current(NATIVE))
    assert plan.cgroup is not None
    names = [",".join(sorted(h.controllers)) or "none" for h in cgroups.hierarchies_for(info, plan.cgroup)]
    times: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(n):
        cg = cgroups.SandboxCgroup(info, plan.cgroup)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            took = []
            for fd in cg.procs_fds:
                t0 = time.perf_counter_ns()
                os.write(fd, b"0")
                took.append(time.perf_counter_ns() - t0)
            os.write(w, json.dumps(took).encode())
            os._exit(0)
        os.close(w)
        took = json.loads(os.read(r, 4096))
        os.close(r)
        os.waitpid(pid, 0)
        cg.close_fds()
        cg.remove(attempts=20)
        for name, ns in zip(names, took, strict=True):
            times[name].append(ns / 1000)
    return {name: (statistics.median(xs), sorted(xs)[int(len(xs) * 0.9)]) for name, xs in times.items()}


def template_rows(n: int, gap_ms: float) -> dict[str, list[float]]:
    """ms per spawn+wait of /bin/true on Templates alone (no other executor's background work between
    them), interleaved, each round starting one row later."""
    other = sandbox.Limits(memory_mb=128, nproc=32, cpu_cores=1.0)
    templates = {"Template, no limits": sandbox.Template(spec(sandbox.Limits())),
                 "Template, cgroup limits (placed)": sandbox.Template(spec(LIMITS)),
                 "Template, memory+nproc (placed)": sandbox.Template(spec(sandbox.Limits(memory_mb=256, nproc=64))),
                 "Template, same limits, no cgroup (rlimits)": without_cgroups(lambda: sandbox.Template(spec(LIMITS)))}
    fns: dict[str, Callable[[], None]] = {name: (lambda t=t: template_true(t)) for name, t in templates.items()}
    fns["Template (placed), other limits per call"] = lambda: template_true(
        templates["Template, cgroup limits (placed)"], other)

    def next_round() -> None:
        first = next(iter(fns))
        fns[first] = fns.pop(first)
        if gap_ms:
            time.sleep(gap_ms / 1000)
    try:
        return measure(fns, n, on_round=next_round)
    finally:
        for t in templates.values():
            t.close()


def small_task() -> int:
    return 42


def workerpool_rows(n: int, gap_ms: float) -> dict[str, list[float]]:
    """ms per task (submit to result) of pools with and without limits, interleaved."""
    pools: dict[str, sandbox.WorkerPool] = {}
    try:
        for spares in (2, 0):
            pools[f"WorkerPool spares={spares}, no limits"] = sandbox.WorkerPool(spec(sandbox.Limits()), 2,
                                                                                 spares=spares)
            pools[f"WorkerPool spares={spares}, cgroup limits"] = sandbox.WorkerPool(spec(LIMITS), 2, spares=spares)
            saved = os.environ.get(cgroups.PARENT_ENV)
            os.environ[cgroups.PARENT_ENV] = "/nonexistent"
            try:
                pools[f"WorkerPool spares={spares}, same limits, no cgroup"] = sandbox.WorkerPool(
                    spec(LIMITS), 2, spares=spares)
            finally:
                if saved is None:
                    del os.environ[cgroups.PARENT_ENV]
                else:
                    os.environ[cgroups.PARENT_ENV] = saved

        def one(pool: sandbox.WorkerPool) -> None:
            f = pool.submit(small_task)
            if f.result() != 42:
                raise RuntimeError("wrong result")
        # Not interleaved: a spared pool forks its next spare after each task,
        # which would land on the next variant's call. Each pool alone, in
        # blocks of n/4, round-robin over the pools.
        times: dict[str, list[float]] = {name: [] for name in pools}
        block = max(1, n // 4)
        for _ in range(4):
            for name, pool in pools.items():
                times[name] += measure({name: lambda p=pool: one(p)}, block, warmup=5,
                                       on_round=(lambda: time.sleep(gap_ms / 1000)) if gap_ms else None)[name]
        return times
    finally:
        for pool in pools.values():
            pool.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="sleep between rounds: spaced-out spawns pay the kernel's RCU grace period on migration")
    ap.add_argument("--workerpool", action="store_true", help="WorkerPool tasks instead of spawns")
    ap.add_argument("--template", action="store_true",
                    help="Templates alone: placed cgroups, rlimits, other limits per call")
    ap.add_argument("--json")
    args = ap.parse_args()
    info = cgroups.host_cgroups()
    print(f"cgroups here: {info.mechanism} ({', '.join(sorted(info.controllers)) or 'none'}); {info.reason}")
    print(f"hierarchies: {', '.join(f'v{h.version} {h.parent}' for h in info.hierarchies) or 'none'}")
    if args.template:
        times = template_rows(args.n, args.gap_ms)
        ref = statistics.median(times["Template, no limits"])
        print(f"\nTemplate spawn+wait of /bin/true, n={args.n} each, rotated, {args.gap_ms} ms between rounds")
        print(f"{'variant':44} {'median ms':>10} {'mean ms':>8} {'vs no limits':>13}")
        for name, xs in times.items():
            med = statistics.median(xs)
            print(f"{name:44} {med:10.3f} {statistics.mean(xs):8.3f} {med - ref:+12.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"mechanism": info.mechanism, "template_times_ms": times}, f)
        return 0
    if args.workerpool:
        times = workerpool_rows(args.n, args.gap_ms)
        base = {k: statistics.median(v) for k, v in times.items() if k.endswith("no limits")}
        print(f"\nWorkerPool task, submit to result, n={args.n} each, in blocks, {args.gap_ms} ms between tasks")
        print(f"{'variant':46} {'median ms':>10} {'p99 ms':>8} {'vs no limits':>13}")
        for name, xs in times.items():
            med = statistics.median(xs)
            ref = base[name.split(",")[0] + ", no limits"]
            print(f"{name:46} {med:10.3f} {p99(xs):8.3f} {med - ref:+12.3f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"mechanism": info.mechanism, "workerpool_times_ms": times}, f)
        return 0
    plain, rl, cg = spec(sandbox.Limits()), spec(sandbox.Limits(nofile=256)), spec(LIMITS)
    templates = {"plain": sandbox.Template(plain), "limits": sandbox.Template(cg),
                 "rlimits": without_cgroups(lambda: sandbox.Template(cg))}
    fns = {
        "posix_spawn /bin/true": lambda: subprocess.run(["/bin/true"], check=True),
        "spawn, no limits": lambda: run_true(plain),
        "spawn, rlimits only": lambda: run_true(rl),
        "spawn, cgroup limits": lambda: run_true(cg),
        "spawn, same limits, no cgroup (rlimits)": lambda: no_cgroup(cg),
        "bwrap backend, no limits": lambda: run_true(plain, "bwrap"),
        "bwrap backend, cgroup limits": lambda: run_true(cg, "bwrap"),
        "Template, no limits": lambda: template_true(templates["plain"]),
        "Template, cgroup limits": lambda: template_true(templates["limits"]),
        "Template, same limits, no cgroup (rlimits)": lambda: template_true(templates["rlimits"]),
        "Template, no limits, the limits per call": lambda: template_true(templates["plain"], LIMITS),
    }
    try:
        def next_round() -> None:
            # the next round starts one variant later: none always follows the same one (a Template's
            # standby replacement, a removal in the background, lands on whichever call comes next)
            first = next(iter(fns))
            fns[first] = fns.pop(first)
            if args.gap_ms:
                time.sleep(args.gap_ms / 1000)
        times = measure(fns, args.n, on_round=next_round)
    finally:
        for t in templates.values():
            t.close()
    base = {"spawn": statistics.median(times["spawn, no limits"]),
            "bwrap": statistics.median(times["bwrap backend, no limits"]),
            "Template": statistics.median(times["Template, no limits"])}
    print(f"\nspawn+wait of /bin/true, n={args.n} each, interleaved, {args.gap_ms} ms between rounds")
    print(f"{'variant':42} {'median ms':>10} {'mean ms':>8} {'p99 ms':>8} {'vs no limits':>13}")
    for name, xs in times.items():
        med = statistics.median(xs)
        ref = base["bwrap"] if name.startswith("bwrap") else base["Template"] if name.startswith("Template") \
            else base["spawn"]
        print(f"{name:42} {med:10.3f} {statistics.mean(xs):8.3f} {p99(xs):8.3f} {med - ref:+12.3f}")
    steps = cgroup_steps(args.n) if info.hierarchies else {}
    if steps:
        print(f"\nthe cgroup's steps in the caller ({len(info.hierarchies)} hierarchies), median µs")
        for name, us in steps.items():
            print(f"  {name:30} {us:8.1f}")
    entries = entry_steps(min(args.n, 100)) if info.hierarchies else {}
    if entries:
        print("\na fresh process writing itself into each cgroup (its entry), µs: median, 90th percentile")
        for name, (med, p90) in entries.items():
            print(f"  {name:30} {med:8.1f} {p90:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mechanism": info.mechanism, "times_ms": times, "steps_us": steps,
                       "entry_us": entries}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
