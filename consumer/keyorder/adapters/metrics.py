"""Every keyorder_* metric of a pod, produced at scrape time from the runtime and the workers.

Nothing on the hot path touches prometheus_client: the poll loop publishes an immutable snapshot
and each worker keeps plain counters; this collector turns them into metric families when
Prometheus scrapes. Labels are ``topic``/``partition`` only, never the message key.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from keyorder.adapters.cpu import pod_cpu_cores, pod_cpu_seconds
from keyorder.batch import BATCH_REASONS
from keyorder.engine.poll_loop import ConsumerRuntime
from keyorder.engine.worker_pools import LATENCY_BUCKETS, LatencyHistogram, WorkerPool, WorkerStats

# name -> help; the table in docs/metrics.md is checked against this in the tests
PARTITION_GAUGES = {
    "keyorder_partition_lag_messages": "End offset minus committed offset of the partition.",
    "keyorder_partition_committed_offset": "Last offset committed by this pod (the lowest unfinished offset).",
    "keyorder_partition_min_inflight_offset": "Lowest offset received and not yet finished (the min-offset).",
    "keyorder_partition_oldest_inflight_age_seconds": "Age of the min-offset message (0 when idle); "
    "grows while a key is blocked.",
    "keyorder_partition_inflight_messages": "Messages of the partition received and not yet finished.",
    "keyorder_partition_uncommitted_messages": "Messages received at or above the committed offset "
    "(what a crash would re-deliver; bounded by backpressure).",
    "keyorder_partition_paused": "1 while fetching from the partition is paused by backpressure.",
    "keyorder_partition_min_offset_parked": "1 while the partition's min-offset message waits for a retry "
    "(its lane is parked): the commit cannot pass it until it succeeds or is dead-lettered.",
    "keyorder_partition_min_offset_blocked": "1 while the partition's min-offset message exhausted its attempts "
    "under the block policy: the partition's commit is stuck until the handler succeeds.",
}


class KeyorderCollector(Collector):
    def __init__(self, runtime: ConsumerRuntime, pool: WorkerPool, cpu_cores: float | None = None) -> None:
        self.runtime = runtime
        self.pool = pool
        self.cpu_cores = pod_cpu_cores() if cpu_cores is None else cpu_cores
        """Read once: a container's CPU limit does not change while it runs."""

    def describe(self) -> list:
        return []  # families depend on the assignment; collect() is cheap enough to run on register

    def collect(self) -> Iterator:
        snapshot = self.runtime.snapshot
        labels = ["topic", "partition"]
        families = {name: GaugeMetricFamily(name, text, labels=labels) for name, text in PARTITION_GAUGES.items()}
        completed = CounterMetricFamily(
            "keyorder_partition_completed_messages",
            "Messages of the partition finished (handled or dead-lettered).",
            labels=labels,
        )
        pauses = CounterMetricFamily(
            "keyorder_partition_pauses",
            "Times flow control paused fetching from the partition (a partition full past "
            "--pause-after, or an uncommitted bound); each pause drops the client's prefetched messages.",
            labels=labels,
        )
        fetch_queue = GaugeMetricFamily(
            "keyorder_partition_fetch_queue_messages",
            "Messages the Kafka client has fetched for the partition and not yet handed to the pod "
            "(librdkafka statistics, every statistics.interval.ms).",
            labels=labels,
        )
        resets = CounterMetricFamily(
            "keyorder_partition_offset_resets",
            "Times the partition's log was found reset below the committed offset (topic recreated or "
            "truncated), or truncated below what the pod had read (a newer leader epoch at an offset "
            "already read); consumption restarted at the new offset.",
            labels=labels,
        )
        lanes = self.pool.lane_summary()
        held = {(state.id, offset): blocked for state, offset, blocked in lanes.parked_heads}
        for part in snapshot.partitions:
            value = [part.topic, str(part.partition)]
            head_blocked = (
                None if part.min_inflight is None else held.get(((part.topic, part.partition), part.min_inflight))
            )
            families["keyorder_partition_min_offset_parked"].add_metric(value, 0 if head_blocked is None else 1)
            families["keyorder_partition_min_offset_blocked"].add_metric(value, 1 if head_blocked else 0)
            if part.lag is not None:
                families["keyorder_partition_lag_messages"].add_metric(value, part.lag)
            if part.committed is not None:
                families["keyorder_partition_committed_offset"].add_metric(value, part.committed)
            if part.min_inflight is not None:
                families["keyorder_partition_min_inflight_offset"].add_metric(value, part.min_inflight)
            families["keyorder_partition_oldest_inflight_age_seconds"].add_metric(value, part.oldest_inflight_age)
            families["keyorder_partition_inflight_messages"].add_metric(value, part.inflight)
            families["keyorder_partition_uncommitted_messages"].add_metric(value, part.uncommitted)
            families["keyorder_partition_paused"].add_metric(value, 1 if part.paused else 0)
            completed.add_metric(value, part.completed)
            pauses.add_metric(value, part.pauses)
            if part.fetch_queue is not None:
                fetch_queue.add_metric(value, part.fetch_queue)
            resets.add_metric(value, part.resets)
        yield from families.values()
        yield completed
        yield resets
        yield pauses
        yield fetch_queue
        loop = CounterMetricFamily(
            "keyorder_poll_loop_seconds",
            "Seconds of the poll loop by activity: reading (inside the Kafka client's consume), waiting "
            "(for the workers, while flow control holds or pauses every partition) and working (the rest: "
            "tracking offsets, routing, committing). Mostly waiting: the workers are the limit; mostly "
            "reading: the broker or the client is; mostly working: the poll thread itself is.",
            labels=["activity"],
        )
        reading, waiting = snapshot.reading_seconds, snapshot.waiting_seconds
        loop.add_metric(["reading"], reading)
        loop.add_metric(["waiting"], waiting)
        loop.add_metric(["working"], max(snapshot.poll_loop_seconds - reading - waiting, 0.0))
        yield loop
        yield CounterMetricFamily(
            "keyorder_flow_holds",
            "Times a partition full in flight stopped the reading while the workers caught up "
            "(flow control's first step; the client keeps its prefetched messages).",
            value=snapshot.holds,
        )

        stats = self.pool.stats()
        busy = sum(1 for worker in stats if worker.busy)
        yield GaugeMetricFamily(
            "keyorder_broker_reachable",
            "1 while some Kafka broker answers; 0 while librdkafka reports every broker down or a probe failed "
            "(the pod is not ready).",
            value=1 if snapshot.broker_reachable else 0,
        )
        yield GaugeMetricFamily(
            "keyorder_partitions_assigned",
            "Partitions assigned to this pod (0 is normal for pods beyond the partition count).",
            value=snapshot.assigned_partitions,
        )
        yield GaugeMetricFamily(
            "keyorder_pod_inflight_messages", "Messages received and not yet finished.", value=snapshot.inflight
        )
        yield GaugeMetricFamily(
            "keyorder_pod_queued_messages",
            "Messages waiting for a worker (in flight and not being handled).",
            value=max(snapshot.inflight - lanes.running, 0),  # a batch handler's busy worker holds many
        )
        yield GaugeMetricFamily(
            "keyorder_lanes_ready",
            "Lanes (keys) with a message ready to run and no worker free to take it: above 0 for long, "
            "more workers would help.",
            value=lanes.ready,
        )
        yield GaugeMetricFamily(
            "keyorder_lanes_running", "Lanes whose head message is inside a handler right now.", value=lanes.running
        )
        yield GaugeMetricFamily(
            "keyorder_lane_backlog_max_messages",
            "Messages queued on the single busiest lane (key): the part of the backlog that only one worker "
            "at a time can drain.",
            value=lanes.longest_backlog,
        )
        yield GaugeMetricFamily(
            "keyorder_lane_backlog_max_ratio",
            "The busiest lane's share of the messages queued in the pod (0 to 1): near 1, one key is the "
            "bottleneck and more workers or pods cannot help.",
            value=lanes.longest_backlog_share,
        )
        yield GaugeMetricFamily(
            "keyorder_workers", "Key workers (target; retiring ones excluded).", value=self.pool.size
        )
        yield GaugeMetricFamily(
            "keyorder_workers_busy",
            "Workers inside the handler right now (retiring ones finishing their call included: for that call, "
            "above keyorder_workers after a shrink).",
            value=busy,
        )
        yield GaugeMetricFamily(
            "keyorder_keys_inflight", "Distinct keys (lanes) with messages in flight.", value=lanes.active
        )
        yield GaugeMetricFamily(
            "keyorder_keys_retrying",
            "Keys parked waiting for a retry.",
            value=lanes.parked,
        )
        yield GaugeMetricFamily(
            "keyorder_keys_blocked",
            "Keys that exhausted their attempts under the block policy.",
            value=lanes.blocked,
        )
        for name, text, attribute in (
            ("keyorder_messages_processed", "Messages handled successfully.", "processed"),
            (
                "keyorder_messages_failed",
                "Messages whose handler attempt failed (each of a failed batch call).",
                "failed",
            ),
            ("keyorder_messages_retried", "Failures that scheduled a retry of the key.", "retried"),
            ("keyorder_messages_dead_lettered", "Messages published to the dead-letter topic.", "dead_lettered"),
        ):
            yield CounterMetricFamily(name, text, value=sum(getattr(worker, attribute) for worker in stats))
        yield CounterMetricFamily(
            "keyorder_messages_skipped",
            "Messages not run because commit metadata marked them done.",
            value=snapshot.skipped,
        )
        yield CounterMetricFamily("keyorder_commits", "Offset commits sent.", value=snapshot.commits)
        yield CounterMetricFamily(
            "keyorder_commit_failures", "Offset commits that failed.", value=snapshot.commit_failures
        )
        yield CounterMetricFamily(
            "keyorder_rebalances", "Partition assignments, revocations and losses.", value=snapshot.rebalances
        )
        yield CounterMetricFamily(
            "keyorder_partitions_revoked",
            "Partitions taken from this pod by rebalances (eager: all of them; cooperative: those that move).",
            value=snapshot.partitions_revoked,
        )
        yield CounterMetricFamily(
            "keyorder_rebalance_idle_seconds",
            "Seconds this pod held no partition between a rebalance that took its last one and the next assignment.",
            value=snapshot.rebalance_idle_seconds,
        )
        yield from self._executor_families(stats)
        yield _histogram(
            "keyorder_handler_duration_seconds",
            "Time inside the handler per successful message (a batch handler's call split evenly over its messages).",
            [worker.handler_seconds for worker in stats],
        )
        yield _histogram(
            "keyorder_processing_latency_seconds",
            "Time from receipt by the pod to successful handling (queueing and retries included).",
            [worker.latency for worker in stats],
        )
        yield from self._batch_families(stats)

    def _batch_families(self, stats: list[WorkerStats]) -> Iterator:
        """How a batch handler's calls fill (all zero with a per-message handler)."""
        yield _histogram(
            "keyorder_batch_size_messages",
            "Messages per call of a batch handler (--batch-max-messages above 1).",
            [worker.batch_sizes for worker in stats],
        )
        yield _histogram(
            "keyorder_batch_fill_seconds",
            "Seconds from a batch's first message taken to the batch handler's call (at most --batch-max-wait-ms).",
            [worker.batch_fill for worker in stats],
        )
        reasons = CounterMetricFamily(
            "keyorder_batches",
            "Batch handler calls by why the batch was sent: full (--batch-max-messages), waited (--batch-max-wait-ms "
            "ran out) or nothing_more_ready (no other key was ready, or a revoke or shutdown cut the wait short).",
            labels=["reason"],
        )
        for reason in BATCH_REASONS:
            reasons.add_metric([reason], sum(worker.batches[reason] for worker in stats))
        yield reasons

    def _executor_families(self, stats: list[WorkerStats]) -> Iterator:
        """How the handler runs and the CPU it has: what the operator needs to size a CPU-bound pod."""
        executor = GaugeMetricFamily(
            "keyorder_pod_executor",
            "1 for the executor running the handler (label executor: thread, async or process).",
            labels=["executor"],
        )
        executor.add_metric([self.pool.executor], 1)
        yield executor
        yield GaugeMetricFamily(
            "keyorder_pod_cpu_cores",
            "Cores the pod may use: its CPU limit (cgroup quota), at most the CPUs it may run on. Thread and "
            "async executors use one at most (the GIL).",
            value=self.cpu_cores,
        )
        pids = self.pool.worker_pids()
        yield CounterMetricFamily(
            "keyorder_pod_cpu_seconds",
            "CPU seconds used by the pod process and its worker processes (live and exited).",
            value=pod_cpu_seconds(pids),
        )
        yield GaugeMetricFamily(
            "keyorder_worker_processes", "Live worker processes (process executor; 0 otherwise).", value=len(pids)
        )
        restarts = CounterMetricFamily(
            "keyorder_worker_process_restarts",
            "Worker processes replaced (process executor), by reason: crashed (died: segfault, OOM kill) or "
            "timeout (killed for running a message past --handler-timeout).",
            labels=["reason"],
        )
        interrupted = CounterMetricFamily(
            "keyorder_messages_interrupted",
            "Messages whose attempt ended because their worker process died or was killed, by reason; each "
            "counts as a failed attempt and is retried under the retry policy.",
            labels=["reason"],
        )
        for reason in ("crashed", "timeout"):
            restarts.add_metric([reason], sum(worker.process_restarts[reason] for worker in stats))
            interrupted.add_metric([reason], sum(worker.interrupted[reason] for worker in stats))
        yield restarts
        yield interrupted


def _histogram(name: str, text: str, parts: list[LatencyHistogram]) -> HistogramMetricFamily:
    bounds = parts[0].bounds if parts else LATENCY_BUCKETS
    counts = [0] * (len(bounds) + 1)
    total = 0.0
    for part in parts:
        for index, count in enumerate(part.buckets):
            counts[index] += count
        total += part.total
    cumulative, buckets = 0, []
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    return HistogramMetricFamily(name, text, buckets=buckets, sum_value=total)


def build_registry(runtime: ConsumerRuntime, pool: WorkerPool) -> CollectorRegistry:
    """The pod's registry: every ``keyorder_*`` family, and prometheus_client's ``process_*`` ones (the pod
    process only: its worker processes are in ``keyorder_pod_cpu_seconds_total``)."""
    registry = CollectorRegistry()
    registry.register(KeyorderCollector(runtime, pool))
    ProcessCollector(registry=registry)
    return registry
