"""Table tests of the operator's pure scaling policy ``decide(observation, limits, state, now)``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from keyorder_operator.policy import Observation, ScalingLimits, ScalingState, Size, decide, shape
from tests.unit.policy_fixtures import LIMITS, ZERO

PER_WORKER = 100.0  # messages/s one key worker handles in these scenarios


ONE_POD = Size(1, 16)


def run(steps, limits=LIMITS, start=ONE_POD):
    """Feed ``(time, lag)`` steps through decide, with a drain rate that follows the current size
    (100 msg/s per worker while there is a backlog); return the targets in order."""
    state, targets = ScalingState(start), []
    for now, lag in steps:
        drain = min(PER_WORKER * state.current.capacity, lag) if lag else 0.0
        decision = decide(Observation(lag=lag, partitions=4, drain_rate=drain), limits, state, now)
        state = decision.state
        targets.append(decision.target)
    return targets


@pytest.mark.parametrize(
    ("capacity", "partitions", "expected"),
    [
        (0, 4, Size(1, 16)),  # the minimum
        (40, 4, Size(2, 20)),  # pods first, spreading the partitions evenly (3 pods: one would hold two)
        (64, 4, Size(4, 16)),  # exactly at the partition cap
        (200, 4, Size(4, 50)),  # at the cap: workers grow
        (10_000, 4, Size(4, 256)),  # workers capped
        (40, 2, Size(2, 20)),  # fewer partitions than pods wanted
        (176, 12, Size(6, 30)),  # 11 pods would leave one with two partitions: 6 with two each do as much
        (60, 7, Size(4, 18)),  # 7 partitions: 4 pods (two each at most), the busiest needing 2/7 of 60
    ],
)
def test_shape_scales_pods_first_then_workers(capacity, partitions, expected):
    assert shape(capacity, LIMITS, partitions) == expected


def test_spike_scales_to_the_partition_cap_then_grows_workers():
    targets = run([(0, 1_200_000), (15, 6_000_000)])  # 4,000 then 20,000 msg/s needed
    assert targets == [Size(2, 20), Size(4, 50)]


def test_reason_carries_the_numbers():
    decision = decide(Observation(lag=1_200_000, partitions=4, drain_rate=1_600), LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.scaled
    assert decision.reason == (
        "scaled replicas 1\u21922, workers/pod 16\u219220: lag 1200000, drain ETA 12.5 min, target 5.0 min"
    )


def test_drain_then_scale_down_only_after_the_window():
    targets = run([(0, 6_000_000), (60, 0), (200, 0), (299, 0), (301, 0)], start=Size(3, 16))
    assert targets[0] == Size(4, 50)
    assert targets[1:4] == [Size(4, 50)] * 3, "scaled down inside the stabilization window"
    assert targets[4] == Size(1, 16)


def test_scale_down_is_stepwise_workers_before_pods():
    limits = replace(LIMITS, scale_down_window_seconds=0)
    shapes = run([(0, 9_000_000), (15, 3_000_000), (30, 1_200_000), (45, 300_000)], limits=limits, start=Size(4, 100))
    # the first poll has no last lag to tell whether the lag grows: it keeps the size (lag_unknown_growth)
    assert shapes == [Size(4, 100), Size(4, 25), Size(2, 20), Size(1, 16)]


def test_noisy_lag_does_not_flap():
    targets = run([(t, 1_200_000 if i % 2 == 0 else 300_000) for i, t in enumerate(range(0, 200, 15))])
    assert targets[0] == Size(2, 20)
    assert set(targets) == {Size(2, 20)}, f"flapped: {targets}"


def test_noisy_spike_does_not_scale_up_within_an_up_window():
    limits = replace(LIMITS, scale_up_window_seconds=60)
    quiet, spike = 150_000, 1_200_000  # 500/s needed (1 pod), then 4,000/s (3 pods)
    targets = run([(0, quiet), (15, spike), (30, quiet), (45, spike)], limits=limits)
    assert set(targets) == {Size(1, 16)}
    sustained = run([(0, quiet), (15, spike), (30, spike), (76, spike)], limits=limits)
    assert sustained == [Size(1, 16), Size(1, 16), Size(1, 16), Size(2, 20)]


def test_unknown_lag_never_scales():
    for observation in (Observation(lag=None, partitions=4), Observation(lag=50_000, partitions=None)):
        state = ScalingState(Size(3, 32))
        decision = decide(observation, LIMITS, state, 10)
        assert decision.lag_unknown and not decision.scaled
        assert decision.target == Size(3, 32) and decision.state == replace(state, failed_observations=1)
        assert decision.reason.startswith("lag unknown")


@pytest.mark.parametrize(
    ("limits", "observation", "expected"),
    [
        (
            ScalingLimits(min_replicas=2, initial_workers=16),
            Observation(lag=0, partitions=8, drain_rate=100),
            Size(2, 16),
        ),
        (
            ScalingLimits(max_replicas=3, initial_workers=8, max_workers=20, target_drain_seconds=60),
            Observation(lag=10_000_000, partitions=8, drain_rate=10),
            Size(3, 20),
        ),
        (
            ScalingLimits(max_replicas=10, initial_workers=4, max_workers=64, target_drain_seconds=60),
            Observation(lag=10_000_000, partitions=3, drain_rate=40),
            Size(3, 64),
        ),  # partitions below max replicas
    ],
)
def test_bounds(limits, observation, expected):
    assert decide(observation, limits, ScalingState(Size(1, limits.initial_workers)), 0).target == expected


def test_scale_to_zero_and_back():
    targets = run([(0, 0), (10, 0), (20, 5_000)], limits=ZERO, start=Size(1, 16))
    assert targets[:2] == [Size(0, 16), Size(0, 16)]
    assert targets[2].replicas >= 1, "a backlog above the activation lag must wake the group up"


def test_below_activation_lag_stays_at_the_minimum():
    targets = run([(0, 99)], start=Size(1, 16))
    assert targets == [Size(1, 16)]


def test_a_trickle_after_the_spike_does_not_keep_the_group_scaled_out():
    """After a spike, a steady 100 msg/s with a small lag: the workers idle, so their low drain rate
    must not be taken as their speed (which would keep the group at its peak forever)."""
    limits = ScalingLimits(
        initial_workers=4, max_workers=64, target_drain_seconds=60, activation_lag=50, scale_down_window_seconds=10
    )
    state = ScalingState(Size(1, 4))
    steps = [(0, 200_000, 400.0), (5, 150_000, 3_200.0), (10, 60_000, 4_000.0)]  # saturated: 100/worker
    steps += [(15 + 5 * i, 60, 100.0) for i in range(8)]  # the trickle: 100 msg/s arrive and are drained
    for now, lag, drain in steps:
        observation = Observation(lag=lag, partitions=8, drain_rate=drain, arrival_rate=100.0 if now >= 15 else 0)
        state = decide(observation, limits, state, now).state
    assert state.current.capacity <= 8, f"still scaled out: {state.current}"
    assert state.per_worker_rate == pytest.approx(100.0)
