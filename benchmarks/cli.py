"""The command line's cold start: `sandbox run <options> /bin/true` against `bwrap <options> /bin/true`.

Every row is a fresh process, what a program that runs the command line pays
for each command, started with subprocess.run and timed to its exit. The
options are latency.py's flatpak-like ones (read-only /usr with its links,
ld.so.cache, proc, dev, a tmpfs /tmp, --unshare-all, --die-with-parent,
--new-session, --clearenv). Rows: bwrap itself; this package's console
script `sandbox run` (the native backend where the host allows it) and the
same under the name `bwrap` (a link, as a drop-in is installed); `--version`
of each; `python -c 'import sandbox'`; and the interpreter's floor
(`python -I -S -c pass`, `python -c pass`). All interleaved round-robin, so
machine noise hits them alike; medians and p99s in ms, and each median as a
ratio to bwrap's and to the interpreter's floor.

`--other LABEL=SCRIPT` adds the `sandbox run` and `import sandbox` rows of
another installation (its `sandbox` console script; the python beside it),
to compare two versions in one run.

    python benchmarks/cli.py [-n 100] [--other before=/opt/old-venv/bin/sandbox] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import sandbox

if __package__:
    from .latency import BWRAP_ARGS
    from .timing import measure, p99
else:  # run as a script (or imported by one): benchmarks/ is sys.path[0]
    from latency import BWRAP_ARGS
    from timing import measure, p99

TRUE = ["/bin/true"]
BWRAP = "bwrap <options> /bin/true"
SANDBOX_RUN = "sandbox run <options> /bin/true"
FLOOR = "python -I -S -c pass"


def console_script() -> Path:
    """The `sandbox` console script of the interpreter running this (the installation measured)."""
    script = Path(sys.executable).with_name("sandbox")
    if not script.exists():
        raise SystemExit(f"no `sandbox` console script beside {sys.executable}: run this with the venv's python")
    return script


def _run(argv: list[str]) -> Callable[[], object]:
    def call() -> None:
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} ... exited {done.returncode}: {done.stderr.decode()[-300:]}")
    return call


def variants(link_dir: Path, others: dict[str, Path]) -> dict[str, Callable[[], object]]:
    """name -> one fresh process, waited for."""
    script = console_script()
    as_bwrap = link_dir / "bwrap"
    as_bwrap.symlink_to(script)
    python = sys.executable
    out: dict[str, Callable[[], object]] = {}
    bwrap = shutil.which("bwrap")
    if bwrap:
        out[BWRAP] = _run([bwrap, *BWRAP_ARGS, *TRUE])
    out[SANDBOX_RUN] = _run([str(script), "run", *BWRAP_ARGS, *TRUE])
    out["the same, named bwrap"] = _run([str(as_bwrap), *BWRAP_ARGS, *TRUE])
    for label, other in others.items():
        out[f"{label}: sandbox run <options> /bin/true"] = _run([str(other), "run", *BWRAP_ARGS, *TRUE])
    if bwrap:
        out["bwrap --version"] = _run([bwrap, "--version"])
    out["sandbox --version"] = _run([str(script), "--version"])
    out["named bwrap: --version"] = _run([str(as_bwrap), "--version"])
    out["python -c 'import sandbox'"] = _run([python, "-c", "import sandbox"])
    for label, other in others.items():
        out[f"{label}: python -c 'import sandbox'"] = _run([str(other.with_name("python")), "-c", "import sandbox"])
    out["python -c pass"] = _run([python, "-c", "pass"])
    out[FLOOR] = _run([python, "-I", "-S", "-c", "pass"])
    return out


def table(times: dict[str, list[float]]) -> str:
    """A Markdown table: medians, p99s, and ratios to bwrap's run and to the interpreter's floor."""
    med = {k: statistics.median(v) for k, v in times.items()}
    bw, floor = med.get(BWRAP), med.get(FLOOR)
    rows = ["| process | median ms | p99 ms | / bwrap | / python -I -S |", "|---|---|---|---|---|"]
    for name, xs in times.items():
        r_bw = f"{med[name] / bw:.1f}x" if bw else "-"
        r_floor = f"{med[name] / floor:.2f}x" if floor else "-"
        rows.append(f"| {name} | {med[name]:.2f} | {p99(xs):.2f} | {r_bw} | {r_floor} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100, help="runs per row (default 100)")
    ap.add_argument("--other", action="append", default=[], metavar="LABEL=SCRIPT",
                    help="also another installation's `sandbox` console script (repeatable)")
    ap.add_argument("--json", help="also write the raw per-run times here")
    args = ap.parse_args()
    others = {}
    for item in args.other:
        label, _, path = item.partition("=")
        if not path or not Path(path).exists():
            ap.error(f"--other wants LABEL=SCRIPT, an existing console script: {item!r}")
        others[label] = Path(path)
    print(f"# fresh processes, n={args.n}, uid={os.getuid()}, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}, kernel {os.uname().release}, load {os.getloadavg()[0]:.2f}")
    print(f"# sandbox {sandbox.__version__} in {Path(sandbox.__file__).parent}; {sandbox.probe().native_reason}")
    with tempfile.TemporaryDirectory(prefix="sandbox-cli-bench-") as link_dir:
        times = measure(variants(Path(link_dir), others), args.n, warmup=min(5, args.n))
    print(table(times))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(times, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
