"""The KEDA reference of ``keyorder simulate --against keda`` (``keyorder.devtools.groupsim.keda``) does
what KEDA's Kafka scaler and the HPA controller do, rule by rule, and the comparison runs both policies on
the same arrivals. Pure: time is a parameter; a few seconds in all."""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import replace

import pytest

from keyorder.devtools.groupsim import driver
from keyorder.devtools.groupsim.compare import SPIKE_RATIO, compare
from keyorder.devtools.groupsim.keda import (
    HpaPolicy,
    KedaSettings,
    KedaState,
    decide,
    hpa_replicas,
    kafka_metric,
)
from keyorder.devtools.groupsim.model import GroupSettings, SimulatedGroup, Workload
from keyorder.devtools.groupsim.scenarios import APP, by_name, constant

DEFAULTS = KedaSettings()


@pytest.mark.parametrize(
    ("lags", "settings", "metric", "active"),
    [
        ((5, 5, 0, 0), DEFAULTS, 10, True),  # the sum of the partitions' lags
        ((0, 0, 0, 0), DEFAULTS, 0, False),  # activationLagThreshold 0: no lag, not active
        ((1_000, 1_000, 0, 0), DEFAULTS, 40, True),  # capped at partitions x lagThreshold
        ((49, 0, 0, 0), DEFAULTS, 49, True),  # 49 // 10 = 4 partitions: not above the cap (Go's integer division)
        ((1_000, 1_000, 0, 0), replace(DEFAULTS, allow_idle_consumers=True), 2_000, True),
        ((1_000, 1_000, 0, 0), replace(DEFAULTS, limit_to_partitions_with_lag=True), 20, True),
        ((3, 2, 0, 0), replace(DEFAULTS, activation_lag_threshold=5), 5, False),  # active only above it
    ],
)
def test_the_kafka_metric_is_getTotalLag(lags, settings, metric, active):
    assert kafka_metric(lags, settings) == (metric, active)


def test_the_hpa_keeps_the_replicas_within_its_tolerance_and_else_asks_for_ceil_metric_over_target():
    assert hpa_replicas(metric=105, current=10, settings=DEFAULTS) == 10  # ratio 1.05: within 10%
    assert hpa_replicas(metric=115, current=10, settings=DEFAULTS) == 12  # ratio 1.15: ceil(11.5)
    assert hpa_replicas(metric=30, current=10, settings=DEFAULTS) == 3


def test_a_scale_up_is_limited_to_4_pods_or_100_percent_per_15_s_whichever_is_more():
    lags = (1_000,) * 12  # the metric is capped at 12 x 10: 12 pods wanted
    replicas, state, seen = 1, KedaState(), []
    for now in (15.0, 30.0, 45.0, 60.0):
        decision = decide(now, replicas, lags, state, DEFAULTS)
        replicas, state = decision.replicas, decision.state
        seen.append(replicas)
    assert seen == [5, 10, 12, 12]  # 1 + 4; 5 x 2; capped by the metric


def test_a_scale_down_waits_for_the_300_s_window_then_goes_at_once():
    replicas, state = 1, KedaState()
    busy, idle = (1_000,) * 12, (0,) * 12
    for now in (15.0, 30.0, 45.0):
        decision = decide(now, replicas, busy, state, DEFAULTS)
        replicas, state = decision.replicas, decision.state
    assert replicas == 12
    held = [decide(now, replicas, idle, state, DEFAULTS).replicas for now in (60.0, 200.0, 344.0)]
    assert held == [12, 12, 12], "the window still holds the 45 s recommendation of 12"
    # 300 s after the last recommendation of 12 (the HPA's cutoff is exclusive): down to minReplicas at
    # once, as 100% per 15 s allows
    assert decide(345.0, replicas, idle, state, DEFAULTS).replicas == 1


def test_keda_scales_from_zero_on_its_polling_interval_and_to_zero_after_the_cooldown():
    settings = replace(DEFAULTS, min_replicas=0)
    state = KedaState(last_poll=0.0)
    assert decide(15.0, 0, (5,), state, settings).replicas == 0, "KEDA's loop runs every 30 s, the HPA not at 0"
    woke = decide(30.0, 0, (5,), state, settings)
    assert woke.replicas == 1
    quiet = replace(woke.state, last_poll=30.0, recommendations=())
    assert decide(300.0, 1, (0,), quiet, settings).replicas == 1, "cooling down"
    assert decide(330.0, 1, (0,), replace(quiet, last_poll=300.0), settings).replicas == 0


def test_keda_raises_an_inactive_target_below_min_replica_count_to_it():
    """``RequestScale``'s ``currentReplicas < minReplicas`` case (review of issue 39, finding 8: the
    reference stayed at 0)."""
    settings = replace(DEFAULTS, min_replicas=2)
    assert decide(30.0, 0, (0,) * 12, KedaState(last_poll=0.0), settings).replicas == 2
    assert decide(15.0, 0, (0,) * 12, KedaState(last_poll=0.0), settings).replicas == 0, "on KEDA's loop only"


