"""``keyorder dev`` (``make demo``): a backlog spike absorbed by autoscaling, on one machine.

The whole mission with real parts and no cluster: the embedded broker; order-lifecycle events
(a spike, then a steady stream); ``keyorder run`` subprocesses as the pods; and the operator's
own scaling policy and worker push driving them through a local-process backend
(``local_pods``). It shows a live view, audits every order's events at the end (in order, none
lost), writes a chart and a JSON report, and (on by default) compares on the same spike with what a
platform team runs today: a plain partition-ordered group scaled by KEDA's Kafka trigger and the HPA
(``keda_group``), run beside the autoscaled group and charted on the same axes; and with a static
keyorder group started at the autoscaler's peak size, from the moment the autoscaled group drained the
spike (its peak is known then), beside the other two.

This module runs it (the broker, the stream, the groups, the sampling loop); its options and flags are
``demo_options``, and what it shows (the live view, the chart, the audit) is ``demo_view``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keyorder.devtools.demo_options import (  # noqa: F401 (QUICK and add_dev_flags: named here by cli.py and tests)
    EXAMPLE_HANDLER,
    QUICK,
    DevFlagError,
    DevOptions,
    _apply_flags,
    add_dev_flags,
    replayable,
    validate,
)
from keyorder.devtools.demo_view import Timeline, View, audit, plot, print_simulated
from keyorder.devtools.drain import crossing_seconds_before
from keyorder.devtools.embedded import FAST_GROUP_JOIN, EmbeddedBroker
from keyorder.devtools.groupsim.demo_replay import demo_keda_settings, replay
from keyorder.devtools.keda_group import KedaGroup, KedaGroupRun
from keyorder.devtools.loadgen import OrderStream, create_topics
from keyorder.devtools.local_pods import LocalPods
from keyorder.logs import configure_logging

if TYPE_CHECKING:
    from keyorder_operator.policy import Decision

TOPIC = "orders"
DLQ_TOPIC = "orders.dlq"
COMPARISON_DLQ_TOPIC = "orders.dlq.comparisons"
"""The comparison groups' dead letters: ``--poison-key`` counts the autoscaled group's in ``DLQ_TOPIC``."""


def pod_settings(bootstrap: str, group: str, options: DevOptions, **extra: str) -> dict[str, str]:
    return {
        "KEYORDER_HANDLER": options.handler or EXAMPLE_HANDLER,
        "KEYORDER_MAX_ATTEMPTS": "3",
        "KEYORDER_RETRY_INITIAL_BACKOFF": "0.05",
        "KEYORDER_RETRY_MAX_BACKOFF": "0.5",
        "KEYORDER_ON_EXHAUSTED": options.on_exhausted,
        "KEYORDER_DLQ_TOPIC": DLQ_TOPIC,
        "KEYORDER_TOPICS": TOPIC,
        "KEYORDER_GROUP_ID": group,
        "KEYORDER_BOOTSTRAP_SERVERS": bootstrap,
        "KEYORDER_WORKERS": str(options.initial_workers),
        "KEYORDER_MAX_WORKERS": str(max(options.max_workers, 1)),
        "KEYORDER_SHUTDOWN_GRACE": "10",
        "KEYORDER_KAFKA_PROPERTY": ",".join(
            [*FAST_GROUP_JOIN, f"partition.assignment.strategy={options.assignment_strategy}"]
        ),
        "KEYORDER_EXAMPLE_LATENCY_MIN_MS": str(options.latency_min_ms),
        "KEYORDER_EXAMPLE_LATENCY_MAX_MS": str(options.latency_max_ms),
        "KEYORDER_LOG_LEVEL": "WARNING",
        **extra,
    }


@dataclass(frozen=True)
class FixedGroupRun:
    """What ``run_fixed_group`` saw of a group kept at one size."""

    reached: Any = None
    """The first lag sample that met the condition (``None``: none did in time, or a pod died)."""
    reached_after: float | None = None
    """Seconds from starting the pods to that sample."""
    died: str | None = None
    """Set when a pod process died: which, and its exit code."""


def run_fixed_group(
    workdir: Path,
    settings: dict[str, str],
    name: str,
    replicas: int,
    lag_source,
    until: Callable[[Any], bool],
    seconds: float,
    interval: float,
    committed_threshold: int | None = None,
    abandoned: threading.Event | None = None,
) -> FixedGroupRun:
    """Run ``replicas`` pods with ``settings`` and sample the group's lag every ``interval`` seconds
    until a sample meets ``until`` (at most ``seconds``); with ``committed_threshold``, ``reached_after``
    is when the committed total crossed it (interpolated between samples). The pods are stopped before
    it returns, and as soon as ``abandoned`` is set. ``keyorder dev`` measures the autoscaled group against
    such a fixed-size group."""
    group = settings["KEYORDER_GROUP_ID"]
    pods = LocalPods(workdir, settings, name=name)
    started = time.monotonic()
    pods.scale(replicas)
    previous = None
    try:
        stop = abandoned or threading.Event()
        while time.monotonic() < started + seconds:
            if stop.wait(interval):
                return FixedGroupRun(died="abandoned: the demo stopped")
            if pods.crashed():
                return FixedGroupRun(died=f"a consumer process died: {pods.crashed()}")
            try:
                sample = lag_source.sample([TOPIC], group, time.time())
            except Exception:  # LagUnavailable until the group's first commit
                continue
            if until(sample):
                reached_after = time.monotonic() - started
                if committed_threshold is not None:
                    reached_after -= crossing_seconds_before(previous, sample, committed_threshold)
                return FixedGroupRun(sample, reached_after)
            previous = sample
        return FixedGroupRun()
    finally:
        pods.stop_all()


def measure_right_sized_group(
    bootstrap: str,
    options: DevOptions,
    workdir: Path,
    spike_end: int,
    size,
    abandoned: threading.Event | None = None,
) -> dict:
    """A keyorder group started at ``size`` (the autoscaler's peak) on the same topic from the
    beginning: how long it takes to drain the same spike. The autoscaler is judged against it. It reads
    the lag with a client of its own (it runs in a thread beside the demo's other groups)."""
    from keyorder_operator.observe import KafkaLagSource

    lag_source = KafkaLagSource({"bootstrap.servers": bootstrap})
    try:
        run = run_fixed_group(
            workdir,
            pod_settings(
                bootstrap,
                "static-right-sized",
                options,
                KEYORDER_WORKERS=str(size.workers),
                KEYORDER_DLQ_TOPIC=COMPARISON_DLQ_TOPIC,
            ),
            "right-sized",
            size.replicas,
            lag_source,
            until=lambda sample: sample.committed_total >= spike_end,
            seconds=options.timeout,
            interval=0.25,
            committed_threshold=spike_end,
            abandoned=abandoned,
        )
    finally:
        lag_source.close()
    if run.died:
        return {"error": run.died}
    return {
        "pods": size.replicas,
        "workers_per_pod": size.workers,
        "spike_drained_seconds": round(run.reached_after, 1) if run.reached_after is not None else None,
    }


def addresses_to_push(
    addresses: list[str], kept: Collection[str], reports: list[dict[str, Any]], decision: Decision
) -> list[str]:
    """The pods ``keyorder dev`` pushes the decided workers to, as the operator picks them
    (``Poll.explain``): those running another count or not reporting, and while a scale step has not
    settled (``decision.hold_workers``) not those running more; never a pod a scale-in just stopped (not in
    ``kept``: it refuses the push)."""
    from keyorder_operator.pod_admin import needing_push

    chosen = needing_push(addresses, reports, decision.target.workers, lower=not decision.hold_workers)
    return [address for address in chosen if address in kept]


def dev_command(args: argparse.Namespace) -> int:
    from keyorder_operator.observe import KafkaLagSource, LagUnavailable, observation_from
    from keyorder_operator.pod_admin import fetch_reports, push_workers
    from keyorder_operator.pod_signals import combine
    from keyorder_operator.policy import (
        Cause,
        LimitKind,
        Observation,
        RateKind,
        RateLimit,
        ScalingLimits,
        ScalingState,
        Size,
        decide,
    )

    configure_logging("WARNING")
    options = _apply_flags(args)
    try:
        validate(options)
    except DevFlagError as error:
        print(f"keyorder dev: error: {error}")
        return 2
    options.output_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="keyorder-dev-"))
    journal = workdir / "journal.txt"
    shape_of_keys = f"{options.keys:,} keys in progress"
    if options.hot_key_share:
        shape_of_keys += f", {options.hot_key_share:.0%} of the events on one hot key"
    if options.poison_key:
        shape_of_keys += f", a poison key ({options.on_exhausted} after 3 attempts)"
    print(
        f"keyorder dev: spike of {options.spike:,} order events on {options.partitions} partitions, then "
        f"{options.rate:g}/s; {shape_of_keys}; handler {options.handler or EXAMPLE_HANDLER} "
        f"({options.latency_min_ms:g}-{options.latency_max_ms:g} ms in the example); "
        f"{options.assignment_strategy} rebalances; work dir {workdir}"
    )
    limits = ScalingLimits(
        min_replicas=1,
        initial_workers=options.initial_workers,
        max_workers=options.max_workers,
        target_drain_seconds=options.target_drain_seconds,
        activation_lag=50,
        scale_down_window_seconds=options.scale_down_window,
        # the demo compresses time (a 30 s target, 2 s polls): HPA's default scale-up policy (4 pods or
        # 100% per 15 s) per poll instead of per 15 s
        scale_up_rates=(
            RateLimit(RateKind.PODS, 4, options.poll_seconds),
            RateLimit(RateKind.PERCENT, 100, options.poll_seconds),
        ),
    )
    timeline = Timeline()
    limits_hit: list[dict] = []
    blocked_polls = 0
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap, [TOPIC, DLQ_TOPIC, COMPARISON_DLQ_TOPIC], options.partitions)
        stream = OrderStream(
            broker.bootstrap,
            TOPIC,
            seed=options.seed,
            in_progress=options.keys,
            hot_key_share=options.hot_key_share,
            poison_every=1_000 if options.poison_key else 0,
        )
        produced_at = time.monotonic()
        for start in range(0, options.spike, 20_000):
            stream.emit(min(20_000, options.spike - start), bulk=True)
            print(f"  producing the spike: {min(start + 20_000, options.spike):,}/{options.spike:,}", flush=True)
        stream.seal(options.partitions)
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
        started = time.monotonic()
        keda = None
        comparisons = ThreadPoolExecutor(max_workers=1, thread_name_prefix="right-sized")
        right_sized_run: Future[dict] | None = None
        right_sized: dict | None = None
        if options.compare:  # beside the autoscaled group, from the same moment: one clock, one chart
            keda = KedaGroup(
                workdir,
                pod_settings(
                    broker.bootstrap,
                    "keda-partition-ordered",
                    options,
                    KEYORDER_ORDERING="partition",
                    KEYORDER_DLQ_TOPIC=COMPARISON_DLQ_TOPIC,  # the audit counts the autoscaled group's alone
                    KEYORDER_WORKERS=str(options.partitions),  # a handler thread per partition: a plain consumer
                ),
                KafkaLagSource({"bootstrap.servers": broker.bootstrap}),
                TOPIC,
                options.partitions,
                spike_end,
                demo_keda_settings(options.partitions, options.poll_seconds, options.scale_down_window),
                started,
                deadline=options.timeout,
            )
        abandoned = threading.Event()
        """Set on an error or Ctrl-C: the comparisons stop at once (their processes too)."""

        def abandon() -> None:
            abandoned.set()
            comparisons.shutdown(wait=True, cancel_futures=True)
            if keda is not None:
                keda.stop()
                keda.join()
            pods.stop_all()

        view = None
        previous = None
        history: list[int] = []
        drained_at = scaled_in_at = None
        previous_cause = None
        peak = Size(1, options.initial_workers)
        try:
            if keda is not None:
                keda.start()
                print(
                    f"  beside it: a partition-ordered group scaled by KEDA's Kafka trigger and the HPA "
                    f"(1 to {options.partitions} pods, a thread per partition)",
                    flush=True,
                )
            producer_thread.start()
            view = View(options.ui)
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
                addresses = pods.ready_addresses()
                reports, _ = fetch_reports(addresses, 0, pods.token)
                signals = combine(reports)
                if sample is None:
                    observation = Observation(lag=None, partitions=None, pods=signals)
                else:
                    observation = observation_from(
                        previous, sample, signals, len(addresses) == pods.replicas, pods_expected=len(addresses)
                    )
                decision = decide(observation, limits, state, time.time())
                state = decision.state
                target = decision.target
                pods.scale(target.replicas)
                kept = pods.addresses()  # not the ones a scale-in just stopped: they refuse the push
                push_workers(addresses_to_push(addresses, kept, reports, decision), 0, pods.token, target.workers)
                held_by_step_cost = decision.cause is Cause.STEP_COST and previous_cause is not Cause.STEP_COST
                previous_cause = decision.cause
                if decision.scaled or held_by_step_cost:  # a pod step refused is a decision too
                    timeline.decisions.append({"t": round(elapsed, 1), "reason": decision.reason})
                    if not options.ui:
                        print(f"  decision: {decision.reason}", flush=True)
                limited = decision.limited
                if limited is not None and (not limits_hit or limits_hit[-1]["message"] != limited.message):
                    limits_hit.append({"t": round(elapsed, 1), "kind": limited.kind.value, "message": limited.message})
                    timeline.decisions.append({"t": round(elapsed, 1), "reason": limited.message})
                    if not options.ui:
                        print(f"  limit: {limited.message}", flush=True)
                blocked_polls = blocked_polls + 1 if limited and limited.kind is LimitKind.BLOCKED_KEY else 0
                if target.capacity > peak.capacity:
                    peak = target
                drain = observation.drain_rate
                if sample:
                    if drained_at is None and sample.committed_total >= spike_end:
                        drained_at = round(elapsed - crossing_seconds_before(previous, sample, spike_end), 1)
                        if options.compare:  # the peak is known: the right-sized group runs beside the scale-in
                            right_sized_run = comparisons.submit(
                                measure_right_sized_group,
                                broker.bootstrap,
                                options,
                                workdir,
                                spike_end,
                                peak,
                                abandoned,
                            )
                            if not options.ui:
                                print(
                                    f"  comparing: a static keyorder group at the peak size ({peak.replicas} pods x "
                                    f"{peak.workers} workers from the start) on the same spike, beside the others ...",
                                    flush=True,
                                )
                    previous = sample
                    history.append(sample.lag)
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
                if drained_at is not None and peak == Size(1, options.initial_workers):
                    break  # drained without scaling (a limit held it, or the spike was small): nothing to scale in
                if blocked_polls >= 5:  # a blocked key pins the lag: nothing more to see
                    break
        except BaseException:
            abandon()
            raise
        finally:
            if view is not None:
                view.stop()
            stop_producing.set()
            if producer_thread.is_alive():
                producer_thread.join(10)
        keda_run: KedaGroupRun | None = None
        try:
            with stream_lock:
                stream.flush()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not blocked_polls:  # the last steady events, then stop the pods
                sample = lag_source.sample([TOPIC], "keyorder-dev", time.time())
                if sample.lag == 0:
                    break
                time.sleep(0.5)
            pods.stop_all()
            dead_letters = count_records(broker.bootstrap, DLQ_TOPIC) if options.poison_key else 0
            if right_sized_run is not None:
                print("  waiting for the right-sized group to drain the spike ...", flush=True)
                right_sized = right_sized_run.result()
            if keda is not None:
                if drained_at is None:
                    keda.stop()  # the autoscaled run did not drain: nothing to compare with
                print("  waiting for the KEDA group to drain the spike ...", flush=True)
                keda_run = keda.join()
            comparisons.shutdown()
        except BaseException:  # an error or Ctrl-C here must not leave the comparisons' processes running
            abandon()
            raise
    expected = {order: count for order, count in stream.expected.items() if order != OrderStream.POISON_ORDER}
    result = audit(journal, expected) if options.handler is None else None
    simulated = replay(options) if replayable(options) else None
    report = {
        "options": {key: str(value) if isinstance(value, Path) else value for key, value in asdict(options).items()},
        "spike_events": spike_end,
        "spike_drained_seconds": drained_at,
        "scaled_in_seconds": scaled_in_at,
        "peak": {"replicas": peak.replicas, "workers_per_pod": peak.workers},
        "limits": limits_hit,
        "poison_events": stream.poisoned,
        "dead_letters": dead_letters,
        "audit": result,
        "decisions": timeline.decisions,
        "timeline": timeline.points,
        "right_sized_comparison": right_sized,
        "keda_comparison": keda_run.report() if keda_run is not None else None,
        "simulated_drain_seconds": simulated,
    }
    (options.output_dir / "report.json").write_text(json.dumps(report, indent=2))
    image = plot(timeline, report, options.output_dir / "demo.png", keda_run)
    print(
        f"  peak size {peak.replicas} pods x {peak.workers} workers; spike drained in "
        f"{drained_at if drained_at is not None else 'n/a'} s; scaled back in at "
        f"{scaled_in_at if scaled_in_at is not None else 'n/a'} s"
    )
    for limit in limits_hit:
        print(f"  limit at {limit['t']:.0f} s: {limit['message']}")
    if right_sized and right_sized.get("spike_drained_seconds") and drained_at:
        ratio = drained_at / right_sized["spike_drained_seconds"]
        print(
            f"  right-sized static group ({right_sized['pods']} x {right_sized['workers_per_pod']} from the start, "
            "beside the others' tails): "
            f"spike drained in {right_sized['spike_drained_seconds']:,.1f} s; autoscaled took {ratio:.2f}x that"
        )
    if keda_run is not None:
        if keda_run.drained_seconds is not None and drained_at:
            ratio = keda_run.drained_seconds / drained_at
            verdict = f"{ratio:.1f}x faster" if ratio >= 1 else f"{1 / ratio:.1f}x slower"
            print(
                f"  KEDA-scaled partition-ordered group (peak {keda_run.peak_replicas} pods, run beside it on the "
                f"same cores): spike drained in {keda_run.drained_seconds:,.1f} s; keyorder autoscaled: "
                f"{drained_at:,.1f} s ({verdict})"
            )
        else:
            print(f"  KEDA-scaled partition-ordered group: {keda_run.error or 'stopped before it drained'}")
    if simulated is not None:
        print_simulated(simulated, drained_at, keda_run.drained_seconds if keda_run is not None else None)
    if options.poison_key:
        print(f"  poison events: {stream.poisoned}; dead letters written: {dead_letters}")
    if result is not None:
        print(
            f"  audit: {result['events']:,} events of {result['orders']:,} orders; order violations "
            f"{result['order_violations']}; lost {result['lost_events']}; re-delivered {result['redelivered_events']}"
        )
    else:
        print("  audit: not available for your own handler (it does not write the example's journal)")
    print(f"  report: {options.output_dir / 'report.json'}" + (f", chart: {image}" if image else ""))
    blocked_run = options.poison_key and options.on_exhausted == "block"
    audited = result is None or (result["order_violations"] == 0 and result["lost_events"] == 0)
    if blocked_run:
        ok = audited and any(limit["kind"] == "blocked_key" for limit in limits_hit)
    else:
        ok = audited and drained_at is not None and (scaled_in_at is not None or peak.replicas == 1)
        if options.poison_key:
            ok = ok and dead_letters == stream.poisoned
    print("keyorder dev: OK" if ok else "keyorder dev: FAILED")
    return 0 if ok else 1


def count_records(bootstrap: str, topic: str) -> int:
    """Records in ``topic`` (end offsets minus start offsets over its partitions)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "keyorder-dev-count"})
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        total = 0
        for partition in metadata.topics[topic].partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            total += max(high - low, 0)
        return total
    finally:
        consumer.close()
