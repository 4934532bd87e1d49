"""Run every benchmark in one process and write a dated report folder.

    python -m benchmarks [--quick] [--out DIR] [--readme] [--no-progress]

Writes DIR (default benchmarks/reports/<YYYY-MM-DD>/): report.md (the tables,
with ratios, and the machine and kernel it ran on), the PNG plots it shows,
and raw.json (every measured value, to draw them again). Within each suite
the variants run interleaved, so compare within one report, not across two.
A full run takes about 3-6 minutes on 2 vCPUs; --quick about half a minute (for
CI, which checks only that it runs and writes the files). --readme puts the
headline table and plot into README.md, between its bench markers.
Needs the `bench` extra (matplotlib; tqdm for the progress bar).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as a script: import the package (whose __init__ takes the checkout off sys.path)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    __package__ = "benchmarks"
    import benchmarks  # noqa: F401

import sandbox  # noqa: E402

from . import latency, suites, workerpool  # noqa: E402
from .progress import Progress  # noqa: E402

HERE = Path(__file__).resolve().parent
README = HERE.parent / "README.md"
BEGIN, END = "<!-- bench:begin (python -m benchmarks --readme) -->", "<!-- bench:end -->"
PLOTS = {"latency": "latency.png", "throughput": "throughput.png", "scaling": "scaling.png",
         "python": "python_tasks.png", "stages": "stages.png"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="about half a minute: few runs of each (numbers are rough)")
    ap.add_argument("--out", type=Path, help="report folder (default benchmarks/reports/<date>)")
    ap.add_argument("--readme", action="store_true", help="put the headline table and plot into README.md")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = ap.parse_args(argv)
    try:
        from . import plots
    except ImportError as exc:
        raise SystemExit(f"the report draws with matplotlib: pip install 'sandbox[bench]' ({exc})") from exc
    out = args.out or HERE / "reports" / dt.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    sizes = suites.Sizes.make(args.quick)
    machine = machine_facts()
    started = time.monotonic()
    results = run_all(sizes, Progress(total_steps(sizes), enabled=not args.no_progress))
    machine["load average after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    machine["run took"] = f"{time.monotonic() - started:.0f} s"
    draw(plots, results, out, args.quick)
    (out / "raw.json").write_text(json.dumps({"machine": machine, "quick": args.quick, **results}, indent=1))
    (out / "report.md").write_text(markdown(results, machine, args.quick))
    if args.readme:
        update_readme(results, out)
    print(f"report written to {out}/report.md ({machine['run took']})")
    return 0


def total_steps(sizes: suites.Sizes) -> int:
    return (suites.spawn_latency_steps(sizes) + suites.throughput_steps(sizes) + suites.scaling_steps(sizes)
            + suites.python_steps(sizes) + suites.stages_steps(sizes) + suites.others_steps(sizes))


def run_all(sizes: suites.Sizes, progress: Progress) -> dict[str, Any]:
    """Every suite, in turn; each interleaves its own variants."""
    try:
        results: dict[str, Any] = {
            "latency": suites.spawn_latency(sizes, progress),
            "throughput_windows": suites.throughput(sizes, progress),
            "scaling": suites.scaling(sizes, progress),
            "python": suites.python_tasks(sizes, progress),
            "stages": suites.stages(sizes, progress),
        }
        results["throughput"] = suites.best(results["throughput_windows"])
        results["others"] = suites.others(sizes, progress) if sizes.others else {}
    finally:
        progress.close()
    return results


def draw(plots: Any, results: dict[str, Any], out: Path, quick: bool = False) -> None:
    plots.latency_cdf(results["latency"], out / PLOTS["latency"], "spawn+wait of /bin/true: distribution per variant")
    windows = results.get("throughput_windows") or {n: {c: [r] for c, r in by.items()}
                                                     for n, by in results["throughput"].items()}
    plots.throughput(windows, out / PLOTS["throughput"], quick)
    plots.scaling(results["scaling"], out / PLOTS["scaling"], quick)
    plots.python_tasks(results["python"], out / PLOTS["python"])
    plots.stages(results["stages"], out / PLOTS["stages"])


# ---------------------------------------------------------------- the machine

def machine_facts() -> dict[str, str]:
    """What the numbers depend on: CPU, kernel, distribution, versions, load."""
    facts = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cpus": str(os.cpu_count()),
        "memory": _meminfo_total(),
        "kernel": f"{platform.system()} {os.uname().release} {os.uname().machine}",
        "distribution": _os_release(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sandbox": f"{sandbox.__version__}; native: {sandbox.probe().native_reason}",
        "bubblewrap": _bwrap_version(),
        "user": f"uid {os.getuid()}",
        "Template": "yes" if suites.template_available() else "not in this version",
        "load average before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "command": "python -m benchmarks " + " ".join(sys.argv[1:]),
    }
    return facts


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_total() -> str:
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        return f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        return "unknown"


def _os_release() -> str:
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return "unknown"


def _bwrap_version() -> str:
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return "not installed (its rows are missing)"
    done = subprocess.run([bwrap, "--version"], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()


# ---------------------------------------------------------------- Markdown

def markdown(results: dict[str, Any], machine: dict[str, str], quick: bool) -> str:
    lines = [f"# sandbox benchmarks, {machine['date']}", ""]
    if quick:
        lines += ["**--quick run: a few calls of each, for CI. The numbers are rough; run without --quick.**", ""]
    lines += ["Every suite runs its variants interleaved in one process (round-robin), so machine noise hits them "
              "alike: compare rows within one report. Medians and p99s in ms unless said otherwise.", "",
              "| machine | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine.items()]
    lines += ["", "## Spawn+wait latency of /bin/true", "",
              "The Spec is flatpak-like: read-only /usr with the /lib, /lib64, /bin, /sbin links, ld.so.cache, "
              "proc, dev, a tmpfs /tmp, every namespace. bwrap runs with the same options; `sandbox backend=bwrap` "
              "is this package's bwrap backend. Rows: `benchmarks/latency.py`.", "",
              latency.table(results["latency"]), "", f"![latency]({PLOTS['latency']})", "",
              "## Throughput against callers", "",
              "Threads each spawning and waiting back to back; the best of the windows for each count (the plot "
              "marks it, with a bar from the worst window to the best).", "",
              throughput_table(results["throughput"]), "", f"![throughput]({PLOTS['throughput']})", "",
              "## Cost against the number of binds and the size of the environment", "",
              "Each bind is a read-only bind of its own empty directory; each variable is 100 bytes "
              "(`--setenv` for bwrap). The native backend holds an fd per bind source while it spawns: "
              "the run raises its soft open-files limit to the hard one (1000 binds fail with EMFILE under "
              "the common soft limit of 1024).", "",
              scaling_table(results["scaling"]), "", f"![scaling]({PLOTS['scaling']})", "",
              "## Python task latency", "",
              f"Every variant runs `{workerpool.CODE}` and returns: the WorkerPool imports them once in its "
              "zygote; the others start `python -I -c` each time. Rows: `benchmarks/workerpool.py`.", "",
              workerpool.table(results["python"]), "", f"![python]({PLOTS['python']})", "",
              "## Where a native spawn's time goes", "",
              "Medians per stage, from the backend's timestamps (`result.timings`, µs since the spawn began; "
              "each stage is named by the stamp that ends it), and around them the Python before and after the "
              "core and the wait for the command to exit. A Template's resident process does the mounts once, "
              "so its sandboxes skip those stages.", "",
              stages_table(results["stages"]), "", f"![stages]({PLOTS['stages']})", ""]
    for title, text in results.get("others", {}).items():
        body = text.strip()
        fenced = not body.lstrip().startswith(("#", "|"))
        lines += [f"## `benchmarks/{title}`", "", *(["```", body, "```"] if fenced else [body]), ""]
    return "\n".join(lines)


def throughput_table(rates: dict[str, dict[int, float]]) -> str:
    callers = sorted({c for r in rates.values() for c in r})
    bw = rates.get(suites.BWRAP, {})
    head = "| variant | " + " | ".join(f"{c} caller{'s' if c > 1 else ''}/s" for c in callers) + " | / bwrap |"
    rows = [head, "|---|" + "---|" * (len(callers) + 1)]
    for name, by in rates.items():
        ratio = ", ".join(f"{by[c] / bw[c]:.1f}x" for c in callers if bw.get(c)) or "-"
        rows.append(f"| {name} | " + " | ".join(f"{by.get(c, 0):.0f}" for c in callers) + f" | {ratio} |")
    return "\n".join(rows)


def scaling_table(data: dict[str, dict[str, dict[int, list[float]]]]) -> str:
    variants = list(dict.fromkeys(v for by_variant in data.values() for v in by_variant))
    rows = ["| what | size | " + " | ".join(f"{v} median ms" for v in variants) + " | bwrap / native | runs |",
            "|---|---|" + "---|" * (len(variants) + 2)]
    for axis, by_variant in data.items():
        native = by_variant.get("native", {})
        bwrap = by_variant.get("bwrap", {})
        for size in sorted(native):
            meds = [statistics.median(by_variant[v][size]) if size in by_variant.get(v, {}) else None
                    for v in variants]
            n = statistics.median(native[size])
            b = statistics.median(bwrap[size]) if size in bwrap else None
            rows.append(f"| {axis} | {size} | " + " | ".join(f"{m:.2f}" if m else "-" for m in meds)
                        + f" | {f'{b / n:.1f}x' if b else '-'} | {len(native[size])} |")
    return "\n".join(rows)


def stages_table(medians: dict[str, dict[str, float]]) -> str:
    names = list(medians)
    order = suites.stage_order(medians)
    rows = ["| stage (µs) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for stage in order:
        rows.append(f"| {stage} | " + " | ".join(f"{medians[n].get(stage, 0):.0f}" for n in names) + " |")
    rows.append("| **sum of medians** | " + " | ".join(f"**{sum(medians[n].values()):.0f}**" for n in names) + " |")
    return "\n".join(rows)


def headline(results: dict[str, Any], out: Path) -> str:
    """The README's part: the latency table and plot of this report."""
    rel = out.resolve().relative_to(README.parent.resolve()) if out.resolve().is_relative_to(README.parent.resolve()) \
        else out
    return "\n".join([BEGIN, "", f"From [{rel}/report.md]({rel}/report.md) (`python -m benchmarks`; "
                      "`--quick` for a rough one in about half a minute):", "", latency.table(results["latency"]), "",
                      f"![spawn+wait latency]({rel}/{PLOTS['latency']})", "", END])


def update_readme(results: dict[str, Any], out: Path) -> None:
    """Replace the part of README.md between the bench markers (or add it under ## Benchmarks)."""
    text = README.read_text()
    part = headline(results, out)
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + part + text[text.index(END) + len(END):]
    else:
        anchor = "## Benchmarks\n"
        at = text.index(anchor) + len(anchor) if anchor in text else len(text)
        text = text[:at] + "\n" + part + "\n" + text[at:]
    README.write_text(text)


if __name__ == "__main__":
    raise SystemExit(main())
