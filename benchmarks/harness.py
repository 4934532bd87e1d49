"""The agent harness's own call path, per sandbox mode, side by side.

Each run is what the harness does for one command: `prepare(argv, cwd)` on
the mode's object, then `subprocess.run(spec.argv, cwd=cwd, env=spec.env,
preexec_fn=spec.preexec_fn, timeout=...)`. Modes run interleaved in one
process: `native-handoff` (sandbox-launch handing the command to a warm
sandbox.Template held by this process: NativeSandbox(warm=True)), `native`
(sandbox-launch setting the sandbox up itself), `bwrap` (the harness's bwrap
mode) and `hermetic-env` (no isolation, the floor). Prints median and p99 in
ms, and what the native mode's first use in a process costs (construction,
with its host probe, and the first prepare).

    python benchmarks/harness.py [-n 300] [--cmd true]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from sandbox.compat.avatar import RLimits, make_sandbox
from sandbox.compat.handoff import handoff


def one_run(box: object, argv: list[str], cwd: Path) -> float:
    """ms for prepare + subprocess.run, exactly as the harness does it."""
    t0 = time.perf_counter()
    spec = box.prepare(argv, cwd)  # type: ignore[attr-defined]
    done = subprocess.run(spec.argv, cwd=cwd, env=spec.env, preexec_fn=spec.preexec_fn, timeout=30)
    elapsed = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{box.mode}: {argv} exited {done.returncode}")  # type: ignore[attr-defined]
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--cmd", default="true", help="command to run (default: true)")
    args = ap.parse_args()
    limits = RLimits()
    with tempfile.TemporaryDirectory() as work:
        cwd = Path(work)
        t0 = time.perf_counter()
        native = make_sandbox("native", rlimits=limits)
        t1 = time.perf_counter()
        native.prepare([args.cmd], cwd)
        t2 = time.perf_counter()
        first = ((t1 - t0) * 1000, (t2 - t1) * 1000)
        warm = make_sandbox("native", rlimits=limits, warm=True)
        t3 = time.perf_counter()
        warm.prewarm(cwd)  # type: ignore[attr-defined]
        t4 = time.perf_counter()
        modes = {"hermetic-env": make_sandbox("hermetic-env", rlimits=limits), "native-handoff": warm,
                 "native": native, "bwrap": make_sandbox("bwrap", rlimits=limits)}
        times: dict[str, list[float]] = {m: [] for m in modes}
        for i in range(args.n + 10):
            for mode, box in modes.items():
                t = one_run(box, [args.cmd], cwd)
                if i >= 10:
                    times[mode].append(t)
    served = handoff().served
    if served != args.n + 10:
        print(f"# WARNING: only {served} of {args.n + 10} native-handoff runs were handed off")
    floor = statistics.median(times["hermetic-env"])
    bw = statistics.median(times["bwrap"])
    print(f"# harness call path (prepare + subprocess.run) of {args.cmd!r}, n={args.n}, uid={os.getuid()}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"# native first use: make_sandbox {first[0]:.2f} ms (host probe), first prepare {first[1]:.2f} ms; "
          f"prewarm (Template start) {(t4 - t3) * 1000:.1f} ms")
    old = statistics.median(times["native"])
    print("| mode | median ms | p99 ms | / hermetic-env | / bwrap | / native |")
    print("|---|---|---|---|---|---|")
    for mode, xs in times.items():
        ys = sorted(xs)
        med = statistics.median(ys)
        print(f"| {mode} | {med:.3f} | {ys[int(0.99 * (len(ys) - 1))]:.3f} | {med / floor:.2f}x | {med / bw:.2f}x "
              f"| {med / old:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
