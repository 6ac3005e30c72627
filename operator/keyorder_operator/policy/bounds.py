"""Steps 5 and 6: what is needed, and where more stops helping.

``required_capacity`` turns the drainable lag and the lasting arrivals into workers at the learned rate;
``bounds`` finds what caps them (a blocked key, a hot key and its horizon, ``ordering: partition``, lag on
only some partitions, workers idle with lag, the CPU) and says why (``Limited``); ``kept_up`` and
``quiet_scale_in`` tell when a group may shrink without the pods' reports.
"""

from __future__ import annotations

import math
from dataclasses import replace

from keyorder_operator.policy.explanation import duration
from keyorder_operator.policy.lag import drainable_lag, kept_up
from keyorder_operator.policy.model import (
    HOT_KEY_SHARE,
    IDLE_POLLS,
    IDLE_SHARE,
    Bound,
    Limited,
    LimitKind,
    Observation,
    ScalingLimits,
    ScalingState,
    Size,
)
from keyorder_operator.policy.rates import same_pods
from keyorder_operator.policy.shape import shape


# -- steps 5 and 6: what is needed, and what can help ------------------------------------------------
def backlog_dominates(lag: int, arrivals: float, limits: ScalingLimits) -> bool:
    """Most of the needed rate is for draining the backlog within the target, not for keeping up with
    arrivals: the need is passing (the size shrinks once the backlog is gone), so a reshape into more
    pods is worth a rebalance only if it drains faster. When arrivals dominate, the size is a lasting
    one and pods come first."""
    return lag / limits.target_drain_seconds > arrivals / max(limits.target_utilization, 0.01)


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


def hot_key_horizon(observation: Observation, handler_time: float | None, limits: ScalingLimits) -> float | None:
    """Seconds the busiest key needs on its own (its estimated backlog x the handler time of one of its
    messages: a call's, under a batch handler, which runs one message of a key per call), when that is
    longer than the target: no size drains the backlog sooner, so sizing for the target would add pods
    and workers that only wait for that key."""
    pods = observation.pods
    if pods is None or pods.busiest is None or not handler_time:
        return None
    seconds = pods.busiest.estimated_backlog * handler_time * pods.messages_per_call
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
            # the workers beyond which the key's own messages, a call each, take longer than the rest of the queue
            parallelism = pods.queued / (pods.busiest.backlog * pods.messages_per_call)
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
