"""The scaling policy: how many pods and how many key workers per pod, and when scaling cannot help.

Pure: ``decide(observation, limits, state, now)`` does no I/O and reads no clock, so every scaling
behaviour is a table test, and ``keyorder simulate`` drives it poll by poll through hours of a
simulated group. The operator's poll observes lag (Kafka admin API) and the pods' own reports
(``pod_signals``), calls ``decide``, then applies the result and explains it in status, Events and
metrics. The Kubernetes HPA and KEDA are the reference for every rule they share.

The algorithm, in order:

1. **Paused** (an annotation) wins over everything: keep the size, learn nothing (KEDA's paused
   annotation wins over its fallback too).
2. **Unknown lag** (broker down, group missing) never scales: keep the current size, flag it; after
   ``fallback`` failed observations in a row, go to the fallback size (KEDA's fallback).
3. **Rebalancing**: a pod joined, left or rebalanced since the last poll, or a partition has no
   reporting pod: keep the size for at most ``HOLD_POLLS`` polls in a row (the pods' queues were just
   refilled, their view says nothing yet). After that the poll decides on Kafka's lag and the pods
   that do report, and says so (``PodsNotReporting``): one silent pod never freezes scaling.
4. **One worker's rate** = efficiency / handler time. The handler time is the mean the pods report
   for the interval (a slowdown lowers the rate on the next poll); the efficiency is the share of
   its time a saturated worker spends in the handler, learned from busy workers' time (handler
   seconds / interval / workers, on clean intervals at both ends of which keys waited for a worker,
   with a backlog in Kafka: a group that keeps up may idle between two saturated moments),
   the median of the last three, between 0.5 and 1 (0.9 before any): so the rate is always bounded by the handler
   time from both sides, and is never the group's drain divided by all workers (idle workers would
   bias it low). A new workload (image, handler, template) starts learning again. Pods that do not
   report at all (an older release) fall back to the drain rate per decided worker.
5. **Required workers** = (drainable lag / target drain time + arrivals / target utilisation) /
   rate. Arrivals are the rate that has lasted (``arrival_level``): the median of the last three
   intervals, so a burst that landed within one poll is counted once (in the lag), not twice; a step
   up to a plateau counts once it held five intervals (a burst of a minute is over before new pods own
   a partition: its lag sizes the group), a fall at once, a periodic producer at the level it reaches.
   The samples are kept in status, so a restarted operator resumes them. Lag
   that a blocked key pins is not drainable (KEDA's ``excludePersistentLag``).
6. **Bounds: when scaling cannot help** (all computed by ``bounds``), the size stops where it helps
   and the decision says why (``Limited``): a blocked key; one hot key holding most of the pods'
   queue, or whose estimated backlog alone takes longer than the target (then the rest of the
   backlog is sized to drain in that time); ``ordering: partition``; lag on only some partitions
   (``limit_to_partitions_with_lag``); workers idle with lag on two polls in a row; the CPU (a
   process executor gains nothing beyond the pod's cores, a thread or async one nothing beyond one
   core once its pods use it up). The CPU bound caps workers per pod on every path.
7. **Tolerance** (HPA's 10%): a change of fewer workers than ``tolerance`` x the current ones is
   not made, so noise at a capacity boundary does not resize the group.
8. **Shape**: pods first, each with the initial worker count, up to min(max replicas, partitions);
   only at that cap do workers per pod grow. Shrinking walks back the same path. A step that adds
   pods and lowers the workers per pod (6 x 29 -> 12 x 17) lowers them only once the new pods are
   ready: until then the pods in place keep theirs (``workers_while_pods_start``).
9. **Activation and zero**: below ``activation_lag`` only what keeps up with arrivals, but any lag
   or arrival keeps at least one pod; with ``scale_to_zero`` an empty backlog with no arrivals
   scales to zero (``activation_lag: 0``: any lag wakes, zero lag sleeps). A lag of at most 1 per
   partition that neither moves nor is held by any pod is a transaction's commit marker.
10. **Stabilization** (as the HPA does, over the recommended *replicas*, and separately over the
    recommended capacity, which sets the workers per pod): a scale-up takes the smallest
    recommendation of the scale-up window, a scale-down the largest of the scale-down window. No
    scale-down while the lag grows, nor on a poll with no last lag to tell (``growth_unknown``); none
    of pods while pods do not report, unless Kafka's lag shows the group keeps up and the pods keep
    their workers (``quiet_scale_in``). Then the rate limits
    (HPA's default: the larger of 4 pods or 100% per 15 s) cap the change of replicas, workers per
    pod making up the capacity where the pods are held back, within the CPU bound. The memory of
    recommendations keeps only those a window can still use (``window_memory``): a few entries, kept
    in status for a restarted operator (``resumed``, and ``restart`` for when it is written).
11. **The cost of a step**: every change of replicas is timed from the decision until every pod
    reports and every partition has an owner again (new pods starting, then the rebalance; the pods
    report when their partitions last changed). While the backlog drains at the current size sooner
    than the median of the last three steps took, no pod is added (``step_cost``): the workers per
    pod grow instead, a live resize that moves no partition.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, replace
from enum import StrEnum

from keyorder_operator.pod_signals import PodSignals


class RateKind(StrEnum):
    PODS = "Pods"
    PERCENT = "Percent"


@dataclass(frozen=True)
class RateLimit:
    """HPA-style: at most ``value`` pods (or percent of the pods) added or removed per ``period_seconds``."""

    kind: RateKind
    value: int
    period_seconds: float


@dataclass(frozen=True)
class ScalingLimits:
    """The part of the OrderedConsumer spec that the policy needs (all validated upstream)."""

    min_replicas: int = 1
    max_replicas: int | None = None
    """``None``: the partition count."""
    min_workers: int = 1
    max_workers: int = 256
    initial_workers: int = 16
    target_drain_seconds: float = 300.0
    activation_lag: int = 100
    scale_up_window_seconds: float = 0.0
    scale_down_window_seconds: float = 300.0
    scale_to_zero: bool = False
    partition_ordering: bool = False
    """``ordering: partition``: one worker per partition is all that can run."""
    limit_to_partitions_with_lag: bool = False
    """No more pods than partitions with lag (KEDA's ``limitToPartitionsWithLag``)."""
    scale_up_rates: tuple[RateLimit, ...] = ()
    """Rate limits on adding pods; the most permissive applies (HPA ``selectPolicy: Max``). Empty: none."""
    scale_down_rates: tuple[RateLimit, ...] = ()
    fallback_after: int = 0
    """Failed observations in a row before the fallback size; 0: no fallback."""
    fallback_replicas: int = 0
    tolerance: float = 0.1
    """A change of fewer workers than this share of the current capacity is not made (HPA's tolerance)."""
    target_utilization: float = 0.8
    """The share of the workers' capacity steady arrivals may use (the rest is headroom for noise)."""
    workload: str = ""
    """A fingerprint of what the pods run (image, handler, executor, template): learning restarts when it changes."""


class LimitKind(StrEnum):
    """Why scaling cannot help (the ``ScalingLimited`` condition's reason is the CamelCase form)."""

    BLOCKED_KEY = "blocked_key"
    HOT_KEY = "hot_key"
    PARTITION_ORDERING = "partition_ordering"
    PARTITIONS_WITH_LAG = "partitions_with_lag"
    IDLE_WORKERS = "idle_workers"
    CPU = "cpu"

    @property
    def reason(self) -> str:
        return "CpuBound" if self is LimitKind.CPU else "".join(part.capitalize() for part in self.value.split("_"))


@dataclass(frozen=True)
class Limited:
    kind: LimitKind
    message: str
    """'scaling cannot help: ...' with the numbers, for the condition and the Event."""


@dataclass(frozen=True)
class Observation:
    """What the operator measured for one consumer group."""

    lag: int | None
    """Sum over partitions of end offset - committed offset (``None``: could not be measured)."""
    partitions: int | None
    drain_rate: float | None = None
    """Messages committed per second over the last interval (``None``: no previous sample)."""
    arrival_rate: float | None = None
    """Messages produced per second (end offsets' movement) over the last interval."""
    partition_lags: tuple[int, ...] = ()
    """Lag per partition (empty: unknown)."""
    pods: PodSignals | None = None
    """The pods' own reports, summed (``None``: no pod answered or none runs)."""
    rollout_settled: bool = True
    """The Deployment has all its pods updated and ready (False while pods start or roll)."""
    paused: bool = False
    pods_expected: int | None = None
    """Ready pods asked for a report this poll (``None``: not known); ``pods.pods`` of them answered."""


@dataclass(frozen=True)
class Size:
    replicas: int
    workers: int

    @property
    def capacity(self) -> int:
        """Concurrent key workers across the group."""
        return self.replicas * self.workers


class RateSource(StrEnum):
    """Where the per-worker rate of a decision came from (a label of the operator's metric)."""

    HANDLER_TIME = "handler_time"
    """The handler time the pods report, times the learned (or default) efficiency."""
    DRAIN = "drain"
    """The drain rate per decided worker (pods that do not report)."""
    KEPT = "kept"
    """The last known rate (no pod reported a handler time this poll)."""
    NONE = "none"


class Cause(StrEnum):
    """Why a decision came out as it did, in one word (a label of the operator's decisions metric)."""

    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    RESHAPE = "reshape"
    """The same capacity with another split between pods and workers (a bound moved)."""
    STEADY = "steady"
    """The recommendation is the current size."""
    WITHIN_TOLERANCE = "within_tolerance"
    STABILIZING = "stabilizing"
    """A change held back by a stabilization window."""
    LAG_GROWING = "lag_growing"
    """A scale-down refused because the lag grows."""
    PODS_NOT_REPORTING = "pods_not_reporting"
    """A scale-down of pods refused while ready pods do not report (a silent pod misses the worker
    push that fewer pods would need)."""
    REBALANCING = "rebalancing"
    WAITING_FOR_RATE = "waiting_for_rate"
    """Pods starting: no rate known yet, the size waits for their first report."""
    PAUSED = "paused"
    LAG_UNKNOWN = "lag_unknown"
    FALLBACK = "fallback"
    STEP_COST = "step_cost"
    """More pods held back: the backlog drains at the current size before a scale step would settle,
    or the backlog dominates and more pods would drain it no faster (a step would only pause the
    partitions it moves)."""


@dataclass(frozen=True)
class Caveat:
    """Something the decision had to do without (shown as the Scaling condition's reason and an Event)."""

    reason: str
    """CamelCase, e.g. ``PodsNotReporting``."""
    message: str


@dataclass(frozen=True)
class ScalingState:
    """What the policy remembers between reconciles (kept in the CR status)."""

    current: Size
    recommendations: tuple[tuple[float, int, int], ...] = ()
    """Recent ``(time, replicas, workers)`` recommendations, for the stabilization windows: only those a
    window can still use (``window_memory``), oldest first; the newest is always kept."""
    per_worker_rate: float | None = None
    """Messages/s of one key worker in use (the last decision's)."""
    rate_source: RateSource = RateSource.NONE
    rate_samples: tuple[float, ...] = ()
    """Per-worker drain rates measured without pod reports (their median is the rate then)."""
    efficiency_samples: tuple[float, ...] = ()
    """Busy workers' share of their time in the handler, from saturated clean intervals."""
    handler_time: float | None = None
    """The last interval's mean handler seconds per call."""
    arrival_samples: tuple[float, ...] = ()
    """The last intervals' arrival rates, oldest first (``arrival_level`` reads the rate used from them)."""
    arrivals_at: float | None = None
    """When the newest of ``arrival_samples`` was measured: a restarted operator resumes them unless they
    are older than ``ARRIVALS_STALE_SECONDS``."""
    drainable_lag: int | None = None
    """The drainable lag at the last poll (to tell a growing lag)."""
    settled: bool = True
    """False right after a resize: the next drain rate still reflects the old size."""
    pod_totals: tuple[int, float, int, int, float] | None = None
    """The pods' ``(handler calls, handler seconds, rebalances, pods, CPU seconds)`` at the last poll."""
    pod_totals_at: float | None = None
    """When ``pod_totals`` were read (for interval rates)."""
    idle_polls: int = 0
    """Polls in a row with lag and idle workers."""
    failed_observations: int = 0
    """Polls in a row whose lag could not be measured (for the fallback)."""
    held_polls: int = 0
    """Polls in a row held for a rebalance (at most ``HOLD_POLLS``)."""
    silent_polls: int = 0
    """Polls in a row on which some ready pod did not report."""
    replica_changes: tuple[tuple[float, int], ...] = ()
    """Recent ``(time, replicas before)`` changes of the replicas, for the rate limits."""
    limit: Limited | None = None
    """The limit of the last decision (kept while a rebalance hides the pods' view)."""
    limit_gone_polls: int = 0
    """Polls in a row on which the kept limit no longer held (it clears after ``LIMIT_CLEAR_POLLS``)."""
    workload: str = ""
    """The workload the rate was learned for (``ScalingLimits.workload``)."""
    cpu_workers_per_pod: int | None = None
    """The last CPU bound on workers per pod the pods' reports gave (kept while they are silent)."""
    polled_at: float | None = None
    """When the last poll with a lag was decided (the interval the growth of the lag is over)."""
    saturated: bool = False
    """The workers were the limit at the last poll (``saturated``: keys waited and nearly every worker was busy)."""
    step_started_at: float | None = None
    """When the last change of replicas was decided, until the group settles after it."""
    step_seconds: tuple[float, ...] = ()
    """The last scale steps' durations: from the decision until every pod reports and every partition
    has an owner again (new pods starting, then the rebalance). Their median is what a step costs."""


@dataclass(frozen=True)
class Decision:
    before: Size
    target: Size
    reason: str
    """One line with the numbers, for the Event and the status ("scaled replicas 2->4: lag ...")."""
    state: ScalingState
    """The state to keep for the next reconcile."""
    cause: Cause = Cause.STEADY
    lag_unknown: bool = False
    limited: Limited | None = None
    """Set when scaling cannot help (or stopped where it stops helping)."""
    caveat: Caveat | None = None
    """Set when the decision was made without part of its inputs (pods not reporting)."""
    handler_seconds: float | None = None
    """Mean handler time per call the pods reported for the interval (for status)."""
    recommended: Size | None = None
    """The size recommended before stabilization, tolerance and rate limits."""
    hold_workers: bool = False
    """Pods of a scale step still start and some ready pod runs more workers than ``target.workers``: the
    ready pods keep theirs (only a pod below the count gets it), so the ready capacity never drops while
    the new pods start; the first decision once they are ready lowers them (``workers_while_pods_start``)."""

    @property
    def scaled(self) -> bool:
        return self.target != self.before


SATURATION_SECONDS = 1.0
"""Without pod reports: a backlog worth at least this many seconds at the measured drain rate
means the workers were busy the whole interval (with a trickle they idle and would look slow)."""
IDLE_SHARE = 0.5
SATURATED_SHARE = 0.9
"""At least this share of the workers busy, with keys waiting: the workers are the limit."""
HOT_KEY_SHARE = 0.5
"""The longest lane holds at least this share of the pods' queue: a hot key. (Below it the bound,
computed over the pods' look-ahead window only, would be too uncertain to stop scaling on.)"""
IDLE_POLLS = 2
MIN_HANDLER_CALLS = 20
"""Handler calls needed before their mean time counts as an estimate."""
DEFAULT_EFFICIENCY = 0.9
"""Before any is learned: a busy worker spends about this share of its time inside the handler
(the rest: dispatch, commits, the poll thread's share of the CPU; tens of microseconds a message)."""
EFFICIENCY_RANGE = (0.5, 1.0)
"""A learned efficiency is kept within these: the handler time bounds the rate from both sides."""
SAMPLES = 3
"""Learned efficiencies, arrival rates and drain rates are the median of the last three."""
MAX_RATE_STEP = 2.0
"""Without reports, a new drain measurement moves the per-worker rate by at most this factor."""
HOLD_POLLS = 2
"""Polls in a row a rebalance may hold the size; then the poll decides on what it has."""
LIMIT_CLEAR_POLLS = 2
"""A limit clears only when absent on this many polls in a row: one poll of refilling queues must
not flip the condition and send an Event each way."""
SEEN_BY_PODS = frozenset({LimitKind.BLOCKED_KEY, LimitKind.HOT_KEY, LimitKind.IDLE_WORKERS, LimitKind.CPU})
"""Limits only the pods' reports show: while some pods are silent or rebalancing, their absence is no
evidence, so they neither clear nor count towards clearing."""
SEED_AGE = 0.001
"""How long ago the seed of an empty history was 'recommended' (outside a zero-length up-window)."""
MARKER_LAG = 1
"""A transaction's commit marker occupies one offset per partition."""
GROWTH_SHARE = 0.025
"""The lag grows when it rose by more than this share of the interval's arrivals (plus half the
activation lag): then no scale-down is made."""
DEFAULT_SCALE_UP_RATES = (RateLimit(RateKind.PODS, 4, 15.0), RateLimit(RateKind.PERCENT, 100, 15.0))
"""HPA's default scale-up policy: the larger of 4 pods or 100% per 15 s."""


def duration(seconds: float) -> str:
    """Human-sized duration for reasons and Events: 45 s, 12.5 min, 3.2 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def replica_cap(limits: ScalingLimits, partitions: int) -> int:
    """The most pods that can hold a partition: min(max replicas, partitions), at least the minimum."""
    cap = min(limits.max_replicas or partitions, partitions)
    return max(cap, limits.min_replicas, 1)


def workers_for(capacity: int, replicas: int, partitions: int) -> int:
    """Workers per pod so that the busiest pod (the one with the most partitions) keeps up with its
    partitions' share of ``capacity`` workers: the group is only as fast as that pod."""
    if replicas <= 0:
        return 0
    if partitions <= 0:
        return math.ceil(capacity / replicas)
    busiest = math.ceil(partitions / min(replicas, partitions))
    return math.ceil(capacity * busiest / partitions)


def drain_capacity(size: Size, partitions: int, workers_per_pod: int | None = None) -> float:
    """Workers' worth of drain ``size`` gives a backlog spread over ``partitions``: the busiest pod (the
    one with the most partitions) sets the pace at its workers per partition, within the CPU's bound on
    workers per pod. 5 pods x 14 workers on 8 partitions drain as fast as 8 x 7: 56 either way."""
    if size.replicas <= 0:
        return 0.0
    workers = min(size.workers, workers_per_pod) if workers_per_pod is not None else size.workers
    if partitions <= 0:
        return float(size.replicas * workers)
    busiest = math.ceil(partitions / min(size.replicas, partitions))
    return workers * partitions / busiest


def on_current_pods(target: Size, current: Size, bound: Bound, limits: ScalingLimits, partitions: int) -> Size:
    """``target``'s drain capacity on the pods in place: a live resize of their workers, no rebalance
    (never fewer workers than they have), within the bounds."""
    drain = math.ceil(drain_capacity(target, partitions, bound.workers_per_pod))
    workers = max(workers_for(drain, current.replicas, partitions), current.workers)
    return fitted(Size(current.replicas, workers), bound, limits, partitions)


def shape(
    capacity: int,
    limits: ScalingLimits,
    partitions: int,
    max_replicas: int | None = None,
    max_workers_per_pod: int | None = None,
) -> Size:
    """Pods first (with the initial workers), up to the partition cap; then workers per pod. The
    pods spread the partitions evenly: 11 pods on 12 partitions leave one pod with two, which then
    needs twice the workers of the others (the group drains only as fast as that pod), so the same
    work takes 6 pods with two partitions each, or 12 with one (like KEDA's
    ``ensureEvenDistributionOfPartitions``)."""
    cap = replica_cap(limits, partitions)
    if max_replicas is not None:
        cap = max(min(cap, max_replicas), limits.min_replicas, 1)
    most_workers = limits.max_workers
    if max_workers_per_pod is not None:
        most_workers = max(min(most_workers, max_workers_per_pod), limits.min_workers)
    initial = min(max(limits.initial_workers, limits.min_workers), most_workers)
    wanted = min(max(math.ceil(capacity / initial), limits.min_replicas), cap)
    if wanted <= 0:
        return Size(0, initial)
    if partitions <= 0:
        return Size(wanted, min(max(math.ceil(capacity / wanted), initial), most_workers))
    # the fewest pods that give the busiest pod as few partitions as ``wanted`` pods would (or fewer)
    busiest = math.ceil(partitions / wanted)
    while True:
        replicas = min(max(math.ceil(partitions / busiest), limits.min_replicas), cap)
        workers = max(workers_for(capacity, replicas, partitions), initial)
        if workers <= most_workers or replicas >= cap:
            return Size(replicas, min(workers, most_workers))
        busiest -= 1  # more workers per pod than allowed: spread over more pods


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


@dataclass(frozen=True)
class Rate:
    """One worker's rate and how it was found."""

    per_worker: float | None
    source: RateSource
    handler_time: float | None
    efficiency_samples: tuple[float, ...]
    rate_samples: tuple[float, ...]


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


# -- the cost of a scale step ------------------------------------------------------------------------
LONGEST_STEP_SECONDS = 600.0
"""A scale step that took longer than this to settle is not counted as one (the operator restarted,
a catch-up hand-over ran, a rollout was stuck): it would stop the policy from adding pods for hours."""


def step_cost(state: ScalingState) -> float | None:
    """Seconds a change of replicas takes to settle, as measured on this group (``None``: not yet)."""
    return statistics.median(state.step_seconds) if state.step_seconds else None


def group_settled(observation: Observation, state: ScalingState) -> bool:
    """Every decided pod runs the current template, reports, and every partition has an owner."""
    pods = observation.pods
    return (
        pods is not None
        and observation.rollout_settled
        and reports_complete(observation)
        and pods.pods == state.current.replicas
        and pods.partitions_assigned >= (observation.partitions or 0)
    )


def timed_step(observation: Observation, state: ScalingState, now: float) -> ScalingState:
    """The state with the step in progress timed once the group settled: it ended at the group's latest
    change of partitions (the pods report its age), or at this poll when they do not say."""
    started = state.step_started_at
    if started is None or not group_settled(observation, state):
        return state
    age = observation.pods.assignment_age if observation.pods is not None else None
    ended = now - age if age is not None else now
    seconds = max(ended - started, 0.0)
    if seconds > LONGEST_STEP_SECONDS:  # not a rebalance's cost: a restart, a hand-over, a stuck rollout
        return replace(state, step_started_at=None)
    return replace(state, step_started_at=None, step_seconds=(*state.step_seconds, round(seconds, 3))[-SAMPLES:])


def step_outlasts_backlog(
    observation: Observation, lag: int, arrivals: float, cost: float | None, growing: bool
) -> float | None:
    """Seconds the backlog still needs at the current size when that is less than a scale step costs
    (so more pods would only pause the partitions they take over); ``None`` otherwise."""
    if cost is None or growing:
        return None
    seconds = net_drain_seconds(lag, observation.drain_rate, arrivals)
    if seconds is None or math.isinf(seconds) or (observation.drain_rate or 0) <= arrivals:
        return None
    return seconds if seconds < cost else None


# -- steps 5 and 6: what is needed, and what can help ------------------------------------------------
def backlog_dominates(lag: int, arrivals: float, limits: ScalingLimits) -> bool:
    """Most of the needed rate is for draining the backlog within the target, not for keeping up with
    arrivals: the need is passing (the size shrinks once the backlog is gone), so a reshape into more
    pods is worth a rebalance only if it drains faster. When arrivals dominate, the size is a lasting
    one and pods come first."""
    return lag / limits.target_drain_seconds > arrivals / max(limits.target_utilization, 0.01)


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


def required_capacity(
    lag: int,
    arrivals: float,
    current: Size,
    per_worker_rate: float | None,
    limits: ScalingLimits,
    observation: Observation,
) -> int:
    """Workers needed to drain ``lag`` within the target while keeping up with ``arrivals`` at the
    target utilisation."""
    needed_rate = lag / limits.target_drain_seconds + arrivals / max(limits.target_utilization, 0.01)
    if needed_rate <= 0:
        return 0
    if per_worker_rate:
        return math.ceil(needed_rate / per_worker_rate)
    if observation.pods is not None or not observation.rollout_settled:
        # pods starting or warming up: their report gives the rate (a blind step costs a rebalance)
        return current.capacity
    return max(current.capacity * 2, 1)  # pods run but do not report (an older release): grow stepwise


@dataclass(frozen=True)
class Bound:
    """An upper bound on what helps, and why it binds."""

    capacity: int | None = None
    replicas: int | None = None
    limited: Limited | None = None
    workers_per_pod: int | None = None
    """CPU: more workers per pod add nothing (more pods still may)."""
    cpu_use: float | None = None


def hot_key_horizon(observation: Observation, handler_time: float | None, limits: ScalingLimits) -> float | None:
    """Seconds the busiest key needs on its own (its estimated backlog x the handler time), when
    that is longer than the target: no size drains the backlog sooner, so sizing for the target
    would add pods and workers that only wait for that key."""
    pods = observation.pods
    if pods is None or pods.busiest is None or not handler_time:
        return None
    seconds = pods.busiest.estimated_backlog * handler_time
    return seconds if seconds > limits.target_drain_seconds else None


def _first_limit(
    observation: Observation, limits: ScalingLimits, state: ScalingState, needed: int, idle_polls: int
) -> Bound:
    """The first of these that binds, in order: blocked key, hot key, partition ordering, partitions
    with lag, idle workers (``Bound()`` when none does)."""
    pods, current = observation.pods, state.current
    lag, partitions = observation.lag or 0, observation.partitions or 0
    if pods is not None and pods.blocked_lag >= max(limits.activation_lag, 1):
        blocked = [held for held in pods.held if held.blocked]
        where = ", ".join(f"{held.where} (lag {held.lag})" for held in blocked[:3])
        message = (
            f"scaling cannot help: a blocked key holds the commit of {where}; {pods.blocked_lag} of the lag "
            "cannot drain until the handler succeeds on it or the message is removed"
        )
        limited = Limited(LimitKind.BLOCKED_KEY, message)
        if drainable_lag(observation) < limits.activation_lag:
            return Bound(capacity=current.capacity, limited=limited)
        return Bound(limited=limited)  # the rest of the lag still drives the size
    if pods is not None and pods.busiest is not None and lag >= limits.activation_lag:
        share = pods.busiest_share
        if share >= HOT_KEY_SHARE and pods.queued >= pods.workers:  # a nearly empty queue is no hot key
            parallelism = pods.queued / pods.busiest.backlog
            cap = max(math.ceil(parallelism), current.capacity)
            message = (
                f"scaling cannot help: key '{pods.busiest.key}' holds {share:.0%} of the backlog on "
                f"{pods.busiest.where}; bound {parallelism:.1f}\u00d7"
            )
            if needed > cap:
                return Bound(capacity=cap, limited=Limited(LimitKind.HOT_KEY, message))
    if limits.partition_ordering and partitions and needed > partitions:
        message = (
            f"scaling cannot help: ordering is by partition, so at most {partitions} workers (one per "
            f"partition) can run; {needed} would be needed"
        )
        return Bound(capacity=partitions, limited=Limited(LimitKind.PARTITION_ORDERING, message))
    if limits.limit_to_partitions_with_lag and observation.partition_lags:
        with_lag = sum(1 for value in observation.partition_lags if value > 0)
        wanted = shape(needed, limits, partitions)
        if with_lag and wanted.replicas > with_lag:
            message = (
                f"scaling cannot help beyond {with_lag} pods: only {with_lag} of {partitions} partitions have "
                "lag (limitToPartitionsWithLag)"
            )
            return Bound(replicas=with_lag, limited=Limited(LimitKind.PARTITIONS_WITH_LAG, message))
    if idle_polls >= IDLE_POLLS and pods is not None and needed > current.capacity:
        message = (
            f"scaling cannot help: {pods.busy} of {pods.workers} workers busy and no key waiting for one "
            f"while the lag is {lag}: the limit is before the workers (fetching, CPU or the broker)"
        )
        return Bound(capacity=current.capacity, limited=Limited(LimitKind.IDLE_WORKERS, message))
    return Bound()


CPU_BUSY_SHARE = 0.85
"""A pod using this share of the cores its executor can use is CPU-bound."""


def cpu_use(observation: Observation, state: ScalingState, now: float) -> float | None:
    """Cores the pods used per pod over the interval (``None``: not measurable)."""
    pods, previous = observation.pods, state.pod_totals
    if pods is None or previous is None or state.pod_totals_at is None or not pods.pods:
        return None
    if not same_pods(observation, state):
        return None
    seconds = now - state.pod_totals_at
    used = pods.cpu_seconds_total - previous[4]
    if seconds <= 0 or used < 0 or not pods.cpu_cores:
        return None
    return used / seconds / pods.pods


def cpu_bound(observation: Observation, state: ScalingState, now: float) -> Bound:
    """CPU bounds on workers per pod: a process executor gains nothing beyond the pod's cores; a
    thread or async one nothing beyond one core (the GIL) once its pods use it up."""
    pods = observation.pods
    if pods is None:
        return Bound(workers_per_pod=state.cpu_workers_per_pod)  # silent pods: the last known bound holds
    if not pods.cpu_cores:
        return Bound()
    cores = pods.cores_per_pod
    if pods.executor == "process":
        return Bound(workers_per_pod=max(math.ceil(cores), 1))
    used = cpu_use(observation, state, now)
    if pods.executor in ("thread", "async") and used is not None and used >= CPU_BUSY_SHARE * min(cores, 1.0):
        return Bound(workers_per_pod=state.current.workers, cpu_use=used)
    return Bound()


def workers_idle(observation: Observation, limits: ScalingLimits) -> bool:
    """Lag to drain, yet the pods hold little, no key waits and most workers idle."""
    pods = observation.pods
    if pods is None or pods.workers == 0 or drainable_lag(observation) < max(limits.activation_lag, 1):
        return False
    return pods.lanes_ready == 0 and pods.busy < IDLE_SHARE * pods.workers and pods.queued < pods.workers


def _cpu_limit(observation: Observation, cpu: Bound, size: Size) -> Limited:
    pods = observation.pods
    cores = pods.cores_per_pod if pods else 0.0
    if cpu.cpu_use is None:
        message = (
            f"scaling cannot help beyond {size.replicas} pods x {size.workers} workers: the process executor "
            f"gains nothing from more workers than each pod's {cores:g} cores"
        )
    else:
        message = (
            f"scaling cannot help beyond {size.replicas} pods x {size.workers} workers: the pods use "
            f"{cpu.cpu_use:.2f} of their {cores:g} cores with a {pods.executor if pods else 'thread'} executor "
            "(one core at most, the GIL); more workers per pod will not help (use --executor process or more "
            "partitions)"
        )
    return Limited(LimitKind.CPU, message)


def draining(observation: Observation, limits: ScalingLimits) -> bool:
    """A backlog to drain (the drainable lag reached the activation lag), not just arrivals to keep up
    with; with ``activation_lag: 0`` any lag is one, and none is not."""
    lag = drainable_lag(observation)
    return lag > 0 and lag >= limits.activation_lag


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
    evidence, as when every pod is silent)."""
    in_flight = in_flight_lag(arrivals, limits)
    previous = state.drainable_lag
    return drainable_lag(observation) <= in_flight and previous is not None and previous <= in_flight


def quiet_scale_in(
    target: Size, current: Size, observation: Observation, state: ScalingState, arrivals: float, limits: ScalingLimits
) -> bool:
    """A scale-in of pods that may go ahead while some pods do not report: the group keeps up on Kafka's
    lag (``kept_up``; the down-window, whose recommendations were all lower, held it until now), and it
    needs no more workers per pod (a pod that does not answer its report gets no worker push either)."""
    return target.workers <= current.workers and kept_up(observation, state, arrivals, limits)


def _hot_key_horizon_bound(
    observation: Observation,
    limits: ScalingLimits,
    current: Size,
    needed: int,
    per_worker_rate: float | None,
    handler_time: float | None,
    arrivals: float,
) -> Bound | None:
    """The hot key's horizon as a bound: when that key alone takes longer than the target, the rest
    of the backlog is sized to drain in that time (``None`` when that needs no fewer workers)."""
    pods = observation.pods
    horizon = hot_key_horizon(observation, handler_time, limits)
    if horizon is None or pods is None or pods.busiest is None:
        return None
    for_horizon = replace(limits, target_drain_seconds=horizon)
    lag = drainable_lag(observation)
    within = max(required_capacity(lag, arrivals, current, per_worker_rate, for_horizon, observation), 1)
    if within >= needed:
        return None
    busiest = pods.busiest
    message = (
        f"scaling cannot help: key '{busiest.key}' holds about {busiest.estimated_backlog} messages on "
        f"{busiest.where}, {duration(horizon)} at {1000 * (handler_time or 0):.1f} ms each, longer than the "
        f"{duration(limits.target_drain_seconds)} target; the rest of the backlog is sized to drain in that time"
    )
    return Bound(capacity=within, limited=Limited(LimitKind.HOT_KEY, message))


def bounds(
    observation: Observation,
    limits: ScalingLimits,
    state: ScalingState,
    needed: int,
    *,
    idle_polls: int,
    now: float,
    per_worker_rate: float | None,
    handler_time: float | None,
    arrivals: float,
) -> Bound:
    """Every limit on what helps, in one place: how far ``needed`` workers may go, and why they stop.

    While a backlog drains: the hot key's horizon first (no size drains sooner than that key, so
    fewer workers are needed), then the first limit that binds (``_first_limit``), then the CPU's
    bound on workers per pod, whose reason shows only when nothing else binds and it holds the size
    below what is needed. Below the activation lag the size only keeps up with arrivals, and the
    first limit only explains it (no horizon, no CPU bound)."""
    if not draining(observation, limits):
        return _first_limit(observation, limits, state, needed, idle_polls)
    horizon = _hot_key_horizon_bound(
        observation, limits, state.current, needed, per_worker_rate, handler_time, arrivals
    )
    if horizon is not None and horizon.capacity is not None:
        needed = horizon.capacity
    first = _first_limit(observation, limits, state, needed, idle_polls)
    caps = [bound.capacity for bound in (horizon, first) if bound is not None and bound.capacity is not None]
    capacity = min(caps, default=None)
    limited = first.limited or (horizon.limited if horizon is not None else None)
    cpu = cpu_bound(observation, state, now)
    if limited is None and cpu.workers_per_pod is not None:
        allowed = needed if capacity is None else min(needed, capacity)
        partitions = observation.partitions or 0
        size = shape(allowed, limits, partitions, max_replicas=first.replicas, max_workers_per_pod=cpu.workers_per_pod)
        if size.capacity < allowed:
            limited = _cpu_limit(observation, cpu, size)
    return Bound(capacity=capacity, replicas=first.replicas, limited=limited, workers_per_pod=cpu.workers_per_pod)


# -- steps 8 and 9: the size ---------------------------------------------------------------------------
def activation_size(
    observation: Observation, limits: ScalingLimits, per_worker_rate: float | None, arrivals: float, partitions: int
) -> Size:
    """Below the activation lag: what keeps up with arrivals, at least one pod while any lag or
    arrival is pending, and zero (with ``scale_to_zero``) once nothing is left or arriving."""
    nothing_left = observation.lag == 0 or is_marker_residue(observation)  # a blocked key's lag stays
    arriving = (observation.arrival_rate or 0.0) > 0 or arrivals > 0
    if limits.scale_to_zero and nothing_left and not arriving:
        return Size(0, limits.initial_workers)
    keep_up = math.ceil(arrivals / limits.target_utilization / per_worker_rate) if per_worker_rate else 0
    pending = not nothing_left or arriving  # a blocked key's lag needs its pod too
    size = shape(max(keep_up, 1 if pending else 0), limits, partitions)
    if pending and size.replicas == 0:
        return Size(1, size.workers)  # never strand a message below the activation lag
    return size


def fitted(size: Size, bound: Bound, limits: ScalingLimits, partitions: int) -> Size:
    """``size`` within what can help: the replica cap and bound, the workers' range, the CPU's bound
    on workers per pod, and with ``ordering: partition`` no more workers than the pod's partitions."""
    cap = replica_cap(limits, partitions)
    if bound.replicas is not None:
        cap = max(min(cap, bound.replicas), limits.min_replicas, 1)
    replicas = min(size.replicas, cap)
    most = limits.max_workers
    if bound.workers_per_pod is not None:
        most = max(min(most, bound.workers_per_pod), limits.min_workers)
    if limits.partition_ordering and replicas:
        most = max(min(most, math.ceil(partitions / replicas)), limits.min_workers)
    return Size(replicas, min(max(size.workers, limits.min_workers), most))


