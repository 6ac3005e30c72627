"""KEDA's Kafka scaler feeding the Kubernetes HPA: the reference policy ``keyorder simulate --against keda`` runs.

What a platform team runs today for a Kafka consumer is KEDA's ``kafka`` trigger on a plain consumer
Deployment. To say how the keyorder autoscaler does against it, the simulator runs the same scenario
(same seed, same arrivals) under this policy too. It is written from the real code, not from memory:

- **The metric**, KEDA ``pkg/scalers/kafka_scaler.go`` (``getLagForPartition``, ``getTotalLag``,
  ``GetMetricsAndActivity``): the lag of a partition is its latest offset minus the group's committed
  offset; the metric is the sum over partitions; unless ``allowIdleConsumers``, it is capped at
  ``partitions x lagThreshold`` (``if totalLag / lagThreshold > upperBound``, Go's integer division),
  and with ``limitToPartitionsWithLag`` at ``partitions with lag x lagThreshold``. The trigger is
  active while the total lag is above ``activationLagThreshold``. Defaults: ``lagThreshold`` 10,
  ``activationLagThreshold`` 0 (``defaultKafkaLagThreshold``, ``defaultKafkaActivationLagThreshold``).
- **KEDA's own loop**, ``pkg/scaling/executor/scale_scaledobjects.go`` (``RequestScale``,
  ``scaleFromZeroOrIdle``, ``scaleToZeroOrIdle``): every ``pollingInterval`` (30 s,
  ``apis/keda/v1alpha1/withtriggers_types.go``) it only moves between 0 and the minimum: an active
  trigger at 0 replicas scales to ``max(minReplicaCount, 1)``; an inactive one below
  ``minReplicaCount`` is raised to it; with ``minReplicaCount`` 0, a trigger inactive for
  ``cooldownPeriod`` (300 s, ``scale_executor.go``) scales to 0, counted from ``LastActiveTime``, which
  only this loop sets (an active trigger at its polls, not at the HPA's syncs). Everything in between
  is the HPA's, whose ``minReplicas`` is ``max(minReplicaCount, 1)``.
- **The HPA**, kubernetes ``pkg/controller/podautoscaler/replica_calculator.go``
  (``GetExternalPerPodMetricReplicas``): KEDA's metric is an ``AverageValue`` target of
  ``lagThreshold`` per pod, so the usage ratio is ``metric / (lagThreshold x current replicas)``; within
  the 10% tolerance (``--horizontal-pod-autoscaler-tolerance``) the replicas stay, otherwise they become
  ``ceil(metric / lagThreshold)``. Then ``horizontal.go``: ``stabilizeRecommendationWithBehaviors``
  (up to the smallest recommendation of the scale-up window, down to the largest of the scale-down
  window, every recommendation recorded unstabilized), ``convertDesiredReplicasWithBehaviorRate`` with
  ``calculateScaleUpLimitWithScalingRules`` and ``calculateScaleDownLimitWithBehaviors`` (the replicas
  at the start of each policy's period, from the scale events within it), then ``minReplicas`` and
  ``maxReplicas``. Default behaviours (``pkg/apis/autoscaling/v2/defaults.go``): scale up without a
  window, the larger of 4 pods or 100% per 15 s; scale down after a 300 s window, 100% per 15 s. The
  controller syncs every 15 s (``--horizontal-pod-autoscaler-sync-period``) and KEDA's metrics
  server reads the lag from Kafka on each request.

Pure: ``decide`` takes the time, the replicas and the partitions' lags, and returns the replicas and
the memory for the next sync; the simulator's driver does the rest (``driver.run(..., keda=...)``).
A lag that cannot be read is an error for the HPA, which keeps the replicas (KEDA's ``fallback`` is
not configured by default); a paused ScaledObject (``autoscaling.keda.sh/paused``) keeps them too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class HpaPolicy:
    """One ``HPAScalingPolicy``: ``kind`` ``Pods`` or ``Percent``, ``value`` per ``period`` seconds."""

    kind: str
    value: int
    period: float


@dataclass(frozen=True)
class KedaSettings:
    """A ScaledObject with a ``kafka`` trigger, and the HPA KEDA creates for it (defaults: KEDA's and the HPA's)."""

    lag_threshold: int = 10
    activation_lag_threshold: int = 0
    allow_idle_consumers: bool = False
    limit_to_partitions_with_lag: bool = False
    polling_interval: float = 30.0
    cooldown_period: float = 300.0
    min_replicas: int = 1
    """``minReplicaCount`` (KEDA's default is 0; the comparison takes the OrderedConsumer's ``replicas.min``)."""
    max_replicas: int = 100
    sync_period: float = 15.0
    tolerance: float = 0.1
    scale_up_window: float = 0.0
    scale_up_policies: tuple[HpaPolicy, ...] = (HpaPolicy("Pods", 4, 15.0), HpaPolicy("Percent", 100, 15.0))
    scale_down_window: float = 300.0
    scale_down_policies: tuple[HpaPolicy, ...] = (HpaPolicy("Percent", 100, 15.0),)


@dataclass(frozen=True)
class KedaState:
    """What KEDA and the HPA controller keep in memory between syncs."""

    recommendations: tuple[tuple[float, int], ...] = ()
    """``(time, unstabilized recommendation)`` of the HPA's syncs (``a.recommendations``)."""
    scale_up_events: tuple[tuple[float, int], ...] = ()
    """``(time, replicas added)`` (``a.scaleUpEvents``)."""
    scale_down_events: tuple[tuple[float, int], ...] = ()
    last_active: float | None = None
    """When the trigger was last active (``status.lastActiveTime``)."""
    last_poll: float | None = None
    """When KEDA's own loop last ran (every ``polling_interval``)."""


