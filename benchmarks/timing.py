"""The benchmarks' timing helpers, written once: interleaved runs, sustained
rates and percentiles. Standard library only, so every script can import it
both as `benchmarks.timing` and, run on its own, as `timing`.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable


def measure(fns: dict[str, Callable[[], object]], n: int, warmup: int = 20,
            on_round: Callable[[], None] | None = None) -> dict[str, list[float]]:
    """Run every variant n times after `warmup` untimed rounds, round-robin (so
    machine noise hits them alike); return ms per call. Each round starts one
    variant further on, so no variant always follows the same one (what a
    variant leaves behind, a network namespace the kernel tears down
    meanwhile, say, falls on each of the others in turn). `on_round` is
    called after each round (a progress bar), outside the timed calls."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns.items())
    for i in range(warmup + n):
        k = i % len(order) if order else 0
        for name, fn in order[k:] + order[:k]:
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                times[name].append((time.perf_counter() - t0) * 1000)
        if on_round is not None:
            on_round()
    return times


def calls_per_second(fn: Callable[[], object], callers: int, seconds: float) -> float:
    """Calls per second of `callers` threads each calling `fn` back to back for
    `seconds` (the first error of any thread is raised here)."""
    counts = [0] * callers
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds

    def loop(k: int) -> None:
        try:
            while time.monotonic() < stop:
                fn()
                counts[k] += 1
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(callers)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.monotonic() - start)


def percentile(xs: list[float], q: float) -> float:
    """The sample at fraction `q` (0..1) of the sorted `xs`, nearest rank."""
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(round(q * (len(ys) - 1))))]


def p99(xs: list[float]) -> float:
    """The 99th percentile of `xs` (see percentile)."""
    return percentile(xs, 0.99)


def arguments(doc: str | None, runs: int, what: str = "runs per variant",
              json_what: str = "the raw per-run times") -> argparse.ArgumentParser:
    """The command line a benchmark starts from: its docstring as --help, -n (`what`, `runs` by
    default) and --json (where to write `json_what` too); it adds its own options."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=runs, help=f"{what} (default {runs})")
    ap.add_argument("--json", help=f"also write {json_what} here")
    return ap


def write_json(path: str | None, figures: object) -> None:
    """--json's: `figures` as JSON in `path` (None: nowhere)."""
    if path:
        with open(path, "w") as f:
            json.dump(figures, f)
