"""Soak: many sandbox starts from many threads, mixed, with leak accounting.

Each start is one of six kinds, in turn: a command that succeeds, a setup
failure (a bind source that does not exist), an exec failure (a command
that does not exist), a timeout kill (`sleep` killed by run()'s timeout), a
forwarded port (bash inside reads a line from a
server of this process through the relay), and a leased network
namespace (network="pool"); backends alternate (native, bwrap) unless one
is chosen. Every outcome is checked (the right exception, the right step).

Before and after, this process is counted (tests/faults/ledger.py): fds,
threads, child processes, mounts, namespace fds, the shared pool's books
and RSS. The script prints a summary and exits non-zero on any wrong
outcome or any leak (RSS: growth above --rss-mb).

    python benchmarks/soak.py                 # 10,000 starts, 16 threads
    python benchmarks/soak.py --quick         # 500 starts (what CI runs)
"""

from __future__ import annotations

import argparse
import collections
import gc
import itertools
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "faults"))
from ledger import Ledger, leaks  # noqa: E402

import sandbox  # noqa: E402
from sandbox import Bind, Spec, Symlink  # noqa: E402

BASE = (sandbox.RoBind("/usr"), Symlink("usr/bin", "/bin"), Symlink("usr/lib", "/lib"),
        Symlink("usr/lib64", "/lib64"), sandbox.Proc(), sandbox.Dev(), sandbox.Tmpfs("/tmp"))
ENV = {"PATH": "/usr/bin:/bin"}
KINDS = ("success", "setup_failure", "exec_failure", "timeout_kill", "forward", "pool")
TIMEOUT_S = 0.3
GREETING = "soak"


def serve_greetings() -> int:
    """A loopback server that greets each client with a line; its port."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(GREETING.encode() + b"\n")

    threading.Thread(target=loop, name="soak-greeter", daemon=True).start()
    return int(server.getsockname()[1])


PORT = serve_greetings()


def spec_for(kind: str) -> Spec:
    if kind == "setup_failure":
        return Spec(mounts=(*BASE, Bind("/nonexistent-soak-source", "/x")), env=ENV)
    if kind == "forward":
        return Spec(mounts=BASE, env=ENV, forward={8080: PORT})
    if kind == "pool":
        return Spec(mounts=BASE, env=ENV, network="pool")
    return Spec(mounts=BASE, env=ENV)


ARGV = {"success": ["true"], "setup_failure": ["true"], "exec_failure": ["no-such-command-soak"],
        "timeout_kill": ["sleep", "30"], "pool": ["true"],
        "forward": ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8080 && read -r line <&3 && echo \"$line\""]}
SPECS = {kind: spec_for(kind) for kind in KINDS}


def one(kind: str, backend: str) -> str | None:
    """Start one sandbox of `kind`; None if it ended as it must, else what went wrong."""
    try:
        result = sandbox.run(ARGV[kind], SPECS[kind], backend=backend, capture_output=True,
                             timeout=TIMEOUT_S if kind == "timeout_kill" else 60)
    except subprocess.TimeoutExpired:
        return None if kind == "timeout_kill" else "timed out"
    except sandbox.SetupError as exc:
        return None if kind == "setup_failure" and exc.step == "source" else f"SetupError {exc.step}: {exc}"
    except sandbox.ExecNotFoundError as exc:
        return None if kind == "exec_failure" else f"ExecNotFoundError: {exc}"
    except Exception as exc:  # noqa: BLE001 - every other outcome is a wrong one, reported
        return f"{type(exc).__name__}: {exc}"
    if kind in ("setup_failure", "exec_failure", "timeout_kill"):
        return f"ran (exit {result.returncode}) where it must fail"
    if result.returncode != 0:
        return f"exit {result.returncode}: {result.stderr[-200:]!r}"
    if kind == "forward" and result.stdout.decode().strip() != GREETING:
        return f"the relay did not carry the greeting: {result.stdout!r} {result.stderr[-200:]!r}"
    return None


def soak(total: int, threads: int, backends: tuple[str, ...]) -> tuple[collections.Counter[str], list[str], float]:
    jobs = itertools.islice(itertools.cycle(itertools.product(KINDS, backends)), total)
    lock = threading.Lock()
    counts: collections.Counter[str] = collections.Counter()
    wrong: list[str] = []

    def worker() -> None:
        while True:
            with lock:
                job = next(jobs, None)
            if job is None:
                return
            problem = one(*job)
            with lock:
                counts[f"{job[1]}/{job[0]}"] += 1
                if problem is not None:
                    wrong.append(f"{job[1]}/{job[0]}: {problem}")

    t0 = time.monotonic()
    pool = [threading.Thread(target=worker, name=f"soak-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return counts, wrong, time.monotonic() - t0


def warm(backends: tuple[str, ...]) -> None:
    """One of each kind first: one-time state (the pool, its factory, the core's fds) exists before the count."""
    for kind, backend in itertools.product(KINDS, backends):
        one(kind, backend)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=10_000, help="sandbox starts (default 10,000)")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="500 starts (CI)")
    ap.add_argument("--backend", choices=("both", "native", "bwrap"), default="both")
    ap.add_argument("--rss-mb", type=float, default=None,
                    help="allowed RSS growth (default: 32 MB, 16 MB with --quick)")
    args = ap.parse_args(argv)
    total = 500 if args.quick else args.n
    rss_mb = args.rss_mb if args.rss_mb is not None else (16.0 if args.quick else 32.0)
    backends = ("native", "bwrap") if args.backend == "both" else (args.backend,)
    probe = sandbox.probe()
    backends = tuple(b for b in backends if (probe.native if b == "native" else probe.bwrap))
    if not backends:
        print("soak: no backend available here", file=sys.stderr)
        return 2
    warm(backends)
    gc.collect()
    before = Ledger.take()
    counts, wrong, elapsed = soak(total, args.threads, backends)
    gc.collect()
    after = Ledger.take()
    found = leaks(before, after, rss_bound_kb=int(rss_mb * 1024))
    report(counts, wrong, found, before, after, elapsed, args.threads, rss_mb)
    return 1 if wrong or found else 0


def report(counts: collections.Counter[str], wrong: list[str], found: list[str], before: Ledger, after: Ledger,
           elapsed: float, threads: int, rss_mb: float) -> None:
    total = sum(counts.values())
    print(f"soak: {total} sandbox starts from {threads} threads in {elapsed:.1f} s ({total / elapsed:.0f}/s)")
    for key in sorted(counts):
        print(f"  {key:28} {counts[key]:6}")
    rows: list[tuple[str, Any, Any]] = [
        ("fds", len(before.fds), len(after.fds)), ("threads", before.threads, after.threads),
        ("child processes", len(before.children), len(after.children)),
        ("mounts", len(before.mounts), len(after.mounts)),
        ("namespace fds", len(before.namespaces()), len(after.namespaces())),
        ("pool (size/idle/in use)", _books(before.pool), _books(after.pool)),
        ("RSS (MB)", f"{before.rss_kb / 1024:.1f}", f"{after.rss_kb / 1024:.1f} (bound +{rss_mb:g})"),
    ]
    print("  accounting           before -> after")
    for name, b, a in rows:
        print(f"    {name:24} {b} -> {a}")
    print(f"  wrong outcomes: {len(wrong)}")
    for line in wrong[:20]:
        print(f"    {line}")
    print(f"  leaks: {len(found)}")
    for line in found:
        print(f"    {line}")


def _books(pool: dict[str, Any]) -> str:
    return f"{pool['size']}/{pool['idle']}/{pool['in_use']}" if pool else "-"


if __name__ == "__main__":
    sys.exit(main())
