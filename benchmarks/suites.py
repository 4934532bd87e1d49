"""The measurements of the report (report.py), each with its variants interleaved.

Every suite runs its variants round-robin in this one process, so machine
noise hits them alike, and returns plain data (ms per call, calls per second,
µs per stage) that report.py turns into tables and plots.py into pictures.
The spawn variants and the Python-task variants are latency.py's and
workerpool.py's own, so the report measures what those scripts measure.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import sandbox
from sandbox import netpool

from . import latency, workerpool
from .progress import Progress
from .timing import calls_per_second, measure

TRUE = ["/bin/true"]
BARE = "subprocess.run /bin/true"
NATIVE = "native sandbox.spawn (leased netns: the default)"
FRESH = "native, fresh netns (pool off)"
BWRAP = "bwrap (same config)"
TEMPLATE = "sandbox.Template spawn"
THROUGHPUT_VARIANTS = (BARE, NATIVE, FRESH, BWRAP, TEMPLATE)


@dataclass(frozen=True)
class Sizes:
    """How much each suite runs: `quick` is about half a minute, the full run a few minutes."""

    spawn_n: int
    callers: tuple[int, ...]
    window_s: float
    windows: int
    binds: tuple[int, ...]
    env_vars: tuple[int, ...]
    scale_n: int
    python_n: int
    stages_n: int
    others: bool

    @classmethod
    def make(cls, quick: bool) -> Sizes:
        if quick:
            return cls(spawn_n=60, callers=(1, 2, 4, 8), window_s=0.2, windows=3, binds=(10, 100, 1000),
                       env_vars=(10, 100, 1000), scale_n=3, python_n=8, stages_n=60, others=False)
        return cls(spawn_n=1000, callers=(1, 2, 4, 8), window_s=2.0, windows=2, binds=(10, 100, 1000),
                   env_vars=(10, 100, 1000), scale_n=30, python_n=100, stages_n=500, others=True)

    def scale_runs(self, size: int) -> int:
        """Runs at one size: fewer for the big ones (bwrap takes seconds per spawn at 1000 binds)."""
        return max(1, self.scale_n // 10) if size >= 1000 else max(1, self.scale_n // 3) if size >= 100 \
            else self.scale_n


def template_available() -> bool:
    """Whether this version of the package has sandbox.Template."""
    return hasattr(sandbox, "Template")


@contextlib.contextmanager
def spawn_variants() -> Iterator[dict[str, Callable[[], object]]]:
    """latency.py's variants, plus a Template of the same Spec where sandbox.Template exists."""
    fns = latency.variants()
    if not template_available():
        yield fns
        return
    with sandbox.Template(sandbox.Spec(mounts=latency.MOUNTS)) as tmpl:  # type: ignore[attr-defined]
        fns[TEMPLATE] = lambda: _check(tmpl.spawn(TRUE).wait())
        yield fns


def _check(rc: int) -> None:
    if rc != 0:
        raise RuntimeError(f"sandboxed /bin/true exited {rc}")


# ---------------------------------------------------------------- spawn+wait latency

def spawn_latency(sizes: Sizes, progress: Progress) -> dict[str, list[float]]:
    """ms per spawn+wait of /bin/true, every latency.py variant (and Template)."""
    progress.section("spawn+wait latency")
    with spawn_variants() as fns:
        return measure(fns, sizes.spawn_n, warmup=min(20, sizes.spawn_n), on_round=progress.step)


def spawn_latency_steps(sizes: Sizes) -> int:
    return sizes.spawn_n + min(20, sizes.spawn_n)


# ---------------------------------------------------------------- throughput

def throughput(sizes: Sizes, progress: Progress) -> dict[str, dict[int, list[float]]]:
    """Spawns per second with 1, 2, 4, 8 callers (threads spawning back to back),
    each variant for `window_s`, interleaved: the rate of every one of the
    `windows` windows (`best` gives the report's figure, the plot the spread)."""
    progress.section("throughput vs callers")
    with spawn_variants() as all_fns:
        fns = {k: v for k, v in all_fns.items() if k in THROUGHPUT_VARIANTS}
        rates: dict[str, dict[int, list[float]]] = {k: {} for k in fns}
        for _ in range(sizes.windows):
            for callers in sizes.callers:
                for name, fn in fns.items():
                    rates[name].setdefault(callers, []).append(_window(fn, callers, sizes.window_s))
                    progress.step()
    return rates


