"""Steps 3 and 4 and the arrivals of step 5: what a poll learns from the pods and from Kafka this interval.

Whether the group rebalanced or pods stay silent (``membership_changed``, ``silent_pods_caveat``); one
worker's rate, the handler time over the efficiency learned on saturated, clean intervals
(``learn_rate``); the drain rate measured from the lag; and the arrival rate that has lasted
(``arrival_level``, ``smoothed_arrivals``), so a burst is counted once.
"""

from __future__ import annotations

import itertools
import statistics

from keyorder_operator.pod_signals import PodSignals
from keyorder_operator.policy.lag import drainable_lag, kept_up
from keyorder_operator.policy.model import (
    DEFAULT_EFFICIENCY,
    EFFICIENCY_RANGE,
    HOLD_POLLS,
    MAX_RATE_STEP,
    MIN_HANDLER_CALLS,
    SAMPLES,
    SATURATED_SHARE,
    SATURATION_SECONDS,
    Caveat,
    Observation,
    Rate,
    RateSource,
    ScalingLimits,
    ScalingState,
)


# -- steps 3 and 4: rebalances and one worker's rate ----------------------------------------------------
def same_pods(observation: Observation, state: ScalingState) -> bool:
    """The same pods answered as at the last poll and none rebalanced: interval figures are exact."""
    pods, previous = observation.pods, state.pod_totals
    return (
        pods is not None
        and previous is not None
        and pods.rebalances_total == previous[2]
        and pods.pods == previous[3]
        and pods.handler_calls_total >= previous[0]
    )


def handler_seconds(observation: Observation, state: ScalingState) -> float | None:
    """Mean handler time per call: over the interval when the same pods ran enough calls in it, else
    the last interval's (the pods changed), else since the pods started."""
    pods, previous = observation.pods, state.pod_totals
    if pods is None:
        return None
    if previous is not None and same_pods(observation, state):
        calls, seconds = pods.handler_calls_total - previous[0], pods.handler_seconds_total - previous[1]
        if calls >= MIN_HANDLER_CALLS and seconds > 0:
            return seconds / calls
    if state.handler_time is not None:
        return state.handler_time
    if pods.handler_calls_total >= MIN_HANDLER_CALLS and pods.handler_seconds_total > 0:
        return pods.handler_seconds_total / pods.handler_calls_total
    return None


def clean_interval(observation: Observation, state: ScalingState) -> bool:
    """The interval measured the group as decided: nothing started, rolled, rebalanced or went missing."""
    pods = observation.pods
    if not (state.settled and observation.rollout_settled and pods is not None and pods.workers > 0):
        return False
    if pods.pods != state.current.replicas or not reports_complete(observation):
        return False
    return same_pods(observation, state)


def reports_complete(observation: Observation) -> bool:
    """Every ready pod asked for a report answered (unknown counts as complete)."""
    expected, pods = observation.pods_expected, observation.pods
    if expected is None:
        return True
    return (pods.pods if pods is not None else 0) >= expected


def membership_changed(observation: Observation, state: ScalingState, limits: ScalingLimits) -> bool:
    """A pod joined, left or rebalanced since the last poll, or some partition has no reporting pod:
    the pods' queues were just emptied and are refilling, so their view (blocked keys, hot keys, idle
    workers) says nothing yet. The first report the operator sees counts as such a change when the pods
    hold fewer messages than workers while a backlog worth scaling for waits in Kafka: they have just
    started and their look-ahead is still filling (a hot key's share is not visible yet)."""
    pods, previous = observation.pods, state.pod_totals
    if pods is None:
        return False
    if previous is None:
        return pods.queued < pods.workers and drainable_lag(observation) >= max(limits.activation_lag, 1)
    unassigned = bool(observation.partitions) and pods.partitions_assigned < (observation.partitions or 0)
    return unassigned or pods.rebalances_total != previous[2] or pods.pods != previous[3]


