"""The command line's cold path, before and after: the direct and cold rows of
benchmarks/cli.py for this installation and another one, interleaved.

`cli.py --compare BINDIR` adds another installation's warm rows only; a
change to what a direct run imports or does is seen in its direct row (the
Python CLI run by the client with SANDBOX_CLI_SERVER=0) and cold row (no
server yet: the call starts one, stopped again after it, untimed). Both
installations' copies are made and called as cli.py makes and calls its own,
round-robin with bwrap and the interpreter's floor, so machine noise hits
them alike.

    python benchmarks/cli_cold.py BINDIR [-n 40]

BINDIR: the other installation's bin directory (its `sandbox` and
`sandbox-py`), e.g. a venv of main's code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

if __package__:
    from .cli import TRUE, Server, _cold, _env, _run, installation
    from .latency import BWRAP_ARGS
    from .timing import measure, p99
else:  # run as a script: benchmarks/ is sys.path[0]
    from cli import TRUE, Server, _cold, _env, _run, installation
    from latency import BWRAP_ARGS
    from timing import measure, p99

BWRAP = "bwrap <flatpak-like> /bin/true"
FLOOR = "python -I -S -c pass"


def rows(copies: dict[str, Path], servers: dict[str, Server],
         cold_times: dict[str, list[float]]) -> dict[str, Callable[[], object]]:
    """name -> one fresh process: bwrap, the floor, then each copy's direct and cold call."""
    env = _env()
    out: dict[str, Callable[[], object]] = {}
    bwrap = shutil.which("bwrap")
    if bwrap:
        out[BWRAP] = _run([bwrap, *BWRAP_ARGS, *TRUE])
    out[FLOOR] = _run([sys.executable, "-I", "-S", "-c", "pass"])
    for name, root in copies.items():
        argv = [str(root / "sandbox"), "run", *BWRAP_ARGS, *TRUE]
        out[f"{name} direct: SANDBOX_CLI_SERVER=0 sandbox run <flatpak-like> /bin/true"] = _run(
            argv, {**env, "SANDBOX_CLI_SERVER": "0"})
        cold = f"{name} cold: sandbox run <flatpak-like> /bin/true"
        out[cold] = _cold(_run(argv, env), servers[name], cold_times.setdefault(cold, []))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("other", type=Path, help="the other installation's bin directory")
    ap.add_argument("-n", type=int, default=40, help="runs per row (default 40)")
    args = ap.parse_args()
    print(f"# fresh processes, n={args.n}, uid={os.getuid()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"this: {Path(sys.executable).parent}, other: {args.other}")
    with tempfile.TemporaryDirectory(prefix="sandbox-cli-cold-") as tmp:
        Path(tmp).chmod(0o755)
        copies = {"this": installation(Path(tmp) / "this"), "other": installation(Path(tmp) / "other", args.other)}
        servers = {name: Server(root) for name, root in copies.items()}
        cold_times: dict[str, list[float]] = {}
        warmup = min(5, args.n)
        try:
            times = measure(rows(copies, servers, cold_times), args.n, warmup=warmup)
            times.update({name: xs[warmup:] for name, xs in cold_times.items()})
        finally:
            for server in servers.values():
                server.stop()
    med = {name: statistics.median(xs) for name, xs in times.items()}
    print("| process | median ms | p99 ms | / bwrap | / other's |\n|---|---|---|---|---|")
    for name, xs in times.items():
        r_bw = f"{med[name] / med[BWRAP]:.2f}x" if BWRAP in med and name != BWRAP else "-"
        twin = name.replace("this ", "other ", 1)
        r_other = f"{med[name] / med[twin]:.2f}x" if name.startswith("this ") and twin in med else "-"
        print(f"| {name} | {med[name]:.2f} | {p99(xs):.2f} | {r_bw} | {r_other} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
