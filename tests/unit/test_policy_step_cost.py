"""The policy times its own scale steps and adds no pod that would settle after the backlog is gone.

A change of replicas costs the group a rebalance: new pods start, join, and the partitions they take
over stop until they own them (docs/rebalancing.md). The policy times each step, from the decision
until every pod reports and every partition has an owner again, and while the backlog drains at the
current size sooner than a step takes, it grows the workers per pod instead (no partition moves).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from keyorder_operator.policy import Cause, Observation, ScalingState, Size, decide
from tests.unit.policy_fixtures import LIMITS
from tests.unit.test_policy_signals import pods

FAST_TARGET = replace(LIMITS, target_drain_seconds=5)
"""Drain within 5 s: a 30,000 backlog at 90 msg/s per worker wants 67 workers (4 pods of 17)."""


def backlog(drain: float = 2_880.0, lag: int = 30_000, **changes: object) -> Observation:
    """Two pods of 16 workers at 10 ms per message (90 msg/s each: 2,880 msg/s), draining ``lag``."""
    signals = replace(pods(2, 16), **changes)  # type: ignore[arg-type]
    return Observation(lag=lag, partitions=12, drain_rate=drain, arrival_rate=0.0, pods=signals, pods_expected=2)


def test_a_step_is_timed_from_the_decision_until_the_last_partition_has_an_owner():
    """Decided at t=100; at t=130 both pods report all 12 partitions, the latest assigned 12 s ago:
    the step took 18 s."""
    state = ScalingState(Size(2, 16), step_started_at=100.0)
    decision = decide(backlog(assignment_age=12.0), LIMITS, state, 130.0)
    assert decision.state.step_seconds == (18.0,)
    assert decision.state.step_started_at is None


@pytest.mark.parametrize(
    ("what", "changes", "expected"),
    [
        ("a partition without an owner", {"partitions_assigned": 11}, 2),
        ("a pod not reporting", {"pods": 1}, 2),
    ],
)
def test_a_step_is_not_timed_before_the_group_settles(what, changes, expected):
    state = ScalingState(Size(expected, 16), step_started_at=100.0)
    decision = decide(backlog(assignment_age=1.0, **changes), LIMITS, state, 130.0)
    assert decision.state.step_seconds == (), what
    assert decision.state.step_started_at == 100.0, what


def test_a_change_of_replicas_starts_the_timer_and_the_last_three_steps_are_kept():
    state = ScalingState(Size(2, 16), step_seconds=(10.0, 20.0, 30.0))
    decision = decide(backlog(lag=3_000_000), LIMITS, state, 50.0)
    assert decision.target.replicas > 2
    assert decision.state.step_started_at == 50.0
    settled = replace(decision.state, current=decision.target)
    later = decide(backlog(lag=3_000_000, pods=decision.target.replicas, assignment_age=0.0), LIMITS, settled, 70.0)
    assert later.state.step_seconds == (20.0, 30.0, 20.0)


def test_no_pod_is_added_when_the_backlog_drains_before_a_step_would_settle():
    """The backlog is gone in 10.4 s at 2,880 msg/s; steps took 20 s here: the two pods grow their
    workers instead, and the reason says why."""
    state = ScalingState(Size(2, 16), step_seconds=(20.0,))
    decision = decide(backlog(), FAST_TARGET, state, 0.0)
    assert decision.target.replicas == 2
    assert decision.target.workers > 16
    assert "no more pods: the backlog drains in 10 s at this size" in decision.reason
    assert decision.state.step_started_at is None


def test_without_a_measured_step_or_with_a_longer_backlog_pods_are_added():
    unmeasured = decide(backlog(), FAST_TARGET, ScalingState(Size(2, 16)), 0.0)
    assert unmeasured.target == Size(4, 17)  # 67 workers, 12 partitions spread evenly over 4 pods
    longer = decide(backlog(lag=120_000), FAST_TARGET, ScalingState(Size(2, 16), step_seconds=(20.0,)), 0.0)
    assert longer.target.replicas > 2  # 42 s at this size, longer than a 20 s step
    assert "no more pods" not in longer.reason


def test_a_group_that_does_not_keep_up_gets_its_pods_whatever_a_step_costs():
    """Arrivals above the drain: the backlog never drains at this size, so a step always pays off."""
    growing = replace(backlog(lag=3_000), arrival_rate=3_500.0)
    decision = decide(growing, FAST_TARGET, ScalingState(Size(2, 16), step_seconds=(60.0,)), 0.0)
    assert decision.target.replicas > 2


def test_held_back_at_the_cpu_bound_the_cause_says_the_step_cost():
    """Workers cannot grow either (a process executor on one core per pod): the size is kept, and the
    cause is the step's cost, not a steady state."""
    signals = {"executor": "process", "cpu_cores": 2.0}
    state = ScalingState(Size(2, 1), step_seconds=(20.0,))
    observation = backlog(lag=1_500, drain=180.0, **signals)  # 8 s at this size; 4 workers wanted
    decision = decide(observation, replace(FAST_TARGET, min_workers=1, initial_workers=1), state, 0.0)
    assert decision.target == Size(2, 1)
    assert decision.cause is Cause.STEP_COST


def test_a_step_that_took_longer_than_minutes_is_not_counted():
    """An operator restart or a hand-over between the decision and the settled group is no rebalance's
    cost: counted, it would keep pods from being added for hours."""
    state = ScalingState(Size(2, 16), step_seconds=(20.0,), step_started_at=100.0)
    decision = decide(backlog(assignment_age=1.0), LIMITS, state, 100.0 + 3_600)
    assert decision.state.step_seconds == (20.0,) and decision.state.step_started_at is None
