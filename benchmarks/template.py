"""sandbox.Template against posix_spawn, sandbox.spawn and bwrap.

Latency: spawn+wait of /bin/true, every variant interleaved in one process
(round-robin, as benchmarks/latency.py), medians and p99s, each median as a
ratio to posix_spawn's and to bwrap's. The config is latency.py's
flatpak-like one, every namespace; the Template and one native row lease
their network namespace from sandbox.netpool. Throughput: sandboxes/s with
2 callers (threads) spawning /bin/true back to back for a few seconds.

Binds: the same spawn+wait with 10, 100 and 1000 extra read-only binds in
the Spec (directories of a temporary tree), for sandbox.spawn, the Template
and bwrap, interleaved per count: what a large mount table costs each.

Targets (issue 10): Template median <= 1.5x posix_spawn and <= 0.25x bwrap,
p99 <= 2.5 ms; sustained >= 4x bwrap. A Template(recycle=True) row (issue 26:
its standbys reset and serve again) runs beside them; its CPU is measured
here from its live processes too (a recycled pid 1 is never reaped) and by
benchmarks/tradeoffs.py (the whole machine's, or this process tree's).

    python benchmarks/template.py [-n 500] [--seconds 5] [--binds 10,100,1000] [--bind-runs 50]
                                  [--json out.json]
    python benchmarks/template.py --caller [-n 2000]   # the caller's own thread time per spawn, per wait
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from latency import BWRAP_ARGS, MOUNTS  # noqa: E402
from timing import arguments, calls_per_second, measure, p99, write_json  # noqa: E402

import sandbox  # noqa: E402
from sandbox import netpool  # noqa: E402

POSIX = "posix_spawn /bin/true"
BWRAP = "bwrap (same config)"
TEMPLATE = "Template.spawn, network=pool"
RECYCLED = "Template.spawn, recycle=True (own netns)"


STAGES: list[dict[str, float]] = []  # the pooled Template's timings, one dict per spawn


def _wait(proc: sandbox.SandboxProcess, stages: list[dict[str, float]] | None = None) -> None:
    if proc.wait() != 0:
        raise RuntimeError(f"sandboxed /bin/true exited {proc.returncode}")
    if stages is not None:
        stages.append(proc.timings)


def stage_table(stages: list[dict[str, float]]) -> str:
    """Median µs from the caller's start to each stamp of a Template's sandbox (csrc/core/sandbox.h, enum
    sbx_stamp; "clone": a standby took the request, "return": the command has exec'd, "exec": the
    caller knows it)."""
    order = ("clone", "child", "idmap", "mounts", "ready", "return", "exec")
    rows = ["| stage | median µs since the call |", "|---|---|"]
    for name in order:
        xs = [t[name] for t in stages if name in t]
        if xs:
            rows.append(f"| {name} | {statistics.median(xs):.0f} |")
    return "\n".join(rows)


def _tree_cpu(pid: int) -> float:
    """CPU seconds of process `pid` and of every child it has reaped (its reaped children's own, likewise),
    and of its live descendants with theirs (a recycled standby's pid 1 and its command maker live on)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    own = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    try:  # the precise run time of the process itself, rather than its ticks
        with open(f"/proc/{pid}/schedstat") as f:
            own += int(f.read().split()[0]) / 1e9 - (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        pass
    return own + sum(_tree_cpu(child) for child in _children(pid))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return out


def cpu_table(templates: dict[str, tuple[sandbox.Template, Callable[[], object]]], posix: Callable[[], object],
              n: int) -> str:
    """CPU µs per spawn+wait, less sensitive to a loaded machine than latency: each template process with
    every standby and command it reaped and its live standbys (a recycled one is never reaped), and the
    caller's process (all its threads: the pool's release check runs in its refill thread); posix_spawn's
    caller and child for scale."""
    def per_call(fn: Callable[[], object], tree: int | None) -> tuple[float, float]:
        time.sleep(0.2)  # the previous variant's sandboxes reaped, its leases checked
        t0, c0 = _tree_cpu(tree) if tree else 0.0, time.process_time()
        children0 = os.times().children_user + os.times().children_system
        for _ in range(n):
            fn()
        time.sleep(0.2)
        tree_s = (_tree_cpu(tree) - t0) if tree else os.times().children_user + os.times().children_system - children0
        return tree_s / n * 1e6, (time.process_time() - c0) / n * 1e6

    rows = ["| CPU µs per spawn+wait | sandbox side | caller process | total |", "|---|---|---|---|"]
    for name, (template, spawn) in templates.items():
        t_tree, t_caller = per_call(spawn, template.pid)
        rows.append(f"| {name} | {t_tree:.0f} | {t_caller:.0f} | {t_tree + t_caller:.0f} |")
    p_child, p_caller = per_call(posix, None)
    rows.append(f"| {POSIX} | {p_child:.0f} | {p_caller:.0f} | {p_child + p_caller:.0f} |")
    return "\n".join(rows)


def _posix_spawn() -> None:
    pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
    os.waitpid(pid, 0)


def variants(pooled: sandbox.Template, fresh: sandbox.Template,
             recycled: sandbox.Template) -> dict[str, Callable[[], object]]:
    """name -> one spawn+wait of /bin/true."""
    spec = sandbox.Spec(mounts=MOUNTS)
    in_pool = spec.replace(network="pool")  # one Spec, as a caller would keep (its plan is then cached)
    out: dict[str, Callable[[], object]] = {
        POSIX: _posix_spawn,
        TEMPLATE: lambda: _wait(pooled.spawn(["/bin/true"]), STAGES),
        "Template.spawn, network=none (fresh netns)": lambda: _wait(fresh.spawn(["/bin/true"])),
        RECYCLED: lambda: _wait(recycled.spawn(["/bin/true"])),
        "sandbox.spawn, network=pool": lambda: _wait(sandbox.spawn(["/bin/true"], in_pool)),
        "sandbox.spawn, network=none": lambda: _wait(sandbox.spawn(["/bin/true"], spec)),
    }
    bwrap = shutil.which("bwrap")
    if bwrap:
        out[BWRAP] = lambda: subprocess.run([bwrap, *BWRAP_ARGS, "/bin/true"], check=True)
    return out


def _bind_medians(count: int, runs: int, bwrap: str | None) -> dict[str, float]:
    """Median ms of spawn+wait of /bin/true with `count` extra read-only binds, per variant."""
    with tempfile.TemporaryDirectory() as tmp:
        binds = [sandbox.RoBind(os.path.join(tmp, str(i)), f"/data/{i}") for i in range(count)]
        for b in binds:
            os.mkdir(b.src)
        spec = sandbox.Spec(mounts=[*MOUNTS, *binds], network="pool")
        bwrap_argv = [a for b in binds for a in ("--ro-bind", b.src, b.dest_path())]
        with sandbox.Template(spec) as t:
            fns: dict[str, Callable[[], object]] = {
                "spawn": lambda: _wait(sandbox.spawn(["/bin/true"], spec)),
                "template": lambda: _wait(t.spawn(["/bin/true"])),
            }
            if bwrap:
                fns["bwrap"] = lambda: subprocess.run([bwrap, *BWRAP_ARGS, *bwrap_argv, "/bin/true"], check=True)
            return {k: statistics.median(v) for k, v in measure(fns, runs, warmup=5).items()}


def bind_costs(counts: list[int], runs: int) -> str:
    """Spawn+wait of /bin/true against the number of extra binds: sandbox.spawn (leased netns), the
    Template (leased netns; its root is built once, with the binds) and bwrap, interleaved per count."""
    rows = ["| extra binds | sandbox.spawn ms | Template ms | bwrap ms | spawn / bwrap | Template / bwrap |",
            "|---|---|---|---|---|---|"]
    bwrap = shutil.which("bwrap")
    for count in counts:
        med = _bind_medians(count, runs, bwrap)
        bw = med.get("bwrap")
        cells = [f"{med['spawn']:.3f}", f"{med['template']:.3f}", f"{bw:.3f}" if bw else "-",
                 f"{med['spawn'] / bw:.2f}x" if bw else "-", f"{med['template'] / bw:.2f}x" if bw else "-"]
        rows.append(f"| {count} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table(times: dict[str, list[float]]) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    base, bw = med[POSIX], med.get(BWRAP)
    rows = ["| variant | median ms | p99 ms | / posix_spawn | / bwrap |", "|---|---|---|---|---|"]
    for name, xs in times.items():
        r_bw = f"{med[name] / bw:.2f}x" if bw else "-"
        rows.append(f"| {name} | {med[name]:.3f} | {p99(xs):.3f} | {med[name] / base:.2f}x | {r_bw} |")
    return "\n".join(rows)


Halves = tuple[Callable[[], object], Callable[[Any], object]]  # start /bin/true; wait for what it started


def _caller_variants(pooled: sandbox.Template, recycled: sandbox.Template) -> dict[str, Halves]:
    """name -> the caller's two halves of a spawn+wait of /bin/true."""
    in_pool = sandbox.Spec(mounts=MOUNTS, network="pool")  # one Spec, as a caller would keep
    return {
        POSIX: (lambda: os.posix_spawn("/bin/true", ["/bin/true"], {}), lambda pid: os.waitpid(pid, 0)),
        RECYCLED: (lambda: recycled.spawn(["/bin/true"]), _wait),
        TEMPLATE: (lambda: pooled.spawn(["/bin/true"]), _wait),
        "sandbox.spawn, network=pool": (lambda: sandbox.spawn(["/bin/true"], in_pool), _wait),
    }


def caller_table(pooled: sandbox.Template, recycled: sandbox.Template, n: int) -> str:
    """The caller's own CPU (its thread's time: its Python, its system calls, its switches) per spawn and
    per wait, every variant interleaved call by call; the sandbox's side is not in it (tradeoffs.py
    measures the whole machine's)."""
    fns = _caller_variants(pooled, recycled)
    spent: dict[str, tuple[list[int], list[int]]] = {name: ([], []) for name in fns}
    for i in range(n + 20):
        for name, (start, wait) in fns.items():
            t0 = time.thread_time_ns()
            obj = start()
            t1 = time.thread_time_ns()
            wait(obj)
            t2 = time.thread_time_ns()
            if i >= 20:  # warmed up
                spent[name][0].append(t1 - t0)
                spent[name][1].append(t2 - t1)
    base = statistics.median(a + b for a, b in zip(*spent[POSIX], strict=True))
    rows = ["| caller's thread | spawn µs | wait µs | spawn+wait µs | / posix_spawn |", "|---|---|---|---|---|"]
    for name, (starts, waits) in spent.items():
        both = statistics.median(a + b for a, b in zip(starts, waits, strict=True))
        rows.append(f"| {name} | {statistics.median(starts) / 1000:.1f} | {statistics.median(waits) / 1000:.1f} "
                    f"| {both / 1000:.1f} | {both / base:.2f}x |")
    return "\n".join(rows)


def main() -> int:
    ap = arguments(__doc__, 500, json_what="the raw per-run times and rates")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput run (default 5)")
    ap.add_argument("--binds", default="10,100,1000", help="extra bind counts for the binds table ('' skips it)")
    ap.add_argument("--bind-runs", type=int, default=50, help="runs per variant and bind count (default 50)")
    ap.add_argument("--caller", action="store_true",
                    help="only the caller's own thread time per spawn and per wait (n calls each, interleaved)")
    args = ap.parse_args()
    print(f"# /bin/true, n={args.n}, uid={os.getuid()}, python {sys.version.split()[0]}, "
          f"kernel {os.uname().release}, load {os.getloadavg()[0]:.2f}")
    netpool.enable(size=8, for_network_none=False).wait_filled(30)
    spec = sandbox.Spec(mounts=MOUNTS)
    if args.caller:
        with sandbox.Template(spec.replace(network="pool")) as pooled, sandbox.Template(spec, recycle=True) as rec:
            print(caller_table(pooled, rec, args.n))
        return 0
    with (sandbox.Template(spec.replace(network="pool")) as pooled, sandbox.Template(spec) as fresh,
          sandbox.Template(spec, recycle=True) as recycled):
        fns = variants(pooled, fresh, recycled)
        times = measure(fns, args.n)
        print(table(times))
        print("\n" + stage_table(STAGES[-args.n:]))
        print("\n" + cpu_table({TEMPLATE: (pooled, fns[TEMPLATE]), RECYCLED: (recycled, fns[RECYCLED])}, fns[POSIX],
                                min(args.n, 300)))
        rated = (TEMPLATE, RECYCLED, "sandbox.spawn, network=pool", BWRAP)
        rates = {name: calls_per_second(fns[name], 2, args.seconds) for name in rated if name in fns}
    print("\n| sustained, 2 callers | sandboxes/s | / bwrap |\n|---|---|---|")
    for name, rate in rates.items():
        ratio = f"{rate / rates[BWRAP]:.2f}x" if BWRAP in rates else "-"
        print(f"| {name} | {rate:.0f} | {ratio} |")
    if args.binds:
        print("\n" + bind_costs([int(x) for x in args.binds.split(",")], args.bind_runs))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n# targets: median {med[TEMPLATE] / med[POSIX]:.2f}x posix_spawn (<= 1.5x), "
          + (f"{med[TEMPLATE] / med[BWRAP]:.2f}x bwrap (<= 0.25x), " if BWRAP in med else "")
          + f"p99 {p99(times[TEMPLATE]):.2f} ms (<= 2.5)"
          + (f", sustained {rates[TEMPLATE] / rates[BWRAP]:.2f}x bwrap (>= 4x)" if BWRAP in rates else ""))
    print(f"# issue 26, recycle=True: median {med[RECYCLED] / med[POSIX]:.2f}x posix_spawn (<= 1.3x), "
          f"p99 {p99(times[RECYCLED]):.2f} ms (<= 2.5)"
          + (f", sustained {rates[RECYCLED] / rates[BWRAP]:.2f}x bwrap (>= 4x)" if BWRAP in rates else "")
          + "; its CPU against posix_spawn's: the table above (<= 1.3x)")
    write_json(args.json, {"times": times, "rates": rates})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