def bounded_size(needed: int, bound: Bound, limits: ScalingLimits, partitions: int) -> Size:
    """The shape of ``needed`` workers within ``bound``."""
    if bound.capacity is not None:
        needed = min(needed, bound.capacity)
    size = shape(needed, limits, partitions, max_replicas=bound.replicas, max_workers_per_pod=bound.workers_per_pod)
    return fitted(size, bound, limits, partitions)


def within_tolerance(needed: int, current: Size, bound: Bound, limits: ScalingLimits, partitions: int) -> bool:
    """The needed workers differ from the current ones by no more than the tolerance, and the current
    size is one the bounds allow: keep it (HPA's tolerance)."""
    if current.replicas == 0 or current.capacity == 0 or needed <= 0:
        return False
    if fitted(current, bound, limits, partitions) != current or current.replicas < limits.min_replicas:
        return False
    natural = shape(
        current.capacity, limits, partitions, max_replicas=bound.replicas, max_workers_per_pod=bound.workers_per_pod
    )
    if natural.replicas != current.replicas:
        return False  # a rate-limited step (workers standing in for pods held back): grow into the shape
    return abs(needed / current.capacity - 1) <= limits.tolerance


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


STEADY_BAND = 0.02
"""Drain and arrivals within this share of each other: the group keeps up, and the lag is only what
is in flight (it holds at its level)."""


