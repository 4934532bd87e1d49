"""A WorkerPool task against starting a Python per task: bwrap, sandbox.run and a bare exec.

Every variant does the same work: a Python with json, asyncio and subprocess
imported returns a small value. The WorkerPool imports them once in its zygote
(preload) and forks a sandbox per task; the others start `python -I -c 'import
json,asyncio,subprocess'` each time, under bwrap with the same mounts (the
Spec's plus the interpreter's, read-only), under sandbox.run (native), and
bare. Variants run interleaved in one process (round-robin), so machine noise
hits them alike; the table reports median and p99 in ms and each median as a
ratio to bwrap's. Then tasks per second with 2 callers (threads submitting
and waiting back to back), and for pool.map over many tasks.

    python benchmarks/workerpool.py [-n 100] [--seconds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import sandbox
from sandbox.workerpool.interpreter import zygote_spec

if __package__:
    from .timing import calls_per_second, measure, p99
else:  # run as a script: benchmarks/ is sys.path[0]
    from timing import calls_per_second, measure, p99

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
            args += ["--ro-bind", m.src, m.target()]
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


def variants(pool: sandbox.WorkerPool, no_spares: sandbox.WorkerPool,
             spec: sandbox.Spec) -> dict[str, Callable[[], object]]:
    """name -> one run of the work."""
    argv = [sys.executable, "-I", "-c", CODE]
    full = zygote_spec(spec).replace(cwd="/")
    out: dict[str, Callable[[], object]] = {
        "WorkerPool task (preloaded, spares=2)": lambda: pool.submit(small_task).result(),
        "WorkerPool task (preloaded, spares=0)": lambda: no_spares.submit(small_task).result(),
        "sandbox.run python -c (native)": lambda: sandbox.run(argv, full, backend="native", check=True),
        "bare python -c": lambda: subprocess.run(argv, check=True),
    }
    bwrap = shutil.which("bwrap")
    if bwrap:
        args = [bwrap, *bwrap_args(full), *argv]
        out["bwrap + python -c (same mounts)"] = lambda: subprocess.run(args, check=True)
    return out


def sustained(pool: sandbox.WorkerPool, seconds: float, callers: int = 2) -> float:
    """Tasks per second with `callers` threads, each submitting and waiting back to back."""
    return calls_per_second(lambda: pool.submit(small_task).result(), callers, seconds)


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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100, help="runs per variant (default 100)")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of the sustained run (default 5)")
    ap.add_argument("--json", help="also write the raw per-run times here")
    args = ap.parse_args()
    print(f"# {CODE!r} per task, n={args.n}, uid={os.getuid()}, python {sys.version.split()[0]}, "
          f"kernel {os.uname().release}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    spec = sandbox.Spec(mounts=MOUNTS)
    with sandbox.WorkerPool(spec, preload=PRELOAD, max_workers=4) as pool, \
            sandbox.WorkerPool(spec, preload=PRELOAD, max_workers=4, spares=0) as no_spares:
        times = measure(variants(pool, no_spares, spec), args.n, warmup=5)
        print(table(times))
        print()
        for name, p in (("spares=2", pool), ("spares=0", no_spares)):
            print(f"{name}: sustained, 2 callers: {sustained(p, args.seconds):.0f} tasks/s; "
                  f"pool.map of 1000 tasks (max_workers=4): {mapped(p, 1000):.0f} tasks/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(times, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
