"""The scaling policy: how many pods and how many key workers per pod, and when scaling cannot help.

Pure: ``decide(observation, limits, state, now)`` does no I/O and reads no clock, so every scaling
behaviour is a table test. The operator's reconcile loop observes lag (Kafka admin API) and the
pods' own reports (``pod_signals``), calls ``decide``, then applies the result and explains it in
status, Events and metrics.

The algorithm, in order:

1. **Unknown lag** (broker down, group missing) never scales: keep the current size, flag it;
   after ``fallback`` failed observations in a row, go to the fallback size (KEDA's fallback).
2. **Paused** (an annotation): keep the current size, learn nothing (KEDA's paused annotation).
   **Rebalancing** (a pod joined, left or rebalanced since the last poll): keep the size and the
   last limit until the pods report a settled view again (their queues were just refilled).
3. **One worker's rate.** Before any measurement, it is estimated from the handler time the pods
   report (a busy worker handles about 0.8/handler-time messages per second), so the first poll of
   a spike jumps straight to the needed size; while the pods are still starting and no report has
   come, the size waits for it rather than guess (a wrong pod count costs a rebalance). Pods that
   run but do not report (an older release) grow stepwise, doubling per poll. The rate is then
   measured as drain rate / the workers the pods *report*, but only from a *clean* interval: the
   size did not just change, the Deployment is rolled out, every pod answered, no pod rebalanced,
   and the workers were the limit (a key waited for a worker, or most workers were busy). The
   rate used is the median of the last three measurements, and a new one may move it at most 2x:
   one bad interval moves the size by at most one step.
4. **Required capacity** = drainable lag / target drain time + arrival rate, in workers. Lag that
   a blocked key pins (its partition's commit cannot move) is not drainable and is left out
   (KEDA's ``excludePersistentLag``).
5. **Bounds: when scaling cannot help** (all computed by ``bounds``), the size stops where it helps
   and the decision says why (``Limited``): a blocked key holding the lag; one hot key holding most
   of the pods' queue (the drain takes at least its backlog x the handler time, so workers beyond queue / longest lane
   add nothing: that is the parallelism bound), or whose estimated backlog alone takes longer
   than the target (then the rest of the backlog is sized to drain in that time, not faster); ``ordering:
   partition`` (one worker per partition is all that helps); lag on only some partitions (with
   ``limit_to_partitions_with_lag``, like KEDA's option); workers idle with lag on two polls in a
   row (the limit is before the workers: fetching, CPU or the broker); the CPU: a process
   executor gains nothing from more workers than its pod's cores, and a thread or async one
   whose pods use up their one core (the GIL) gains nothing from more workers per pod (more pods
   still help, up to the partitions).
6. **Shape**: pods first, each with the initial worker count, up to min(max replicas,
   partitions); only at that cap do workers per pod grow. Shrinking walks back the same path.
7. **Activation and zero**: below ``activation_lag`` only what keeps up with arrivals, but any
   lag or arrival keeps at least one pod (nothing is stranded); with ``scale_to_zero`` an empty
   backlog with no arrivals scales to zero. A lag of at most 1 per partition that neither moves
   nor is held by any pod is a transaction's commit marker, not a message, and counts as zero.
8. **Stabilization** (like the Kubernetes HPA): a scale-up takes the *smallest* recommendation of
   the scale-up window, a scale-down the *largest* of the scale-down window; then the HPA-style
   rate limits (pods or percent per period) cap the change of replicas, workers per pod making
   up the capacity where the pods are held back.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Size:
    replicas: int
    workers: int

    @property
    def capacity(self) -> int:
        """Concurrent key workers across the group."""
        return self.replicas * self.workers


@dataclass(frozen=True)
class ScalingState:
    """What the policy remembers between reconciles (kept in the CR status)."""

    current: Size
    recommendations: tuple[tuple[float, int, int], ...] = ()
    """Recent ``(time, replicas, workers)`` recommendations, for the stabilization windows."""
    per_worker_rate: float | None = None
    """Messages/s of one key worker in use (measured, else estimated from the handler time)."""
    rate_samples: tuple[float, ...] = ()
    """The last clean per-worker measurements (the rate is their median)."""
    settled: bool = True
    """False right after a resize: the next drain rate still reflects the old size."""
    pod_totals: tuple[int, float, int, int, float] | None = None
    """The pods' ``(handler calls, handler seconds, rebalances, pods, CPU seconds)`` at the last poll."""
    pod_totals_at: float | None = None
    """When ``pod_totals`` were read (for the CPU rate)."""
    idle_polls: int = 0
    """Polls in a row with lag and idle workers."""
    failed_observations: int = 0
    """Polls in a row whose lag could not be measured (for the fallback)."""
    replica_changes: tuple[tuple[float, int], ...] = ()
    """Recent ``(time, replicas before)`` changes of the replicas, for the rate limits."""
    limit: Limited | None = None
    """The limit of the last decision (kept while a rebalance hides the pods' view)."""
    limit_gone_polls: int = 0
    """Polls in a row on which the kept limit no longer held (it clears after ``LIMIT_CLEAR_POLLS``)."""


