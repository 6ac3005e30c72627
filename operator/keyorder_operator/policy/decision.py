"""Steps 1 and 2, and the order of all: ``decide``, the one entry point of the policy.

``decide(observation, limits, state, now)`` runs the steps for one poll: paused and unknown lag first
(``_lag_unknown``), then, in ``_sized``, the rate, what is needed and its bounds, the shape and the
tolerance, the stabilisation and the rate limits, each adding to the reason a person reads. Also what
the poll does with the state once the decision is applied or not (``unapplied``, ``not_resized``), and
what a restarted operator resumes from its record (``resumed``, ``MEASURED_EACH_POLL``). ``_sized`` is
one function of about 180 lines on purpose: it is the algorithm's sequence, each step a call into the
modules below, and reading it top to bottom is reading the policy.
"""

from __future__ import annotations

from dataclasses import replace

from keyorder_operator.policy.bounds import (
    backlog_dominates,
    bounds,
    cpu_bound,
    draining,
    quiet_scale_in,
    required_capacity,
    workers_idle,
)
from keyorder_operator.policy.explanation import _describe, _size_words, duration
from keyorder_operator.policy.lag import drainable_lag
from keyorder_operator.policy.model import (
    HOLD_POLLS,
    LIMIT_CLEAR_POLLS,
    SEED_AGE,
    SEEN_BY_PODS,
    Cause,
    Decision,
    Observation,
    RateSource,
    ScalingLimits,
    ScalingState,
    Size,
)
from keyorder_operator.policy.rates import (
    ARRIVALS_STALE_SECONDS,
    clean_interval,
    learn_rate,
    membership_changed,
    reports_complete,
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
    within_tolerance,
)
from keyorder_operator.policy.stabilisation import (
    growth_unknown,
    lag_growing,
    rate_limited,
    scale_up_rates,
    stabilized,
    window_memory,
)
from keyorder_operator.policy.step_cost import step_cost, step_outlasts_backlog, timed_step, workers_while_pods_start


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
