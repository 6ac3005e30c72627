"""``keyorder dev`` (``make demo``): a backlog spike absorbed by autoscaling, on one machine.

The whole mission with real parts and no cluster: the embedded broker; order-lifecycle events
(a spike, then a steady stream); ``keyorder run`` subprocesses as the pods; and the operator's
own scaling policy and worker push driving them through a local-process backend
(``local_pods``). It shows a live view, audits every order's events at the end (in order, none
lost), writes a chart and a JSON report, and optionally compares with a static
partition-ordered group at the partition cap (the best KEDA plus a plain consumer can do).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from keyorder.devtools.embedded import FAST_GROUP_JOIN, EmbeddedBroker
from keyorder.devtools.loadgen import OrderStream, create_topics
from keyorder.devtools.local_pods import LocalPods
from keyorder.logs import configure_logging

TOPIC = "orders"
SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class DevOptions:
    partitions: int = 8
    spike: int = 200_000
    rate: float = 100.0
    latency_min_ms: float = 5.0
    latency_max_ms: float = 20.0
    target_drain_seconds: float = 60.0
    initial_workers: int = 4
    max_workers: int = 64
    poll_seconds: float = 2.0
    scale_down_window: float = 15.0
    timeout: float = 900.0
    compare: bool = True
    compare_seconds: float = 30.0
    seed: int = 7
    ui: bool = True
    output_dir: Path = Path("demo-results")


QUICK = DevOptions(
    partitions=4,
    spike=12_000,
    rate=20.0,
    target_drain_seconds=15.0,
    poll_seconds=1.0,
    scale_down_window=5.0,
    compare_seconds=12.0,
    max_workers=32,
)
"""``--quick``: a smaller run (copied before the flags are applied to it)."""


def add_dev_flags(parser: argparse.ArgumentParser) -> None:
    defaults = DevOptions()
    parser.add_argument("--partitions", type=int, help=f"topic partitions [default: {defaults.partitions}]")
    parser.add_argument("--spike", type=int, help=f"events in the backlog spike [default: {defaults.spike}]")
    parser.add_argument("--rate", type=float, help=f"steady events/s after the spike [default: {defaults.rate:g}]")
    parser.add_argument("--latency-min-ms", type=float, help="handler latency, lower bound [default: 5]")
    parser.add_argument("--latency-max-ms", type=float, help="handler latency, upper bound [default: 20]")
    parser.add_argument("--target-drain-seconds", type=float, help="autoscaler target [default: 60]")
    parser.add_argument("--max-workers", type=int, help="key workers per pod, at most [default: 64]")
    parser.add_argument("--timeout", type=float, help="give up after this many seconds [default: 900]")
    parser.add_argument(
        "--compare",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure a static partition-ordered group on the same spike [default: on]",
    )
    parser.add_argument("--compare-seconds", type=float, help="measurement window of the comparison [default: 30]")
    parser.add_argument("--seed", type=int, help="random seed of the event stream [default: 7]")
    parser.add_argument("--no-ui", action="store_true", help="plain log lines instead of the live view (CI)")
    parser.add_argument("--quick", action="store_true", help="a shortened run (4 partitions, 12k events)")
    parser.add_argument("--output-dir", type=Path, help="where demo.png and report.json go [default: demo-results]")


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


def plot(timeline: Timeline, report: dict, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    times = [point["t"] for point in timeline.points]
    figure, (lag_axes, size_axes) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), dpi=110)
    lag_axes.plot(times, [point["lag"] for point in timeline.points], color="tab:red", label="lag (messages)")
    lag_axes.set_ylabel("lag")
    lag_axes.set_title(
        f"keyorder dev: {report['options']['spike']:,}-event spike on {report['options']['partitions']}"
        f" partitions, handler {report['options']['latency_min_ms']:g}-"
        f"{report['options']['latency_max_ms']:g} ms"
    )
    size_axes.step(times, [point["replicas"] for point in timeline.points], where="post", label="replicas")
    size_axes.step(times, [point["workers"] for point in timeline.points], where="post", label="workers per pod")
    size_axes.set_yscale("symlog")
    size_axes.set_ylabel("size")
    size_axes.set_xlabel("seconds")
    for decision in timeline.decisions:
        for axes in (lag_axes, size_axes):
            axes.axvline(decision["t"], color="grey", alpha=0.3, linewidth=0.8)
    lag_axes.legend(loc="upper right")
    size_axes.legend(loc="upper right")
    for axes in (lag_axes, size_axes):
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def pod_settings(bootstrap: str, group: str, options: DevOptions, **extra: str) -> dict[str, str]:
    return {
        "KEYORDER_HANDLER": "keyorder_example.orders:handle",
        "KEYORDER_TOPICS": TOPIC,
        "KEYORDER_GROUP_ID": group,
        "KEYORDER_BOOTSTRAP_SERVERS": bootstrap,
        "KEYORDER_WORKERS": str(options.initial_workers),
        "KEYORDER_MAX_WORKERS": str(max(options.max_workers, 1)),
        "KEYORDER_SHUTDOWN_GRACE": "10",
        "KEYORDER_KAFKA_PROPERTY": ",".join(FAST_GROUP_JOIN),
        "KEYORDER_EXAMPLE_LATENCY_MIN_MS": str(options.latency_min_ms),
        "KEYORDER_EXAMPLE_LATENCY_MAX_MS": str(options.latency_max_ms),
        "KEYORDER_LOG_LEVEL": "WARNING",
        **extra,
    }


def measure_static_group(bootstrap: str, options: DevOptions, workdir: Path, lag_source, spike_end: int) -> dict:
    """A partition-ordered group at the partition cap (one worker per partition): its drain rate."""
    pods = LocalPods(
        workdir,
        pod_settings(
            bootstrap, "static-partition-ordered", options, KEYORDER_ORDERING="partition", KEYORDER_WORKERS="1"
        ),
        name="static",
    )
    pods.scale(options.partitions)
    try:
        first = None
        deadline = time.monotonic() + 90
        while first is None and time.monotonic() < deadline:
            try:
                sample = lag_source.sample([TOPIC], "static-partition-ordered", time.time())
                first = sample if sample.committed_total > 0 else None
            except Exception:  # LagUnavailable until the group's first commit
                first = None
            time.sleep(0.5)
        if first is None:
            return {"error": "the static group never committed"}
        time.sleep(options.compare_seconds)
        last = lag_source.sample([TOPIC], "static-partition-ordered", time.time())
    finally:
        pods.stop_all()
    rate = (last.committed_total - first.committed_total) / (last.at - first.at)
    return {
        "pods": options.partitions,
        "workers_per_pod": 1,
        "measured_seconds": round(last.at - first.at, 1),
        "rate": round(rate, 1),
        "projected_spike_drain_seconds": round(spike_end / rate, 1) if rate else None,
    }


def dev_command(args: argparse.Namespace) -> int:
    from keyorder_operator.observe import KafkaLagSource, LagUnavailable, rates
    from keyorder_operator.pod_admin import push_workers
    from keyorder_operator.policy import Observation, ScalingLimits, ScalingState, Size, decide

    configure_logging("WARNING")
    options = replace(QUICK) if args.quick else DevOptions()
    for name in (
        "partitions",
        "spike",
        "rate",
        "latency_min_ms",
        "latency_max_ms",
        "target_drain_seconds",
        "max_workers",
        "timeout",
        "compare",
        "compare_seconds",
        "seed",
        "output_dir",
    ):
        if getattr(args, name, None) is not None:
            setattr(options, name, getattr(args, name))
    options.ui = not args.no_ui
    options.output_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="keyorder-dev-"))
    journal = workdir / "journal.txt"
    print(
        f"keyorder dev: spike of {options.spike:,} order events on {options.partitions} partitions, then "
        f"{options.rate:g}/s; handler {options.latency_min_ms:g}-{options.latency_max_ms:g} ms; work dir {workdir}"
    )
    limits = ScalingLimits(
        min_replicas=1,
        initial_workers=options.initial_workers,
        max_workers=options.max_workers,
        target_drain_seconds=options.target_drain_seconds,
        activation_lag=50,
        scale_down_window_seconds=options.scale_down_window,
    )
    timeline = Timeline()
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap, [TOPIC], options.partitions)
        stream = OrderStream(broker.bootstrap, TOPIC, seed=options.seed)
        produced_at = time.monotonic()
        for start in range(0, options.spike, 5_000):
            stream.emit(min(5_000, options.spike - start))
            print(f"  producing the spike: {min(start + 5_000, options.spike):,}/{options.spike:,}", flush=True)
        stream.flush()
        print(f"  spike written in {time.monotonic() - produced_at:.0f}s")
        lag_source = KafkaLagSource({"bootstrap.servers": broker.bootstrap})
        spike_end = stream.written
        pods = LocalPods(
            workdir, pod_settings(broker.bootstrap, "keyorder-dev", options, KEYORDER_EXAMPLE_JOURNAL=str(journal))
        )
        stop_producing = threading.Event()
        stream_lock = threading.Lock()

        def steady() -> None:
            while not stop_producing.wait(0.1):
                with stream_lock:
                    stream.emit(max(int(options.rate / 10), 1))

        producer_thread = threading.Thread(target=steady, name="steady-producer", daemon=True)
        state = ScalingState(Size(1, options.initial_workers))
        pods.scale(1)
        producer_thread.start()
        view = View(options.ui)
        started = time.monotonic()
        previous = None
        history: list[int] = []
        drained_at = scaled_in_at = None
        peak = Size(1, options.initial_workers)
        try:
            while time.monotonic() - started < options.timeout:
                time.sleep(options.poll_seconds)
                elapsed = time.monotonic() - started
                crashed = pods.crashed()
                if crashed:
                    raise RuntimeError(f"a consumer process died: {crashed}")
                try:
                    sample = lag_source.sample([TOPIC], "keyorder-dev", time.time())
                except LagUnavailable:
                    sample = None
                drain, arrival = rates(previous, sample) if sample else (None, None)
                observation = Observation(
                    lag=sample.lag if sample else None,
                    partitions=sample.partitions if sample else None,
                    drain_rate=drain,
                    arrival_rate=arrival,
                )
                decision = decide(observation, limits, state, time.time())
                state = decision.state
                target = decision.target
                pods.scale(target.replicas)
                for address in pods.ready_addresses():
                    host, port = address.rsplit(":", 1)
                    push_workers([host], int(port), pods.token, target.workers)
                if decision.scaled:
                    timeline.decisions.append({"t": round(elapsed, 1), "reason": decision.reason})
                    if not options.ui:
                        print(f"  decision: {decision.reason}", flush=True)
                if target.capacity > peak.capacity:
                    peak = target
                if sample:
                    previous = sample
                    history.append(sample.lag)
                    if drained_at is None and sample.committed_total >= spike_end:
                        drained_at = round(elapsed, 1)
                timeline.points.append(
                    {
                        "t": round(elapsed, 2),
                        "lag": sample.lag if sample else None,
                        "replicas": target.replicas,
                        "workers": target.workers,
                        "drain_rate": drain,
                    }
                )
                view.update(elapsed, sample, target.replicas, target.workers, drain, history, timeline.decisions)
                if drained_at is not None and peak.replicas > 1 and target.capacity <= peak.capacity / 4:
                    scaled_in_at = round(elapsed, 1)
                    break
        finally:
            view.stop()
            stop_producing.set()
            producer_thread.join(10)
        with stream_lock:
            stream.flush()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the last steady events, then stop the pods
            sample = lag_source.sample([TOPIC], "keyorder-dev", time.time())
            if sample.lag == 0:
                break
            time.sleep(0.5)
        pods.stop_all()
        comparison = None
        if options.compare and drained_at is not None:
            print(
                f"  comparing: a static partition-ordered group ({options.partitions} pods x 1 worker) "
                f"for {options.compare_seconds:g}s ...",
                flush=True,
            )
            comparison = measure_static_group(broker.bootstrap, options, workdir, lag_source, spike_end)
    result = audit(journal, stream.expected)
    report = {
        "options": {key: str(value) if isinstance(value, Path) else value for key, value in asdict(options).items()},
        "spike_events": spike_end,
        "spike_drained_seconds": drained_at,
        "scaled_in_seconds": scaled_in_at,
        "peak": {"replicas": peak.replicas, "workers_per_pod": peak.workers},
        "audit": result,
        "decisions": timeline.decisions,
        "timeline": timeline.points,
        "static_comparison": comparison,
    }
    (options.output_dir / "report.json").write_text(json.dumps(report, indent=2))
    image = plot(timeline, report, options.output_dir / "demo.png")
    print(
        f"  peak size {peak.replicas} pods x {peak.workers} workers; spike drained in "
        f"{drained_at if drained_at is not None else 'n/a'} s; scaled back in at "
        f"{scaled_in_at if scaled_in_at is not None else 'n/a'} s"
    )
    if comparison and comparison.get("projected_spike_drain_seconds") and drained_at:
        ratio = comparison["projected_spike_drain_seconds"] / drained_at
        print(
            f"  static partition-ordered group: {comparison['rate']:,.0f} msg/s -> spike drain "
            f"{comparison['projected_spike_drain_seconds']:,.0f} s (projected); keyorder autoscaled: "
            f"{drained_at:,.0f} s: {ratio:.1f}x faster"
        )
    print(
        f"  audit: {result['events']:,} events of {result['orders']:,} orders; order violations "
        f"{result['order_violations']}; lost {result['lost_events']}; re-delivered {result['redelivered_events']}"
    )
    print(f"  report: {options.output_dir / 'report.json'}" + (f", chart: {image}" if image else ""))
    ok = (
        result["order_violations"] == 0
        and result["lost_events"] == 0
        and drained_at is not None
        and scaled_in_at is not None
    )
    print("keyorder dev: OK" if ok else "keyorder dev: FAILED")
    return 0 if ok else 1