@dataclass(frozen=True)
class Decision:
    before: Size
    target: Size
    reason: str
    """One line with the numbers, for the Event and the status ("scaled replicas 2->4: lag ...")."""
    state: ScalingState
    """The state to keep for the next reconcile."""
    lag_unknown: bool = False
    limited: Limited | None = None
    """Set when scaling cannot help (or stopped where it stops helping)."""
    handler_seconds: float | None = None
    """Mean handler time per call the pods reported for the interval (for status)."""

    @property
    def scaled(self) -> bool:
        return self.target != self.before


SATURATION_SECONDS = 1.0
"""Without pod reports: a backlog worth at least this many seconds at the measured drain rate
means the workers were busy the whole interval (with a trickle they idle and would look slow)."""
BUSY_SHARE = 0.8
"""Most workers busy: the workers were the limit in the interval (with pod reports)."""
IDLE_SHARE = 0.5
HOT_KEY_SHARE = 0.5
"""The longest lane holds at least this share of the pods' queue: a hot key. (Below it the bound,
computed over the pods' look-ahead window only, would be too uncertain to stop scaling on.)"""
IDLE_POLLS = 2
MIN_HANDLER_CALLS = 20
"""Handler calls needed before their mean time counts as an estimate."""
HANDLER_EFFICIENCY = 0.8
"""A worker spends about this share of its time inside the handler (the rest: dispatch, commits,
the poll thread's share of the CPU); only for the estimate before a rate is measured."""
RATE_SAMPLES = 3
MAX_RATE_STEP = 2.0
"""A new measurement moves the learned per-worker rate by at most this factor."""
LIMIT_CLEAR_POLLS = 2
"""A limit clears only when absent on this many polls in a row: one poll of refilling queues must
not flip the condition and send an Event each way."""
MARKER_LAG = 1
"""A transaction's commit marker occupies one offset per partition."""


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


def shape(
    capacity: int,
    limits: ScalingLimits,
    partitions: int,
    max_replicas: int | None = None,
    max_workers_per_pod: int | None = None,
) -> Size:
    """Pods first (with the initial workers), up to the partition cap; then workers per pod."""
    cap = replica_cap(limits, partitions)
    if max_replicas is not None:
        cap = max(min(cap, max_replicas), limits.min_replicas, 1)
    most_workers = limits.max_workers
    if max_workers_per_pod is not None:
        most_workers = max(min(most_workers, max_workers_per_pod), limits.min_workers)
    workers = min(max(limits.initial_workers, limits.min_workers), most_workers)
    replicas = max(math.ceil(capacity / workers), limits.min_replicas)
    if replicas <= cap:
        return Size(replicas, workers)
    workers = min(max(math.ceil(capacity / cap), workers), most_workers)
    return Size(cap, workers)


# -- step 3: one worker's rate ------------------------------------------------------------------------
def handler_seconds(pods: PodSignals | None, previous: tuple[int, float, int, int, float] | None) -> float | None:
    """Mean handler time per call: over the interval when enough calls ran in it, else since the pods started."""
    if pods is None:
        return None
    if previous is not None:
        calls, seconds = pods.handler_calls_total - previous[0], pods.handler_seconds_total - previous[1]
        if calls >= MIN_HANDLER_CALLS and seconds > 0:
            return seconds / calls
    if pods.handler_calls_total >= MIN_HANDLER_CALLS and pods.handler_seconds_total > 0:
        return pods.handler_seconds_total / pods.handler_calls_total
    return None


def clean_interval(observation: Observation, state: ScalingState) -> bool:
    """The interval measured the group as decided: nothing started, rolled, rebalanced or went missing."""
    pods = observation.pods
    if not (state.settled and observation.rollout_settled and pods is not None and pods.workers > 0):
        return False
    if pods.pods != state.current.replicas:
        return False
    previous = state.pod_totals
    return previous is not None and pods.rebalances_total == previous[2] and pods.pods == previous[3]