def silent_pods_caveat(observation: Observation, silent_polls: int) -> Caveat | None:
    """``PodsNotReporting`` once some ready pods have not answered on ``HOLD_POLLS`` polls in a row."""
    if silent_polls < HOLD_POLLS:
        return None
    expected = observation.pods_expected or 0
    answered = observation.pods.pods if observation.pods is not None else 0
    if answered:
        message = (
            f"{expected - answered} of {expected} ready pods did not report on {silent_polls} polls in a row: "
            f"sizing on Kafka's lag and the {answered} pods that report"
        )
    else:
        message = (
            f"none of the {expected} ready pods reported on {silent_polls} polls in a row: sizing on Kafka's lag "
            "and the last known rate per worker"
        )
    return Caveat("PodsNotReporting", message)


def saturated(pods: PodSignals | None) -> bool:
    """The group's workers are the limit right now: keys wait for a worker and (nearly) every worker is
    busy. (Keys waiting on one pod while the others idle say nothing about a saturated worker.)"""
    return (
        pods is not None and pods.workers > 0 and pods.lanes_ready > 0 and pods.busy >= SATURATED_SHARE * pods.workers
    )


def measured_efficiency(
    observation: Observation, state: ScalingState, now: float, limits: ScalingLimits
) -> float | None:
    """Busy workers' share of their time in the handler over the interval, when the workers were the
    limit at both of its ends (keys waited for a worker and nearly every worker was busy) with a backlog
    in Kafka at either end, and the interval was clean; ``None`` otherwise. (Saturated at one end only,
    the workers may have emptied their queues early and idled: the share would then be the load, not the
    efficiency. So may they between two saturated moments of a group that keeps up, its lag only what is
    in flight at both ends (``kept_up``): 2 pods of 16 at 10 ms keeping up with 2,600/s, 83% of what they
    handle, were seen saturated at both ends of an interval and learned an efficiency of 0.83 for 0.98.)"""
    pods, previous, since = observation.pods, state.pod_totals, state.pod_totals_at
    if pods is None or previous is None or since is None or now <= since:
        return None
    if not (state.saturated and saturated(pods)):
        return None  # the workers were not the limit at both ends of the interval: not throughout it
    if kept_up(observation, state, observation.arrival_rate or 0.0, limits):
        return None  # no backlog to keep them busy in between: the share may be the load
    if not clean_interval(observation, state):
        return None
    busy_seconds = pods.handler_seconds_total - previous[1]
    if busy_seconds <= 0:
        return None
    share = busy_seconds / (now - since) / pods.workers
    return min(max(share, EFFICIENCY_RANGE[0]), EFFICIENCY_RANGE[1])


def measured_drain_rate(observation: Observation, state: ScalingState, limits: ScalingLimits) -> float | None:
    """Without any pod report (an older release): one worker's rate as the drain rate per decided
    worker, only when the backlog kept every worker busy through a settled interval."""
    drain = observation.drain_rate or 0.0
    lag = observation.lag or 0
    capacity = state.current.capacity
    loaded = lag >= max(limits.activation_lag, 1) and lag >= drain * SATURATION_SECONDS
    if drain <= 0 or not state.settled or not loaded or capacity <= 0:
        return None
    return drain / capacity


def learn_rate(observation: Observation, state: ScalingState, limits: ScalingLimits, now: float) -> Rate:
    """One worker's rate: the learned efficiency over the handler time; without reports, the measured
    drain per worker; without either, the last known rate."""
    handler_time = handler_seconds(observation, state)
    efficiencies = state.efficiency_samples
    if handler_time:
        efficiency = measured_efficiency(observation, state, now, limits)
        if efficiency is not None:
            efficiencies = (*efficiencies, efficiency)[-SAMPLES:]
        learned = statistics.median(efficiencies) if efficiencies else DEFAULT_EFFICIENCY
        return Rate(learned / handler_time, RateSource.HANDLER_TIME, handler_time, efficiencies, state.rate_samples)
    samples = state.rate_samples
    never_reported = state.rate_source in (RateSource.NONE, RateSource.DRAIN)
    if observation.pods is None and never_reported:  # pods that went silent keep their last known rate
        measured = measured_drain_rate(observation, state, limits)
        if measured is not None:
            anchor = state.per_worker_rate or measured
            samples = (*samples, min(max(measured, anchor / MAX_RATE_STEP), anchor * MAX_RATE_STEP))[-SAMPLES:]
            return Rate(statistics.median(samples), RateSource.DRAIN, None, efficiencies, samples)
    if state.per_worker_rate:
        return Rate(state.per_worker_rate, RateSource.KEPT, state.handler_time, efficiencies, samples)
    return Rate(None, RateSource.NONE, None, efficiencies, samples)