def net_drain_seconds(lag: int, drain: float | None, arrivals: float | None) -> float | None:
    """Seconds until the lag is worked off, net of arrivals: ``lag / (drain - arrivals)`` while the lag
    shrinks; ``lag / drain`` while the group just keeps up (the lag is what is in flight); ``inf``
    while the lag grows; ``None`` before a drain rate is measured."""
    if lag == 0:
        return 0.0
    if drain is None:
        return None
    arriving = arrivals or 0.0
    net = drain - arriving
    band = STEADY_BAND * max(drain, arriving)
    if net > band:
        return lag / net
    if net >= -band and drain > 0:
        return lag / drain
    return math.inf


def drain_eta(observation: Observation, arrivals: float) -> str:
    """The drain ETA in words: ``growing`` (with both rates) when the lag does not shrink."""
    lag = observation.lag or 0
    drain = observation.drain_rate
    if lag == 0:
        return "drained"
    seconds = net_drain_seconds(lag, drain, arrivals)
    if seconds is None or drain is None:
        return "unknown (no drain measured yet)"
    if math.isinf(seconds):
        return f"growing (arrivals {arrivals:.0f}/s, drain {drain:.0f}/s)"
    return duration(seconds)


def _describe(before: Size, after: Size, observation: Observation, limits: ScalingLimits, arrivals: float) -> str:
    facts = (
        f"lag {observation.lag or 0}, drain ETA {drain_eta(observation, arrivals)}, "
        f"target {duration(limits.target_drain_seconds)}"
    )
    changes = []
    if after.replicas != before.replicas:
        changes.append(f"replicas {before.replicas}\u2192{after.replicas}")
    if after.workers != before.workers:
        changes.append(f"workers/pod {before.workers}\u2192{after.workers}")
    if not changes:
        return f"kept {before.replicas} replicas x {before.workers} workers: {facts}"
    return f"scaled {', '.join(changes)}: {facts}"


