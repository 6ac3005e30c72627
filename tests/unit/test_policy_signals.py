"""Table tests of the policy with the pods' own reports: rate learning, bounds, KEDA parity.

Each test states the scenario in numbers; the pods' reports are built as ``PodSignals`` (what
``pod_signals.combine`` makes of the pods' JSON, tested in ``test_pod_signals``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from keyorder_operator.pod_signals import BusiestLane, HeldPartition, PodSignals
from keyorder_operator.policy import (
    Cause,
    Limited,
    LimitKind,
    Observation,
    RateKind,
    RateLimit,
    RateSource,
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
    """No drain measured yet: 10 ms per message in the handler is about 90 msg/s per worker (0.9
    of its time in the handler), so 1.2 M in 300 s (4,000 msg/s) needs 45 workers at once (3 pods
    of 16, four partitions each), not a doubling per poll."""
    observation = Observation(lag=1_200_000, partitions=12, pods=pods(1, 16))
    decision = decide(observation, LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.target == Size(3, 16)
    assert decision.state.per_worker_rate == pytest.approx(90.0)
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
    rate_source=RateSource.HANDLER_TIME,
    efficiency_samples=(1.0, 1.0, 1.0),
    handler_time=0.010,
    pod_totals=(100_000, 1_000.0, 0, 12, 0.0),
    pod_totals_at=0.0,
    saturated=True,
)
"""12 pods x 16 workers whose busy workers spent all their time in a 10 ms handler: 100 msg/s each
(and keys waited for a worker at the last poll)."""
BACKLOG = 12 * 16 * 100 * 300  # exactly what 12 x 16 drains in the 300 s target


def interval(calls: int, handler_ms: float, **signals) -> PodSignals:
    """12 pods x 16 workers after ``LEARNED``'s totals plus ``calls`` calls of ``handler_ms`` each."""
    report = pods(12, 16, calls=LEARNED.pod_totals[0] + calls, **signals)
    return replace(report, handler_seconds_total=LEARNED.pod_totals[1] + calls * handler_ms / 1000)


def test_a_rebalance_interval_is_not_learned_from():
    """The issue's case: one 15 s rebalance drains 20 msg/s. Nothing is learned from it, and the size
    is held while the pods refill their queues."""
    rebalanced = replace(interval(28_800, 10.0), rebalances_total=12)
    observation = Observation(lag=BACKLOG, partitions=12, drain_rate=20.0, pods=rebalanced)
    decision = decide(observation, LIMITS, LEARNED, 15)
    assert decision.state.efficiency_samples == LEARNED.efficiency_samples
    assert decision.cause is Cause.REBALANCING
    assert decision.target == Size(12, 16)


@pytest.mark.parametrize(
    "unclean",
    [
        {"rollout_settled": False},  # pods starting or rolling
        {"pods_expected": 13},  # a ready pod did not answer
    ],
)
def test_unclean_intervals_are_not_learned_from(unclean):
    """Half the workers' time in the handler, on an interval that does not measure the group as decided."""
    observation = Observation(lag=BACKLOG, partitions=12, drain_rate=20.0, pods=interval(14_400, 10.0))
    decision = decide(replace(observation, **unclean), LIMITS, LEARNED, 15)
    assert decision.state.efficiency_samples == LEARNED.efficiency_samples
    assert decision.state.per_worker_rate == pytest.approx(100.0)


def test_a_handler_slowdown_lowers_the_rate_at_once_and_a_speedup_waits_for_the_window():
    """The handler goes from 10 to 100 ms: the interval's handler time bounds the rate (10 msg/s per
    worker) on the very next poll, whatever was learned; back at 10 ms the smaller recommendation waits
    for the scale-down window (the issue's scale-down into a slowdown cannot happen)."""
    slow = Observation(lag=BACKLOG, partitions=12, drain_rate=1_920.0, pods=interval(28_800, 100.0))
    decision = decide(slow, LIMITS, LEARNED, 15)
    assert decision.state.per_worker_rate == pytest.approx(10.0)
    assert decision.target.capacity >= 10 * LEARNED.current.capacity * 0.9
    fast_again = replace(decision.state, pod_totals=interval(28_800, 100.0).totals(), pod_totals_at=15.0, settled=True)
    totals = fast_again.pod_totals
    assert totals is not None
    quick = replace(interval(0, 10.0), handler_calls_total=totals[0] + 288_000, handler_seconds_total=totals[1] + 2_880)
    later = decide(replace(slow, pods=quick), LIMITS, fast_again, 30)
    assert later.state.per_worker_rate == pytest.approx(100.0)
    assert later.target == decision.target, "the speed-up waits for the scale-down window"
    assert later.cause is Cause.STABILIZING