def best(windows: dict[str, dict[int, list[float]]]) -> dict[str, dict[int, float]]:
    """The best window of each variant and caller count: the throughput the report gives."""
    return {name: {callers: max(rates) for callers, rates in by.items()} for name, by in windows.items()}


def throughput_steps(sizes: Sizes) -> int:
    return sizes.windows * len(sizes.callers) * (len(THROUGHPUT_VARIANTS) - (0 if template_available() else 1))


def _window(fn: Callable[[], object], callers: int, seconds: float) -> float:
    """Calls per second of `callers` threads each calling fn back to back for `seconds`."""
    fn()  # the variant's set-up (its pool toggle) before the clock starts
    return calls_per_second(fn, callers, seconds)


# ---------------------------------------------------------------- cost against binds and environment

def scaling(sizes: Sizes, progress: Progress) -> dict[str, dict[str, dict[int, list[float]]]]:
    """ms per spawn+wait of /bin/true, native against bwrap, by the number of
    read-only binds and by the number of environment variables (100 bytes each).

    The native backend holds one fd per bind source while it spawns, so 1000
    binds need more than the usual soft limit of 1024 open files: the soft
    limit is raised to the hard one for the run (a caller with that many
    binds must do the same)."""
    progress.section("cost vs binds and environment")
    raise_nofile()
    bwrap = shutil.which("bwrap")
    out: dict[str, dict[str, dict[int, list[float]]]] = {"binds": {}, "env": {}}
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as work, contextlib.ExitStack() as stack:
        cases = {("binds", n): _bind_case(work, n, bwrap, stack) for n in sizes.binds}
        cases |= {("env", n): _env_case(n, bwrap) for n in sizes.env_vars}
        for axis, _ in cases:
            out[axis] = {}
        for i in range(max(sizes.scale_runs(n) for _, n in cases) + 1):  # round 0 warms up
            for (axis, n), fns in cases.items():
                if i > sizes.scale_runs(n):
                    continue
                for name, fn in fns.items():
                    t0 = time.perf_counter()
                    fn()
                    if i > 0:
                        out[axis].setdefault(name, {}).setdefault(n, []).append((time.perf_counter() - t0) * 1000)
                progress.step()
    return out


def scaling_steps(sizes: Sizes) -> int:
    return sum(sizes.scale_runs(n) + 1 for n in (*sizes.binds, *sizes.env_vars))


def raise_nofile() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _bind_case(work: str, n: int, bwrap: str | None,
               stack: contextlib.ExitStack) -> dict[str, Callable[[], object]]:
    srcs = []
    for i in range(n):
        src = os.path.join(work, f"b{n}-{i}")
        os.mkdir(src)
        srcs.append(src)
    spec = sandbox.Spec(mounts=[*latency.MOUNTS, *(sandbox.RoBind(s, f"/mnt/b{i}") for i, s in enumerate(srcs))])
    fns: dict[str, Callable[[], object]] = {"native": lambda: latency._native(spec)}
    if template_available():  # the binds are made once, in the template's root
        tmpl = stack.enter_context(sandbox.Template(spec))  # type: ignore[attr-defined]
        fns["Template"] = lambda: _check(tmpl.spawn(TRUE).wait())
    if bwrap:
        args = [bwrap, *latency.BWRAP_ARGS]
        for i, src in enumerate(srcs):
            args += ["--ro-bind", src, f"/mnt/b{i}"]
        fns["bwrap"] = lambda: _run_bwrap([*args, *TRUE])
    return fns


def _run_bwrap(argv: list[str]) -> None:
    """Run bwrap; a failure names its message, not the (long) command line."""
    done = subprocess.run(argv, stderr=subprocess.PIPE)
    if done.returncode != 0:
        raise RuntimeError(f"bwrap with {len(argv)} arguments exited {done.returncode}: "
                           f"{done.stderr.decode(errors='replace')[:300]}")