def relearned(state: ScalingState, limits: ScalingLimits) -> ScalingState:
    """The state for ``limits.workload``: what was learned for another workload is dropped."""
    if state.workload == limits.workload:
        return state
    return replace(
        state,
        workload=limits.workload,
        per_worker_rate=None,
        rate_source=RateSource.NONE,
        rate_samples=(),
        efficiency_samples=(),
        handler_time=None,
        cpu_workers_per_pod=None,
    )


def _kept(state: ScalingState, reason: str, new_state: ScalingState, cause: Cause) -> Decision:
    return Decision(before=state.current, target=state.current, reason=reason, state=new_state, cause=cause)


def _size_words(size: Size) -> str:
    return f"{size.replicas} replicas x {size.workers} workers"


def ready_pods(observation: Observation) -> int | None:
    """The ready pods: those asked for a report, else those that answered (``None``: not known)."""
    if observation.pods_expected is not None:
        return observation.pods_expected
    return observation.pods.pods if observation.pods is not None else None


def workers_while_pods_start(decision: Decision, observation: Observation, now: float) -> Decision:
    """``decision``, with the pods already running keeping their workers while a scale step's pods start.

    A step that adds pods lowers the workers per pod when the same capacity spreads over more pods (6 x 29
    -> 12 x 17). Lowered at once, the running pods would lose workers for the whole start of the new ones
    (30 s in ``keyorder simulate``): 6 x 17 workers at 10 ms handle 10,000/s, under the 12,000/s that 6 x 29
    kept up with, and the backlog would grow because the group scaled up. So while fewer pods are ready
    than decided, within ``LONGEST_STEP_SECONDS`` of the step, a ready pod running more than
    ``target.workers`` keeps them (``Decision.hold_workers``: the operator pushes the count only to the pods
    below it); the first decision once the decided pods are ready lowers them, whatever its path. A step
    whose pods are not ready in that time (a pod left Pending) holds nothing any more. The decided size
    (``target``, the state's ``current``, the windows, the status) stays the one the step is for."""
    target, before, pods = decision.target, decision.before, observation.pods
    started = decision.state.step_started_at
    if started is None or now - started > LONGEST_STEP_SECONDS or target.replicas == 0:
        return decision
    ready = ready_pods(observation)
    if ready is not None and ready >= target.replicas:
        return decision
    adding = target.replicas > before.replicas
    if adding:
        running: int | None = before.workers  # what the pods in place were last pushed
    else:
        running = math.ceil(pods.workers / pods.pods) if pods is not None and pods.pods else None
    if running is not None and running <= target.workers:
        return decision
    then = f"then {target.workers}"
    if adding:
        added = target.replicas - before.replicas
        hold = f"adding {added} pods; workers per pod stay {running} until they are ready ({then})"
    elif ready is not None and running is not None:
        hold = (
            f"{target.replicas - ready} of {target.replicas} pods starting; the {ready} ready pods keep their "
            f"{running} workers per pod until they are ready ({then})"
        )
    else:
        hold = (
            f"pods starting; the ready pods keep their workers per pod until all {target.replicas} are ready ({then})"
        )
    return replace(decision, hold_workers=True, reason=f"{decision.reason}; {hold}")


