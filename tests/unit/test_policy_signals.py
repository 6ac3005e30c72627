"""Table tests of the policy with the pods' own reports: rate learning, bounds, KEDA parity.

Each test states the scenario in numbers; the pods' reports are built as ``PodSignals`` (what
``pod_signals.combine`` makes of the pods' JSON, tested in ``test_pod_signals``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from keyorder_operator.pod_signals import BusiestLane, HeldPartition, PodSignals
from keyorder_operator.policy import (
    Limited,
    LimitKind,
    Observation,
    RateKind,
    RateLimit,
    ScalingState,
    Size,
    decide,
)
from tests.unit.policy_fixtures import LIMITS, ZERO


def pods(
    replicas: int,
    workers: int,
    *,
    busy: int | None = None,
    ready: int = 50,
    queued: int = 5_000,
    calls: int = 100_000,
    handler_ms: float = 10.0,
    rebalances: int = 0,
    busiest: BusiestLane | None = None,
    held: tuple[HeldPartition, ...] = (),
    ordering: str = "key",
    inflight: int | None = None,
    executor: str = "thread",
    cores: float = 0.0,
    cpu_seconds: float = 0.0,
) -> PodSignals:
    """``replicas`` pods reporting ``workers`` workers each (busy, with keys waiting, by default)."""
    total = replicas * workers
    return PodSignals(
        pods=replicas,
        workers=total,
        busy=total if busy is None else busy,
        lanes_ready=ready,
        queued=queued,
        inflight=queued if inflight is None else inflight,
        handler_calls_total=calls,
        handler_seconds_total=calls * handler_ms / 1000,
        rebalances_total=rebalances,
        ordering=ordering,
        partitions_assigned=12,
        busiest=busiest,
        held=held,
        executor=executor,
        cpu_cores=cores * replicas,
        cpu_seconds_total=cpu_seconds,
    )


def test_first_poll_of_a_spike_sizes_from_the_handler_time():
    """No drain measured yet: 10 ms per message in the handler is about 80 msg/s per worker (0.8
    of its time in the handler), so 1.2 M in 300 s (4,000 msg/s) needs 50 workers at once, not a
    doubling per poll."""
    observation = Observation(lag=1_200_000, partitions=12, pods=pods(1, 16))
    decision = decide(observation, LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.target == Size(4, 16)
    assert decision.state.per_worker_rate == pytest.approx(80.0)
    assert decision.handler_seconds == pytest.approx(0.010)


def test_without_any_report_the_size_grows_stepwise_once_the_pods_run():
    """Pods that run but never report (an older release): doubling per poll, as before."""
    decision = decide(Observation(lag=1_200_000, partitions=12), LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.target == Size(2, 16)


def test_while_the_first_pods_start_the_size_waits_for_their_report():
    """No report because the pods are still starting: a blind doubling would cost a rebalance
    that the first report (a poll later) makes unnecessary."""
    starting = Observation(lag=1_200_000, partitions=12, rollout_settled=False)
    assert decide(starting, LIMITS, ScalingState(Size(1, 16)), 0).target == Size(1, 16)


LEARNED = ScalingState(
    Size(12, 16),
    per_worker_rate=100.0,
    rate_samples=(100.0, 100.0, 100.0),
    pod_totals=(100_000, 1_000.0, 0, 12),
)
"""12 pods x 16 workers that measured 100 msg/s per worker on three clean intervals."""
BACKLOG = 12 * 16 * 100 * 300  # exactly what 12 x 16 drains in the 300 s target


def test_a_rebalance_interval_is_not_learned_from():
    """The issue's case: one 15 s rebalance drains 20 msg/s. Learning 20 / 192 = 0.1 msg/s per
    worker would jump the group to 12 x 256 and fire catch-up; the interval is skipped instead."""
    rebalanced = pods(12, 16, rebalances=12, calls=110_000)
    observation = Observation(lag=BACKLOG, partitions=12, drain_rate=20.0, pods=rebalanced)
    decision = decide(observation, LIMITS, LEARNED, 15)
    assert decision.state.rate_samples == LEARNED.rate_samples
    assert decision.state.per_worker_rate == 100.0
    assert decision.target == Size(12, 16)


@pytest.mark.parametrize(
    "unclean",
    [
        {"rollout_settled": False},  # pods starting or rolling
        {"pods": pods(11, 16, calls=110_000)},  # a pod did not answer
    ],
)
def test_unclean_intervals_are_not_learned_from(unclean):
    observation = Observation(lag=BACKLOG, partitions=12, drain_rate=20.0, pods=pods(12, 16, calls=110_000))
    decision = decide(replace(observation, **unclean), LIMITS, LEARNED, 15)
    assert decision.state.per_worker_rate == 100.0
    assert decision.target == Size(12, 16)


def test_an_undetected_dip_moves_the_size_by_at_most_one_step():
    """A dip nothing flagged (clean, saturated): the median of three ignores one bad sample, and a
    sample never moves the rate more than 2x, so the size moves by at most one doubling."""
    observation = Observation(lag=BACKLOG, partitions=12, drain_rate=20.0, pods=pods(12, 16, calls=110_000))
    decision = decide(observation, LIMITS, LEARNED, 15)
    assert decision.state.rate_samples[-1] == 50.0, "a sample is clamped to half the learned rate"
    assert decision.state.per_worker_rate == 100.0, "the median of (100, 100, 50)"
    assert decision.target == Size(12, 16)
    fresh = replace(LEARNED, rate_samples=(100.0,))
    decision = decide(observation, LIMITS, fresh, 15)
    assert decision.target.capacity <= 2 * LEARNED.current.capacity


def test_the_rate_is_divided_by_the_workers_the_pods_report():
    """Pods still at 8 workers although 16 were decided (a push not yet applied): 19,200 msg/s
    over 12 x 8 reported workers is 200 msg/s each, not 100."""
    state = ScalingState(Size(12, 16), pod_totals=(100_000, 1_000.0, 0, 12))
    observation = Observation(lag=BACKLOG, partitions=12, drain_rate=19_200.0, pods=pods(12, 8, calls=110_000))
    assert decide(observation, LIMITS, state, 15).state.per_worker_rate == pytest.approx(200.0)


def test_idle_workers_do_not_measure_a_worker():
    """Workers not the limit (no key waiting, few busy): the drain says nothing about their speed."""
    idle = pods(12, 16, busy=20, ready=0, calls=110_000)
    observation = Observation(lag=BACKLOG, partitions=12, drain_rate=2_000.0, pods=idle)
    assert decide(observation, LIMITS, LEARNED, 15).state.rate_samples == LEARNED.rate_samples


HOT = BusiestLane(key="acct-17", where="orders[3]", backlog=3_050)


def test_a_hot_key_stops_the_size_at_the_bound_and_says_why():
    """61% of the pods' queue is one key and no other key waits for a worker: more workers or pods
    cannot help; the size stays, and the reason names the key, the share and the bound."""
    hot = pods(1, 16, ready=0, queued=5_000, busiest=HOT, busy=6)
    decision = decide(Observation(lag=1_200_000, partitions=12, pods=hot), LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.target == Size(1, 16)
    assert decision.limited is not None and decision.limited.kind is LimitKind.HOT_KEY
    assert decision.limited.message == (
        "scaling cannot help: key 'acct-17' holds 61% of the backlog on orders[3]; bound 1.6\u00d7"
    )
    assert decision.limited.message in decision.reason


def test_a_hot_key_bounds_the_size_even_while_other_keys_wait():
    """Keys waiting for a worker do not change the bound: the drain takes at least the hot key's
    backlog x the handler time, which 16 workers already beat (the bound is 1.6)."""
    hot = pods(1, 16, ready=30, queued=5_000, busiest=HOT)
    decision = decide(Observation(lag=1_200_000, partitions=12, pods=hot), LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.limited is not None and decision.limited.kind is LimitKind.HOT_KEY
    assert decision.target == Size(1, 16)


def test_a_key_with_less_than_half_of_the_queue_does_not_stop_scaling():
    warm = pods(1, 16, ready=30, queued=5_000, busiest=replace(HOT, backlog=2_000))
    decision = decide(Observation(lag=1_200_000, partitions=12, pods=warm), LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.limited is None
    assert decision.target == Size(4, 16)


def test_a_blocked_key_pinning_the_lag_gives_no_scaling():
    held = (HeldPartition("orders[3]", blocked=True, lag=40_000),)
    stuck = pods(2, 16, ready=0, busy=0, queued=0, held=held)
    decision = decide(Observation(lag=40_050, partitions=12, pods=stuck), LIMITS, ScalingState(Size(2, 16)), 0)
    assert decision.target.capacity <= Size(2, 16).capacity, "40,000 pinned messages must not scale anything up"
    assert decision.limited is not None and decision.limited.kind is LimitKind.BLOCKED_KEY
    assert "orders[3] (lag 40000)" in decision.limited.message


def test_lag_a_blocked_key_pins_is_left_out_of_the_size():
    """1.2 M of the lag drains; 4.8 M behind a blocked key does not: size for the 1.2 M (50 workers)."""
    held = (HeldPartition("orders[3]", blocked=True, lag=4_800_000),)
    observation = Observation(lag=6_000_000, partitions=12, pods=pods(1, 16, held=held))
    decision = decide(observation, LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.target == Size(4, 16)
    assert decision.limited is not None and decision.limited.kind is LimitKind.BLOCKED_KEY


def test_a_rebalance_keeps_the_size_and_the_last_limit_until_the_pods_report_again():
    """Right after a rebalance the pods' queues are empty: no blocked key, no hot key, idle
    workers. That view must neither clear a limit nor drive the size."""
    blocked = Limited(LimitKind.BLOCKED_KEY, "scaling cannot help: a blocked key holds ...")
    state = ScalingState(Size(2, 16), pod_totals=(1_000, 10.0, 3, 2), limit=blocked)
    emptied = pods(2, 16, busy=0, ready=0, queued=0, calls=1_100, rebalances=5)
    decision = decide(Observation(lag=1_200_000, partitions=12, pods=emptied), LIMITS, state, 0)
    assert decision.target == Size(2, 16)
    assert decision.limited == blocked
    assert decision.reason.startswith("pods rebalancing: keeping 2 replicas x 16 workers")
    assert decision.state.pod_totals == emptied.totals(), "the next poll compares with this one"


def test_a_limit_clears_only_after_two_polls_without_it():
    blocked = Limited(LimitKind.BLOCKED_KEY, "scaling cannot help: a blocked key holds ...")
    state = ScalingState(Size(2, 16), pod_totals=(1_000, 10.0, 3, 2), limit=blocked)
    healthy = Observation(lag=1_000, partitions=12, pods=pods(2, 16, calls=1_100, rebalances=3))
    first = decide(healthy, LIMITS, state, 0)
    assert first.limited == blocked, "one poll without it keeps the limit"
    second = decide(healthy, LIMITS, replace(first.state, current=Size(2, 16)), 15)
    assert second.limited is None


def test_partition_ordering_stops_at_one_worker_per_partition():
    limits = replace(LIMITS, partition_ordering=True)
    observation = Observation(lag=12_000_000, partitions=4, pods=pods(1, 16, ordering="partition"))
    decision = decide(observation, limits, ScalingState(Size(1, 16)), 0)
    assert decision.target.capacity <= 4 * 1 or decision.target.workers <= 4
    assert decision.target.replicas * min(decision.target.workers, 4) >= 4
    assert decision.limited is not None and decision.limited.kind is LimitKind.PARTITION_ORDERING
    assert "at most 4 workers" in decision.limited.message


def test_limit_to_partitions_with_lag():
    """Lag on 1 of 12 partitions: a second pod would only cost a rebalance."""
    limits = replace(LIMITS, limit_to_partitions_with_lag=True)
    lags = (1_200_000,) + (0,) * 11
    observation = Observation(lag=1_200_000, partitions=12, partition_lags=lags, pods=pods(1, 16))
    decision = decide(observation, limits, ScalingState(Size(1, 16)), 0)
    assert decision.target.replicas == 1
    assert decision.target.capacity >= 40, "the one useful pod gets the workers instead"
    assert decision.limited is not None and decision.limited.kind is LimitKind.PARTITIONS_WITH_LAG


def test_idle_workers_with_lag_on_two_clean_polls_are_a_limit():
    idle = pods(1, 16, busy=2, ready=0, queued=3)
    observation = Observation(lag=1_200_000, partitions=12, drain_rate=200.0, pods=idle)
    state = ScalingState(Size(1, 16), per_worker_rate=100.0, rate_samples=(100.0,), pod_totals=idle.totals())
    first = decide(observation, LIMITS, state, 0)
    assert first.limited is None and first.state.idle_polls == 1
    second = decide(observation, LIMITS, replace(first.state, current=Size(1, 16), settled=True), 15)
    assert second.limited is not None and second.limited.kind is LimitKind.IDLE_WORKERS
    assert second.target == Size(1, 16)


def test_pause_keeps_the_size_without_resetting_to_the_minimum():
    observation = Observation(lag=1_200_000, partitions=12, pods=pods(6, 32), paused=True)
    decision = decide(observation, LIMITS, ScalingState(Size(6, 32)), 0)
    assert decision.target == Size(6, 32) and not decision.scaled
    assert decision.reason.startswith("paused: keeping 6 replicas x 32 workers")
    calm = replace(observation, lag=0)
    assert decide(calm, LIMITS, ScalingState(Size(6, 32)), 400).target == Size(6, 32)


def test_fallback_after_consecutive_failed_observations():
    limits = replace(LIMITS, fallback_after=3, fallback_replicas=2)
    state = ScalingState(Size(5, 16))
    unknown = Observation(lag=None, partitions=None)
    targets = []
    for now in (0, 15, 30, 45):
        decision = decide(unknown, limits, state, now)
        state = decision.state
        targets.append(decision.target)
    assert targets == [Size(5, 16), Size(5, 16), Size(2, 16), Size(2, 16)]
    recovered = decide(Observation(lag=0, partitions=12), limits, state, 60)
    assert recovered.state.failed_observations == 0


def test_a_lag_below_the_activation_threshold_still_wakes_a_group_at_zero():
    decision = decide(Observation(lag=5, partitions=4, drain_rate=0.0), ZERO, ScalingState(Size(0, 16)), 0)
    assert decision.target.replicas == 1


def test_commit_markers_of_an_idle_transactional_topic_reach_zero():
    """One offset per partition left behind (the commit markers), nothing moving, nothing held."""
    observation = Observation(
        lag=4, partitions=4, drain_rate=0.0, arrival_rate=0.0, partition_lags=(1, 1, 1, 1), pods=pods(1, 16, queued=0)
    )
    assert decide(observation, ZERO, ScalingState(Size(1, 16)), 0).target.replicas == 0
    held = replace(observation, pods=pods(1, 16, queued=1, inflight=1))
    assert decide(held, ZERO, ScalingState(Size(1, 16)), 0).target.replicas == 1, "a pod holds a real message"
    moving = replace(observation, arrival_rate=0.5)
    assert decide(moving, ZERO, ScalingState(Size(1, 16)), 0).target.replicas == 1


def test_a_blocked_key_never_lets_the_group_scale_to_zero():
    held = (HeldPartition("orders[0]", blocked=True, lag=500),)
    observation = Observation(lag=500, partitions=4, drain_rate=0.0, arrival_rate=0.0, pods=pods(1, 16, held=held))
    assert decide(observation, ZERO, ScalingState(Size(1, 16)), 0).target.replicas == 1


def test_scale_up_rate_limit_holds_pods_back_and_workers_make_up_the_capacity():
    limits = replace(LIMITS, scale_up_rates=(RateLimit(RateKind.PODS, 4, 15),))
    observation = Observation(lag=6_000_000, partitions=12, pods=pods(1, 16))  # 20,000 msg/s: 250 workers
    decision = decide(observation, limits, ScalingState(Size(1, 16)), 0)
    assert decision.target.replicas == 5
    assert decision.target.capacity >= 250
    later = decide(observation, limits, replace(decision.state, settled=True), 5)
    assert later.target.replicas == 5, "still inside the 15 s period"
    after = decide(observation, limits, replace(later.state, settled=True), 16)
    assert after.target.replicas == 9


def test_scale_down_rate_limit_percent():
    limits = replace(LIMITS, scale_down_window_seconds=0, scale_down_rates=(RateLimit(RateKind.PERCENT, 50, 60),))
    decision = decide(
        Observation(lag=0, partitions=12, pods=pods(8, 16, ready=0)), limits, ScalingState(Size(8, 16)), 0
    )
    assert decision.target.replicas == 4


def test_a_process_executor_gets_no_more_workers_than_its_cores():
    """Process workers beyond a pod's cores add nothing: 4 partitions x 2 cores is the most that
    helps, whatever the backlog; the limit says so."""
    limits = replace(LIMITS, initial_workers=1)
    observation = Observation(lag=6_000_000, partitions=4, pods=pods(1, 1, executor="process", cores=2.0))
    decision = decide(observation, limits, ScalingState(Size(1, 1)), 0)
    assert decision.target == Size(4, 2)
    assert decision.limited is not None and decision.limited.kind is LimitKind.CPU
    assert decision.limited.kind.reason == "CpuBound"
    assert "each pod's 2 cores" in decision.limited.message


def test_a_cpu_bound_thread_executor_grows_pods_not_workers():
    """Pods using 0.95 of a core with threads (the GIL): more threads per pod cannot help; more
    pods can, up to the partitions; then the limit says so."""
    before = pods(2, 16, cores=4.0, cpu_seconds=100.0)
    state = ScalingState(Size(2, 16), pod_totals=before.totals(), pod_totals_at=0.0, per_worker_rate=100.0)
    busy = pods(2, 16, cores=4.0, cpu_seconds=100.0 + 2 * 0.95 * 15, calls=110_000)
    observation = Observation(lag=12_000_000, partitions=4, drain_rate=3_200.0, pods=busy)
    decision = decide(observation, LIMITS, state, 15.0)
    assert decision.target == Size(4, 16), "pods grow to the partitions; workers per pod stay"
    assert decision.limited is not None and decision.limited.kind is LimitKind.CPU
    assert "use 0.95 of their 4 cores with a thread executor" in decision.limited.message
    idle_cpu = replace(observation, pods=pods(2, 16, cores=4.0, cpu_seconds=100.0 + 2 * 0.2 * 15, calls=110_000))
    assert decide(idle_cpu, LIMITS, state, 15.0).target.workers > 16, "CPU to spare: workers grow"


def test_a_hot_key_longer_than_the_target_sizes_the_rest_for_its_time():
    """The pod holds 1,000 messages of one key among 2,500 in flight from a partition whose lag is
    250,000: about 100,000 messages of that key, 1,000 s at 10 ms each. No size drains the backlog
    sooner, so the 3,000,000 are sized to drain in those 1,000 s (38 workers at 80 msg/s: 3 pods),
    not in the 300 s target (125 workers: 8 pods)."""
    hot = BusiestLane(key="acct-17", where="orders[3]", backlog=1_000, partition_inflight=2_500, partition_lag=250_000)
    signals = pods(1, 16, ready=20, queued=10_000, busiest=hot)
    observation = Observation(lag=3_000_000, partitions=12, pods=signals)
    assert hot.estimated_backlog == 100_000
    decision = decide(observation, LIMITS, ScalingState(Size(1, 16)), 0)
    without = decide(replace(observation, pods=replace(signals, busiest=None)), LIMITS, ScalingState(Size(1, 16)), 0)
    assert without.target == Size(8, 16)
    assert decision.target == Size(3, 16)
    assert decision.limited is not None and decision.limited.kind is LimitKind.HOT_KEY
    assert decision.limited.message == (
        "scaling cannot help: key 'acct-17' holds about 100000 messages on orders[3], 16.7 min at 10.0 ms each, "
        "longer than the 5.0 min target; the rest of the backlog is sized to drain in that time"
    )


def test_a_hot_keys_horizon_still_sizes_the_backlog_when_a_blocked_key_gives_the_reason():
    """Both at once: 40,000 messages behind a blocked key (the reason shown) and the hot key of the
    test above. The 2,960,000 that can drain are still sized for the hot key's 1,000 s (37
    workers: 3 pods), not for the 300 s target (124 workers: 8 pods)."""
    hot = BusiestLane(key="acct-17", where="orders[3]", backlog=1_000, partition_inflight=2_500, partition_lag=250_000)
    held = (HeldPartition("orders[5]", blocked=True, lag=40_000),)
    signals = pods(1, 16, ready=20, queued=10_000, busiest=hot, held=held)
    decision = decide(Observation(lag=3_000_000, partitions=12, pods=signals), LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.target == Size(3, 16)
    assert decision.limited is not None and decision.limited.kind is LimitKind.BLOCKED_KEY
