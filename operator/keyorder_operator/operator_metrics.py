"""The operator's own Prometheus metrics, per resource: what each poll saw, decided and could not do.

Kept apart from the handlers so the alerts, the dashboard and their tests (``tests/packaging``) read
the metric names from one place, and a deleted resource's series are removed in one place.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from keyorder_operator.catchup import largest_size
from keyorder_operator.observe import LagSample
from keyorder_operator.policy import Cause, Decision, LimitKind, RateSource, ScalingLimits, net_drain_seconds, step_cost

CATCHUP_OUTCOMES = ("started", "succeeded", "failed", "missing", "image_failed")
"""``image_failed``: the image's pre-flight failed before any pod stopped (``image_check``); catch-up is then off."""


class OperatorMetrics:
    """The operator's own metrics (decisions, observed lag, errors)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ["namespace", "name"]
        self.decisions = Counter(
            "keyorder_operator_decisions",
            "Scaling decisions that changed the size.",
            [*labels, "direction"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "keyorder_operator_observed_lag_messages",
            "Lag observed in Kafka per resource.",
            labels,
            registry=self.registry,
        )
        self.replicas = Gauge(
            "keyorder_operator_replicas", "Replicas decided per resource.", labels, registry=self.registry
        )
        self.workers = Gauge(
            "keyorder_operator_workers_per_pod",
            "Key workers per pod decided per resource.",
            labels,
            registry=self.registry,
        )
        self.lag_unknown = Counter(
            "keyorder_operator_lag_unavailable",
            "Observations that could not measure lag.",
            labels,
            registry=self.registry,
        )
        self.errors = Counter(
            "keyorder_operator_reconcile_errors", "Reconciles that failed (retried).", labels, registry=self.registry
        )
        self.catchups = Counter(
            "keyorder_operator_catchups",
            "Catch-up hand-overs by outcome: started, succeeded, failed, missing, passing (refused for now: retried), "
            "image_failed (pre-flight).",
            [*labels, "outcome"],
            registry=self.registry,
        )
        self.catching_up = Gauge(
            "keyorder_operator_catching_up",
            "1 while a catch-up hand-over is in progress.",
            labels,
            registry=self.registry,
        )

        self.lag_seconds = Gauge(
            "keyorder_operator_lag_seconds",
            "Lag divided by the net drain rate (drain - arrivals): the drain ETA; +Inf while the lag does not shrink.",
            labels,
            registry=self.registry,
        )
        self.arrival_rate = Gauge(
            "keyorder_operator_arrival_rate", "Messages/s produced to the topics.", labels, registry=self.registry
        )
        self.drain_rate = Gauge(
            "keyorder_operator_drain_rate", "Messages/s committed by the group.", labels, registry=self.registry
        )
        self.target_drain_seconds = Gauge(
            "keyorder_operator_target_drain_seconds",
            "spec.scaling.targetDrainSeconds: the drain time the autoscaler sizes for.",
            labels,
            registry=self.registry,
        )
        self.ceiling_workers = Gauge(
            "keyorder_operator_ceiling_workers",
            "The most key workers the group may reach: min(replicas.max, partitions) x workers.max.",
            labels,
            registry=self.registry,
        )
        self.scaling_limited = Gauge(
            "keyorder_operator_scaling_limited",
            "1 while scaling cannot help, by reason (hot_key, blocked_key, partition_ordering, cpu, "
            "partitions_with_lag, idle_workers).",
            [*labels, "reason"],
            registry=self.registry,
        )
        self.paused = Gauge(
            "keyorder_operator_paused",
            "1 while the resource carries the keyorder.dev/paused annotation.",
            labels,
            registry=self.registry,
        )
        self.decision_causes = Counter(
            "keyorder_operator_decisions_by_cause",
            "Every decision by its cause (scale_up, scale_down, steady, within_tolerance, stabilizing, "
            "lag_growing, pods_not_reporting, rebalancing, waiting_for_rate, paused, lag_unknown, fallback, reshape, "
            "step_cost).",
            [*labels, "cause"],
            registry=self.registry,
        )
        self.recommended_replicas = Gauge(
            "keyorder_operator_recommended_replicas",
            "Replicas the policy recommended before stabilization, tolerance and rate limits (applied: "
            "keyorder_operator_replicas).",
            labels,
            registry=self.registry,
        )
        self.recommended_workers = Gauge(
            "keyorder_operator_recommended_workers_per_pod",
            "Workers per pod the policy recommended before stabilization, tolerance and rate limits.",
            labels,
            registry=self.registry,
        )
        self.per_worker_rate = Gauge(
            "keyorder_operator_per_worker_rate",
            "Messages/s one key worker is taken to handle, by where it came from (handler_time, drain, kept); "
            "one source at a time.",
            [*labels, "source"],
            registry=self.registry,
        )
        self.cache_reads = Counter(
            "keyorder_operator_cache_reads",
            "Reads of owned objects and consumer pods by the polls, by result: hit (the watched copy) or miss "
            "(read from the API server). A steady poll should miss nothing.",
            ["result"],
            registry=self.registry,
        )
        self.scale_step = Gauge(
            "keyorder_operator_scale_step_seconds",
            "What a change of replicas took to settle on this group, the median of the last three: from the "
            "decision until every pod reports and every partition has an owner again. The policy adds no pod "
            "while the backlog drains sooner than this.",
            labels,
            registry=self.registry,
        )
        self.poll_duration = Histogram(
            "keyorder_operator_poll_duration_seconds",
            "Time one poll took (Kafka, the pods, the API writes).",
            labels,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
            registry=self.registry,
        )
        self.last_poll = Gauge(
            "keyorder_operator_last_poll_timestamp_seconds",
            "When the last poll ran (Unix time): time() - this is the poll's age.",
            labels,
            registry=self.registry,
        )
        self.pod_report_failures = Counter(
            "keyorder_operator_pod_report_failures",
            "Ready pods whose scaling report could not be read (no answer, refused, not a report).",
            labels,
            registry=self.registry,
        )
        self.peering_object_present = Gauge(
            "keyorder_operator_peering_object_present",
            "With --peering: 1 while the kopf peering object is there, 0 once it is gone (or its CRD, or the "
            "right to read it): the standby replicas then never take over. Checked on each health probe.",
            ["kind", "namespace", "name"],
            registry=self.registry,
        )

    def observed(
        self,
        labels: tuple[str, str],
        sample: LagSample,
        drain: float | None,
        arrival: float | None,
        limits: ScalingLimits,
    ) -> None:
        """The figures of one lag observation."""
        self.lag.labels(*labels).set(sample.lag)
        if drain is not None:
            self.drain_rate.labels(*labels).set(drain)
            eta = net_drain_seconds(sample.lag, drain, arrival)
            if eta is not None:  # +Inf while the lag does not shrink: the series stays when the group is stuck
                self.lag_seconds.labels(*labels).set(eta)
        if arrival is not None:
            self.arrival_rate.labels(*labels).set(arrival)
        self.target_drain_seconds.labels(*labels).set(limits.target_drain_seconds)
        self.ceiling_workers.labels(*labels).set(largest_size(limits, sample.partitions).capacity)

    def decided(self, labels: tuple[str, str], decision: Decision) -> None:
        """What one decision recommended and from which rate, and its cause."""
        self.decision_causes.labels(*labels, decision.cause.value).inc()
        if decision.recommended is not None:
            self.recommended_replicas.labels(*labels).set(decision.recommended.replicas)
            self.recommended_workers.labels(*labels).set(decision.recommended.workers)
        state = decision.state
        cost = step_cost(state)
        if cost is not None:
            self.scale_step.labels(*labels).set(cost)
        for source in RateSource:
            if source is state.rate_source and state.per_worker_rate is not None:
                self.per_worker_rate.labels(*labels, source.value).set(state.per_worker_rate)
            else:
                with contextlib.suppress(KeyError):
                    self.per_worker_rate.remove(*labels, source.value)

    def cache_read(self, result: str) -> None:
        self.cache_reads.labels(result).inc()

    def poll_started(self, labels: tuple[str, str], now: float) -> None:
        """A poll starts (set first: once it moves again, the poll before has written its status)."""
        self.last_poll.labels(*labels).set(now)

    def polled(self, labels: tuple[str, str], seconds: float) -> None:
        self.poll_duration.labels(*labels).observe(seconds)

    def limit(self, labels: tuple[str, str], kind: str | None) -> None:
        """Exactly one reason at 1 while scaling is limited; all at 0 otherwise."""
        for reason in LimitKind:
            self.scaling_limited.labels(*labels, reason.value).set(1 if reason.value == kind else 0)

    def _series(self) -> list[tuple[Any, tuple[str, ...]]]:
        """Every labelled series of a resource: (metric, extra label values)."""
        return [
            (self.decisions, ("up",)),
            (self.decisions, ("down",)),
            (self.lag_unknown, ()),
            (self.errors, ()),
            (self.catching_up, ()),
            (self.pod_report_failures, ()),
            *((self.catchups, (outcome,)) for outcome in CATCHUP_OUTCOMES),
            *((self.decision_causes, (cause.value,)) for cause in Cause),
        ]

    def track(self, namespace: str, name: str) -> None:
        """Create a resource's counters at 0, so the first increment is an ``increase()`` alerts can see."""
        for metric, extra in self._series():
            metric.labels(namespace, name, *extra)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted resource's series (dashboards and alerts stop showing it)."""
        gauges = [
            self.lag,
            self.replicas,
            self.workers,
            self.lag_seconds,
            self.arrival_rate,
            self.drain_rate,
            self.target_drain_seconds,
            self.ceiling_workers,
            self.paused,
            self.recommended_replicas,
            self.recommended_workers,
            self.scale_step,
            self.poll_duration,
            self.last_poll,
        ]
        limited = [(self.scaling_limited, (kind.value,)) for kind in LimitKind]
        limited += [(self.per_worker_rate, (source.value,)) for source in RateSource]
        for metric, extra in [*self._series(), *((gauge, ()) for gauge in gauges), *limited]:
            with contextlib.suppress(KeyError):
                metric.remove(namespace, name, *extra)