def decide(observation: Observation, limits: ScalingLimits, state: ScalingState, now: float) -> Decision:
    """The size the consumer group should have now, and why (with the workers of the pods in place kept
    while a step's new pods start: ``workers_while_pods_start``)."""
    return workers_while_pods_start(_decided(observation, limits, state, now), observation, now)


def _decided(observation: Observation, limits: ScalingLimits, state: ScalingState, now: float) -> Decision:
    state = timed_step(observation, relearned(state, limits), now)
    current = state.current
    pods = observation.pods
    totals = pods.totals() if pods is not None else None
    if observation.paused:  # pause wins over the fallback, the catch-up and everything else
        lag = "unknown" if observation.lag is None else str(observation.lag)
        return _kept(
            state,
            f"paused: keeping {_size_words(current)} (lag {lag})",
            replace(state, pod_totals=totals, pod_totals_at=now if totals else None, settled=False),
            Cause.PAUSED,
        )
    if observation.lag is None or not observation.partitions:
        return _lag_unknown(state, limits)
    silent_polls = 0 if reports_complete(observation) else state.silent_polls + 1
    changed = membership_changed(observation, state, limits)
    if changed and state.held_polls < HOLD_POLLS:
        held = _kept(
            state,
            f"pods rebalancing: keeping {_size_words(current)} until they report a settled view "
            f"(lag {observation.lag}, poll {state.held_polls + 1} of at most {HOLD_POLLS})",
            replace(
                state,
                failed_observations=0,
                pod_totals=totals,
                pod_totals_at=now if totals else None,
                held_polls=state.held_polls + 1,
                silent_polls=silent_polls,
                saturated=False,
            ),
            Cause.REBALANCING,
        )
        return replace(held, limited=state.limit)
    # held long enough (a silent pod, a partition nobody reports): decide on what there is, and do not
    # hold again until the pods have shown one settled view
    held_polls = state.held_polls if changed else 0
    settled = not changed and silent_polls == 0
    return _sized(observation, limits, replace(state, held_polls=held_polls), now, silent_polls, settled)


