"""The picture of a simulated run: lag, rates and size over time, with every decision that changed the size.

Three panels sharing the time axis (minutes): the lag (shaded while it could not be read or the
resource was paused); arrivals, the drain and the ready pods' true capacity in messages/s; the
decided replicas, the pods actually in the group and the workers per pod. Vertical lines mark the
scenario's events (a burst, pods going silent, a spec change) and each scaling decision.
``plot_comparison`` draws a scenario's keyorder run and its KEDA reference run on the same axes.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from keyorder.devtools.groupsim.criteria import Measured, failures


def plot(measured: Measured, path: Path) -> Path:
    """Write the run's PNG to ``path`` (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = measured.run
    scenario = run.scenario
    points = run.points
    minutes = [p.t / 60 for p in points]
    figure, (lag_axes, rate_axes, size_axes) = plt.subplots(3, 1, sharex=True, figsize=(10, 8), dpi=100)
    figure.suptitle(f"keyorder simulate {scenario.name} (seed {run.seed})\n{scenario.summary}", fontsize=10)

    lag_axes.plot(minutes, [p.lag for p in points], color="tab:red", label="lag (messages)")
    for where, color, label in (
        ([p.lag_unknown for p in points], "0.85", "lag unknown"),
        ([p.paused for p in points], "#cde", "paused"),
    ):
        if any(where):
            lag_axes.fill_between(
                minutes,
                0,
                1,
                where=where,
                color=color,
                alpha=0.6,
                transform=lag_axes.get_xaxis_transform(),
                label=label,
            )
    lag_axes.set_ylabel("lag")
    lag_axes.legend(loc="upper right", fontsize=8)

    rate_axes.plot(minutes, [p.arrival_rate for p in points], color="0.6", linewidth=0.6, label="arrivals/s")
    rate_axes.plot(minutes, [p.drain_rate for p in points], color="tab:blue", linewidth=0.6, label="drain/s")
    rate_axes.plot(minutes, [p.capacity for p in points], color="tab:green", label="ready capacity/s (truth)")
    rate_axes.set_ylabel("messages/s")
    # a burst within one step would flatten everything else: the scale follows the capacity then
    steady_peak = max((scenario.arrivals(p.t) for p in points), default=1.0)
    rate_axes.set_ylim(0, max(max((p.capacity for p in points), default=1.0), steady_peak) * 1.15)
    rate_axes.legend(loc="upper right", fontsize=8)

    size_axes.step(minutes, [p.replicas for p in points], where="post", color="tab:purple", label="replicas (decided)")
    size_axes.step(
        minutes, [p.ready for p in points], where="post", color="tab:purple", linestyle=":", label="pods in the group"
    )
    size_axes.step(minutes, [p.workers for p in points], where="post", color="tab:orange", label="workers per pod")
    size_axes.set_ylabel("size")
    size_axes.set_xlabel("minutes")
    size_axes.legend(loc="upper right", fontsize=8)

    for at, label in scenario.events():
        for axes in (lag_axes, rate_axes, size_axes):
            axes.axvline(at / 60, color="tab:red", alpha=0.35, linestyle="--")
        lag_axes.annotate(
            label,
            (at / 60, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            rotation=90,
            va="top",
            ha="right",
            color="tab:red",
        )
    for poll in run.polls:
        if poll.target != poll.before:
            size_axes.axvline(poll.t / 60, color="0.5", alpha=0.25, linewidth=0.8)

    missed = failures(measured)
    verdict = "every criterion held" if not missed else "FAILED: " + "; ".join(missed)[:160]
    figure.text(0.01, 0.005, verdict, fontsize=7)
    figure.tight_layout(rect=(0, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def plot_comparison(ours: Measured, theirs: Measured, path: Path) -> Path:
    """The scenario under keyorder and under the KEDA reference on the same axes (``--against keda``):
    the lag, the drain and the ready capacity, and the replicas (and the handler workers in all)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenario = ours.run.scenario
    figure, (lag_axes, rate_axes, size_axes) = plt.subplots(3, 1, sharex=True, figsize=(10, 8), dpi=100)
    summary = "\n".join(textwrap.wrap(scenario.summary, 110))
    figure.suptitle(f"keyorder simulate {scenario.name} --against keda (seed {ours.run.seed})\n{summary}", fontsize=10)
    styles = (
        (ours, "keyorder", "tab:blue"),
        (theirs, "KEDA + HPA, plain consumer", "tab:red"),
    )
    for measured, label, color in styles:
        points = measured.run.points
        minutes = [p.t / 60 for p in points]
        lag_axes.plot(minutes, [p.lag for p in points], color=color, label=f"lag, {label}")
        rate_axes.plot(minutes, [p.drain_rate for p in points], color=color, linewidth=0.5, alpha=0.6)
        rate_axes.plot(minutes, [p.capacity for p in points], color=color, label=f"ready capacity/s, {label}")
        size_axes.step(minutes, [p.replicas for p in points], where="post", color=color, label=f"replicas, {label}")
    points = ours.run.points
    rate_axes.plot(
        [p.t / 60 for p in points], [p.arrival_rate for p in points], color="0.6", linewidth=0.6, label="arrivals/s"
    )
    steady_peak = max((scenario.arrivals(p.t) for p in points), default=1.0)
    capacity_peak = max((p.capacity for m in (ours, theirs) for p in m.run.points), default=1.0)
    rate_axes.set_ylim(0, max(capacity_peak, steady_peak) * 1.15)
    lag_axes.set_ylabel("lag (messages)")
    rate_axes.set_ylabel("messages/s (thin: drain)")
    size_axes.set_ylabel("replicas")
    size_axes.set_xlabel("minutes")
    for axes in (lag_axes, rate_axes, size_axes):
        axes.legend(loc="upper right", fontsize=8)
    for at, label in scenario.events():
        for axes in (lag_axes, rate_axes, size_axes):
            axes.axvline(at / 60, color="0.3", alpha=0.35, linestyle="--")
        lag_axes.annotate(
            label, (at / 60, 1.0), xycoords=("data", "axes fraction"), fontsize=7, rotation=90, va="top", ha="right"
        )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path