def test_the_rate_comes_from_busy_workers_time_not_from_all_workers():
    """A hot key holds a partition's commit, so the group's commits move at 20 msg/s; yet the busy
    workers spent 90% of the interval in a 10 ms handler with keys waiting: 90 msg/s per worker."""
    busy = interval(round(12 * 16 * 15 * 0.9 / 0.010), 10.0)
    state = replace(LEARNED, efficiency_samples=())
    decision = decide(Observation(lag=BACKLOG, partitions=12, drain_rate=20.0, pods=busy), LIMITS, state, 15)
    assert decision.state.efficiency_samples == pytest.approx((0.9,))
    assert decision.state.per_worker_rate == pytest.approx(90.0)
    assert decision.state.rate_source is RateSource.HANDLER_TIME


def test_a_learned_efficiency_stays_within_the_handler_times_bounds():
    """Workers idle a third of a saturated interval (the poll thread starved them): the efficiency is
    kept at 0.5 at least, so the rate never falls below half of what the handler time allows."""
    starved = interval(round(12 * 16 * 15 * 0.3 / 0.010), 10.0)
    decision = decide(Observation(lag=BACKLOG, partitions=12, pods=starved), LIMITS, LEARNED, 15)
    assert decision.state.efficiency_samples[-1] == 0.5
    assert decision.state.per_worker_rate == pytest.approx(100.0), "the median of (1, 1, 0.5)"


def test_a_new_workload_learns_again():
    """A new image: what was learned for the old one is dropped; the handler time gives the rate again
    with the default efficiency (0.9)."""
    renewed = replace(LIMITS, workload="new-image")
    observation = Observation(lag=BACKLOG, partitions=12, pods=interval(28_800, 10.0, ready=0, busy=100))
    decision = decide(observation, renewed, replace(LEARNED, workload="old-image"), 15)
    assert decision.state.workload == "new-image"
    assert decision.state.efficiency_samples == ()
    assert decision.state.per_worker_rate == pytest.approx(90.0)


def test_idle_workers_do_not_measure_a_worker():
    """Workers not the limit (no key waiting, few busy): their share of time in the handler says
    nothing about a saturated worker."""
    idle = interval(3_000, 10.0, busy=20, ready=0)
    observation = Observation(lag=BACKLOG, partitions=12, drain_rate=2_000.0, pods=idle)
    assert decide(observation, LIMITS, LEARNED, 15).state.efficiency_samples == LEARNED.efficiency_samples


def test_a_group_that_keeps_up_does_not_measure_a_worker():
    """Keys waited and every worker was busy at both ends of the interval, yet Kafka's lag was only what
    is in flight at both (16,000 of 16,000/s arriving): the group kept up, at 83% of what 12 x 16 workers
    handle, and may have idled in between. That share is the load, not the efficiency (``keyorder simulate
    slow-ramp`` through restarts learned 0.83 so, where a worker spends 0.98 of its time in the handler,
    and later stepped up to 1.6x the workers needed). With a backlog at both ends the same interval counts."""
    kept_up = interval(16_000 * 15, 10.0)  # 2,400 handler seconds over 15 s and 192 workers: 0.83
    state = replace(LEARNED, drainable_lag=16_000, polled_at=0.0)
    observation = Observation(
        lag=16_000, partitions=12, drain_rate=16_000.0, arrival_rate=16_000.0, pods=kept_up, pods_expected=12
    )
    assert decide(observation, LIMITS, state, 15).state.efficiency_samples == LEARNED.efficiency_samples
    behind = replace(observation, lag=BACKLOG)
    learned = decide(behind, LIMITS, replace(state, drainable_lag=BACKLOG), 15).state.efficiency_samples
    assert learned == pytest.approx((1.0, 1.0, 2_400 / 15 / 192))


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
    assert decision.target == Size(3, 16)


