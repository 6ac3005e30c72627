"""Step 10: stabilisation and rate limits, as the HPA does them.

Windows over the recommended replicas and, separately, the recommended capacity (``stabilized``; the
memory a window can still use, ``window_memory``); no scale-down while the lag grows nor when no last
lag tells (``lag_growing``, ``growth_unknown``); then the rate limits cap the change of replicas, workers
per pod making up the capacity where pods are held back (``rate_limited``).
"""

from __future__ import annotations

import math

from keyorder_operator.policy.lag import drainable_lag
from keyorder_operator.policy.model import (
    DEFAULT_SCALE_UP_RATES,
    GROWTH_SHARE,
    Observation,
    RateKind,
    RateLimit,
    ScalingLimits,
    ScalingState,
    Size,
)
from keyorder_operator.policy.shape import workers_for


# -- step 10: stabilization and rate limits ------------------------------------------------------------
def _stabilized_value(
    recommended: int, current: int, history: list[tuple[float, int]], now: float, limits: ScalingLimits
) -> int:
    """One dimension, as the HPA does: up to the smallest recommendation of the up-window, down to
    the largest of the down-window, never past the current value the other way."""
    if recommended > current:
        window = [value for at, value in history if now - at <= limits.scale_up_window_seconds]
        return max(min([recommended, *window]), current)
    if recommended < current:
        window = [value for at, value in history if now - at <= limits.scale_down_window_seconds]
        return min(max([recommended, *window]), current)
    return recommended


def stabilized(
    recommended: Size,
    current: Size,
    history: tuple[tuple[float, int, int], ...],
    now: float,
    limits: ScalingLimits,
    partitions: int,
) -> Size:
    """Replicas and capacity stabilized separately (a reshape of the same capacity into fewer pods is
    a scale-down of pods, and waits for the down-window); the workers per pod then carry the capacity.
    (``_sized`` seeds an empty history with the current size, so a new resource waits a window too.)"""
    replicas = _stabilized_value(recommended.replicas, current.replicas, [(at, r) for at, r, _ in history], now, limits)
    capacity = _stabilized_value(
        recommended.capacity, current.capacity, [(at, r * w) for at, r, w in history], now, limits
    )
    if replicas == 0:
        return Size(0, recommended.workers)
    if replicas == recommended.replicas and capacity == recommended.capacity:
        return recommended
    return Size(replicas, max(workers_for(capacity, replicas, partitions), 1))


def window_memory(
    recommendations: tuple[tuple[float, int, int], ...], now: float, limits: ScalingLimits
) -> tuple[tuple[float, int, int], ...]:
    """The recommendations the stabilization windows can still use from ``now`` on, oldest first: the
    memory stays a few entries long however many polls a window spans (a steady recommendation is one
    entry), and every later decision is the same as with the whole list.

    The windows only ever ask for the largest replicas and capacity of the down-window and the smallest
    of the up-window (``_stabilized_value``). A recommendation is of no further use once a later one is
    at least as large in both (for the down-window's maximum) and at most as small in both or older than
    the up-window (for its minimum): the later one stays in every window at least as long. The HPA keeps
    every recommendation of the longest window instead, replacing the ones that fell out of it
    (kubernetes/kubernetes ``pkg/controller/podautoscaler/horizontal.go``,
    ``stabilizeRecommendationWithBehaviors``), in the controller's memory only; keyorder keeps the
    short form in status (``restart``), so a restarted operator has it too. The newest is always kept:
    an empty memory means "never recommended" to ``_sized``."""
    kept: list[tuple[float, int, int]] = []
    largest_replicas = largest_capacity = -1
    smallest_replicas = smallest_capacity = math.inf
    for at, replicas, workers in reversed(recommendations):
        capacity = replicas * workers
        age = now - at
        for_down = age <= limits.scale_down_window_seconds and (
            replicas > largest_replicas or capacity > largest_capacity
        )
        for_up = age <= limits.scale_up_window_seconds and (
            replicas < smallest_replicas or capacity < smallest_capacity
        )
        if not kept or for_down or for_up:
            kept.append((at, replicas, workers))
        largest_replicas, largest_capacity = max(largest_replicas, replicas), max(largest_capacity, capacity)
        smallest_replicas, smallest_capacity = min(smallest_replicas, replicas), min(smallest_capacity, capacity)
    return tuple(reversed(kept))


def replicas_at(changes: tuple[tuple[float, int], ...], current: int, since: float) -> int:
    """The replicas the group had at ``since``: what the first change after it started from."""
    later = [before for at, before in changes if at > since]
    return later[0] if later else current


def rate_limited(target: Size, state: ScalingState, limits: ScalingLimits, now: float, partitions: int) -> Size:
    """Cap the change of replicas by the HPA-style rate limits; workers make up the capacity (the
    caller fits the result within the bounds again)."""
    current = state.current
    if target.replicas > current.replicas:
        allowed = max(
            _limit(rate, replicas_at(state.replica_changes, current.replicas, now - rate.period_seconds), +1)
            for rate in scale_up_rates(limits)
        )
        if current.replicas == 0:
            allowed = max(allowed, 1)  # waking up always starts a pod (a percentage of zero is zero)
        if target.replicas > allowed:
            replicas = max(allowed, current.replicas, 1)
            workers = max(workers_for(target.capacity, replicas, partitions), target.workers)
            return Size(replicas, workers)
    if target.replicas < current.replicas and limits.scale_down_rates:
        allowed = min(
            _limit(rate, replicas_at(state.replica_changes, current.replicas, now - rate.period_seconds), -1)
            for rate in limits.scale_down_rates
        )
        if target.replicas < allowed:
            return Size(min(allowed, current.replicas), target.workers)
    return target


def scale_up_rates(limits: ScalingLimits) -> tuple[RateLimit, ...]:
    """The scale-up rate limits in force: the spec's, else HPA's default."""
    return limits.scale_up_rates or DEFAULT_SCALE_UP_RATES


def _limit(rate: RateLimit, start: int, direction: int) -> int:
    step = rate.value if rate.kind is RateKind.PODS else math.ceil(start * rate.value / 100)
    return max(start + direction * step, 0)


def lag_growing(observation: Observation, state: ScalingState, limits: ScalingLimits, now: float) -> bool:
    """The drainable lag rose since the last poll by more than a small share of what arrived meanwhile."""
    previous = state.drainable_lag
    if previous is None or state.polled_at is None or now <= state.polled_at:
        return False
    lag = drainable_lag(observation)
    if lag < max(limits.activation_lag, 1):
        return False
    arrived = (observation.arrival_rate or 0.0) * (now - state.polled_at)
    return lag - previous > GROWTH_SHARE * arrived + limits.activation_lag / 2


def growth_unknown(observation: Observation, state: ScalingState, limits: ScalingLimits) -> bool:
    """No last lag to tell whether a lag at or above the activation lag grows (the first poll of a new
    resource, or after a restart: ``MEASURED_EACH_POLL``): no scale-down on such a poll, as while the lag
    grows. A periodic producer's on-half otherwise looked like a quiet poll right after every restart."""
    return state.drainable_lag is None and drainable_lag(observation) >= max(limits.activation_lag, 1)
