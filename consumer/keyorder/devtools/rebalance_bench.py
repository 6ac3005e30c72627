"""``keyorder rebalance-bench``: what one scale step costs the group, eager against cooperative, in one run.

Every step the operator takes changes the group's membership, and a membership change is a
rebalance. An eager one (``range``) takes every partition from every member until the group has
rejoined; a cooperative one (``cooperative-sticky``, keyorder's default) moves only the partitions
that change owner. This bench measures the difference instead of asserting it: it grows a group of
``keyorder run`` processes (``LocalPods``, the laptop stand-in for the operator's Deployment) under
a backlog, 1 -> 2 -> 4 -> 8 pods by default, once per strategy, each strategy on its own topic and
group, on the embedded broker, and reads every handler call's start time, key, sequence number and
partition back from the pods (``bench_handlers``' records, one file per pod process).

Per step, over the window from the scale call to the next one (``step_figures``, pure):

- **group stall**: the longest time in which no handler call started anywhere in the group;
- **kept-pod stall**: the longest such time of any pod that was running before the step (a pod that
  keeps partitions should not stop; under an eager rebalance it does);
- **partition wait**: the longest time any one partition went without a call (what a moved
  partition waits for its new owner; eager rebalances make every partition wait);

and per strategy, over the steps (not the pods' shutdown at the end), re-deliveries (calls of a
``(key, seq)`` already handled) and order violations (a key's first calls out of sequence). The
figures are compared as ratios within one run (the machine is shared); ``--output-dir`` gets the
JSON report, a markdown table and a plot of the group's and each pod's calls per second.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from keyorder.devtools.bench_handlers import LATENCY_VARIABLE, RECORDS_DIR_VARIABLE, read_records
from keyorder.devtools.embedded import FAST_GROUP_JOIN, EmbeddedBroker
from keyorder.devtools.loadgen import create_topics, produce_keyed
from keyorder.devtools.local_pods import LocalPods
from keyorder.progress import Progress

STRATEGIES = {"eager": "range", "cooperative": "cooperative-sticky"}
"""The strategies compared: a name for the report -> librdkafka's ``partition.assignment.strategy``."""

Call = tuple[float, str, int, int]
"""One handler call: ``(started, key, seq, partition)``; ``started`` on the machine's monotonic clock."""


@dataclass(frozen=True)
class StepFigures:
    """One scale step of one strategy (seconds unless named otherwise)."""

    pods_before: int
    pods_after: int
    group_stall: float
    kept_pod_stall: float
    """The longest stop of a pod that was running before the step (0 for the first step: none was)."""
    partition_wait: float
    calls: int


@dataclass
class StrategyRun:
    strategy: str
    assignment_strategy: str
    steps: list[StepFigures] = field(default_factory=list)
    calls: int = 0
    redeliveries: int = 0
    order_violations: int = 0
    per_pod: dict[str, list[float]] = field(default_factory=dict)
    """Each pod's call start times relative to the first step (for the plot)."""
    step_times: list[float] = field(default_factory=list)
    """The scale calls, relative to the first step."""


def longest_gap(times: Sequence[float], start: float, end: float) -> float:
    """The longest time within ``[start, end]`` without an entry of the sorted ``times`` (edges included)."""
    inside = [t for t in times if start <= t <= end]
    edges = [start, *inside, end]
    return max(later - earlier for earlier, later in itertools.pairwise(edges))


def step_figures(
    calls_by_pod: Mapping[str, Sequence[Call]],
    pods_started: Mapping[str, float],
    steps: Sequence[tuple[float, int]],
    end: float,
) -> list[StepFigures]:
    """Per step ``(scale call time, pods after it)``, up to the next step (the last one up to ``end``).

    ``pods_started`` says when each pod was started: the kept-pod stall looks only at pods started
    before the step. Pure: the bench's I/O ends before this is called.
    """
    everything = sorted(started for calls in calls_by_pod.values() for started, *_ in calls)
    by_pod = {pod: sorted(started for started, *_ in calls) for pod, calls in calls_by_pod.items()}
    by_partition: dict[int, list[float]] = defaultdict(list)
    for calls in calls_by_pod.values():
        for started, _key, _seq, partition in calls:
            by_partition[partition].append(started)
    for times in by_partition.values():
        times.sort()
    figures = []
    pods_before = 0
    for index, (start, pods_after) in enumerate(steps):
        stop = steps[index + 1][0] if index + 1 < len(steps) else end
        kept = [pod for pod, started_at in pods_started.items() if started_at < start]
        figures.append(
            StepFigures(
                pods_before=pods_before,
                pods_after=pods_after,
                group_stall=round(longest_gap(everything, start, stop), 3),
                kept_pod_stall=round(
                    max((longest_gap(by_pod.get(pod, []), start, stop) for pod in kept), default=0.0), 3
                ),
                partition_wait=round(
                    max((longest_gap(times, start, stop) for times in by_partition.values()), default=0.0), 3
                ),
                calls=sum(1 for t in everything if start <= t < stop),
            )
        )
        pods_before = pods_after
    return figures