def rebalancing(observation: Observation, state: ScalingState) -> bool:
    """A pod joined, left or rebalanced since the last poll, or some partition has no reporting
    pod: the pods' queues were just emptied and are refilling, so their view (blocked keys, hot
    keys, idle workers) says nothing yet."""
    pods, previous = observation.pods, state.pod_totals
    if pods is None or previous is None:
        return False
    unassigned = bool(observation.partitions) and pods.partitions_assigned < (observation.partitions or 0)
    return unassigned or pods.rebalances_total != previous[2] or pods.pods != previous[3]


def measured_per_worker_rate(observation: Observation, state: ScalingState, limits: ScalingLimits) -> float | None:
    """One worker's rate measured in the last interval, or ``None`` when the interval cannot tell."""
    drain = observation.drain_rate or 0.0
    if drain <= 0:
        return None
    pods = observation.pods
    if pods is None:  # no reports (old pods): today's rule, by the decided capacity
        lag = observation.lag or 0
        loaded = lag >= limits.activation_lag and lag >= drain * SATURATION_SECONDS
        capacity = state.current.capacity
        return drain / capacity if state.settled and loaded and capacity > 0 else None
    if not clean_interval(observation, state):
        return None
    saturated = pods.lanes_ready > 0 or pods.busy >= BUSY_SHARE * pods.workers
    return drain / pods.workers if saturated else None


def learn_rate(
    observation: Observation, state: ScalingState, limits: ScalingLimits, handler_time: float | None
) -> tuple[float | None, tuple[float, ...]]:
    """``(per-worker rate, samples)``: the median of the last clean measurements, else the handler estimate."""
    samples = state.rate_samples
    measured = measured_per_worker_rate(observation, state, limits)
    if measured is not None:
        anchor = state.per_worker_rate or measured
        measured = min(max(measured, anchor / MAX_RATE_STEP), anchor * MAX_RATE_STEP)
        samples = (*samples, measured)[-RATE_SAMPLES:]
    if samples:
        return statistics.median(samples), samples
    if handler_time:
        return HANDLER_EFFICIENCY / handler_time, samples
    return state.per_worker_rate, samples


# -- steps 4 and 5: what is needed, and what can help ------------------------------------------------
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
    lag: int, observation: Observation, current: Size, per_worker_rate: float | None, limits: ScalingLimits
) -> int:
    """Workers needed to drain ``lag`` within the target, keeping up with arrivals."""
    needed_rate = lag / limits.target_drain_seconds + (observation.arrival_rate or 0.0)
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
    if pods is None or previous is None or len(previous) < 5 or state.pod_totals_at is None or not pods.pods:
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
    if pods is None or not pods.cpu_cores:
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
    """A backlog to drain (the drainable lag reached the activation lag), not just arrivals to keep up with."""
    return drainable_lag(observation) >= limits.activation_lag


def _hot_key_horizon_bound(
    observation: Observation,
    limits: ScalingLimits,
    current: Size,
    needed: int,
    per_worker_rate: float | None,
    handler_time: float | None,
) -> Bound | None:
    """The hot key's horizon as a bound: when that key alone takes longer than the target, the rest
    of the backlog is sized to drain in that time (``None`` when that needs no fewer workers)."""
    pods = observation.pods
    horizon = hot_key_horizon(observation, handler_time, limits)
    if horizon is None or pods is None or pods.busiest is None:
        return None
    for_horizon = replace(limits, target_drain_seconds=horizon)
    within = max(required_capacity(drainable_lag(observation), observation, current, per_worker_rate, for_horizon), 1)
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
) -> Bound:
    """Every limit on what helps, in one place: how far ``needed`` workers may go, and why they stop.

    While a backlog drains: the hot key's horizon first (no size drains sooner than that key, so
    fewer workers are needed), then the first limit that binds (``_first_limit``), then the CPU's
    bound on workers per pod, whose reason shows only when nothing else binds and it holds the size
    below what is needed. Below the activation lag the size only keeps up with arrivals, and the
    first limit only explains it (no horizon, no CPU bound)."""
    if not draining(observation, limits):
        return _first_limit(observation, limits, state, needed, idle_polls)
    horizon = _hot_key_horizon_bound(observation, limits, state.current, needed, per_worker_rate, handler_time)
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


