"""The report's pictures (matplotlib, drawn to PNG files without a display)."""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

from .suites import stage_order  # noqa: E402
from .timing import p99  # noqa: E402

DPI = 110


def latency_cdf(times: dict[str, list[float]], path: Path, title: str) -> None:
    """One empirical CDF per variant, ms on a log scale: left and steep is fast and steady."""
    fig, ax = plt.subplots(figsize=(9, 5))
    order = sorted(times, key=lambda k: sorted(times[k])[len(times[k]) // 2])
    for name in order:
        xs = sorted(times[name])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=name, linewidth=1.6)
    _log_x(ax)
    ax.set_xlabel("ms per call (log scale)")
    ax.set_ylabel("fraction of calls at or under")
    ax.set_ylim(0, 1.0)
    ax.axhline(0.5, color="grey", linewidth=0.6, linestyle=":")
    ax.axhline(0.99, color="grey", linewidth=0.6, linestyle=":")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    _save(fig, path)


def throughput(rates: dict[str, dict[int, float]], path: Path) -> None:
    """Spawns per second against the number of callers."""
    fig, ax = plt.subplots(figsize=(8, 6))
    for name, by_callers in rates.items():
        xs = sorted(by_callers)
        ax.plot(xs, [by_callers[x] for x in xs], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({x for r in rates.values() for x in r}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("callers (threads spawning and waiting back to back)")
    ax.set_ylabel("spawn+wait of /bin/true per second")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title("Throughput against the number of callers")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    _save(fig, path)


def scaling(data: dict[str, dict[str, dict[int, list[float]]]], path: Path) -> None:
    """Median ms against binds and against environment variables, native and bwrap, log-log."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    labels = {"binds": "read-only binds in the Spec", "env": "environment variables (100 bytes each)"}
    names = list(dict.fromkeys(v for by_variant in data.values() for v in by_variant))
    color = {name: f"C{i}" for i, name in enumerate(names)}  # one colour per variant in both panels
    for ax, (axis, by_variant) in zip(axes, data.items(), strict=False):
        for name, by_size in by_variant.items():
            xs = sorted(by_size)
            ax.plot(xs, [statistics.median(by_size[x]) for x in xs], marker="o", label=name, color=color[name])
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.yaxis.set_major_formatter(plain)  # plain numbers at 1, 2, 5 of each decade
        ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel(labels.get(axis, axis))
        ax.set_ylabel("median ms per spawn+wait of /bin/true")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"Cost against {axis}")
    _save(fig, path)


def python_tasks(times: dict[str, list[float]], path: Path) -> None:
    """Median ms per Python task as bars, the p99 as a whisker, log scale."""
    names = sorted(times, key=lambda k: statistics.median(times[k]))
    meds = [statistics.median(times[k]) for k in names]
    p99s = [p99(times[k]) for k in names]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) + 1.5))
    ax.barh(names, meds, xerr=[[0] * len(names), [p - m for p, m in zip(p99s, meds, strict=True)]],
            color="tab:blue", alpha=0.8, capsize=3)
    for y, (m, p) in enumerate(zip(meds, p99s, strict=True)):
        ax.text(p * 1.05, y, f"{m:.1f} (p99 {p:.1f})", va="center", fontsize=8)
    ax.set_xlim(min(meds) / 2, max(p99s) * 4)  # room for the labels
    _log_x(ax)
    ax.set_xlabel("ms per task: median (bar), p99 (whisker), log scale")
    ax.set_title("A small Python task, same imports (json, asyncio, subprocess)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    _save(fig, path)


def stages(medians: dict[str, dict[str, float]], path: Path) -> None:
    """One stacked bar per variant: where the µs of a spawn+wait go."""
    order = stage_order(medians)
    names = list(medians)
    fig, ax = plt.subplots(figsize=(10, 1.2 * len(names) + 2))
    left = [0.0] * len(names)
    colors = plt.get_cmap("tab10")
    for i, stage in enumerate(order):
        widths = [medians[n].get(stage, 0.0) for n in names]
        ax.barh(names, widths, left=left, label=stage, color=colors(i % 10))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlabel("µs (medians of each stage)")
    ax.set_title("Where a spawn+wait of /bin/true goes (native backend; Template where it exists)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3)
    ax.grid(True, axis="x", alpha=0.3)
    _save(fig, path)


def _log_x(ax: plt.Axes) -> None:
    """A log x axis labelled in plain numbers (0.5, 1, 2, 5, 10...), not powers of ten."""
    ax.set_xscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 5.0)))
    ax.xaxis.set_minor_formatter(plain)


def _save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