def delivery_audit(calls: Iterable[Call]) -> tuple[int, int]:
    """``(re-deliveries, order violations)``: calls of a ``(key, seq)`` seen before, and first calls
    of a key whose sequence number is not the next one (a gap or a swap)."""
    seen: set[tuple[str, int]] = set()
    expected: dict[str, int] = {}
    redeliveries = violations = 0
    for _started, key, seq, _partition in sorted(calls):
        if (key, seq) in seen:
            redeliveries += 1
            continue
        seen.add((key, seq))
        if seq != expected.get(key, 0):
            violations += 1
        expected[key] = max(expected.get(key, 0), seq + 1)
    return redeliveries, violations


@dataclass(frozen=True)
class Options:
    steps: tuple[int, ...]
    partitions: int
    step_seconds: float
    latency_ms: float
    workers: int
    keys: int


def _pod_settings(bootstrap: str, topic: str, strategy: str, options: Options, records: Path) -> dict[str, str]:
    return {
        "KEYORDER_HANDLER": "keyorder.devtools.bench_handlers:sleep",
        "KEYORDER_HANDLER_TEARDOWN": "keyorder.devtools.bench_handlers:save",
        "KEYORDER_TOPICS": topic,
        "KEYORDER_GROUP_ID": f"group-{topic}",
        "KEYORDER_BOOTSTRAP_SERVERS": bootstrap,
        "KEYORDER_WORKERS": str(options.workers),
        "KEYORDER_SHUTDOWN_GRACE": "10",
        "KEYORDER_KAFKA_PROPERTY": ",".join([*FAST_GROUP_JOIN, f"partition.assignment.strategy={strategy}"]),
        "KEYORDER_LOG_LEVEL": "WARNING",
        RECORDS_DIR_VARIABLE: str(records),
        LATENCY_VARIABLE: str(options.latency_ms / 1000),
    }


def backlog_for(options: Options) -> int:
    """Enough messages that no partition runs dry before the last step ends (each pod at its ideal rate)."""
    per_pod = options.workers / (options.latency_ms / 1000)
    return int(1.5 * per_pod * options.step_seconds * sum(options.steps)) + 1_000


