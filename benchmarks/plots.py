"""The report's pictures (matplotlib, drawn to PNG files without a display)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

from .suites import stage_order  # noqa: E402
from .timing import p99  # noqa: E402

DPI = 110

# One colour per variant, the same in every plot of a report: a variant is
# recognised by words of its label (the first rule that matches wins), so
# "bwrap (same config)", "bwrap" and "bwrap + python -c" are all bwrap's red.
_FAMILIES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("backend=bwrap",), "tab:brown"),
    (("bwrap",), "tab:red"),
    (("template",), "tab:green"),
    (("workerpool", "spares=0"), "tab:pink"),
    (("workerpool",), "tab:purple"),
    (("fresh netns",), "tab:cyan"),
    (("seccomp=none",), "tab:olive"),
    (("as_pid_1",), "tab:orange"),
    (("native",), "tab:blue"),
    (("subprocess.run",), "dimgray"),
    (("posix_spawn",), "dimgray"),
    (("bare",), "dimgray"),
)
_SPARE_COLOURS = ("black", "tab:gray", "darkkhaki", "teal", "navy", "salmon", "indigo", "sienna")
_spare: dict[str, str] = {}


def colour(variant: str) -> str:
    """The colour of `variant` in every plot (a label no rule knows gets a spare one, kept for the run)."""
    label = variant.lower()
    for words, c in _FAMILIES:
        if all(w in label for w in words):
            return c
    if variant not in _spare:
        _spare[variant] = _SPARE_COLOURS[len(_spare) % len(_SPARE_COLOURS)]
    return _spare[variant]


def _stage_colours(n: int) -> list[Any]:
    """n distinct colours for the stages of a bar (tab10, then tab20's light shades, then Set3's)."""
    tab20, set3 = plt.get_cmap("tab20"), plt.get_cmap("Set3")  # listed colormaps: an int picks a colour
    palette = [tab20(i) for i in range(0, 20, 2)] + [tab20(i) for i in range(1, 20, 2)] + [set3(i) for i in range(12)]
    return [palette[i % len(palette)] for i in range(n)]


def latency_cdf(times: dict[str, list[float]], path: Path, title: str) -> None:
    """One empirical CDF per variant, ms on a log scale: left and steep is fast and steady."""
    fig, ax = plt.subplots(figsize=(9, 5))
    order = sorted(times, key=lambda k: sorted(times[k])[len(times[k]) // 2])
    for name in order:
        xs = sorted(times[name])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=name, linewidth=1.6, color=colour(name))
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


def throughput(windows: dict[str, dict[int, list[float]]], path: Path, quick: bool = False) -> None:
    """Spawns per second against the number of callers: the best window (the report's figure) as a
    point, a bar from the worst window to the best. A quick run's few short windows are noise, so
    its points are not joined into a trend."""
    fig, ax = plt.subplots(figsize=(8, 6))
    names = list(windows)
    for k, name in enumerate(names):
        by_callers = windows[name]
        xs = sorted(by_callers)
        best = [max(by_callers[x]) for x in xs]
        low = [b - min(by_callers[x]) for x, b in zip(xs, best, strict=True)]
        shift = 2 ** (0.04 * (k - (len(names) - 1) / 2))  # side by side, so that the bars do not overlap
        ax.errorbar([x * shift for x in xs], best, yerr=[low, [0.0] * len(xs)], marker="o", capsize=3,
                    linestyle="none" if quick else "-", label=name, color=colour(name))
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({x for r in windows.values() for x in r}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("callers (threads spawning and waiting back to back); point: best window, bar: down to the worst")
    ax.set_ylabel("spawn+wait of /bin/true per second")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title("Throughput against the number of callers" + (" (quick run: rough)" if quick else ""))
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    _save(fig, path)


def scaling(data: dict[str, dict[str, dict[int, list[float]]]], path: Path, quick: bool = False) -> None:
    """Median ms against binds and against environment variables, log-log, with a bar from the fastest
    run to the slowest; a quick run's few runs are not joined into a trend."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    labels = {"binds": "read-only binds in the Spec", "env": "environment variables (100 bytes each)"}
    for ax, (axis, by_variant) in zip(axes, data.items(), strict=False):
        for k, (name, by_size) in enumerate(by_variant.items()):
            xs = sorted(by_size)
            meds = [statistics.median(by_size[x]) for x in xs]
            low = [m - min(by_size[x]) for x, m in zip(xs, meds, strict=True)]
            high = [max(by_size[x]) - m for x, m in zip(xs, meds, strict=True)]
            shift = 10 ** (0.02 * (k - (len(by_variant) - 1) / 2))  # side by side on the log axis
            ax.errorbar([x * shift for x in xs], meds, yerr=[low, high], marker="o", capsize=3,
                        linestyle="none" if quick else "-", label=name, color=colour(name))
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain = matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}")
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.yaxis.set_major_formatter(plain)  # plain numbers at 1, 2, 5 of each decade
        ax.yaxis.set_minor_locator(matplotlib.ticker.LogLocator(subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel(labels.get(axis, axis))
        ax.set_ylabel("ms per spawn+wait of /bin/true (median; bar: fastest to slowest)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"Cost against {axis}" + (" (quick run: rough)" if quick else ""))
    _save(fig, path)


def python_tasks(times: dict[str, list[float]], path: Path) -> None:
    """Median ms per Python task as bars, the p99 as a whisker, log scale."""
    names = sorted(times, key=lambda k: statistics.median(times[k]))
    meds = [statistics.median(times[k]) for k in names]
    p99s = [p99(times[k]) for k in names]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(names) + 1.5))
    ax.barh(names, meds, xerr=[[0] * len(names), [p - m for p, m in zip(p99s, meds, strict=True)]],
            color=[colour(k) for k in names], alpha=0.8, capsize=3)
    for y, (m, p) in enumerate(zip(meds, p99s, strict=True)):
        ax.text(p * 1.05, y, f"{m:.1f} (p99 {p:.1f})", va="center", fontsize=8)
    ax.set_xlim(min(meds) / 2, max(p99s) * 4)  # room for the labels
    _log_x(ax)
    ax.set_xlabel("ms per task: median (bar), p99 (whisker), log scale")
    ax.set_title("A small Python task, same imports (json, asyncio, subprocess)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    _save(fig, path)


def stages(medians: dict[str, dict[str, float]], path: Path) -> None:
    """One stacked bar per variant: where the µs of a spawn+wait go. Every stage has a colour of its own
    (in the legend, in spawn order) and, where its segment is wide enough, its µs written on it."""
    order = stage_order(medians)
    names = list(medians)
    fig, ax = plt.subplots(figsize=(11, 1.2 * len(names) + 2.5))
    left = [0.0] * len(names)
    total = max((sum(m.values()) for m in medians.values()), default=0.0)
    for stage, c in zip(order, _stage_colours(len(order)), strict=True):
        widths = [medians[n].get(stage, 0.0) for n in names]
        bars = ax.barh(names, widths, left=left, label=stage, color=c, edgecolor="white", linewidth=0.5)
        for bar, w in zip(bars, widths, strict=True):
            if w >= 0.045 * total:  # room for the number
                ax.text(bar.get_x() + w / 2, bar.get_y() + bar.get_height() / 2, f"{w:.0f}", ha="center",
                        va="center", fontsize=7)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, end in enumerate(left):
        ax.text(end + total * 0.01, y, f"{end:.0f} µs", va="center", fontsize=8)
    ax.set_xlim(0, total * 1.12)
    ax.set_xlabel("µs (medians of each stage; the number on a segment is its µs)")
    ax.set_title("Where a spawn+wait of /bin/true goes (native backend; Template where it exists)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=3)
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