def test_last_active_time_is_set_on_keda_s_loop_not_on_every_hpa_sync():
    """``LastActiveTime`` is RequestScale's, every ``pollingInterval`` (review of issue 39, finding 8)."""
    state = KedaState(last_poll=0.0, last_active=0.0)
    between = decide(15.0, 1, (5,), state, replace(DEFAULTS, min_replicas=0))
    assert between.state.last_active == 0.0, "an HPA sync between KEDA's polls"
    assert decide(30.0, 1, (5,), state, replace(DEFAULTS, min_replicas=0)).state.last_active == 30.0


def test_an_unreadable_lag_or_a_pause_keeps_the_replicas():
    assert decide(15.0, 7, None, KedaState(), DEFAULTS).replicas == 7
    assert decide(15.0, 7, (1_000,) * 12, KedaState(), DEFAULTS, paused=True).replicas == 7


def test_custom_behaviours_apply():
    slow = replace(DEFAULTS, scale_up_policies=(HpaPolicy("Pods", 1, 60.0),))
    replicas, state = 1, KedaState()
    for now in (15.0, 30.0, 45.0, 75.0):
        decision = decide(now, replicas, (1_000,) * 12, state, slow)
        replicas, state = decision.replicas, decision.state
    assert replicas == 3  # one pod per minute: at 15 s and at 75 s


def test_a_plain_consumer_drains_a_partition_at_one_threads_rate_however_many_pods_it_has():
    """One handler thread per partition: with an I/O-bound handler, more pods move partitions but drain
    no faster; and a pod's workers are its partitions."""
    drained = {}
    for pods in (1, 4):
        group = SimulatedGroup(
            settings=GroupSettings(partitions=4, thread_per_partition=True),
            workloads={APP: Workload(APP, constant(0.010), spread=0.0)},
            workload=APP,
            rng=random.Random(1),
            replicas=pods,
        )
        assert sorted(pod.workers for pod in group.pods) == sorted(len(pod.partitions) for pod in group.pods)
        group.add_arrivals(40_000)
        for _ in range(10):
            group.step(1.0)
        drained[pods] = 40_000 - group.lag()
    one_thread = 1 / (0.010 + 0.0002)
    assert drained[1] == pytest.approx(4 * 9 * one_thread, rel=0.02)  # the commits lag one step behind
    assert drained[4] == pytest.approx(drained[1], rel=0.01)


def test_a_blocked_message_stops_a_plain_consumers_partition():
    group = SimulatedGroup(
        settings=GroupSettings(partitions=2, thread_per_partition=True),
        workloads={APP: Workload(APP, constant(0.010))},
        workload=APP,
        rng=random.Random(1),
    )
    group.add_arrivals(2_000)
    group.partitions[0].blocked_at = 100.0
    for _ in range(30):
        group.step(1.0)
    assert group.partitions[0].last_commit == pytest.approx(100.0)
    assert group.partitions[1].last_commit == pytest.approx(1_000.0)


def test_both_policies_see_the_same_arrivals_and_keyorder_drains_the_spike_in_at_most_half_the_time():
    scenario = replace(by_name("spike"), duration=1800.0)
    comparison = compare(scenario, seed=7)
    ours, theirs = comparison.keyorder.run, comparison.keda.run
    assert [p.arrival_rate for p in ours.points] == [p.arrival_rate for p in theirs.points]
    assert ours.policy == "keyorder" and theirs.policy == "keda"
    assert comparison.keda_outcome.peak_workers is None, "not measured for KEDA: no constant in its place"
    assert comparison.keda_outcome.workers_over_need is None
    ratio = comparison.time_ratio
    assert ratio is not None and ratio <= SPIKE_RATIO
    assert comparison.keyorder_outcome.pod_minutes < comparison.keda_outcome.pod_minutes


def test_noise_draws_the_same_arrivals_under_either_policy():
    scenario = replace(by_name("noisy-steady"), duration=300.0)
    ours = driver.run(scenario, seed=3)
    theirs = driver.run(scenario, seed=3, keda=DEFAULTS)
    assert [p.arrival_rate for p in ours.points] == [p.arrival_rate for p in theirs.points]
    assert len({round(p.arrival_rate) for p in ours.points}) > 10, "the noise is there"


def test_keyorder_simulate_against_keda_prints_both_runs_and_writes_the_overlaid_chart(tmp_path):
    command = [sys.executable, "-m", "keyorder.cli", "simulate"]
    ran = subprocess.run(
        [*command, "burst", "--hours", "0.4", "--against", "keda", "--output", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "KEDA reference" in ran.stdout and "time to target" in ran.stdout and "pod-minutes" in ran.stdout
    assert "0 (thread per partition)" in ran.stdout
    assert (tmp_path / "burst-vs-keda.png").read_bytes()[:4] == b"\x89PNG"
    several = subprocess.run(
        [*command, "all", "--hours", "0.05", "--against", "keda", "--no-plot", "--keda-lag-threshold", "1000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "| scenario | time to target (keyorder / KEDA)" in several.stdout, several.stdout + several.stderr
    assert "lagThreshold 1000" in several.stdout
    assert several.stdout.count("| spike |") == 1 and "| silent-pod-idle |" in several.stdout