def test_a_blocked_key_pinning_the_lag_gives_no_scaling():
    held = (HeldPartition("orders[3]", blocked=True, lag=40_000),)
    stuck = pods(2, 16, ready=0, busy=0, queued=0, held=held)
    decision = decide(Observation(lag=40_050, partitions=12, pods=stuck), LIMITS, ScalingState(Size(2, 16)), 0)
    assert decision.target.capacity <= Size(2, 16).capacity, "40,000 pinned messages must not scale anything up"
    assert decision.limited is not None and decision.limited.kind is LimitKind.BLOCKED_KEY
    assert "orders[3] (lag 40000)" in decision.limited.message


def test_lag_a_blocked_key_pins_is_left_out_of_the_size():
    """1.2 M of the lag drains; 4.8 M behind a blocked key does not: size for the 1.2 M (45 workers)."""
    held = (HeldPartition("orders[3]", blocked=True, lag=4_800_000),)
    observation = Observation(lag=6_000_000, partitions=12, pods=pods(1, 16, held=held))
    decision = decide(observation, LIMITS, ScalingState(Size(1, 16)), 0)
    assert decision.target == Size(3, 16)
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


def test_a_limit_the_pods_show_does_not_clear_while_pods_are_silent():
    """Past the rebalance hold, a pod that does not report may be the one holding the blocked key:
    its absence from the reports is no evidence the key was unblocked."""
    blocked = Limited(LimitKind.BLOCKED_KEY, "scaling cannot help: a blocked key holds ...")
    state = ScalingState(Size(2, 16), pod_totals=(1_000, 10.0, 3, 1), limit=blocked)
    one_of_two = Observation(lag=1_000, partitions=12, pods=pods(1, 16, calls=1_100, rebalances=3), pods_expected=2)
    for poll in range(4):
        decision = decide(one_of_two, LIMITS, state, poll * 15)
        assert decision.limited == blocked, f"poll {poll}: {decision.reason}"
        state = replace(decision.state, current=Size(2, 16))
    both = Observation(lag=1_000, partitions=12, pods=pods(2, 16, calls=1_200, rebalances=3), pods_expected=2)
    cleared = [decide(both, LIMITS, state, 60)]
    cleared.append(decide(both, LIMITS, replace(cleared[0].state, current=Size(2, 16)), 75))
    cleared.append(decide(both, LIMITS, replace(cleared[1].state, current=Size(2, 16)), 90))
    assert [item.limited for item in cleared][-1] is None, "all pods report without it: it clears"


def test_partition_ordering_stops_at_one_worker_per_partition():
    limits = replace(LIMITS, partition_ordering=True)
    observation = Observation(lag=12_000_000, partitions=4, pods=pods(1, 16, ordering="partition"))
    decision = decide(observation, limits, ScalingState(Size(1, 16)), 0)
    assert decision.target == Size(1, 4), "one worker per partition (4), on the fewest pods"
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
    assert after.target == later.target, "9 pods drain no faster than 5 with their workers: no step"
    assert after.cause is Cause.STEP_COST
    assert f"would drain no faster than 5 replicas x {later.target.workers} workers" in after.reason


def test_after_a_rate_limited_step_more_pods_come_when_they_drain_faster():
    """Workers per pod capped at 32: 5 pods drain at 32 workers per busiest pod's 3 partitions, 9 pods
    at 32 per 2, so the next period's step adds drain capacity and is taken."""
    limits = replace(LIMITS, max_workers=32, scale_up_rates=(RateLimit(RateKind.PODS, 4, 15),))
    observation = Observation(lag=6_000_000, partitions=12, pods=pods(1, 16))
    first = decide(observation, limits, ScalingState(Size(1, 16)), 0)
    assert first.target == Size(5, 32)
    after = decide(observation, limits, replace(first.state, settled=True), 16)
    assert after.target.replicas == 9 and after.cause is Cause.SCALE_UP