def run_strategy(bootstrap: str, name: str, options: Options, workdir: Path, progress: Progress) -> StrategyRun:
    strategy = STRATEGIES[name]
    topic = f"rebalance-{name}-{int(time.time())}"
    create_topics(bootstrap, [topic], options.partitions)
    total = backlog_for(options)
    produce_keyed(
        bootstrap,
        topic,
        total,
        options.keys,
        seed=42,
        progress=lambda n: progress.show(f"[{name}] producing {n:,}/{total:,}"),
    )
    records = workdir / name
    records.mkdir()
    pods = LocalPods(workdir, _pod_settings(bootstrap, topic, strategy, options, records), name=name)
    started_at: dict[int, float] = {}
    steps: list[tuple[float, int]] = []
    try:
        for size in options.steps:
            now = time.monotonic()
            pods.scale(size)
            for pod in pods.pods:
                started_at.setdefault(pod.process.pid, now)
            steps.append((now, size))
            deadline = now + options.step_seconds
            while time.monotonic() < deadline:
                if crashed := pods.crashed():
                    log = workdir / crashed[0].split(":")[0]
                    tail = log.read_text().strip().splitlines()[-5:]
                    raise RuntimeError(f"a pod died: {crashed}; its log ends:\n" + "\n".join(tail))
                progress.show(
                    f"[{name}] {size} pods ({strategy}), {deadline - time.monotonic():4.1f} s left in the step"
                )
                time.sleep(0.5)
        end = time.monotonic()
    finally:
        pods.stop_all()  # SIGTERM: each pod finishes, commits and writes its records (the tear-down hook)
    calls_by_pod: dict[str, list[Call]] = {}
    for path in records.glob("*.txt"):
        pid = int(path.name.split("-")[0])
        calls_by_pod.setdefault(str(pid), []).extend(read_records(path.read_text().splitlines()))
    pods_started = {str(pid): at for pid, at in started_at.items()}
    first = steps[0][0]
    run = StrategyRun(name, strategy, step_figures(calls_by_pod, pods_started, steps, end))
    # the steps only: stopping the pods at the end is a cascade of leaves, not a scale step
    during_steps = [call for calls in calls_by_pod.values() for call in calls if call[0] <= end]
    run.calls = len(during_steps)
    run.redeliveries, run.order_violations = delivery_audit(during_steps)
    run.per_pod = {
        pod: sorted(call[0] - first for call in calls if call[0] <= end) for pod, calls in calls_by_pod.items()
    }
    run.step_times = [at - first for at, _size in steps]
    return run


def markdown(runs: Sequence[StrategyRun]) -> str:
    rows = [
        "| strategy | step | group stall (s) | longest stop of a pod that kept partitions (s) "
        "| longest partition wait (s) |",
        "|---|---|---|---|---|",
    ]
    for run in runs:
        for step in run.steps:
            kept = f"{step.kept_pod_stall:.2f}" if step.pods_before else "-"
            rows.append(
                f"| {run.strategy} ({run.assignment_strategy}) | {step.pods_before} -> {step.pods_after} | "
                f"{step.group_stall:.2f} | {kept} | {step.partition_wait:.2f} |"
            )
    lines = ["\n".join(rows), ""]
    for run in runs:
        lines.append(
            f"{run.strategy}: {run.calls:,} handler calls, {run.redeliveries} re-deliveries, "
            f"{run.order_violations} order violations"
        )
    return "\n".join(lines) + "\n"


def comparison(runs: Sequence[StrategyRun]) -> dict[str, float | int | None]:
    """Eager ÷ cooperative, over the steps that changed an existing group (one run: ratios)."""
    by_name = {run.strategy: run for run in runs}
    if set(by_name) != set(STRATEGIES):
        return {}
    eager, cooperative = by_name["eager"], by_name["cooperative"]

    def worst(run: StrategyRun, attribute: str) -> float:
        return max((getattr(step, attribute) for step in run.steps if step.pods_before), default=0.0)

    def ratio(attribute: str) -> float | None:
        below = worst(cooperative, attribute)
        return round(worst(eager, attribute) / below, 2) if below > 0 else None

    return {
        "worst_group_stall_eager_s": worst(eager, "group_stall"),
        "worst_group_stall_cooperative_s": worst(cooperative, "group_stall"),
        "group_stall_eager_over_cooperative": ratio("group_stall"),
        "worst_kept_pod_stall_cooperative_s": worst(cooperative, "kept_pod_stall"),
        "worst_partition_wait_eager_s": worst(eager, "partition_wait"),
        "worst_partition_wait_cooperative_s": worst(cooperative, "partition_wait"),
        # the work done over the same steps: what the stalls and the waits cost together
        "calls_cooperative_over_eager": round(cooperative.calls / eager.calls, 2) if eager.calls else None,
        "redeliveries_eager": eager.redeliveries,
        "redeliveries_cooperative": cooperative.redeliveries,
    }


