"""Pure arithmetic and rendering for ``keyorder bench``: ideals, ratios, percentiles, plot, table.

Kept apart from the runner (which owns brokers, pods and clocks) so the numbers a user reads can
be unit-tested, and re-rendered from a saved JSON report without re-running anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from keyorder.workers import LATENCY_BUCKETS


@dataclass
class RunResult:
    """The measured outcome of one benchmark run."""

    name: str
    mode: str  # "partition" (baseline), "key", "unordered"
    handler: str  # "sleep", "async-sleep", "noop", "cpu"
    workers: int
    messages: int
    seconds: float
    rate: float
    """Messages per second between the first and the last handled message."""
    cpu_us_per_message: float
    p50_ms: float | None
    p99_ms: float | None
    peak_rss_mb: float
    peak_inflight: int
    order_violations: int
    """Per-key sequence gaps seen by the handler (expected, and not a failure, in unordered mode)."""
    ideal_rate: float | None = None
    ratio_to_baseline: float | None = None
    ratio_to_ideal: float | None = None


@dataclass
class BenchReport:
    machine: dict
    parameters: dict
    runs: list[RunResult] = field(default_factory=list)
    commit_metadata_bytes: int | None = None
    targets: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> BenchReport:
        data = json.loads(text)
        runs = [RunResult(**run) for run in data.pop("runs")]
        return cls(runs=runs, **data)


def ideal_rate(workers: int, active_keys: int, latency: float) -> float | None:
    """The physical ceiling for an IO-bound handler: min(W, active keys) / L (None for L = 0)."""
    if latency <= 0:
        return None
    return min(workers, active_keys) / latency


def histogram_percentile(buckets: Sequence[int], quantile: float) -> float | None:
    """Percentile (seconds) from non-cumulative bucket counts over ``LATENCY_BUCKETS`` (+Inf last),
    interpolated linearly inside the bucket, as Prometheus' ``histogram_quantile`` does."""
    total = sum(buckets)
    if not total:
        return None
    rank = quantile * total
    seen = 0
    lower = 0.0
    for index, count in enumerate(buckets):
        upper = LATENCY_BUCKETS[index] if index < len(LATENCY_BUCKETS) else LATENCY_BUCKETS[-1]
        if count and seen + count >= rank:
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
        lower = upper
    return LATENCY_BUCKETS[-1]


def fill_ratios(runs: list[RunResult], active_keys: int, latency: float) -> None:
    """Ratio of every run to the baseline with the same handler family, and to its ideal."""
    baselines = {run.handler.replace("async-", ""): run for run in runs if run.mode == "partition"}
    for run in runs:
        if run.handler in ("sleep", "async-sleep"):
            run.ideal_rate = ideal_rate(run.workers, active_keys, latency)
            if run.ideal_rate:
                run.ratio_to_ideal = run.rate / run.ideal_rate
        baseline = baselines.get(run.handler.replace("async-", ""))
        if baseline is not None and baseline.rate > 0:
            run.ratio_to_baseline = run.rate / baseline.rate


def markdown_table(runs: Sequence[RunResult]) -> str:
    rows = [
        "| run | handler | W | msg/s | x baseline | x ideal | p50 ms | p99 ms | CPU µs/msg | peak RSS MB "
        "| order violations |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def number(value: float | None, digits: int = 1) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    for run in runs:
        rows.append(
            f"| {run.name} | {run.handler} | {run.workers} | {run.rate:,.0f} | "
            f"{number(run.ratio_to_baseline)} | {number(run.ratio_to_ideal, 2)} | {number(run.p50_ms)} | "
            f"{number(run.p99_ms)} | {run.cpu_us_per_message:.1f} | {run.peak_rss_mb:.0f} | "
            f"{run.order_violations} |"
        )
    return "\n".join(rows) + "\n"


def plot(report: BenchReport, path: Path) -> Path | None:
    """Throughput against W (log-log), with the partition baseline and the ideal line drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
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
    axes.plot(
        widths,
        [ideal_rate(w, keys, latency) for w in widths],
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