def test_after_a_rate_limited_step_pods_come_first_when_arrivals_dominate():
    """Most of the need is arrivals (a lasting size, not a passing backlog): grow into the shape."""
    limits = replace(LIMITS, scale_up_rates=(RateLimit(RateKind.PODS, 4, 15),))
    observation = Observation(lag=1_000, partitions=12, arrival_rate=16_000.0, pods=pods(1, 16))
    first = decide(observation, limits, ScalingState(Size(1, 16)), 0)
    assert first.target.replicas == 5
    after = decide(observation, limits, replace(first.state, settled=True, arrival_samples=(16_000.0,) * 3), 16)
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
    sooner, so the 3,000,000 are sized to drain in those 1,000 s (34 workers at 90 msg/s: 3 pods),
    not in the 300 s target (112 workers: 6 pods of 19, two partitions each)."""
    hot = BusiestLane(key="acct-17", where="orders[3]", backlog=1_000, partition_inflight=2_500, partition_lag=250_000)
    signals = pods(1, 16, ready=20, queued=10_000, busiest=hot)
    observation = Observation(lag=3_000_000, partitions=12, pods=signals)
    assert hot.estimated_backlog == 100_000
    decision = decide(observation, LIMITS, ScalingState(Size(1, 16)), 0)
    without = decide(replace(observation, pods=replace(signals, busiest=None)), LIMITS, ScalingState(Size(1, 16)), 0)
    assert without.target == Size(6, 19)
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


def test_a_silent_pod_holds_the_size_for_two_polls_at_most_then_the_lag_decides():
    """One of two pods stops answering (CPU-starved): its partitions have no reporting pod. The first
    two polls hold the size; the third sizes on Kafka's lag and the pod that reports, and says so."""
    limits = LIMITS
    state = ScalingState(Size(2, 16), pod_totals=(76_000, 760.0, 0, 2, 0.0), pod_totals_at=-15.0)
    reporting = replace(pods(1, 16), partitions_assigned=6)
    decisions = []
    for poll in range(4):
        calls = 100_000 + poll * 24_000
        signals = replace(reporting, handler_calls_total=calls, handler_seconds_total=calls * 0.010)
        observation = Observation(lag=3_000_000 + poll * 150_000, partitions=12, pods=signals, pods_expected=2)
        decision = decide(observation, limits, state, 15.0 * poll)
        state = replace(decision.state, settled=True)
        decisions.append(decision)
    assert [d.cause for d in decisions[:2]] == [Cause.REBALANCING, Cause.REBALANCING]
    assert decisions[2].scaled, "a silent pod froze scaling"
    assert decisions[2].target.capacity >= 3_000_000 / 300 / 80
    assert decisions[2].caveat is not None and decisions[2].caveat.reason == "PodsNotReporting"
    assert "1 of 2 ready pods did not report" in decisions[2].caveat.message


def test_waking_from_zero_with_a_percent_policy_starts_pods():
    """The issue's crash: a Percent scale-up policy at 0 replicas divided by zero on every poll."""
    limits = replace(ZERO, scale_up_rates=(RateLimit(RateKind.PERCENT, 100, 15),))
    decision = decide(Observation(lag=50_000, partitions=12), limits, ScalingState(Size(0, 16)), 0)
    assert decision.target.replicas >= 1


def test_the_default_scale_up_policy_is_hpas_4_pods_or_100_percent_per_15_s():
    # workers per pod capped at 16, so each step's pods drain faster than the ones before
    limits = replace(LIMITS, scale_up_rates=(), max_workers=16)
    observation = Observation(lag=6_000_000, partitions=24, pods=replace(pods(1, 16), partitions_assigned=24))
    first = decide(observation, limits, ScalingState(Size(1, 16)), 0)
    assert first.target.replicas == 5, "1 + 4 pods"
    second = decide(observation, limits, replace(first.state, settled=True), 16)
    assert second.target.replicas == 10, "5 + 100%"


def test_with_activation_lag_zero_any_lag_wakes_and_zero_lag_sleeps():
    limits = replace(ZERO, activation_lag=0)
    empty = Observation(lag=0, partitions=4, drain_rate=0.0, arrival_rate=0.0)
    assert decide(empty, limits, ScalingState(Size(1, 16)), 0).target.replicas == 0
    one = Observation(lag=1, partitions=4, drain_rate=0.0, arrival_rate=0.0, partition_lags=(0, 0, 0, 1))
    assert decide(replace(one, drain_rate=None), limits, ScalingState(Size(0, 16)), 0).target.replicas == 1