def plot(runs: Sequence[StrategyRun], path: Path, bin_seconds: float = 0.25) -> Path:
    """The group's and each pod's handler calls per second, one panel per strategy, the scale steps marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(runs), 1, sharex=True, figsize=(10, 3.2 * len(runs)), dpi=100, squeeze=False)
    for panel, run in zip(axes[:, 0], runs, strict=True):
        horizon = max((times[-1] for times in run.per_pod.values() if times), default=1.0)
        bins = int(horizon / bin_seconds) + 1
        moments = [i * bin_seconds for i in range(bins)]
        group = [0] * bins
        for index, (_pod, times) in enumerate(sorted(run.per_pod.items(), key=lambda item: item[1][:1] or [0.0])):
            counts = [0] * bins
            for t in times:
                if t >= 0:
                    counts[int(t / bin_seconds)] += 1
                    group[int(t / bin_seconds)] += 1
            panel.plot(moments, [c / bin_seconds for c in counts], linewidth=0.6, alpha=0.7, label=f"pod {index + 1}")
        panel.plot(moments, [c / bin_seconds for c in group], color="black", linewidth=1.2, label="the group")
        for at in run.step_times:
            panel.axvline(at, color="0.5", linestyle=":", linewidth=0.8)
        panel.set_title(f"{run.strategy} ({run.assignment_strategy})", fontsize=9)
        panel.set_ylabel("handler calls/s")
        panel.legend(loc="upper right", fontsize=7, ncol=4)
    axes[-1, 0].set_xlabel("seconds since the first pod started (dotted: a scale step)")
    figure.suptitle("keyorder rebalance-bench: the group's and each pod's handler calls while it grows", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def add_rebalance_bench_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", default="1,2,4,8", help="pod counts, in order [default: 1,2,4,8]")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of each topic [default: 8]")
    parser.add_argument("--step-seconds", type=float, default=15.0, help="time at each size [default: 15]")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="handler latency [default: 20]")
    parser.add_argument("--workers", type=int, default=8, help="key workers per pod [default: 8]")
    parser.add_argument("--keys", type=int, default=2_000, help="distinct keys [default: 2000]")
    parser.add_argument(
        "--strategies", default="eager,cooperative", help="which to run, of eager,cooperative [default: both]"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("bench-results"),
        help="where rebalance.json, rebalance.md and rebalance.png go [default: bench-results]",
    )


def parse_options(args: argparse.Namespace) -> tuple[Options, list[str]]:
    """The options, or ``ValueError`` naming the flag that is wrong."""
    try:
        steps = tuple(int(part) for part in args.steps.split(","))
    except ValueError:
        raise ValueError(f"--steps must be comma-separated pod counts, got {args.steps!r}") from None
    if not steps or any(size < 1 for size in steps) or list(steps) != sorted(set(steps)):
        raise ValueError(f"--steps must be increasing pod counts of at least 1, got {args.steps!r}")
    if steps[-1] > args.partitions:
        raise ValueError(
            f"--steps goes to {steps[-1]} pods but --partitions is {args.partitions}: the extra pods would idle"
        )
    strategies = [name.strip() for name in args.strategies.split(",") if name.strip()]
    unknown = [name for name in strategies if name not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"--strategies: unknown {unknown or strategies}; choose from {', '.join(STRATEGIES)}")
    for flag, value in (("--step-seconds", args.step_seconds), ("--latency-ms", args.latency_ms)):
        if value <= 0:
            raise ValueError(f"{flag} must be positive, got {value}")
    for flag, value in (("--workers", args.workers), ("--keys", args.keys), ("--partitions", args.partitions)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    return Options(steps, args.partitions, args.step_seconds, args.latency_ms, args.workers, args.keys), strategies


def rebalance_bench_command(args: argparse.Namespace) -> int:
    try:
        options, strategies = parse_options(args)
    except ValueError as error:
        print(f"keyorder rebalance-bench: {error}")
        return 2
    progress = Progress()
    runs = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="keyorder-rebalance-") as workdir:
        for name in strategies:
            runs.append(run_strategy(broker.bootstrap, name, options, Path(workdir), progress))
            progress.done()
    args.output_dir.mkdir(parents=True, exist_ok=True)
    ratios = comparison(runs)
    report = {
        "options": asdict(options),
        "runs": [asdict(run) | {"per_pod": None} for run in runs],
        "comparison": ratios,
    }
    (args.output_dir / "rebalance.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(runs)
    (args.output_dir / "rebalance.md").write_text(table)
    image = plot(runs, args.output_dir / "rebalance.png")
    print(table)
    for name, value in ratios.items():
        print(f"  {name}: {value}")
    print(f"wrote {args.output_dir / 'rebalance.json'}, {args.output_dir / 'rebalance.md'}, {image}")
    return 0
