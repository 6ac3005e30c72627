"""What a poll compares its status with (``status_view``): its own last write until the watched body shows it,
so a poll that decides the same writes nothing and moves no time, however far the body lags behind.

Issue 35, defect 8: at 500 resources kopf's bodies lagged behind the operator's own writes, and each poll
compared with such a body rewrote ``lastDecision.time`` and the conditions' ``lastTransitionTime``.
"""

from __future__ import annotations

import kopf
import pytest

from keyorder_operator.poll import decision_record, drop_unchanged
from keyorder_operator.status import POLL_CONDITIONS, SPEC_CONDITIONS, merge_owned_conditions, set_condition
from keyorder_operator.status_view import (
    CATCH_UP_SECONDS,
    WrittenStatus,
    after_write,
    changed_conditions,
    merge_patched,
    still_awaited,
    with_written,
)
from tests.unit.poll_fixtures import TICK, Clocks, poll_context, poll_of

STALE_BODY = {
    "replicas": 1,
    "lastDecision": {"reason": "scaled replicas 1\u21920: lag 0", "time": "1970-01-01T00:16:40Z"},
    "conditions": set_condition([], "Scaling", True, "Scaled", "scaled replicas 1\u21920: lag 0", 1000.0),
}
"""The body kopf hands the polls: the status before the write that brought the group to rest."""
KEPT = "kept 0 replicas x 4 workers: lag 0"


def one_poll(body: dict, written: WrittenStatus, now: float) -> tuple[dict, WrittenStatus]:
    """What a poll at rest does with its status: the patch it sends (empty: no write) and what it then
    remembers as written (the steps of ``Poll.run``)."""
    awaited = still_awaited(body, written, now)
    compared = with_written(body, awaited)
    conditions = set_condition(list(compared.get("conditions") or []), "Scaling", False, "Stable", KEPT, now)
    patch = kopf.Patch()
    patch.status["replicas"] = 0
    patch.status["lastDecision"] = decision_record(compared.get("lastDecision"), KEPT, now)
    changed = changed_conditions(compared, conditions, POLL_CONDITIONS)
    drop_unchanged(patch, compared)
    fields = dict(patch.get("status") or {})
    if fields or changed:
        awaited = after_write(awaited, compared, fields, changed, now)
    return {"fields": fields, "conditions": changed}, awaited


def test_a_poll_that_decides_the_same_on_a_body_behind_its_last_write_writes_nothing():
    first, written = one_poll(STALE_BODY, WrittenStatus(), 1005.0)
    assert first["fields"] == {"replicas": 0, "lastDecision": {"reason": KEPT, "time": "1970-01-01T00:16:45Z"}}
    assert [(c["type"], c["status"], c["lastTransitionTime"]) for c in first["conditions"]] == [
        ("Scaling", "False", "1970-01-01T00:16:45Z")
    ]
    for now in (1010.0, 1015.0, 1020.0):  # the body still shows the status from before the first write
        again, written = one_poll(STALE_BODY, written, now)
        assert again == {"fields": {}, "conditions": []}, now


def test_once_the_body_shows_the_write_it_is_compared_with_the_body_alone():
    _, written = one_poll(STALE_BODY, WrittenStatus(), 1005.0)
    caught_up = with_written(STALE_BODY, written)  # what the API server holds, now in the watched body
    assert not still_awaited(caught_up, written, 1010.0)
    again, written = one_poll(caught_up, written, 1010.0)
    assert again == {"fields": {}, "conditions": []}
    assert not written


def test_a_write_the_body_never_shows_is_compared_with_the_body_again_after_the_catch_up_time():
    """A write that failed, or fields another writer (a failed-over operator) changed since: after
    ``CATCH_UP_SECONDS`` the body is believed, and what differs from it is written again."""
    _, written = one_poll(STALE_BODY, WrittenStatus(), 1005.0)
    assert still_awaited(STALE_BODY, written, 1005.0 + CATCH_UP_SECONDS - 1)
    assert not still_awaited(STALE_BODY, written, 1005.0 + CATCH_UP_SECONDS)
    later, _ = one_poll(STALE_BODY, written, 1005.0 + CATCH_UP_SECONDS)
    assert later["fields"]["replicas"] == 0
    assert later["fields"]["lastDecision"]["reason"] == KEPT


