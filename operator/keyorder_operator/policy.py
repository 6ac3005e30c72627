"""The scaling policy: how many pods and how many key workers per pod, from the observed backlog.

Pure: ``decide(observation, spec, state, now)`` does no I/O and reads no clock, so every scaling
behaviour is a table test. The operator's reconcile loop observes lag (Kafka admin API), calls
``decide``, then applies the result and explains it in status and Events.

The algorithm, in order:

1. **Unknown lag** (broker down, group missing) never scales: keep the current size, flag it.
2. **Required capacity** = backlog / target drain time + the rate at which new messages arrive.
   One worker's throughput is learned from the observed drain rate divided by the workers that
   produced it, but only from a *settled* interval (the size did not just change, so the new
   pods are not still joining) whose remaining backlog was worth at least 1 s at that drain rate
   (with a trickle, workers idle and would look slow). Without a measurement yet, capacity doubles per
   step (bounded by the limits).
3. **Shape**: pods first, each with the initial worker count, up to min(max replicas,
   partitions) (a pod beyond the partition count would sit idle); only at that cap do workers per
   pod grow, up to their maximum. Shrinking walks back the same path: workers first, then pods.
4. **Activation**: a backlog below ``activation_lag`` needs only what keeps up with the arrivals
   (at the learned per-worker rate; the minimum when that is unknown); with ``scale_to_zero`` an
   empty backlog with no arrivals scales to zero pods.
5. **Stabilization** (like the Kubernetes HPA): a scale-up takes the *smallest* recommendation of
   the scale-up window, a scale-down the *largest* of the scale-down window, so a noisy lag does
   not flap the Deployment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


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
    """Learned messages/s of one key worker (``None`` until measured under load)."""
    settled: bool = True
    """False right after a resize: the next drain rate still reflects the old size."""


@dataclass(frozen=True)
class Decision:
    before: Size
    target: Size
    reason: str
    """One line with the numbers, for the Event and the status ("scaled replicas 2->4: lag ...")."""
    state: ScalingState
    """The state to keep for the next reconcile."""
    lag_unknown: bool = False

    @property
    def scaled(self) -> bool:
        return self.target != self.before


def shape(capacity: int, limits: ScalingLimits, partitions: int) -> Size:
    """Pods first (with the initial workers), up to the partition cap; then workers per pod."""
    cap = min(limits.max_replicas or partitions, partitions)
    cap = max(cap, limits.min_replicas, 1)
    workers = min(max(limits.initial_workers, limits.min_workers), limits.max_workers)
    replicas = max(math.ceil(capacity / workers), limits.min_replicas)
    if replicas <= cap:
        return Size(replicas, workers)
    workers = min(max(math.ceil(capacity / cap), workers), limits.max_workers)
    return Size(cap, workers)


SATURATION_SECONDS = 1.0
"""A backlog worth at least this many seconds at the measured drain rate means the workers were
busy the whole interval: only such an interval measures what a worker can do. (With a trickle
they idle and would look slow; the lag also counts messages already inside the pods.)"""


def learn_per_worker_rate(observation: Observation, state: ScalingState, limits: ScalingLimits) -> float | None:
    """Update the per-worker throughput from a settled, saturated interval; otherwise keep the old one."""
    capacity = state.current.capacity
    lag, drain = observation.lag or 0, observation.drain_rate or 0.0
    loaded = lag >= limits.activation_lag and lag >= drain * SATURATION_SECONDS
    if state.settled and loaded and drain > 0 and capacity > 0:
        return drain / capacity  # drain > 0: it is the observed drain rate
    return state.per_worker_rate


def required_capacity(
    observation: Observation, current: Size, per_worker_rate: float | None, limits: ScalingLimits
) -> int:
    """Workers needed to drain the backlog within the target, keeping up with arrivals."""
    lag = observation.lag or 0
    needed_rate = lag / limits.target_drain_seconds + (observation.arrival_rate or 0.0)
    if needed_rate <= 0:
        return 0
    if per_worker_rate:
        return math.ceil(needed_rate / per_worker_rate)
    return max(current.capacity * 2, 1)  # no throughput measured yet: grow stepwise


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


def duration(seconds: float) -> str:
    """Human-sized duration for reasons and Events: 45 s, 12.5 min, 3.2 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


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


def decide(observation: Observation, limits: ScalingLimits, state: ScalingState, now: float) -> Decision:
    """The size the consumer group should have now, and why."""
    current = state.current
    if observation.lag is None or not observation.partitions:
        return Decision(
            before=current,
            target=current,
            reason=f"lag unknown: keeping {current.replicas} replicas x {current.workers} workers",
            state=state,
            lag_unknown=True,
        )
    partitions = observation.partitions
    arrivals = observation.arrival_rate or 0.0
    per_worker = learn_per_worker_rate(observation, state, limits)
    if observation.lag < limits.activation_lag:
        if limits.scale_to_zero and observation.lag == 0 and arrivals <= 0:
            recommended = Size(0, limits.initial_workers)
        elif per_worker:  # keep up with what arrives
            recommended = shape(math.ceil(arrivals / per_worker), limits, partitions)
        else:
            recommended = shape(0, limits, partitions)
    else:
        recommended = shape(required_capacity(observation, current, per_worker, limits), limits, partitions)
        if recommended.capacity == 0:
            recommended = shape(1, limits, partitions)
    keep_since = now - max(limits.scale_up_window_seconds, limits.scale_down_window_seconds)
    history = tuple(item for item in state.recommendations if item[0] >= keep_since)
    target = _stabilized(recommended, current, history, now, limits)
    new_state = replace(
        state,
        current=target,
        settled=target == current,
        per_worker_rate=per_worker,
        recommendations=(*history, (now, recommended.replicas, recommended.workers)),
    )
    return Decision(
        before=current, target=target, reason=_describe(current, target, observation, limits), state=new_state
    )