# -- steps 6 and 7: the size -----------------------------------------------------------------------------
def activation_size(
    observation: Observation, limits: ScalingLimits, per_worker_rate: float | None, partitions: int
) -> Size:
    """Below the activation lag: what keeps up with arrivals, at least one pod while any lag or
    arrival is pending, and zero (with ``scale_to_zero``) once nothing is left or arriving."""
    arrivals = observation.arrival_rate or 0.0
    nothing_left = observation.lag == 0 or is_marker_residue(observation)  # a blocked key's lag stays
    if limits.scale_to_zero and nothing_left and arrivals <= 0:
        return Size(0, limits.initial_workers)
    keep_up = math.ceil(arrivals / per_worker_rate) if per_worker_rate else 0
    pending = not nothing_left or arrivals > 0  # a blocked key's lag needs its pod too
    size = shape(max(keep_up, 1 if pending else 0), limits, partitions)
    if pending and size.replicas == 0:
        return Size(1, size.workers)  # never strand a message below the activation lag
    return size


def bounded_size(needed: int, bound: Bound, limits: ScalingLimits, partitions: int) -> Size:
    """The shape of ``needed`` workers within ``bound``; with ``ordering: partition``, no more
    workers per pod than the pod has partitions."""
    if bound.capacity is not None:
        needed = min(needed, bound.capacity)
    size = shape(needed, limits, partitions, max_replicas=bound.replicas, max_workers_per_pod=bound.workers_per_pod)
    if limits.partition_ordering:
        useful = max(math.ceil(partitions / max(size.replicas, 1)), limits.min_workers)
        size = Size(size.replicas, min(size.workers, max(useful, 1)))
    return size


# -- step 8: stabilization and rate limits -------------------------------------------------------------
def _stabilized(
    recommended: Size, current: Size, history: tuple[tuple[float, int, int], ...], now: float, limits: ScalingLimits
) -> Size:
    if recommended.capacity > current.capacity:
        window = [Size(r, w) for at, r, w in history if now - at <= limits.scale_up_window_seconds]
        smallest = min([recommended, *window], key=lambda size: size.capacity)
        return smallest if smallest.capacity > current.capacity else current
    if recommended.capacity < current.capacity:
        window = [Size(r, w) for at, r, w in history if now - at <= limits.scale_down_window_seconds]
        largest = max([recommended, *window], key=lambda size: size.capacity)
        return largest if largest.capacity < current.capacity else current
    return recommended


def replicas_at(changes: tuple[tuple[float, int], ...], current: int, since: float) -> int:
    """The replicas the group had at ``since``: what the first change after it started from."""
    later = [before for at, before in changes if at > since]
    return later[0] if later else current


def rate_limited(target: Size, state: ScalingState, limits: ScalingLimits, now: float) -> Size:
    """Cap the change of replicas by the HPA-style rate limits; workers make up the capacity."""
    current = state.current
    if target.replicas > current.replicas and limits.scale_up_rates:
        allowed = max(
            _limit(rate, replicas_at(state.replica_changes, current.replicas, now - rate.period_seconds), +1)
            for rate in limits.scale_up_rates
        )
        if target.replicas > allowed:
            replicas = max(allowed, current.replicas)
            workers = min(max(math.ceil(target.capacity / replicas), target.workers), limits.max_workers)
            return Size(replicas, workers)
    if target.replicas < current.replicas and limits.scale_down_rates:
        allowed = min(
            _limit(rate, replicas_at(state.replica_changes, current.replicas, now - rate.period_seconds), -1)
            for rate in limits.scale_down_rates
        )
        if target.replicas < allowed:
            return Size(min(allowed, current.replicas), target.workers)
    return target


def _limit(rate: RateLimit, start: int, direction: int) -> int:
    step = rate.value if rate.kind is RateKind.PODS else math.ceil(start * rate.value / 100)
    return max(start + direction * step, 0)


def _describe(before: Size, after: Size, observation: Observation, limits: ScalingLimits) -> str:
    lag = observation.lag or 0
    drain = observation.drain_rate or 0.0
    eta = duration(lag / drain) if drain > 0 else "unknown (no drain measured yet)"
    facts = f"lag {lag}, drain ETA {eta}, target {duration(limits.target_drain_seconds)}"
    changes = []
    if after.replicas != before.replicas:
        changes.append(f"replicas {before.replicas}\u2192{after.replicas}")
    if after.workers != before.workers:
        changes.append(f"workers/pod {before.workers}\u2192{after.workers}")
    if not changes:
        return f"kept {before.replicas} replicas x {before.workers} workers: {facts}"
    return f"scaled {', '.join(changes)}: {facts}"


