"""What the observed lag says, read the same way by every step: the drainable lag (what a blocked key
pins is not; a transaction's commit-marker residue is nothing), the lag that is only in flight at the
arrival rate (``in_flight_lag``), and whether the group keeps up (``kept_up``: the lag only in flight at
this poll and the last).
"""

from __future__ import annotations

from keyorder_operator.policy.model import MARKER_LAG, Observation, ScalingLimits, ScalingState


def drainable_lag(observation: Observation) -> int:
    """The lag minus what blocked keys pin; a lag of commit markers only counts as zero."""
    lag = observation.lag or 0
    if observation.pods is not None:
        lag = max(lag - observation.pods.blocked_lag, 0)
    if is_marker_residue(observation):
        return 0
    return lag


def is_marker_residue(observation: Observation) -> bool:
    """At most one offset behind per partition, nothing arriving or draining, and no pod holding a
    message: what a transactional producer's commit markers leave (they are never delivered)."""
    lags = observation.partition_lags
    if not lags or max(lags) > MARKER_LAG or sum(lags) == 0:
        return False
    if (observation.arrival_rate or 0) > 0 or (observation.drain_rate or 0) > 0 or observation.drain_rate is None:
        return False
    return observation.pods is None or observation.pods.inflight == 0


IN_FLIGHT_SECONDS = 5.0
"""A lag of at most this many seconds of arrivals (or the activation lag) is what a group that keeps up
holds in flight, not a backlog."""


def in_flight_lag(arrivals: float, limits: ScalingLimits) -> float:
    """The most lag a group that keeps up with ``arrivals`` holds in flight: ``IN_FLIGHT_SECONDS`` of them,
    or the activation lag, or 1 (``keyorder simulate``'s criteria use it too)."""
    return max(limits.activation_lag, arrivals * IN_FLIGHT_SECONDS, 1)


def kept_up(observation: Observation, state: ScalingState, arrivals: float, limits: ScalingLimits) -> bool:
    """Kafka's lag is only what is in flight, on this poll and the last: the group keeps up. While pods
    do not report, a scale-down of pods waits for this (and for the down-window, whose recommendations
    were all lower): a silent pod then no longer holds the group at its peak (Kafka's lag is the
    evidence, as when every pod is silent). The last poll's lag is judged by the arrivals measured then
    (the newest of ``state.arrival_samples``, when measured at that poll; else ``arrivals``): after a rise,
    a backlog left at the old rate would otherwise pass for what is in flight at the new one."""
    previous = state.drainable_lag
    if previous is None or drainable_lag(observation) > in_flight_lag(arrivals, limits):
        return False
    measured_then = state.arrival_samples and state.arrivals_at is not None and state.arrivals_at == state.polled_at
    arrivals_then = state.arrival_samples[-1] if measured_then else arrivals
    return previous <= in_flight_lag(arrivals_then, limits)
