"""Parsing and summing the pods' scaling reports (``keyorder_operator.pod_signals``)."""

from __future__ import annotations

import copy

import pytest

from keyorder_operator.pod_signals import BadPodReport, combine, parse_report

REPORT = {
    "version": 1,
    "ordering": "key",
    "workers": 16,
    "workersBusy": 12,
    "handlerCallsTotal": 1_000,
    "handlerSecondsTotal": 10.0,
    "rebalancesTotal": 1,
    "partitionsAssigned": 2,
    "inflight": 900,
    "lanes": {"ready": 3, "running": 12, "parked": 1, "blocked": 1, "queued": 880, "active": 40},
    "busiestLane": {"key": "acct-17", "topic": "orders", "partition": 3, "backlog": 500, "share": 0.57},
    "partitions": [
        {"topic": "orders", "partition": 3, "lag": 7_000, "inflight": 600, "minOffsetHeld": None},
        {"topic": "orders", "partition": 4, "lag": 2_000, "inflight": 300, "minOffsetHeld": "blocked"},
    ],
}


def test_reports_are_summed_and_the_longest_lane_wins():
    other = copy.deepcopy(REPORT)
    other["busiestLane"] = {"key": "acct-9", "topic": "orders", "partition": 5, "backlog": 900, "share": 0.9}
    other["partitions"] = [{"topic": "orders", "partition": 5, "lag": 50, "inflight": 10, "minOffsetHeld": "retrying"}]
    signals = combine([parse_report(REPORT), parse_report(other)])
    assert signals is not None
    assert (signals.pods, signals.workers, signals.busy, signals.lanes_ready, signals.queued) == (2, 32, 24, 6, 1760)
    assert signals.busiest is not None and (signals.busiest.key, signals.busiest.where) == ("acct-9", "orders[5]")
    assert signals.busiest_share == pytest.approx(900 / 1760)
    assert signals.blocked_lag == 2_000, "only the blocked partition's lag is pinned; a retrying one drains"
    assert [(held.where, held.blocked) for held in signals.held] == [("orders[4]", True), ("orders[5]", False)]
    assert signals.totals() == (2_000, 20.0, 2, 2, 0.0)


def test_the_pods_rebalance_costs_are_summed_and_older_pods_count_zero():
    eager = {**copy.deepcopy(REPORT), "partitionsRevokedTotal": 4, "rebalanceIdleSecondsTotal": 3.5}
    cooperative = {**copy.deepcopy(REPORT), "partitionsRevokedTotal": 1, "rebalanceIdleSecondsTotal": 0.0}
    signals = combine([parse_report(eager), parse_report(cooperative), parse_report(REPORT)])  # REPORT: older pod
    assert signals is not None
    assert (signals.partitions_revoked_total, signals.rebalance_idle_seconds_total) == (5, 3.5)


def test_no_report_is_no_signal():
    assert combine([]) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 2}, "report version 2, this operator reads version 1"),
        ({"workers": -1}, "field 'workers' must be a non-negative integer, got -1"),
        ({"workersBusy": True}, "field 'workersBusy' must be a non-negative integer, got True"),
        ({"handlerSecondsTotal": "10"}, "field 'handlerSecondsTotal' must be a number"),
        ({"lanes": []}, "field 'lanes' must be an object"),
        ({"partitions": None}, "field 'partitions' must be a list"),
    ],
)
def test_a_bad_report_names_the_field(change, message):
    with pytest.raises(BadPodReport, match=message.replace("(", r"\(")):
        parse_report({**REPORT, **change})
    with pytest.raises(BadPodReport, match="expected a JSON object, got list"):
        parse_report([])


def test_the_busiest_key_is_estimated_over_its_whole_partition():
    """500 of the pod's 600 in-flight messages from orders[3] are one key and the partition's lag is
    7,000: the key holds about 5,833 of them (the pod's look-ahead window stands for the rest)."""
    signals = combine([parse_report(REPORT)])
    assert signals is not None and signals.busiest is not None
    assert (signals.busiest.partition_inflight, signals.busiest.partition_lag) == (600, 7_000)
    assert signals.busiest.estimated_backlog == 5_833


def test_the_groups_latest_change_of_partitions_is_the_smallest_age_any_pod_reports() -> None:
    older, newer = (
        {**copy.deepcopy(REPORT), "assignmentAgeSeconds": 40.0},
        {**copy.deepcopy(REPORT), "assignmentAgeSeconds": 2.5},
    )
    signals = combine([parse_report(older), parse_report(newer), parse_report(REPORT)])  # REPORT: an older pod
    assert signals is not None and signals.assignment_age == 2.5
    none_said = combine([parse_report(REPORT)])
    assert none_said is not None and none_said.assignment_age is None
