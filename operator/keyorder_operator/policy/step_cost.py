"""Step 11: the cost of a scale step, and what holds while one is under way.

Every change of replicas is timed from the decision until every pod reports and every partition has an
owner again (``timed_step``, ``group_settled``); while the backlog drains at the current size sooner than
such steps took, no pod is added (``step_cost``, ``step_outlasts_backlog``). Until a step has settled,
the pods in place keep the workers they run (``workers_while_pods_start``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from keyorder_operator.policy.explanation import duration, net_drain_seconds
from keyorder_operator.policy.model import SAMPLES, Decision, Observation, ScalingState
from keyorder_operator.policy.rates import reports_complete

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


def ready_pods(observation: Observation) -> int | None:
    """The ready pods: those asked for a report, else those that answered (``None``: not known)."""
    if observation.pods_expected is not None:
        return observation.pods_expected
    return observation.pods.pods if observation.pods is not None else None


def most_workers_per_pod(observation: Observation) -> int | None:
    """The most workers one pod reports running (``None``: no pod reported); the mean rounded up where the
    reports do not say (``PodSignals.most_workers`` 0)."""
    pods = observation.pods
    if pods is None or not pods.pods:
        return None
    return pods.most_workers or math.ceil(pods.workers / pods.pods)


def workers_while_pods_start(decision: Decision, observation: Observation, now: float) -> Decision:
    """``decision``, with the pods already running keeping their workers until a scale step has settled.

    A step that adds pods lowers the workers per pod when the same capacity spreads over more pods (6 x 29
    -> 12 x 17). Lowered at once, the running pods would lose workers for the whole start of the new ones
    (30 s in ``keyorder simulate``) and the rebalance after it: 6 x 17 workers at 10 ms handle 10,000/s,
    under the 12,000/s that 6 x 29 kept up with, and the backlog would grow because the group scaled up.

    So while a step has not settled (``state.step_started_at``, which ``timed_step`` clears once every
    decided pod is ready and reports and every partition has an owner: /readyz only says a broker
    answered, the partitions move after it), a pod reporting more than ``target.workers`` keeps them
    (``Decision.hold_workers``: the operator pushes the count only to pods running fewer or not
    reporting). This holds on every path of the decision, and for a second step decided while the first
    one's pods still start (the count kept is the highest a pod reports, not the one decided before).
    The hold never raises a pod above what it runs, so it never gives the group more than it ran before
    the step; it has no time limit: a step whose pods stay Pending or crash-loop keeps the pods in place
    at their count (the reason says how long the step has been under way once that is more than
    ``LONGEST_STEP_SECONDS``). The decided size (``target``, the state's ``current``, the windows, the
    status) stays the one the step is for; the first decision once the step has settled lowers them."""
    target = decision.target
    started = decision.state.step_started_at
    if started is None or target.replicas == 0:
        return decision
    most = most_workers_per_pod(observation)
    if most is None or most <= target.workers:
        return decision
    ready = ready_pods(observation)
    keep = f"keep up to {most} workers per pod until the step settles (then {target.workers})"
    if target.replicas > decision.before.replicas:
        hold = f"adding {target.replicas - decision.before.replicas} pods; the running pods {keep}"
    elif ready is not None and ready < target.replicas:
        hold = f"{target.replicas - ready} of {target.replicas} pods starting; the ready pods {keep}"
    else:
        hold = f"the step's pods take over their partitions; the pods {keep}"
    if now - started > LONGEST_STEP_SECONDS:
        hold = f"{hold}; the step has not settled in {duration(now - started)} (a pod Pending or restarting?)"
    return replace(decision, hold_workers=True, reason=f"{decision.reason}; {hold}")
