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

    python benchmarks/harness.py [-n 300] [--cmd true] [--blocks]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import sandbox
from sandbox.compat.avatar import RLimits, hermetic_env, make_sandbox, native_spec
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


class TemplateFloor:
    """Not a harness mode: the same world's sandbox.Template run in-process
    (no launcher, no handoff), what the handoff path costs at least."""

    mode = "Template.run (floor)"

    def __init__(self, cwd: Path, limits: RLimits) -> None:
        spec = native_spec(cwd, rlimits=limits, environ=hermetic_env(os.environ))
        self.template = sandbox.Template(spec.replace(network="pool"))

    def run(self, argv: list[str]) -> float:
        t0 = time.perf_counter()
        done = self.template.run(argv)
        elapsed = (time.perf_counter() - t0) * 1000
        if done.returncode != 0:
            raise RuntimeError(f"Template: {argv} exited {done.returncode}")
        return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300)
    ap.add_argument("--cmd", default="true", help="command to run (default: true)")
    ap.add_argument("--blocks", action="store_true",
                    help="run each mode's n runs back to back instead of interleaved (a harness uses one mode; "
                         "interleaved, each run also pays for the teardown of the other modes' namespaces)")
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
        floor_template = TemplateFloor(cwd, limits)
        times: dict[str, list[float]] = {m: [] for m in [*modes, floor_template.mode]}
        runners = {mode: (lambda box=box: one_run(box, [args.cmd], cwd)) for mode, box in modes.items()}
        runners[floor_template.mode] = lambda: floor_template.run([args.cmd])
        if args.blocks:
            for mode, fn in runners.items():
                times[mode] = [fn() for _ in range(args.n + 10)][10:]
        else:
            for i in range(args.n + 10):
                for mode, fn in runners.items():
                    t = fn()
                    if i >= 10:
                        times[mode].append(t)
        floor_template.template.close()
    served = handoff().served
    if served != args.n + 10:
        print(f"# WARNING: only {served} of {args.n + 10} native-handoff runs were handed off")
    floor = statistics.median(times["hermetic-env"])
    bw = statistics.median(times["bwrap"])
    print(f"# harness call path (prepare + subprocess.run) of {args.cmd!r}, n={args.n}, uid={os.getuid()}, "
          f"{'blocks' if args.blocks else 'interleaved'}, load {os.getloadavg()[0]:.1f}")
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