def test_pause_wins_over_the_fallback():
    limits = replace(LIMITS, fallback_after=1, fallback_replicas=4)
    decision = decide(Observation(lag=None, partitions=None, paused=True), limits, ScalingState(Size(2, 16)), 0)
    assert decision.target == Size(2, 16) and decision.cause is Cause.PAUSED


def test_a_small_excess_within_the_tolerance_does_not_add_a_pod():
    """3 pods x 16 at 90 msg/s; steady arrivals of 3,500/s at 80% utilisation need 48.6 workers: 1%
    more than 48, within the 10% tolerance (no rebalance for noise)."""
    state = ScalingState(Size(3, 16), arrival_samples=(3_500.0, 3_500.0))
    observation = Observation(lag=2_000, partitions=12, drain_rate=3_500.0, arrival_rate=3_500.0, pods=pods(3, 16))
    decision = decide(observation, LIMITS, state, 0)
    assert decision.target == Size(3, 16) and decision.cause is Cause.WITHIN_TOLERANCE


def test_a_burst_within_one_poll_is_counted_once():
    """1 M messages landed within one 15 s poll on top of 500/s: that interval's 67k/s is not an
    arrival rate to keep up with (the median of the last three is); the lag carries the burst."""
    state = ScalingState(Size(1, 16), arrival_samples=(500.0, 500.0))
    observation = Observation(lag=1_000_000, partitions=12, drain_rate=500.0, arrival_rate=67_000.0, pods=pods(1, 16))
    decision = decide(observation, LIMITS, state, 0)
    needed = (1_000_000 / 300 + 500 / 0.8) / 80  # 50 workers at the default efficiency
    assert decision.target.capacity <= 16 * (needed // 16 + 1)


def test_lag_on_a_few_partitions_for_one_poll_does_not_reshape_the_group():
    """limitToPartitionsWithLag and lag on 3 of 12 partitions for one poll: 12 pods stay (a scale-down
    of pods waits for the down-window), the workers carry the capacity."""
    limits = replace(LIMITS, limit_to_partitions_with_lag=True)
    lags = (700_000, 700_000, 700_000) + (0,) * 9
    observation = Observation(lag=2_100_000, partitions=12, partition_lags=lags, pods=pods(12, 16))
    decision = decide(observation, limits, ScalingState(Size(12, 16)), 0)
    assert decision.target.replicas == 12


def test_no_scale_down_while_the_lag_grows():
    """Over-provisioned on paper (the learned rate says 2 pods suffice) but the lag rose by 30,000 in the
    interval: the group keeps its size."""
    state = replace(LEARNED, drainable_lag=100_000, polled_at=0.0, recommendations=())
    limits = replace(LIMITS, scale_down_window_seconds=0)
    observation = Observation(
        lag=130_000, partitions=12, drain_rate=1_000.0, arrival_rate=3_000.0, pods=interval(28_800, 10.0)
    )
    decision = decide(observation, limits, state, 15)
    assert decision.target == LEARNED.current and decision.cause is Cause.LAG_GROWING


def test_the_first_report_of_pods_still_filling_their_queue_holds_one_poll():
    """A new group's first report: 1 pod x 16 workers holding 3 messages while 600,000 wait in Kafka.
    Its look-ahead is still filling, so a hot key is not visible yet: sizing on that view would add
    pods for a backlog one key holds. The poll holds; the next one sees the hot key and bounds."""
    filling = Observation(lag=600_000, partitions=4, pods=pods(1, 16, busy=3, ready=0, queued=3, calls=50))
    first = decide(filling, LIMITS, ScalingState(Size(1, 16)), 0)
    assert first.target == Size(1, 16) and first.cause is Cause.REBALANCING, first.reason
    hot = BusiestLane("k-0000", "orders[2]", backlog=900, partition_inflight=1_000, partition_lag=500_000)
    filled = replace(filling, pods=pods(1, 16, queued=1_000, calls=150, busiest=hot))
    second = decide(filled, LIMITS, replace(first.state, current=Size(1, 16)), 15)
    assert second.limited is not None and second.limited.kind is LimitKind.HOT_KEY, second.reason
    assert second.target == Size(1, 16), second.reason