def test_only_the_written_fields_are_laid_over_the_body_and_a_shown_field_is_no_longer_awaited():
    written = WrittenStatus({"lag": (0, 1000.0), "limit": (None, 1000.0)}, {})
    body = {"lag": 5, "limit": "hot key", "observedGeneration": 3}
    assert with_written(body, still_awaited(body, written, 1001.0)) == {"lag": 0, "observedGeneration": 3}
    half = {"lag": 0, "limit": "hot key", "observedGeneration": 3}  # the removal is not shown yet
    assert still_awaited(half, written, 1001.0).fields == {"limit": (None, 1000.0)}


def test_a_written_map_is_remembered_as_the_merge_patch_leaves_it_stored():
    compared = {"pods": {"reporting": 2, "busiestKey": "key:abc", "failures": []}}
    patch = {"pods": {"reporting": 0, "busiestKey": None, "failures": []}}
    written = after_write(WrittenStatus(), compared, patch, [], 1000.0)
    assert written.fields["pods"] == ({"reporting": 0, "failures": []}, 1000.0)
    assert merge_patched({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}


@pytest.mark.parametrize("owned", [POLL_CONDITIONS, SPEC_CONDITIONS])
def test_a_condition_written_onto_a_fresher_stored_list_keeps_its_stored_transition_time(owned):
    """kopf applies the handler's conditions to the freshest body at patch time. A handler that computed them
    from an older body (there, Ready was False) must not move the stored time of a Ready that is True and
    stays True: the transition time moves only on a transition of what is stored (apimachinery
    ``meta.SetStatusCondition``)."""
    kind = "Ready" if owned is POLL_CONDITIONS else "InvalidSpec"
    stored = set_condition([], kind, True, "Reconciled", "ok", 1000.0)
    older = set_condition([], kind, False, "Degraded", "lag unknown", 900.0)
    mine = set_condition(older, kind, True, "Reconciled", "ok, again", 2000.0)  # a "transition" from the old body
    merged = merge_owned_conditions(stored, mine, owned)
    assert merged == [
        {
            "type": kind,
            "status": "True",
            "reason": "Reconciled",
            "message": "ok, again",
            "lastTransitionTime": "1970-01-01T00:16:40Z",
        }
    ]
    flipped = set_condition(stored, kind, False, "Degraded", "lag unknown", 3000.0)
    assert merge_owned_conditions(stored, flipped, owned)[0]["lastTransitionTime"] == "1970-01-01T00:50:00Z"


def test_only_the_owned_conditions_that_differ_need_a_write():
    compared = {"conditions": set_condition([], "Ready", True, "Reconciled", "ok", 1000.0)}
    same = set_condition(compared["conditions"], "Ready", True, "Reconciled", "ok", 2000.0)
    assert changed_conditions(compared, same, POLL_CONDITIONS) == []
    other = set_condition(same, "InvalidSpec", True, "InvalidSpec", "bad", 2000.0)
    assert changed_conditions(compared, other, POLL_CONDITIONS) == []  # not the poll's to write
    moved = set_condition(same, "LagUnknown", True, "LagUnavailable", "no broker", 2000.0)
    assert [c["type"] for c in changed_conditions(compared, moved, POLL_CONDITIONS)] == ["LagUnknown"]


def test_the_catch_up_time_is_counted_on_the_monotonic_clock():
    """The poll's side, with the wall clock set (review F8). Set forward an hour, the write made a tick ago is
    still awaited (compared with the stale body, the poll would write it again); set back an hour, a write the
    body never shows is compared with the body again after ``CATCH_UP_SECONDS``, not an hour later."""
    for jump in (3_600.0, -3_600.0):
        clocks = Clocks(1_750_000_000.0, 100.0)
        context = poll_context(clocks)
        first = poll_of(context, STALE_BODY)
        first.patch.status["replicas"] = 0
        first.write_status()
        assert set(first.memory.written.fields) == {"replicas"}
        clocks.wall += jump
        waited = 0.0
        while waited < CATCH_UP_SECONDS:  # the body never shows the write; the poll looks every tick
            assert poll_of(context, STALE_BODY).status["replicas"] == 0, (jump, waited)
            clocks.advance(TICK)
            waited += TICK
        later = poll_of(context, STALE_BODY)
        assert not later.memory.written and later.status["replicas"] == 1, jump