def _env_case(n: int, bwrap: str | None) -> dict[str, Callable[[], object]]:
    env = tuple((f"VAR_{i:05d}", "x" * 90) for i in range(n))
    spec = sandbox.Spec(mounts=latency.MOUNTS, env=env)
    fns: dict[str, Callable[[], object]] = {"native": lambda: latency._native(spec)}
    if bwrap:
        args = [bwrap, *latency.BWRAP_ARGS]
        for name, value in env:
            args += ["--setenv", name, value]
        fns["bwrap"] = lambda: _run_bwrap([*args, *TRUE])
    return fns


# ---------------------------------------------------------------- Python tasks

def python_tasks(sizes: Sizes, progress: Progress) -> dict[str, list[float]]:
    """ms per Python task: workerpool.py's variants (WorkerPool, sandbox.run,
    bwrap and bare `python -I -c` with the same imports), and a Template's run."""
    progress.section("Python task latency")
    spec = sandbox.Spec(mounts=workerpool.MOUNTS)
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(sandbox.WorkerPool(spec, preload=workerpool.PRELOAD, max_workers=4))
        no_spares = stack.enter_context(sandbox.WorkerPool(spec, preload=workerpool.PRELOAD, max_workers=4,
                                                           spares=0))
        fresh = stack.enter_context(workerpool.fresh_netns_pool(spec))
        fns = workerpool.variants(pool, no_spares, fresh, spec)
        if template_available():
            full = workerpool.zygote_spec(spec).replace(cwd="/")
            tmpl = stack.enter_context(sandbox.Template(full))  # type: ignore[attr-defined]
            argv = [sys.executable, "-I", "-c", workerpool.CODE]
            fns["sandbox.Template python -c"] = lambda: tmpl.run(argv, check=True)
        return measure(fns, sizes.python_n, warmup=min(5, sizes.python_n), on_round=progress.step)


def python_steps(sizes: Sizes) -> int:
    return sizes.python_n + min(5, sizes.python_n)


# ---------------------------------------------------------------- where a native spawn's time goes

# Each stage ends at one of the backend's stamps (µs since the spawn began; the
# contract's start, child, ready and exec, plus the backend's own), in time order.
STAMP_LABELS = {
    "clone": "template: request and clone",
    "child": "clone: namespaces made",
    "idmap": "uid/gid maps",
    "mounts": "mounts",
    "pivot": "pivot_root",
    "ready": "rest of the setup (limits, seccomp; a Template: its mounts)",
    "return": "execve until the parent resumes",
    "exec": "parent: exec confirmed",
}
OUTSIDE = "Python around the core (plan, pool lease)"
RUN_AND_REAP = "command runs, exits, is reaped"


