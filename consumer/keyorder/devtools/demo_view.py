"""What ``keyorder dev`` shows: the live view, the chart, the end-of-run audit and the simulator's line.

The demo (``demo``) samples its groups into a ``Timeline``; this module turns that into what a person
reads: the terminal view while it runs (``View``, the lag and the pods' workers as sparklines), the
chart written at the end (``plot``: the lag and the size of the autoscaled group, with the KEDA group on
the same axes), the audit of the journal the example handler writes (``audit``: every order's events in
order, none lost) and the simulator's drain times beside the run's (``print_simulated``). No broker and
no process: it reads figures the demo already has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from keyorder.devtools.keda_group import KedaGroupRun

SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class Timeline:
    points: list[dict] = field(default_factory=list)
    decisions: list[dict] = field(default_factory=list)


def audit(journal: Path, expected: dict[str, int]) -> dict:
    """Every order's events present, and the first handling of each in sequence order."""
    seen: dict[str, int] = {}
    violations = duplicates = 0
    if journal.exists():
        for line in journal.read_text().splitlines():
            order, sequence_text = line.split()
            sequence, done = int(sequence_text), seen.get(order, 0)
            if sequence < done:
                duplicates += 1
            elif sequence == done:
                seen[order] = done + 1
            else:
                violations += 1
                seen[order] = max(done, sequence + 1)
    lost = sum(max(count - seen.get(order, 0), 0) for order, count in expected.items())
    return {
        "orders": len(expected),
        "events": sum(expected.values()),
        "order_violations": violations,
        "lost_events": lost,
        "redelivered_events": duplicates,
    }


class View:
    """The live terminal view (rich), or one plain line per poll with ``--no-ui``."""

    def __init__(self, enabled: bool) -> None:
        self.live = None
        if enabled:
            from rich.console import Console
            from rich.live import Live

            console = Console()
            if console.is_terminal:
                self.live = Live(console=console, refresh_per_second=4)
                self.live.start()

    def update(
        self,
        elapsed: float,
        sample,
        replicas: int,
        workers: int,
        drain: float | None,
        history: list[int],
        decisions: list[dict],
    ) -> None:
        lag = sample.lag if sample else None
        eta = f"{lag / drain:.0f} s" if lag is not None and drain else "-"
        if self.live is None:
            print(
                f"t={elapsed:6.1f}s lag={lag if lag is not None else '?':>8} replicas={replicas} "
                f"workers/pod={workers} drain={drain or 0:,.0f}/s eta={eta}",
                flush=True,
            )
            return
        from rich.table import Table

        table = Table(title=f"keyorder dev - {elapsed:.0f}s", expand=False)
        table.add_column("partition")
        table.add_column("lag", justify="right")
        top = max(sample.partition_lags, default=1) if sample else 1
        for index, value in enumerate(sample.partition_lags if sample else ()):
            table.add_row(str(index), f"{value:,} {'█' * int(20 * value / max(top, 1))}")
        high = max(history, default=1) or 1
        spark = "".join(SPARK[min(int(value / high * (len(SPARK) - 1)), len(SPARK) - 1)] for value in history[-60:])
        table.add_row("total", f"{lag if lag is not None else '?':,} {spark}" if lag is not None else "?")
        table.add_row("replicas x workers", f"{replicas} x {workers}")
        table.add_row("throughput", f"{drain or 0:,.0f} msg/s")
        table.add_row("projected drain", eta)
        for decision in decisions[-6:]:
            table.add_row(f"{decision['t']:.0f}s", decision["reason"])
        self.live.update(table)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


def plot(timeline: Timeline, report: dict, path: Path, keda: KedaGroupRun | None = None) -> Path | None:
    """Lag, then size, over time; with ``keda``, the KEDA-scaled group's lag and replicas on the same axes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    times = [point["t"] for point in timeline.points]
    figure, (lag_axes, size_axes) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), dpi=110)
    lag_axes.plot(times, [point["lag"] for point in timeline.points], color="tab:red", label="keyorder: lag")
    if keda is not None and keda.points:
        keda_times = [point["t"] for point in keda.points]
        lag_axes.plot(
            keda_times, [point["lag"] for point in keda.points], color="tab:purple", label="KEDA + plain consumer: lag"
        )
    lag_axes.set_ylabel("lag")
    lag_axes.set_title(
        f"keyorder dev: {report['options']['spike']:,}-event spike on {report['options']['partitions']}"
        f" partitions, handler {report['options']['latency_min_ms']:g}-"
        f"{report['options']['latency_max_ms']:g} ms"
    )
    size_axes.step(times, [point["replicas"] for point in timeline.points], where="post", label="keyorder: replicas")
    size_axes.step(
        times, [point["workers"] for point in timeline.points], where="post", label="keyorder: workers per pod"
    )
    if keda is not None and keda.points:
        size_axes.step(
            keda_times,
            [point["replicas"] for point in keda.points],
            where="post",
            color="tab:purple",
            label="KEDA: replicas (a thread per partition)",
        )
    from matplotlib.ticker import MaxNLocator

    size_axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    sizes = [point[name] for point in timeline.points for name in ("replicas", "workers")]
    sizes += [point["replicas"] for point in keda.points] if keda is not None else []
    size_axes.set_ylim(0, max(sizes, default=1) * 1.35)  # room for the legend above the lines
    size_axes.set_ylabel("size")
    size_axes.set_xlabel("seconds")
    for decision in timeline.decisions:
        for axes in (lag_axes, size_axes):
            axes.axvline(decision["t"], color="grey", alpha=0.3, linewidth=0.8)
    drained = [(report.get("spike_drained_seconds"), "tab:red", "keyorder")]
    if keda is not None:
        drained.append((keda.drained_seconds, "tab:purple", "KEDA"))
    for at, color, who in drained:  # the lag then is the steady stream's, not the spike's
        if at is not None:
            lag_axes.axvline(at, color=color, linestyle="--", linewidth=1)
            lag_axes.annotate(
                f"{who}: spike drained, {at:.0f} s",
                (at, 0.5),
                xycoords=("data", "axes fraction"),
                rotation=90,
                color=color,
                fontsize=8,
                ha="right",
                va="center",
            )
    lag_axes.legend(loc="upper right")
    size_axes.legend(loc="upper center", ncol=3, fontsize=8)
    for axes in (lag_axes, size_axes):
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def print_simulated(
    simulated: dict[str, float | None], keyorder_seconds: float | None, keda_seconds: float | None
) -> None:
    """The simulator's drain times for this spike beside this run's (``groupsim.demo_replay``)."""

    def beside(name: str, measured: float | None) -> str:
        predicted = simulated.get(name.lower())
        if predicted is None:
            return f"{name} did not drain"
        if measured is None:
            return f"{name} {predicted:,.1f} s"
        return f"{name} {predicted:,.1f} s (this run {measured:,.1f} s, {100 * (predicted / measured - 1):+.0f}%)"

    shown = [beside("keyorder", keyorder_seconds)]
    if keda_seconds is not None:
        shown.append(beside("KEDA", keda_seconds))
    print(f"  keyorder simulate, replaying this spike: {'; '.join(shown)}")
