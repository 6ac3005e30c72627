"""The plots ``keyorder bench`` writes beside its report: throughput against W, the live resize, and
the compared rows' passes.

Kept apart from the arithmetic (``bench_report``) because only these need matplotlib, an optional
extra: without it the bench still measures and writes its report and tables. Each function returns
the path it wrote, or ``None`` when it drew nothing: matplotlib is missing, or the report has no such rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keyorder.devtools.bench_report import BenchReport, Comparison, ResizeResult, ideal_rate


def _pyplot() -> Any | None:
    """matplotlib's pyplot on the file-only backend, or ``None`` when the extra is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def matplotlib_missing() -> bool:
    return _pyplot() is None


def plot_comparisons(comparisons: Sequence[Comparison], path: Path) -> Path | None:
    """One panel per target: each pass of both rows as a dot, each side's best as a bar, and the rate the
    row must reach (``factor`` x the other's best) as a dashed line, so a reader sees at once whether a
    target was met by every pass or only by the best one."""
    plt = _pyplot()
    if plt is None or not comparisons:
        return None
    from matplotlib.ticker import StrMethodFormatter

    figure, panels = plt.subplots(1, len(comparisons), figsize=(4.2 * len(comparisons), 4.6), dpi=110, squeeze=False)
    for panel, comparison in zip(panels[0], comparisons, strict=True):
        sides = (
            (comparison.against, comparison.against_rate, comparison.against_passes, "tab:grey"),
            (comparison.row, comparison.row_rate, comparison.row_passes, "tab:blue"),
        )
        for position, (_name, best, passes, color) in enumerate(sides):
            panel.bar(position, best, width=0.6, color=color, alpha=0.35)
            shown = list(passes) or [best]
            panel.scatter([position] * len(shown), shown, color=color, zorder=3, s=22)
        required = comparison.factor * comparison.against_rate
        panel.axhline(
            required,
            color="green" if comparison.met else "red",
            linestyle="--",
            label=f"target {comparison.factor:g} x: {required:,.0f} msg/s",
        )
        panel.set_xticks([0, 1], [_wrapped(comparison.against), _wrapped(comparison.row)], fontsize=7)
        medians = comparison.median_ratio
        panel.set_title(
            f"{comparison.ratio:.2f} x best" + ("" if medians is None else f", {medians:.2f} x medians"), fontsize=9
        )
        panel.set_ylim(0, 1.15 * max(required, comparison.row_rate, comparison.against_rate))
        panel.set_ylabel("messages / second")
        panel.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
        panel.grid(True, axis="y", alpha=0.3)
        panel.legend(fontsize=7, loc="upper left")
    figure.suptitle("keyorder bench: the compared rows, every pass (dots) and the best (bars)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def _wrapped(name: str, width: int = 22) -> str:
    """A row's name over lines of about ``width`` characters, for a tick label."""
    lines: list[str] = []
    for word in name.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def plot_resize(result: ResizeResult, path: Path) -> Path | None:
    """Throughput over time around a live resize, with the old and new ideals and the target drawn."""
    plt = _pyplot()
    if plt is None:
        return None
    if not result.series_seconds:
        return None
    figure, axes = plt.subplots(figsize=(8, 5), dpi=110)
    axes.plot(
        result.series_seconds,
        result.series_rates,
        color="tab:blue",
        label=f"throughput (trailing {result.window_seconds:g} s window)",
    )
    axes.axvline(0, color="black", linestyle="-", label=f"resize W={result.workers_before} -> {result.workers_after}")
    for ideal, workers, color in (
        (result.ideal_before, result.workers_before, "grey"),
        (result.ideal_after, result.workers_after, "green"),
    ):
        if ideal:
            axes.axhline(ideal, color=color, linestyle=":", label=f"ideal at W={workers}: {ideal:,.0f} msg/s")
    if result.ideal_after:
        axes.axhline(
            result.target_fraction * result.ideal_after,
            color="green",
            linestyle="--",
            alpha=0.5,
            label=f"target: {result.target_fraction:g} x new ideal within {result.settle_seconds:g} s",
        )
    if result.seconds_to_target is not None:
        axes.axvline(result.seconds_to_target, color="green", alpha=0.4, linestyle="-.")
    axes.set_xlabel("seconds since the resize")
    axes.set_ylabel("messages / second")
    axes.set_ylim(0, 1.15 * max([*result.series_rates, result.ideal_after or 0.0]))
    axes.set_title(f"keyorder: live resize under backlog, {result.keys:,} keys")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def plot(report: BenchReport, path: Path) -> Path | None:
    """Throughput against W (log-log), with the partition baseline and the ideal line drawn."""
    plt = _pyplot()
    if plt is None:
        return None
    latency = report.parameters["latency_ms"] / 1000.0
    keys = report.parameters["keys"]
    sleep_runs = [run for run in report.runs if run.handler in ("sleep", "async-sleep")]
    if not sleep_runs:
        return None
    figure, axes = plt.subplots(figsize=(8, 5), dpi=110)
    for handler, label, marker in (
        ("sleep", "key mode, thread workers", "o"),
        ("async-sleep", "key mode, asyncio workers", "s"),
    ):
        points = sorted((run.workers, run.rate) for run in sleep_runs if run.mode == "key" and run.handler == handler)
        if points:
            axes.plot(*zip(*points, strict=True), marker=marker, label=label)
    widths = sorted({run.workers for run in sleep_runs} | {1})
    ideals = [(w, ideal) for w in widths if (ideal := ideal_rate(w, keys, latency)) is not None]
    if ideals:  # none for L = 0
        axes.plot(
            *zip(*ideals, strict=True),
            linestyle=":",
            color="grey",
            label=f"ideal min(W, {keys:,} keys) / {latency * 1000:g} ms",
        )
    for run in sleep_runs:
        if run.mode == "partition":
            axes.axhline(
                run.rate,
                color="red",
                linestyle="--",
                label=f"partition-ordered baseline ({run.workers} workers): {run.rate:,.0f} msg/s",
            )
        elif run.mode == "unordered":
            axes.scatter(
                [run.workers],
                [run.rate],
                marker="*",
                s=150,
                color="black",
                zorder=5,
                label=f"unordered (no ordering), W={run.workers}",
            )
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("key workers per pod (W)")
    axes.set_ylabel("messages / second")
    parameters = report.parameters
    axes.set_title(
        f"keyorder: one pod, {parameters['partitions']} partitions, {keys:,} keys, "
        f"handler latency {latency * 1000:g} ms"
    )
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
