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
   pods and lowers the workers per pod (6 x 29 -> 12 x 17) lowers them only once the step has settled
   (every pod ready and reporting, every partition owned): until then the pods in place keep theirs
   (``workers_while_pods_start``).
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

The package follows those steps, one module each, every module importing only those before it in this
list: ``model`` (the vocabulary: observation, limits, state, size, decision), ``lag`` (what the lag
says), ``explanation`` (the words), ``shape`` (7 to 9), ``rates`` (3, 4 and the arrivals), ``step_cost``
(11), ``bounds`` (5 and 6), ``stabilisation`` (10) and ``decision`` (1, 2 and the sequence: ``decide``;
import-linter holds the layers). The public names are all importable from ``keyorder_operator.policy`` itself.
"""

from keyorder_operator.policy.bounds import (
    CPU_BUSY_SHARE,
    backlog_dominates,
    bounds,
    cpu_bound,
    cpu_use,
    draining,
    hot_key_horizon,
    quiet_scale_in,
    required_capacity,
    workers_idle,
)
from keyorder_operator.policy.decision import (
    MEASURED_EACH_POLL,
    decide,
    not_resized,
    relearned,
    resumed,
    unapplied,
)
from keyorder_operator.policy.explanation import (
    STEADY_BAND,
    drain_eta,
    duration,
    net_drain_seconds,
)
from keyorder_operator.policy.lag import (
    IN_FLIGHT_SECONDS,
    drainable_lag,
    in_flight_lag,
    is_marker_residue,
    kept_up,
)
from keyorder_operator.policy.model import (
    DEFAULT_EFFICIENCY,
    DEFAULT_SCALE_UP_RATES,
    EFFICIENCY_RANGE,
    GROWTH_SHARE,
    HOLD_POLLS,
    HOT_KEY_SHARE,
    IDLE_POLLS,
    IDLE_SHARE,
    LIMIT_CLEAR_POLLS,
    MARKER_LAG,
    MAX_RATE_STEP,
    MIN_HANDLER_CALLS,
    SAMPLES,
    SATURATED_SHARE,
    SATURATION_SECONDS,
    SEED_AGE,
    SEEN_BY_PODS,
    Bound,
    Cause,
    Caveat,
    Decision,
    Limited,
    LimitKind,
    Observation,
    Rate,
    RateKind,
    RateLimit,
    RateSource,
    ScalingLimits,
    ScalingState,
    Size,
)
from keyorder_operator.policy.rates import (
    ARRIVAL_SAMPLES,
    ARRIVALS_STALE_SECONDS,
    PERIODIC_CHANGES,
    RISE_BAND,
    arrival_level,
    clean_interval,
    handler_seconds,
    learn_rate,
    measured_drain_rate,
    measured_efficiency,
    membership_changed,
    reports_complete,
    same_pods,
    saturated,
    silent_pods_caveat,
    smoothed_arrivals,
)
from keyorder_operator.policy.shape import (
    activation_size,
    bounded_size,
    drain_capacity,
    fitted,
    on_current_pods,
    replica_cap,
    shape,
    within_tolerance,
    workers_for,
)
from keyorder_operator.policy.stabilisation import (
    growth_unknown,
    lag_growing,
    rate_limited,
    replicas_at,
    scale_up_rates,
    stabilized,
    window_memory,
)
from keyorder_operator.policy.step_cost import (
    LONGEST_STEP_SECONDS,
    group_settled,
    ready_pods,
    step_cost,
    step_outlasts_backlog,
    timed_step,
    workers_while_pods_start,
)

__all__ = [
    "ARRIVALS_STALE_SECONDS",
    "ARRIVAL_SAMPLES",
    "CPU_BUSY_SHARE",
    "DEFAULT_EFFICIENCY",
    "DEFAULT_SCALE_UP_RATES",
    "EFFICIENCY_RANGE",
    "GROWTH_SHARE",
    "HOLD_POLLS",
    "HOT_KEY_SHARE",
    "IDLE_POLLS",
    "IDLE_SHARE",
    "IN_FLIGHT_SECONDS",
    "LIMIT_CLEAR_POLLS",
    "LONGEST_STEP_SECONDS",
    "MARKER_LAG",
    "MAX_RATE_STEP",
    "MEASURED_EACH_POLL",
    "MIN_HANDLER_CALLS",
    "PERIODIC_CHANGES",
    "RISE_BAND",
    "SAMPLES",
    "SATURATED_SHARE",
    "SATURATION_SECONDS",
    "SEED_AGE",
    "SEEN_BY_PODS",
    "STEADY_BAND",
    "Bound",
    "Cause",
    "Caveat",
    "Decision",
    "LimitKind",
    "Limited",
    "Observation",
    "Rate",
    "RateKind",
    "RateLimit",
    "RateSource",
    "ScalingLimits",
    "ScalingState",
    "Size",
    "activation_size",
    "arrival_level",
    "backlog_dominates",
    "bounded_size",
    "bounds",
    "clean_interval",
    "cpu_bound",
    "cpu_use",
    "decide",
    "drain_capacity",
    "drain_eta",
    "drainable_lag",
    "draining",
    "duration",
    "fitted",
    "group_settled",
    "growth_unknown",
    "handler_seconds",
    "hot_key_horizon",
    "in_flight_lag",
    "is_marker_residue",
    "kept_up",
    "lag_growing",
    "learn_rate",
    "measured_drain_rate",
    "measured_efficiency",
    "membership_changed",
    "net_drain_seconds",
    "not_resized",
    "on_current_pods",
    "quiet_scale_in",
    "rate_limited",
    "ready_pods",
    "relearned",
    "replica_cap",
    "replicas_at",
    "reports_complete",
    "required_capacity",
    "resumed",
    "same_pods",
    "saturated",
    "scale_up_rates",
    "shape",
    "silent_pods_caveat",
    "smoothed_arrivals",
    "stabilized",
    "step_cost",
    "step_outlasts_backlog",
    "timed_step",
    "unapplied",
    "window_memory",
    "within_tolerance",
    "workers_for",
    "workers_idle",
    "workers_while_pods_start",
]