def _kept(state: ScalingState, reason: str, new_state: ScalingState) -> Decision:
    return Decision(before=state.current, target=state.current, reason=reason, state=new_state)


def decide(observation: Observation, limits: ScalingLimits, state: ScalingState, now: float) -> Decision:
    """The size the consumer group should have now, and why."""
    current = state.current
    if observation.lag is None or not observation.partitions:
        failures = state.failed_observations + 1
        if limits.fallback_after and failures >= limits.fallback_after and current.replicas != limits.fallback_replicas:
            target = Size(limits.fallback_replicas, current.workers)
            reason = (
                f"lag unknown on {failures} polls in a row: fallback to {target.replicas} replicas "
                f"(was {current.replicas})"
            )
            new_state = replace(state, current=target, failed_observations=failures, settled=False)
            return Decision(before=current, target=target, reason=reason, state=new_state, lag_unknown=True)
        decision = _kept(
            state,
            f"lag unknown: keeping {current.replicas} replicas x {current.workers} workers",
            replace(state, failed_observations=failures),
        )
        return replace(decision, lag_unknown=True)
    pods = observation.pods
    totals = pods.totals() if pods is not None else None
    if observation.paused:
        return _kept(
            state,
            f"paused: keeping {current.replicas} replicas x {current.workers} workers (lag {observation.lag})",
            replace(state, failed_observations=0, pod_totals=totals, pod_totals_at=now, settled=False),
        )
    if rebalancing(observation, state):
        held = _kept(
            state,
            f"pods rebalancing: keeping {current.replicas} replicas x {current.workers} workers until they "
            f"report again (lag {observation.lag})",
            replace(state, failed_observations=0, pod_totals=totals, pod_totals_at=now),
        )
        return replace(held, limited=state.limit)
    partitions = observation.partitions
    handler_time = handler_seconds(pods, state.pod_totals)
    per_worker, samples = learn_rate(observation, state, limits, handler_time)
    idle = workers_idle(observation, limits) and clean_interval(observation, state)
    idle_polls = state.idle_polls + 1 if idle else 0
    keep_up: Size | None = None  # below the activation lag: the size that keeps up (the bounds only explain it)
    if draining(observation, limits):
        needed = max(required_capacity(drainable_lag(observation), observation, current, per_worker, limits), 1)
    else:
        keep_up = activation_size(observation, limits, per_worker, partitions)
        needed = keep_up.capacity
    bound = bounds(
        observation,
        limits,
        state,
        needed,
        idle_polls=idle_polls,
        now=now,
        per_worker_rate=per_worker,
        handler_time=handler_time,
    )
    recommended = keep_up if keep_up is not None else bounded_size(needed, bound, limits, partitions)
    limited, gone = bound.limited, 0
    if limited is None and state.limit is not None and state.limit_gone_polls + 1 < LIMIT_CLEAR_POLLS:
        limited, gone = state.limit, state.limit_gone_polls + 1
    keep_since = now - max(limits.scale_up_window_seconds, limits.scale_down_window_seconds)
    history = tuple(item for item in state.recommendations if item[0] >= keep_since)
    target = _stabilized(recommended, current, history, now, limits)
    target = rate_limited(target, state, limits, now)
    longest_period = max(
        (rate.period_seconds for rate in (*limits.scale_up_rates, *limits.scale_down_rates)), default=0
    )
    changes = tuple(item for item in state.replica_changes if item[0] >= now - longest_period)
    if target.replicas != current.replicas:
        changes = (*changes, (now, current.replicas))
    new_state = replace(
        state,
        current=target,
        settled=target == current,
        per_worker_rate=per_worker,
        rate_samples=samples,
        recommendations=(*history, (now, recommended.replicas, recommended.workers)),
        pod_totals=totals,
        pod_totals_at=now if totals is not None else None,
        idle_polls=idle_polls,
        failed_observations=0,
        replica_changes=changes,
        limit=limited,
        limit_gone_polls=gone,
    )
    reason = _describe(current, target, observation, limits)
    if limited is not None and not (target.capacity > current.capacity):
        reason = f"{reason}; {limited.message}"
    return Decision(
        before=current,
        target=target,
        reason=reason,
        state=new_state,
        limited=limited,
        handler_seconds=handler_time,
    )