@dataclass(frozen=True)
class KedaDecision:
    replicas: int
    state: KedaState
    metric: int | None
    """The external metric the HPA read (the capped total lag), ``None`` when it could not."""
    active: bool
    reason: str


def kafka_metric(partition_lags: tuple[int, ...], settings: KedaSettings) -> tuple[int, bool]:
    """``getTotalLag`` and the activity of ``GetMetricsAndActivity``: the total lag, capped so the HPA
    never asks for more consumers than partitions (or partitions with lag), and whether it is active."""
    total = sum(max(lag, 0) for lag in partition_lags)
    with_lag = sum(1 for lag in partition_lags if lag > 0)
    metric = total
    if not settings.allow_idle_consumers or settings.limit_to_partitions_with_lag:
        upper = with_lag if settings.limit_to_partitions_with_lag else len(partition_lags)
        if total // settings.lag_threshold > upper:
            metric = upper * settings.lag_threshold
    return metric, total > settings.activation_lag_threshold


def hpa_replicas(metric: int, current: int, settings: KedaSettings) -> int:
    """``GetExternalPerPodMetricReplicas``: ``ceil(metric / target)`` unless within the tolerance."""
    if current <= 0:
        return math.ceil(metric / settings.lag_threshold)
    usage_ratio = metric / (settings.lag_threshold * current)
    if abs(1.0 - usage_ratio) > settings.tolerance:
        return math.ceil(metric / settings.lag_threshold)
    return current


def _changed_in_period(events: tuple[tuple[float, int], ...], period: float, now: float) -> int:
    """``getReplicasChangePerPeriod``: the replicas changed by the events within the last ``period`` seconds."""
    return sum(change for at, change in events if now - at < period)


def scale_up_limit(current: int, state: KedaState, settings: KedaSettings, now: float) -> int:
    """``calculateScaleUpLimitWithScalingRules`` with ``selectPolicy: Max``: the most any policy allows."""
    best = -(2**31)
    for policy in settings.scale_up_policies:
        added = _changed_in_period(state.scale_up_events, policy.period, now)
        deleted = _changed_in_period(state.scale_down_events, policy.period, now)
        start = current - added + deleted
        proposed = start + policy.value if policy.kind == "Pods" else math.ceil(start * (1 + policy.value / 100))
        best = max(best, proposed)
    return best


def scale_down_limit(current: int, state: KedaState, settings: KedaSettings, now: float) -> int:
    """``calculateScaleDownLimitWithBehaviors`` with ``selectPolicy: Max``: the fewest any policy allows."""
    best = 2**31
    for policy in settings.scale_down_policies:
        added = _changed_in_period(state.scale_up_events, policy.period, now)
        deleted = _changed_in_period(state.scale_down_events, policy.period, now)
        start = current - added + deleted
        proposed = start - policy.value if policy.kind == "Pods" else int(start * (1 - policy.value / 100))
        best = min(best, proposed)
    return best


