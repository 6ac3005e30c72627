"""The policy's vocabulary: what it observes, what bounds it, what it remembers and what it decides.

``Observation`` (one poll's lag, rates and the pods' reports), ``ScalingLimits`` and ``RateLimit`` (the
spec's rules), ``ScalingState`` (the memory between polls, kept in status for a restarted operator),
``Size`` and ``Decision`` (with ``Cause``, ``Limited``, ``Caveat`` and ``Bound`` for the why), the
tunables the steps share. It decides nothing; every other module of the package imports it and it
imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    """A scale step has not settled and some pod reports more workers than ``target.workers``: a pod
    running more keeps them (only pods below the count or not reporting get it), so the running capacity
    never drops while the new pods start and take over their partitions; the first decision once the step
    has settled lowers them (``workers_while_pods_start``)."""

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


@dataclass(frozen=True)
class Rate:
    """One worker's rate and how it was found."""

    per_worker: float | None
    source: RateSource
    handler_time: float | None
    efficiency_samples: tuple[float, ...]
    rate_samples: tuple[float, ...]


@dataclass(frozen=True)
class Bound:
    """An upper bound on what helps, and why it binds."""

    capacity: int | None = None
    replicas: int | None = None
    limited: Limited | None = None
    workers_per_pod: int | None = None
    """CPU: more workers per pod add nothing (more pods still may)."""
    cpu_use: float | None = None
