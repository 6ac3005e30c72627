"""The operator's own Prometheus metrics, per resource: what each poll saw, decided and could not do.

Kept apart from the handlers so the alerts, the dashboard and their tests (``tests/packaging``) read
the metric names from one place, and a deleted resource's series are removed in one place.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from keyorder_operator.catchup import largest_size
from keyorder_operator.observe import LagSample
from keyorder_operator.policy import LimitKind, ScalingLimits

CATCHUP_OUTCOMES = ("started", "succeeded", "failed", "missing")


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
            "Catch-up Jobs by outcome: started, succeeded, failed.",
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
            "Lag divided by the drain rate: the drain ETA at the current rate (absent while nothing drains).",
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
            if drain > 0:
                self.lag_seconds.labels(*labels).set(sample.lag / drain)
            else:
                with contextlib.suppress(KeyError):
                    self.lag_seconds.remove(*labels)
        if arrival is not None:
            self.arrival_rate.labels(*labels).set(arrival)
        self.target_drain_seconds.labels(*labels).set(limits.target_drain_seconds)
        self.ceiling_workers.labels(*labels).set(largest_size(limits, sample.partitions).capacity)

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
            *((self.catchups, (outcome,)) for outcome in CATCHUP_OUTCOMES),
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
        ]
        limited = [(self.scaling_limited, (kind.value,)) for kind in LimitKind]
        for metric, extra in [*self._series(), *((gauge, ()) for gauge in gauges), *limited]:
            with contextlib.suppress(KeyError):
                metric.remove(namespace, name, *extra)