def _hpa_sync(metric: int, current: int, state: KedaState, settings: KedaSettings, now: float) -> tuple[int, KedaState]:
    """One HPA sync with an external metric: the recommendation, stabilized, rate-limited, within min/max."""
    lowest = max(settings.min_replicas, 1)
    desired = hpa_replicas(metric, current, settings)
    # stabilizeRecommendationWithBehaviors: the windows hold the unstabilized recommendations
    up, down = desired, desired
    for at, recommended in state.recommendations:
        if at > now - settings.scale_up_window:
            up = min(up, recommended)
        if at > now - settings.scale_down_window:
            down = max(down, recommended)
    stabilized = min(max(current, up), down)
    keep = max(settings.scale_up_window, settings.scale_down_window)
    recommendations = (*(item for item in state.recommendations if item[0] > now - keep), (now, desired))
    # convertDesiredReplicasWithBehaviorRate
    target = stabilized
    if stabilized > current:
        target = min(stabilized, max(scale_up_limit(current, state, settings, now), current), settings.max_replicas)
    elif stabilized < current:
        target = max(stabilized, min(scale_down_limit(current, state, settings, now), current), lowest)
    target = min(max(target, lowest), settings.max_replicas)
    return target, replace(state, recommendations=recommendations)


def _recorded(state: KedaState, current: int, target: int, now: float, settings: KedaSettings) -> KedaState:
    """The scale event of a change (``storeScaleEvent``), older events dropped past the longest period."""
    longest = max((p.period for p in (*settings.scale_up_policies, *settings.scale_down_policies)), default=0.0)
    ups = tuple(item for item in state.scale_up_events if now - item[0] < longest)
    downs = tuple(item for item in state.scale_down_events if now - item[0] < longest)
    if target > current:
        ups = (*ups, (now, target - current))
    elif target < current:
        downs = (*downs, (now, current - target))
    return replace(state, scale_up_events=ups, scale_down_events=downs)


def decide(
    now: float,
    current: int,
    partition_lags: tuple[int, ...] | None,
    state: KedaState,
    settings: KedaSettings,
    paused: bool = False,
) -> KedaDecision:
    """KEDA and the HPA at simulated second ``now`` (called every ``sync_period``): the replicas the
    Deployment should have. ``partition_lags`` ``None``: the lag could not be read (the HPA keeps the
    replicas, as on a failed metric)."""
    if paused:
        return KedaDecision(current, state, None, False, "paused: the ScaledObject keeps the replicas")
    if partition_lags is None:
        return KedaDecision(current, state, None, False, "metric unavailable: the HPA keeps the replicas")
    metric, active = kafka_metric(partition_lags, settings)
    keda_loop = state.last_poll is None or now - state.last_poll >= settings.polling_interval - 1e-9
    if keda_loop:
        # RequestScale, on KEDA's polling loop (not on the HPA's syncs): an active trigger sets
        # LastActiveTime, in scaleFromZeroOrIdle and in its default case alike
        state = replace(state, last_poll=now, last_active=now if active else state.last_active)
    if current == 0 and keda_loop and active:  # the HPA does not scale from 0; KEDA's loop does
        target = max(settings.min_replicas, 1)
        reason = f"KEDA: trigger active (lag {sum(partition_lags)}), 0 -> {target}"
        return KedaDecision(target, _recorded(state, 0, target, now, settings), metric, active, reason)
    if keda_loop and not active and current < settings.min_replicas:
        # RequestScale's "currentReplicas < minReplicas" case (no idleReplicaCount): inactive, the target
        # is raised to minReplicaCount all the same
        target = settings.min_replicas
        reason = f"KEDA: trigger inactive, {current} replicas below minReplicaCount -> {target}"
        return KedaDecision(target, _recorded(state, current, target, now, settings), metric, active, reason)
    if current == 0:
        return KedaDecision(0, state, metric, active, "KEDA: scaled to zero, trigger inactive")
    idle_since = state.last_active if state.last_active is not None else -math.inf
    if settings.min_replicas == 0 and keda_loop and not active and now - idle_since >= settings.cooldown_period:
        return KedaDecision(0, _recorded(state, current, 0, now, settings), metric, active, "KEDA: cooldown over, -> 0")
    target, state = _hpa_sync(metric, current, state, settings, now)
    reason = f"HPA: metric {metric} / target {settings.lag_threshold} per pod, {current} -> {target}"
    return KedaDecision(target, _recorded(state, current, target, now, settings), metric, active, reason)