def _lag_unknown(state: ScalingState, limits: ScalingLimits) -> Decision:
    current = state.current
    failures = state.failed_observations + 1
    if limits.fallback_after and failures >= limits.fallback_after and current.replicas != limits.fallback_replicas:
        target = Size(limits.fallback_replicas, current.workers)
        reason = (
            f"lag unknown on {failures} polls in a row: fallback to {target.replicas} replicas (was {current.replicas})"
        )
        new_state = replace(state, current=target, failed_observations=failures, settled=False)
        return Decision(
            before=current, target=target, reason=reason, state=new_state, cause=Cause.FALLBACK, lag_unknown=True
        )
    decision = _kept(
        state,
        f"lag unknown: keeping {_size_words(current)}",
        replace(state, failed_observations=failures),
        Cause.LAG_UNKNOWN,
    )
    return replace(decision, lag_unknown=True)


def _sized(
    observation: Observation,
    limits: ScalingLimits,
    state: ScalingState,
    now: float,
    silent_polls: int,
    settled: bool,
) -> Decision:
    """The decision of a poll that has a lag and is not held: need, bounds, tolerance, windows, limits.
    ``settled``: every pod reported and none rebalanced, so a limit only the pods show may clear."""
    current, pods = state.current, observation.pods
    partitions = observation.partitions or 0
    rate = learn_rate(observation, state, limits, now)
    arrivals, arrival_samples = smoothed_arrivals(observation, state)
    idle = workers_idle(observation, limits) and clean_interval(observation, state)
    idle_polls = state.idle_polls + 1 if idle else 0
    keep_up: Size | None = None  # below the activation lag: the size that keeps up (the bounds only explain it)
    lag = drainable_lag(observation)
    if draining(observation, limits):
        needed = max(required_capacity(lag, arrivals, current, rate.per_worker, limits, observation), 1)
    else:
        keep_up = activation_size(observation, limits, rate.per_worker, arrivals, partitions)
        needed = keep_up.capacity
    bound = bounds(
        observation,
        limits,
        state,
        needed,
        idle_polls=idle_polls,
        now=now,
        per_worker_rate=rate.per_worker,
        handler_time=rate.handler_time,
        arrivals=arrivals,
    )
    if keep_up is not None:
        recommended = fitted(keep_up, replace(bound, capacity=None, replicas=None), limits, partitions)
    else:
        recommended = bounded_size(needed, bound, limits, partitions)
    cause = Cause.STEADY
    wanted = min(needed, bound.capacity) if bound.capacity is not None else needed
    growing = lag_growing(observation, state, limits, now)
    tolerated = recommended != current and recommended.replicas and not (growing and wanted > current.capacity)
    if tolerated and within_tolerance(wanted, current, bound, limits, partitions):
        recommended, cause = current, Cause.WITHIN_TOLERANCE
    waiting = rate.per_worker is None and keep_up is None and recommended == current
    limited, gone = bound.limited, 0
    if limited is None and state.limit is not None:
        if not settled and state.limit.kind in SEEN_BY_PODS:
            limited, gone = state.limit, state.limit_gone_polls  # no evidence either way
        elif state.limit_gone_polls + 1 < LIMIT_CLEAR_POLLS:
            limited, gone = state.limit, state.limit_gone_polls + 1
    keep_since = now - max(limits.scale_up_window_seconds, limits.scale_down_window_seconds)
    history = tuple(item for item in state.recommendations if item[0] >= keep_since)
    shrinking = recommended.replicas < current.replicas or recommended.capacity < current.capacity
    if not history and shrinking and limits.scale_down_window_seconds > 0:
        # no memory (a new resource, a status from another release): the current size stands as if
        # recommended a moment ago, so a scale-down waits one whole window (the seed is kept with the rest)
        history = ((now - SEED_AGE, current.replicas, current.workers),)
    target = stabilized(recommended, current, history, now, limits, partitions)
    if target != recommended and cause is Cause.STEADY:
        cause = Cause.STABILIZING
    # after the windows, only the hard limits apply (a bound on how many pods help is a recommendation:
    # fewer pods for the same capacity is a scale-down of pods, and waits for its window)
    hard = replace(bound, replicas=None)
    caveat = silent_pods_caveat(observation, silent_polls)
    if (growing or growth_unknown(observation, state, limits)) and (
        target.replicas < current.replicas or target.capacity < current.capacity
    ):
        # never shrink while the lag grows; only the CPU's bound may still take surplus workers away
        target, cause = fitted(current, hard, limits, partitions), Cause.LAG_GROWING
    elif (
        caveat is not None
        and target.replicas < current.replicas
        and not quiet_scale_in(target, current, observation, state, arrivals, limits)
    ):
        target, cause = fitted(current, hard, limits, partitions), Cause.PODS_NOT_REPORTING
    target = fitted(rate_limited(target, state, limits, now, partitions), hard, limits, partitions)
    if target.replicas < limits.min_replicas and not (limits.scale_to_zero and target.replicas == 0):
        target = Size(limits.min_replicas, target.workers)
    cost = step_cost(state)
    outlasted = None
    if target.replicas > current.replicas > 0:
        outlasted = step_outlasts_backlog(observation, lag, arrivals, cost, growing)
    if outlasted is not None:
        # the pods in place finish the backlog before new ones would own a partition: grow the workers
        # per pod instead (a live resize, no rebalance), within the bounds
        target = on_current_pods(target, current, hard, limits, partitions)
    idle_step = (
        outlasted is None
        and target.replicas > current.replicas > 0
        and backlog_dominates(lag, arrivals, limits)
        and drain_capacity(target, partitions, hard.workers_per_pod)
        <= drain_capacity(current, partitions, hard.workers_per_pod) * (1 + limits.tolerance)
    )
    if idle_step:
        # more pods that drain no faster, within the tolerance (the busiest pod keeps as many workers per
        # partition): the step would only pause the partitions it moves, so the pods in place keep the backlog
        more_pods = target
        target = on_current_pods(target, current, hard, limits, partitions)
    if target != current:
        if target.capacity > current.capacity:
            cause = Cause.SCALE_UP
        elif target.capacity < current.capacity or target.replicas < current.replicas:
            cause = Cause.SCALE_DOWN
        else:
            cause = Cause.RESHAPE
    elif waiting:
        cause = Cause.WAITING_FOR_RATE
    if (outlasted is not None or idle_step) and target.capacity <= current.capacity:
        cause = Cause.STEP_COST
    longest_period = max(
        (limit.period_seconds for limit in (*scale_up_rates(limits), *limits.scale_down_rates)), default=0
    )
    changes = tuple(item for item in state.replica_changes if item[0] >= now - longest_period)
    step_started_at = state.step_started_at
    if target.replicas != current.replicas:
        changes = (*changes, (now, current.replicas))
        step_started_at = now
    cpu_cap = cpu_bound(observation, state, now).workers_per_pod if pods is not None else state.cpu_workers_per_pod
    new_state = replace(
        state,
        current=target,
        settled=target == current,
        per_worker_rate=rate.per_worker,
        rate_source=rate.source,
        rate_samples=rate.rate_samples,
        efficiency_samples=rate.efficiency_samples,
        handler_time=rate.handler_time,
        arrival_samples=arrival_samples,
        arrivals_at=now if observation.arrival_rate is not None else state.arrivals_at,
        drainable_lag=lag,
        recommendations=window_memory((*history, (now, recommended.replicas, recommended.workers)), now, limits),
        pod_totals=pods.totals() if pods is not None else None,
        pod_totals_at=now if pods is not None else None,
        idle_polls=idle_polls,
        failed_observations=0,
        silent_polls=silent_polls,
        polled_at=now,
        saturated=saturated(pods),
        replica_changes=changes,
        limit=limited,
        limit_gone_polls=gone,
        cpu_workers_per_pod=cpu_cap if (pods is None or pods.executor == "process") else None,
        step_started_at=step_started_at,
    )
    reason = _describe(current, target, observation, limits, arrivals)
    if cause is Cause.LAG_GROWING:
        reason = f"{reason}; no scale-down while the lag grows"
    elif cause is Cause.WITHIN_TOLERANCE:
        reason = f"{reason}; {needed} workers needed is within the {limits.tolerance:.0%} tolerance"
    elif cause is Cause.STABILIZING:
        reason = f"{reason}; {_size_words(recommended)} recommended, held by the stabilization window"
    elif cause is Cause.WAITING_FOR_RATE:
        reason = f"{reason}; waiting for the pods' first report (their handler time gives the rate)"
    elif cause is Cause.PODS_NOT_REPORTING:
        reason = f"{reason}; no scale-down of pods while pods do not report"
    if outlasted is not None:
        reason = (
            f"{reason}; no more pods: the backlog drains in {duration(outlasted)} at this size, sooner than a "
            f"scale step settles here ({duration(cost or 0)}, measured), and new pods would only pause the "
            "partitions they take over"
        )
    if idle_step:
        reason = (
            f"{reason}; no more pods: {_size_words(more_pods)} would drain no faster than "
            f"{_size_words(target)} (the busiest pod keeps as many workers per partition), and a scale step "
            "would only pause the partitions it moves"
        )
    if limited is not None and not (target.capacity > current.capacity):
        reason = f"{reason}; {limited.message}"
    if caveat is not None:
        reason = f"{reason}; {caveat.message}"
    return Decision(
        before=current,
        target=target,
        reason=reason,
        state=new_state,
        cause=cause,
        limited=limited,
        caveat=caveat,
        handler_seconds=rate.handler_time,
        recommended=recommended,
    )


