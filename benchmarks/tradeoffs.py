"""What the isolation choices cost: /bin/true spawn+wait, native and Template, beside bwrap and a bare exec.

Every row runs the flatpak-like Spec of latency.py. Rows marked "experiment"
are not configurations the package offers: they compile the same Spec with
fewer /proc covers (sandbox.plan.proc_covers replaced while the plan is
compiled) to measure what the default covers cost, against bwrap's own four
(sys, sysrq-trigger, irq and bus read-only). `seccomp=None` is a real Spec
option. Three measures, each side by side in one run:

- latency: all variants interleaved round-robin, median and p99 in ms;
- busy CPU per spawn: each variant alone for a block of spawns, the whole
  machine's busy time (/proc/stat) divided by the spawns, so the kernel's
  asynchronous teardown and the template process count too; blocks of every
  variant alternate, so drift hits them alike (--own-cpu: this process
  tree's CPU alone, from a cpuacct cgroup, on a machine others load);
- sustained rate: 2 caller threads back to back for a few seconds.

    python benchmarks/tradeoffs.py [-n 300] [--seconds 3] [--only NAME,...] [--own-cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import sandbox
import sandbox.plan as plan_module
from sandbox import netpool

try:
    from .latency import BWRAP_ARGS, MOUNTS
    from .timing import calls_per_second, measure, p99
except ImportError:  # run as a script
    from latency import BWRAP_ARGS, MOUNTS
    from timing import calls_per_second, measure, p99

BWRAP_COVERS = ("sys", "sysrq-trigger", "irq", "bus")
COVERS = {
    "default": None,
    "bwrap's /proc covers": lambda uid: tuple((name, plan_module.Cover.READ_ONLY) for name in BWRAP_COVERS),
    "no /proc covers": lambda uid: (),
}
Variant = Callable[[], object]


_chosen = threading.local()  # the covers kind of plans compiled in this thread


def _chosen_covers(host_uid: int, root_only: Iterable[str] = (),
                   cover_set: str = "strict") -> tuple[tuple[str, plan_module.Cover], ...]:
    replacement = COVERS[getattr(_chosen, "kind", "default")]
    return _DEFAULT_COVERS(host_uid, root_only, cover_set) if replacement is None else replacement(host_uid)


_DEFAULT_COVERS = plan_module.proc_covers


@contextlib.contextmanager
def experiments() -> Iterator[None]:
    """While inside, plans compile with the covers their thread chose (`proc_covers`)."""
    plan_module.proc_covers = _chosen_covers
    try:
        yield
    finally:
        plan_module.proc_covers = _DEFAULT_COVERS


@contextlib.contextmanager
def proc_covers(kind: str) -> Iterator[None]:
    """Plans compiled in this thread get the covers of `kind` (an experiment: not a package option)."""
    _chosen.kind = kind
    try:
        yield
    finally:
        _chosen.kind = "default"


def _check(proc: sandbox.SandboxProcess) -> None:
    if proc.wait() != 0:
        raise RuntimeError(f"sandboxed /bin/true exited {proc.returncode}")


def _native(spec: sandbox.Spec, kind: str) -> Variant:
    spec = spec.replace()  # an object of its own: sandbox.spawn keeps one compiled plan per Spec object

    def run() -> None:
        with proc_covers(kind):
            proc = sandbox.spawn(["/bin/true"], spec, backend="native")
        _check(proc)
    return run


def _template(spec: sandbox.Spec, kind: str, stack: contextlib.ExitStack, recycle: bool = False) -> Variant:
    with proc_covers(kind):
        template = stack.enter_context(sandbox.Template(spec, recycle=recycle))
    return lambda: _check(template.spawn(["/bin/true"]))


def _posix_spawn() -> None:
    os.waitpid(os.posix_spawn("/bin/true", ["/bin/true"], {}), 0)


def variants(stack: contextlib.ExitStack) -> dict[str, Variant]:
    """name -> one spawn+wait of /bin/true."""
    spec = sandbox.Spec(mounts=MOUNTS, network="pool")
    out: dict[str, Variant] = {"posix_spawn /bin/true": _posix_spawn}
    bwrap = shutil.which("bwrap")
    if bwrap:
        out["bwrap (same config)"] = lambda: subprocess.run([bwrap, *BWRAP_ARGS, "/bin/true"], check=True)
    for kind in COVERS:
        label = "" if kind == "default" else f", experiment: {kind}"
        out[f"sandbox.spawn{label}"] = _native(spec, kind)
    out["sandbox.spawn, seccomp=None"] = _native(spec.replace(seccomp=None), "default")
    for kind in COVERS:
        label = "" if kind == "default" else f", experiment: {kind}"
        out[f"Template.spawn{label}"] = _template(spec, kind, stack)
    # issue 26: its standbys reset after each request and serve again (a network namespace of their own)
    out["Template.spawn, recycle=True"] = _template(spec, "default", stack, recycle=True)
    return out


OWN_CPU: str | None = None  # --own-cpu: a cpuacct cgroup holding this process and all it starts


def _busy_seconds() -> float:
    """The machine's busy CPU seconds so far (every CPU, every state but idle and iowait); with
    --own-cpu, the CPU seconds of this process and everything it started (kernel work they caused in
    kernel threads, such as a network namespace's cleanup, is not counted)."""
    if OWN_CPU is not None:
        with open(os.path.join(OWN_CPU, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def own_cpu() -> Iterator[None]:
    """Move this process into a cpuacct cgroup of its own (v1, root), so that busy CPU counts what it and
    its sandboxes use, not the rest of a shared machine; back out and remove it at the end."""
    global OWN_CPU
    top = "/sys/fs/cgroup/cpuacct"
    path = os.path.join(top, f"sbx-bench-{os.getpid()}")
    os.mkdir(path)
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        OWN_CPU = path
        yield
    finally:
        OWN_CPU = None
        with open(os.path.join(top, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        for _ in range(100):
            try:
                os.rmdir(path)
                break
            except OSError:
                time.sleep(0.1)


def busy_cpu(fns: dict[str, Variant], blocks: int, per_block: int) -> dict[str, float]:
    """Busy CPU µs per spawn+wait of each variant, run alone in alternating blocks. Each block ends
    with a pause for its teardown and pool checks; the machine's busy time in an equal pause
    without spawns (its background) is taken off."""
    def block(fn: Variant | None) -> float:
        start, t0 = _busy_seconds(), time.monotonic()
        for _ in range(per_block if fn else 0):
            fn()
        spawning = time.monotonic() - t0
        time.sleep(0.2)
        return _busy_seconds() - start - (background * (spawning + 0.2) if fn else 0.0)

    background = 0.0
    busy = dict.fromkeys(fns, 0.0)
    for _ in range(blocks):
        for name, fn in fns.items():
            time.sleep(0.2)  # the previous block's teardown done
            background = block(None) / 0.2  # busy CPU seconds per second, now
            busy[name] += block(fn)
    return {name: seconds / (blocks * per_block) * 1e6 for name, seconds in busy.items()}


def table(times: dict[str, list[float]], cpu: dict[str, float], rates: dict[str, float]) -> str:
    """Markdown: latency median/p99, busy CPU and sustained rate, each with its ratio to bwrap."""
    med = {k: statistics.median(v) for k, v in times.items()}
    bw = "bwrap (same config)"

    def ratio(value: float, base: float | None) -> str:
        return f"{value / base:.2f}x" if base else "-"

    rows = ["| variant | median ms | p99 ms | / bwrap | busy CPU µs per spawn | sustained/s, 2 callers | / bwrap |",
            "|---|---|---|---|---|---|---|"]
    for name in times:
        rows.append(f"| {name} | {med[name]:.3f} | {p99(times[name]):.3f} | {ratio(med[name], med.get(bw))} | "
                    f"{cpu[name]:.0f} | {rates[name]:.0f} | {ratio(rates[name], rates.get(bw))} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300, help="interleaved runs per variant (default 300)")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each sustained run (default 3)")
    ap.add_argument("--only", default="", help="comma-separated substrings: only the variants whose name has one")
    ap.add_argument("--own-cpu", action="store_true",
                    help="busy CPU of this process tree alone (a cpuacct cgroup; root, cgroup v1), not the machine's")
    args = ap.parse_args()
    netpool.enable(size=8, for_network_none=False).wait_filled(30)
    print(f"# /bin/true spawn+wait, n={args.n}, uid={os.getuid()}, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}, kernel {os.uname().release}, load {os.getloadavg()[0]:.2f}")
    with contextlib.ExitStack() as stack:
        if args.own_cpu:
            stack.enter_context(own_cpu())
        stack.enter_context(experiments())
        fns = variants(stack)
        if args.only:
            fns = {k: v for k, v in fns.items() if any(part in k for part in args.only.split(","))}
        times = measure(fns, args.n)
        cpu = busy_cpu(fns, blocks=4, per_block=max(10, args.n // 6))
        rates = {name: calls_per_second(fn, 2, args.seconds) for name, fn in fns.items()}
    print(table(times, cpu, rates))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
