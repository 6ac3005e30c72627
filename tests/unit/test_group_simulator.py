"""The simulated group itself (``keyorder.devtools.groupsim``): deterministic, conserving, and reporting
what a pod reports, so the scenario suite judges the policy and not the simulator's accidents."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace

import pytest

from keyorder.devtools.groupsim import driver
from keyorder.devtools.groupsim.criteria import failures, measure
from keyorder.devtools.groupsim.model import GroupSettings, SimulatedGroup, Workload
from keyorder.devtools.groupsim.scenarios import APP, by_name, constant
from keyorder_operator.pod_signals import combine, parse_report

TEN_MS = {APP: Workload(APP, constant(0.010))}


def group(**settings) -> SimulatedGroup:
    return SimulatedGroup(
        settings=GroupSettings(**settings), workloads=TEN_MS, workload=APP, rng=random.Random(3), replicas=1
    )


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    scenario = by_name("noisy-steady")
    first, again, other = run_points(scenario, 1), run_points(scenario, 1), run_points(scenario, 2)
    assert first == again
    assert first != other


def run_points(scenario, seed):
    return [
        (p.t, round(p.lag, 6), p.replicas, p.workers) for p in driver.run(replace(scenario, duration=900), seed).points
    ]


def test_nothing_is_lost_the_commit_never_passes_the_end_and_never_goes_back():
    simulated = group()
    simulated.scale(4)
    before = [0.0] * simulated.settings.partitions
    produced = 0.0
    for second in range(600):
        rate = 9_000 if 100 <= second < 160 else 1_000
        simulated.add_arrivals(rate)
        produced += rate
        simulated.step(1.0)
        for index, partition in enumerate(simulated.partitions):
            assert partition.last_commit <= partition.end + 1e-6
            assert partition.last_commit >= before[index] - 1e-6, "a commit went backwards"
            before[index] = partition.last_commit
        assert simulated.lag() == pytest.approx(produced - sum(before), abs=1e-3)
    assert sum(partition.end for partition in simulated.partitions) == pytest.approx(produced)


def test_a_new_pod_joins_after_its_start_delay_and_the_rebalance_pauses_every_pod():
    simulated = group(start_delay=30.0, rebalance_pause=5.0, incremental=False)
    simulated.add_arrivals(100_000)
    simulated.scale(2)
    for _ in range(29):
        simulated.step(1.0)
    assert sum(pod.joined for pod in simulated.pods) == 1, "joined before its start delay"
    simulated.step(1.0)
    assert sum(pod.joined for pod in simulated.pods) == 2
    paused_at = simulated.lag()
    for _ in range(4):
        simulated.step(1.0)
    assert simulated.partitions[0].committed == simulated.partitions[0].last_commit
    assert simulated.lag() == pytest.approx(paused_at), "the eager rebalance did not stop the group"
    for _ in range(3):
        simulated.step(1.0)
    assert simulated.lag() < paused_at


@pytest.mark.parametrize("incremental", [False, True])
def test_an_incremental_rebalance_stops_only_the_partitions_that_change_owner(incremental):
    """4 partitions, 2 pods -> 3: the first pod keeps partitions 0 and 1 either way. Eager, every
    partition stops; incremental (cooperative-sticky), only partition 3 (moving to the new pod) does."""
    simulated = group(incremental=incremental, start_delay=0.0, partitions=4, rebalance_pause=5.0, move_pause=8.0)
    simulated.scale(2)
    simulated.step(1.0)
    simulated.step(10.0)  # past the first rebalance's pause
    first, second = simulated.pods[0], simulated.pods[1]
    assert (first.partitions, second.partitions) == ((0, 1), (2, 3))
    simulated.add_arrivals(100_000)
    simulated.scale(3)
    simulated.step(1.0)
    assert first.partitions == (0, 1)
    stopped = {index: partition.paused_until - simulated.now for index, partition in enumerate(simulated.partitions)}
    stopped = {index: left for index, left in stopped.items() if left > 0}
    # eager: every partition for the rebalance pause; incremental: the moving one for the move pause
    assert stopped == ({3: 8.0} if incremental else dict.fromkeys(range(4), 5.0))
    assert (simulated.partitions[0].committed > 0) is incremental
    assert simulated.partitions[3].committed == 0


def test_the_pods_of_the_start_were_consuming_before_it_and_do_not_pause():
    simulated = group(rebalance_pause=5.0)
    simulated.add_arrivals(12_000)
    simulated.step(1.0)
    assert all(partition.committed > 0 for partition in simulated.partitions)


def test_the_sticky_assignment_is_as_even_as_the_range_one_and_moves_the_fewest_partitions():
    from keyorder.devtools.groupsim.model import range_assignment, sticky_assignment

    before = range_assignment([(f"p{n}", ()) for n in range(5)], 12)
    members = [(name, held) for name, held in before.items()] + [("p5", ())]
    after = sticky_assignment(members, 12)
    assert sorted(len(held) for held in after.values()) == [2] * 6
    assert sorted(p for held in after.values() for p in held) == list(range(12))
    moved = sum(len(set(held) - set(before.get(name, ()))) for name, held in after.items())
    assert moved == 2, after
    shrunk = sticky_assignment([(name, held) for name, held in after.items() if name != "p0"], 12)
    assert sorted(p for held in shrunk.values() for p in held) == list(range(12))
    assert all(set(after[name]) <= set(held) for name, held in shrunk.items())


def test_partitions_are_spread_in_ranges_and_an_extra_pod_gets_none():
    simulated = group(start_delay=0.0, partitions=12)
    simulated.scale(13)
    simulated.step(1.0)
    sizes = sorted(len(pod.partitions) for pod in simulated.pods)
    assert sizes == [0] + [1] * 12
    simulated.scale(11)
    simulated.step(1.0)
    assert sorted(len(pod.partitions) for pod in simulated.pods) == [1] * 10 + [2]


def test_the_reports_are_the_pods_own_and_parse_as_the_operator_reads_them():
    simulated = group(start_delay=0.0)
    simulated.partitions[0].hot_share = 0.9
    simulated.add_arrivals(120_000)
    simulated.scale(2)
    for _ in range(10):
        simulated.step(1.0)
    moving = combine([parse_report(simulated.report(pod)) for pod in simulated.pods])
    assert moving is not None and moving.partitions_assigned == 6  # the moved half waits for its new owner
    for _ in range(5):
        simulated.step(1.0)
    reports = [parse_report(json.loads(json.dumps(simulated.report(pod)))) for pod in simulated.pods]
    signals = combine(reports)
    assert signals is not None
    assert signals.pods == 2 and signals.workers == 32
    assert signals.partitions_assigned == 12
    # the newcomer's partitions arrived move_pause (13 s) after the step at t=0: the latest change is 2 s old
    assert signals.assignment_age == pytest.approx(2.0, abs=1.0)
    assert signals.handler_calls_total > 0
    assert signals.handler_seconds_total / signals.handler_calls_total == pytest.approx(0.010, rel=0.2)
    assert signals.busiest is not None and signals.busiest.key == "acct-hot" and signals.busiest.where == "orders[0]"


def test_a_blocked_key_pins_its_partition_and_the_report_says_blocked():
    simulated = group(start_delay=0.0)
    simulated.add_arrivals(12_000)
    simulated.partitions[3].blocked_at = 500.0
    for _ in range(20):
        simulated.add_arrivals(1_200)
        simulated.step(1.0)
    assert simulated.partitions[3].last_commit == 500.0
    signals = combine([parse_report(simulated.report(pod)) for pod in simulated.pods])
    assert signals is not None and signals.blocked_lag == pytest.approx(simulated.partitions[3].lag, abs=1)
    assert [held.where for held in signals.held] == ["orders[3]"]


def test_an_exception_in_the_policy_is_recorded_and_the_size_kept(monkeypatch):
    """A FAKE ``decide`` that raises: the run records it (a criterion fails) and goes on at its size."""

    def broken(*_args, **_kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(driver, "decide", broken)
    measured = measure(driver.run(replace(by_name("burst"), duration=120), seed=1))
    assert measured.exceptions and "ZeroDivisionError" in measured.exceptions[0]
    assert any("exception" in failure for failure in failures(measured))
    assert {p.replicas for p in measured.run.points} == {1}


def test_recommend_only_mode_records_decisions_and_keeps_the_size():
    scenario = by_name("burst")
    recommending = replace(
        scenario, spec={**scenario.spec, "scaling": {**scenario.spec["scaling"], "mode": "recommend"}}
    )
    result = driver.run(replace(recommending, duration=900), seed=1)
    assert {p.replicas for p in result.points} == {1}
    assert any(poll.recommended is not None and poll.recommended.replicas > 1 for poll in result.polls)


def test_keyorder_simulate_lists_runs_plots_and_refuses_an_unknown_name(tmp_path):
    command = [sys.executable, "-m", "keyorder.cli", "simulate"]
    listed = subprocess.run([*command, "--list"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "one-silent-pod" in listed.stdout
    unknown = subprocess.run([*command, "no-such"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "unknown scenario 'no-such'" in unknown.stderr and "burst" in unknown.stderr
    picture = tmp_path / "burst.png"
    ran = subprocess.run([*command, "burst", "--output", str(picture)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "PASS: every criterion held" in ran.stdout
    assert picture.read_bytes()[:4] == b"\x89PNG"
    shorter = subprocess.run(
        [*command, "burst", "--hours", "0.3", "--no-plot"], capture_output=True, text=True, timeout=120
    )
    assert shorter.returncode == 0, shorter.stdout + shorter.stderr
    assert "simulated 15 of 18 min" in shorter.stdout and "peak / needed replicas" in shorter.stdout
    negative = subprocess.run([*command, "burst", "--hours", "-1"], capture_output=True, text=True, timeout=60)
    assert negative.returncode == 2 and "--hours must be above 0" in negative.stderr