def stages(sizes: Sizes, progress: Progress) -> dict[str, dict[str, float]]:
    """Median µs per stage of a native spawn+wait of /bin/true, with a leased
    and with a fresh netns (and from a Template), from the result's timings."""
    progress.section("stage breakdown")
    spec = sandbox.Spec(mounts=latency.MOUNTS)
    samples: dict[str, list[dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        spawners: dict[str, Callable[[], sandbox.SandboxProcess]] = {
            "native (leased netns)": lambda: _spawn_native(spec, True),
            "native (fresh netns)": lambda: _spawn_native(spec, False),
        }
        if template_available():
            tmpl = stack.enter_context(sandbox.Template(spec))  # type: ignore[attr-defined]
            spawners["Template"] = lambda: tmpl.spawn(TRUE)
        for i in range(sizes.stages_n + 5):
            for name, spawn in spawners.items():
                t0 = time.perf_counter_ns()
                proc = spawn()
                t1 = time.perf_counter_ns()
                _check(proc.wait())
                t2 = time.perf_counter_ns()
                if i >= 5:
                    samples.setdefault(name, []).append(_stage_split(proc.timings, t0, t1, t2))
            progress.step()
    return {name: {k: statistics.median(s.get(k, 0.0) for s in rows) for k in {k for s in rows for k in s}}
            for name, rows in samples.items()}


def stages_steps(sizes: Sizes) -> int:
    return sizes.stages_n + 5


def _spawn_native(spec: sandbox.Spec, pool: bool) -> sandbox.SandboxProcess:
    netpool.enable(for_network_none=pool)
    return sandbox.spawn(TRUE, spec, backend="native")


def _stage_split(t: dict[str, float], t0: int, t1: int, t2: int) -> dict[str, float]:
    """µs per stage: between the backend's stamps in time order, each named by
    the stamp that ends it; the Python before and after the core; the wait."""
    out: dict[str, float] = {}
    prev = 0.0
    for name, at in sorted(((k, v) for k, v in t.items() if k not in ("start", "done")), key=lambda kv: kv[1]):
        label = STAMP_LABELS.get(name, f"until {name}")
        out[label] = out.get(label, 0.0) + max(0.0, at - prev)
        prev = max(prev, at)
    out[OUTSIDE] = max(0.0, (t1 - t0) / 1000 - prev)
    out[RUN_AND_REAP] = (t2 - t1) / 1000
    return out


def stage_order(medians: dict[str, dict[str, float]]) -> list[str]:
    """Every stage that occurs, in the order of a spawn."""
    known = [OUTSIDE, *STAMP_LABELS.values(), RUN_AND_REAP]
    seen = {k for m in medians.values() for k in m}
    return [k for k in known if k in seen] + sorted(seen - set(known))


# ---------------------------------------------------------------- the other scripts, as they print

def others(sizes: Sizes, progress: Progress) -> dict[str, str]:
    """What cli.py, harness.py, limits.py, netpool.py, seccomp_install.py,
    netlink_decode.py and images.py print (their own Markdown tables), each run here with a
    smaller count."""
    from . import cli, harness, images, limits, netlink_decode, seccomp_install, workerpool
    from . import netpool as netpool_bench

    runs = {
        "cli.py -n 50": (cli.main, ["-n", "50"]),
        "harness.py -n 100": (harness.main, ["-n", "100"]),
        "limits.py -n 100": (limits.main, ["-n", "100"]),
        "workerpool.py -n 50 --seconds 3": (workerpool.main, ["-n", "50", "--seconds", "3"]),
        "netpool.py -n 500": (netpool_bench.main, ["-n", "500"]),
        "seccomp_install.py --runs 500": (seccomp_install.main, ["--runs", "500"]),
        "netlink_decode.py -n 500": (netlink_decode.main, ["-n", "500"]),
        "images.py -n 3": (images.main, ["-n", "3"]),
    }
    if importlib.util.find_spec(f"{__package__}.template") is not None:  # with sandbox.Template
        template_bench = importlib.import_module(f"{__package__}.template")
        runs["template.py -n 300 --seconds 2 --binds 10,100 --bind-runs 10"] = (
            template_bench.main, ["-n", "300", "--seconds", "2", "--binds", "10,100", "--bind-runs", "10"])
        tradeoffs = importlib.import_module(f"{__package__}.tradeoffs")
        runs["tradeoffs.py -n 200 --seconds 2"] = (tradeoffs.main, ["-n", "200", "--seconds", "2"])
    out = {}
    for title, (main, argv) in runs.items():
        progress.section(title)
        out[title] = _captured(main, argv)
        progress.step()
    return out


def others_steps(sizes: Sizes) -> int:
    return (8 + 2 * template_available()) if sizes.others else 0


def _captured(main: Callable[[], int], argv: list[str]) -> str:
    """What `main()` prints with sys.argv set to argv (or why it failed)."""
    import io

    saved, buf = sys.argv, io.StringIO()
    sys.argv = ["benchmark", *argv]
    try:
        with contextlib.redirect_stdout(buf):
            rc = main()
        return buf.getvalue() + ("" if not rc else f"\n(exited {rc})\n")
    except Exception as exc:  # noqa: BLE001 - one failing script does not sink the report
        return buf.getvalue() + f"\nfailed: {type(exc).__name__}: {exc}\n"
    finally:
        sys.argv = saved
