"""Status conditions: transition times, and each handler writing only the condition types it owns."""

from __future__ import annotations

from keyorder_operator.status import (
    POLL_CONDITIONS,
    SPEC_CONDITIONS,
    merge_owned_conditions,
    set_condition,
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