def unapplied(state: ScalingState, current: Size) -> ScalingState:
    """The state to keep after a decision that was only recommended (``scaling.mode: recommend``): the
    group kept its size, so nothing was resized, and no replica change counts against the rate limits."""
    changes = tuple(change for change in state.replica_changes if change[0] != state.polled_at)
    started = None if state.step_started_at == state.polled_at else state.step_started_at
    return replace(state, current=current, settled=True, replica_changes=changes, step_started_at=started)


def not_resized(decision: Decision, now: float) -> ScalingState:
    """The state to keep after ``decision`` (made at ``now``) when its change of replicas was not made: the
    Deployment no longer had the replicas it decided from (``kubectl scale`` or an HPA wrote others, and
    the write was refused), or a catch-up hand-over stops the pods instead. The group has the size it had,
    the change does not count against the rate limits and starts no scale step; the recommendation stays
    made. It is not settled: somebody else changed its size, so the next drain rate is over two sizes."""
    state = decision.state
    changes = tuple(change for change in state.replica_changes if change[0] != now)
    started = None if state.step_started_at == now else state.step_started_at
    return replace(state, current=decision.before, settled=False, replica_changes=changes, step_started_at=started)


MEASURED_EACH_POLL = (
    "drainable_lag",
    "handler_time",
    "held_polls",
    "idle_polls",
    "pod_totals",
    "pod_totals_at",
    "polled_at",
    "saturated",
    "settled",
)
"""The state fields that describe the last poll or two (the pods' totals and the lag at the last poll, the
last interval's handler time, polls in a row counted from them): measured again after a restart, never
resumed, because what status holds of them is as old as its last write. The arrival samples are resumed
(a rise must last ``ARRIVAL_SAMPLES`` polls to count, more than an operator that restarts every minute
would ever see), unless older than ``ARRIVALS_STALE_SECONDS``."""


