"""Status: conditions (transition times, each handler writing only the types it owns) and the policy's
memory (it survives the round trip through the API server)."""

from __future__ import annotations

import json

from keyorder_operator.policy import Limited, LimitKind, RateSource, ScalingState, Size
from keyorder_operator.spec import parse_spec
from keyorder_operator.status import (
    POLL_CONDITIONS,
    SPEC_CONDITIONS,
    merge_owned_conditions,
    set_condition,
    state_from_status,
    state_to_status,
)


def test_a_condition_keeps_its_transition_time_until_its_status_flips():
    first = set_condition([], "Ready", True, "Reconciled", "ok", 1000.0)
    again = set_condition(first, "Ready", True, "Reconciled", "still ok", 2000.0)
    flipped = set_condition(again, "Ready", False, "Degraded", "lag unknown", 3000.0)
    assert again[0]["lastTransitionTime"] == first[0]["lastTransitionTime"] == "1970-01-01T00:16:40Z"
    assert again[0]["message"] == "still ok"
    assert flipped[0]["lastTransitionTime"] == "1970-01-01T00:50:00Z"


def test_the_poll_never_writes_back_a_stale_invalid_spec():
    # the poll read the resource while the spec was invalid; the spec handler has cleared it since
    stale = set_condition([], "InvalidSpec", True, "InvalidSpec", "spec.workers: min above max", 1000.0)
    stored = set_condition(stale, "InvalidSpec", False, "Valid", "spec is valid", 1001.0)
    poll = set_condition(stale, "LagUnknown", True, "LagUnavailable", "no broker", 1002.0)
    merged = merge_owned_conditions(stored, poll, POLL_CONDITIONS)
    by_type = {c["type"]: c for c in merged}
    assert by_type["InvalidSpec"]["status"] == "False"
    assert by_type["LagUnknown"]["status"] == "True"
    assert [c["type"] for c in merged] == ["InvalidSpec", "LagUnknown"]


def test_the_spec_handler_never_writes_back_stale_poll_conditions():
    stored = set_condition([], "Ready", True, "Reconciled", "objects applied, lag measured", 1000.0)
    stale_ready = set_condition([], "Ready", False, "Degraded", "lag unknown", 900.0)
    mine = set_condition(stale_ready, "InvalidSpec", True, "InvalidSpec", "bad", 1001.0)
    merged = merge_owned_conditions(stored, mine, SPEC_CONDITIONS)
    assert {c["type"]: c["status"] for c in merged} == {"Ready": "True", "InvalidSpec": "True"}


def test_owned_types_missing_from_the_handlers_list_stay_as_stored():
    stored = set_condition([], "Scaling", True, "Scaled", "up", 1000.0)
    assert merge_owned_conditions(stored, [], POLL_CONDITIONS) == stored


def test_no_condition_type_has_two_owners():
    assert not SPEC_CONDITIONS & POLL_CONDITIONS


def test_the_policy_state_survives_the_status_round_trip():
    """The operator is stateless: everything ``decide`` learned comes back from status as it was
    (through JSON, as the API server stores it), so a restarted operator decides the same."""
    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "k:9092", "topics": ["t"], "groupId": "g"},
            "handler": {"image": "i:1", "handler": "pkg.mod:handle"},
            "workers": {"initial": 8},
        }
    )
    state = ScalingState(
        current=Size(3, 8),
        recommendations=((10.0, 3, 8), (25.0, 4, 8)),
        per_worker_rate=92.5,
        rate_source=RateSource.HANDLER_TIME,
        rate_samples=(50.0,),
        efficiency_samples=(0.9, 0.95),
        handler_time=0.0102,
        arrival_samples=(400.0, 410.5, 399.0),
        drainable_lag=12_345,
        settled=False,
        pod_totals=(1_000, 10.5, 2, 3, 4.25),
        pod_totals_at=25.0,
        idle_polls=1,
        failed_observations=0,
        held_polls=1,
        silent_polls=2,
        replica_changes=((25.0, 3),),
        limit=Limited(LimitKind.HOT_KEY, "scaling cannot help: ..."),
        limit_gone_polls=1,
        workload="abc123",
        cpu_workers_per_pod=2,
        polled_at=25.0,
    )
    stored = json.loads(json.dumps({"autoscaler": state_to_status(state), "workersPerPod": 8}))
    assert state_from_status(stored, spec, 3) == state


def test_a_status_written_by_an_older_release_starts_learning_again():
    """Fields an older release wrote (a learned drain rate, no rate source) are read where they mean
    the same; what is missing starts empty."""
    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "k:9092", "topics": ["t"], "groupId": "g"},
            "handler": {"image": "i:1", "handler": "pkg.mod:handle"},
        }
    )
    old = {"autoscaler": {"perWorkerRate": 100.0, "rateSamples": [100.0], "podTotals": [1, 0.5, 0, 1]}}
    state = state_from_status(old, spec, 2)
    assert state.rate_source is RateSource.NONE and state.efficiency_samples == ()
    assert state.pod_totals == (1, 0.5, 0, 1, 0.0)
    assert state.workload == ""