ARRIVAL_SAMPLES = 5
"""Intervals of arrivals kept (with the time of the newest, ``ScalingState.arrivals_at``, so a restarted
operator resumes them): a step up counts as lasting once it held for all of them."""


ARRIVALS_STALE_SECONDS = 300.0
"""Arrival samples a restarted operator finds older than this (the default scale-down window) describe
another time: it starts them afresh, as a new resource does."""


RISE_BAND = 0.25
"""Two intervals' rates within this share of the higher one are one level (noise); further apart, the rate
rose or fell between them."""


PERIODIC_CHANGES = 3
"""Changes of level (beyond ``RISE_BAND``) between consecutive intervals, among the last
``ARRIVAL_SAMPLES``, from which the arrivals are a periodic producer's (up, down, up...)."""


def _apart(lower: float, higher: float) -> bool:
    """Whether ``lower`` is below ``higher`` by more than ``RISE_BAND`` of it: not one level."""
    return lower < higher * (1 - RISE_BAND)


def arrival_level(samples: tuple[float, ...]) -> float:
    """The arrival rate the intervals' rates ``samples`` (oldest first) say has lasted:

    - a periodic producer (the level changed at least ``PERIODIC_CHANGES`` times between consecutive
      intervals, both up and down, as a producer that sends every 30 s looks to a 15 s poll): the level
      it reaches (the median of the intervals at or above their mean), so its on-intervals do not build
      a lag the next poll would see as a rise; the down-window would hold that size anyway;
    - a step up that has not lasted all ``ARRIVAL_SAMPLES`` intervals (every older interval below every
      newer one beyond the band, and the newer ones one level: a plateau, not a ramp): the older level
      (its median). A rise of a minute or so (a burst of
      45 s at 40,000/s) is over before pods added for it would own a partition: it counts in the lag it
      leaves, which the size drains within the target, not as a rate the group must keep up with;
    - a fall (the latest interval below the median of the last three, beyond the band): the latest
      interval's rate at once, so the interval after a burst ends says so (a median still held the
      burst's rate for a poll or two, and the group stepped up after the burst was over);
    - else the median of the last three: noise, and a burst that landed within one poll counted once
      (in the lag), not also as a lasting rate. A gradual ramp (each interval within the band of the
      one before) is followed by this median, one interval behind."""
    if not samples:
        return 0.0
    pairs = list(itertools.pairwise(samples))
    ups = sum(1 for older, newer in pairs if _apart(older, newer))
    downs = sum(1 for older, newer in pairs if _apart(newer, older))
    if ups and downs and ups + downs >= PERIODIC_CHANGES:
        mean = statistics.fmean(samples)
        return statistics.median(rate for rate in samples if rate >= mean)
    for split in range(1, len(samples)):
        older, newer = samples[:split], samples[split:]
        if _apart(max(older), min(newer)) and not _apart(min(newer), max(newer)):
            return statistics.median(older)
    median = statistics.median(samples[-SAMPLES:])
    latest = samples[-1]
    return latest if _apart(latest, median) else median


def smoothed_arrivals(observation: Observation, state: ScalingState) -> tuple[float, tuple[float, ...]]:
    """The arrival rate to keep up with (``arrival_level`` of the last ``ARRIVAL_SAMPLES`` intervals, this
    poll's included), and the intervals to keep."""
    samples = state.arrival_samples
    if observation.arrival_rate is not None:
        samples = (*samples, observation.arrival_rate)[-ARRIVAL_SAMPLES:]
    return arrival_level(samples), samples