def resumed(state: ScalingState, now: float) -> ScalingState:
    """The state a started operator resumes from, given the one its predecessor kept in status.

    What describes the last poll or two (``MEASURED_EACH_POLL``) starts afresh, as on a new resource: the
    first poll after a start has no previous lag sample either. The rest (the windows' recommendations,
    the rate limits' replica changes, the learned rates and step costs, the limit, the failed observations
    and silent polls in a row) is taken as it was written. The newest recommendation counts as made
    just before ``now`` (``SEED_AGE``, outside a zero-length up-window, as the seed of an empty memory):
    status is written when the recommendations change, not when one is repeated, so the predecessor made
    it on every poll since it was written, up to the moment it stopped (a restart after a long outage
    waits a whole window before a scale-down, as a new resource does).

    Nothing in it happened after ``now``: a time later than that (the predecessor's clock was a little
    ahead: ``restart.RECORD_CLOCK_SKEW_SECONDS``) is taken as ``now`` (a recommendation, as made just before
    it), so it holds nothing past its own window from now on."""
    seeded = now - SEED_AGE
    recommendations = tuple((min(at, seeded), replicas, workers) for at, replicas, workers in state.recommendations)
    if recommendations:
        *older, (_, replicas, workers) = recommendations
        recommendations = (*older, (seeded, replicas, workers))
    started = state.step_started_at
    defaults = ScalingState(current=state.current)
    fresh = {name: getattr(defaults, name) for name in MEASURED_EACH_POLL}
    arrivals_at = state.arrivals_at
    if arrivals_at is None or now - arrivals_at > ARRIVALS_STALE_SECONDS:
        fresh.update(arrival_samples=(), arrivals_at=None)
    else:
        fresh.update(arrivals_at=min(arrivals_at, now))
    return replace(
        state,
        recommendations=recommendations,
        replica_changes=tuple((min(at, now), before) for at, before in state.replica_changes),
        step_started_at=min(started, now) if started is not None else None,
        **fresh,
    )
