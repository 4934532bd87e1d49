"""Network namespace pool: lease+release vs a fresh namespace every time.

Rows (median and p99 in µs, and throughput):

- `pool lease+release`: lease a pooled namespace and release it (the
  release check runs; the namespace is clean, so it is recycled).
- `pool lease` / `pool release`: the two halves of that.
- `pool lease+release(wait=False)`: the caller's part when the release
  check is left to the refill thread (1 ms pause between rounds, as if a
  sandbox ran).
- `pool fresh-on-empty`: a size-0 pool, so every lease makes, configures
  and verifies a namespace on the spot and every release destroys it.
- `kernel: unshare+lo up`: what a sandbox spawn pays today, timed inside a
  single-threaded helper: unshare(CLONE_NEWNET) and lo up by ioctl, the
  previous namespace freed as the helper leaves it.
- `kernel: setns(netns)`: what joining a leased namespace costs instead,
  timed in the same helper (alternating between two pooled namespaces).

    python benchmarks/netpool.py [-n 2000] [--owner auto|init|userns]
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

from sandbox.netpool import NetnsPool
from sandbox.netpool.factory import FACTORY_PATH

if __package__:
    from .timing import p99
else:  # run as a script: benchmarks/ is sys.path[0]
    from timing import p99

# argv: mode (kernel-unshare | kernel-setns), n, userns fd (-1), netns fd a, netns fd b
HELPER = f"_FACTORY_MAIN = {str(FACTORY_PATH)!r}\n" + r'''
import fcntl, importlib.util, json, os, socket, struct, sys, time
_spec = importlib.util.spec_from_file_location("_factory_main", _FACTORY_MAIN)  # the factory's helpers
fm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fm)
mode, n, userns, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
times = []
if mode == "kernel-unshare":
    if os.geteuid() != 0:
        fm.unshare_userns()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fm.call(fm.libc.unshare(fm.CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22x", b"lo", 0x41))  # SIOCSIFFLAGS: IFF_UP|IFF_RUNNING
        s.close()
        times.append(time.perf_counter_ns() - t0)
else:
    if userns >= 0:
        fm.call(fm.libc.setns(userns, fm.CLONE_NEWUSER), "setns(CLONE_NEWUSER)")
    for i in range(n):
        t0 = time.perf_counter_ns()
        fm.call(fm.libc.setns(a if i % 2 else b, fm.CLONE_NEWNET), "setns(CLONE_NEWNET)")
        times.append(time.perf_counter_ns() - t0)
print(json.dumps(times))
'''


def timed(n: int, op: Callable[[], None]) -> list[float]:
    """µs per call of `op`, n calls after a short warm-up."""
    for _ in range(min(20, n)):
        op()
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        op()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def helper(mode: str, n: int, fds: tuple[int, int, int] = (-1, -1, -1)) -> list[float]:
    argv = [sys.executable, "-I", "-S", "-c", HELPER, mode, str(n), *map(str, fds)]
    done = subprocess.run(argv, pass_fds=[fd for fd in fds if fd >= 0], capture_output=True, text=True, check=True)
    return [t / 1000 for t in json.loads(done.stdout)]


def row(name: str, xs: list[float], baseline: float | None) -> str:
    med = statistics.median(xs)
    ratio = f"{med / baseline:.2f}x" if baseline else ""
    return f"| {name} | {med:.1f} | {p99(xs):.1f} | {1e6 / statistics.mean(xs):.0f} | {ratio} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--owner", default="auto", choices=["auto", "init", "userns"])
    ap.add_argument("--size", type=int, default=4)
    args = ap.parse_args()
    results: dict[str, list[float]] = {}

    with NetnsPool(args.size, owner=args.owner) as pool:
        if not pool.wait_filled(60):
            raise SystemExit(f"pool did not fill: {pool.stats()}")
        owner = pool.owner
        results["pool lease+release"] = timed(args.n, lambda: pool.lease().release())
        lease_t, release_t = [], []
        for _ in range(args.n):
            t0 = time.perf_counter_ns()
            lease = pool.lease()
            t1 = time.perf_counter_ns()
            lease.release()
            t2 = time.perf_counter_ns()
            lease_t.append((t1 - t0) / 1000)
            release_t.append((t2 - t1) / 1000)
        results["pool lease"], results["pool release"] = lease_t, release_t
        deferred = []
        for _ in range(args.n):
            time.sleep(0.001)  # the sandbox's run; the refill thread checks meanwhile
            t0 = time.perf_counter_ns()
            pool.lease(timeout=1.0).release(wait=False)
            deferred.append((time.perf_counter_ns() - t0) / 1000)
        results["pool lease+release(wait=False)"] = deferred
        a, b = pool.lease(), pool.lease()
        userns = a.userns_fd if a.userns_fd is not None else -1
        results["kernel: setns(netns)"] = helper("kernel-setns", args.n, (userns, a.netns_fd, b.netns_fd))
        a.release()
        b.release()
        stats = pool.stats()

    with NetnsPool(0, owner=owner) as fresh_pool:
        fresh_n = max(50, args.n // 10)
        results["pool fresh-on-empty"] = timed(fresh_n, lambda: fresh_pool.lease().release())
    results["kernel: unshare+lo up"] = helper("kernel-unshare", max(50, args.n // 4))

    base = statistics.median(results["kernel: unshare+lo up"])
    print(f"# netns pool, owner={owner}, uid={os.getuid()}, n={args.n}, {os.cpu_count()} cpus")
    print("| operation | median µs | p99 µs | ops/s | / unshare+lo up |")
    print("|---|---|---|---|---|")
    for name in ("pool lease+release", "pool lease", "pool release", "pool lease+release(wait=False)",
                 "kernel: setns(netns)", "pool fresh-on-empty", "kernel: unshare+lo up"):
        print(row(name, results[name], base))
    print(f"\npool stats: {stats}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
