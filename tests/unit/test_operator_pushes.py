"""The worker count is pushed only to the pods that need it: a steady poll pushes nothing."""

from __future__ import annotations

from keyorder_operator.pod_admin import ADDRESS, needing_push
from keyorder_operator.policy import Size
from keyorder_operator.poll import PodsRead
from tests.unit.poll_fixtures import Clocks, poll_context, poll_of


def test_only_pods_at_another_count_or_without_a_report_are_pushed():
    reports = [{ADDRESS: "10.0.0.1", "workers": 8}, {ADDRESS: "10.0.0.2", "workers": 4}]
    addresses = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]  # .3 is new (or did not answer)
    assert needing_push(addresses, reports, 8) == ["10.0.0.2", "10.0.0.3"]
    assert needing_push(addresses[:1], reports, 8) == []  # steady: nothing to push
    assert needing_push(addresses, [], 8) == addresses  # no report at all: push to every ready pod


def test_a_map_written_whole_replaces_the_stored_one_and_an_unchanged_one_is_not_written():
    """status.pods goes out whole; a merge patch keeps keys it does not name, and a None removes one, so an
    unchanged map with a None in it must not count as a change, and a smaller map must remove the rest."""
    import kopf

    from keyorder_operator.poll import drop_unchanged

    stored = {"pods": {"reporting": 2, "busiestKey": "key:abc", "workers": 32}, "lag": 5}
    same = kopf.Patch()
    same["status"] = {"pods": {"reporting": 2, "busiestKey": "key:abc", "workers": 32, "handlerMs": None}, "lag": 5}
    drop_unchanged(same, stored)
    assert "status" not in same, same
    smaller = kopf.Patch()
    smaller["status"] = {"pods": {"reporting": 0, "failures": []}, "lag": 5}
    drop_unchanged(smaller, stored)
    assert dict(smaller["status"]) == {"pods": {"reporting": 0, "failures": [], "busiestKey": None, "workers": None}}


def test_while_a_steps_new_pods_start_the_poll_pushes_only_to_pods_running_fewer():
    """``Decision.hold_workers``: the 2 pods in place keep their 29 workers, the new one that is ready with
    16 gets the decided 17; ``podsUpdated`` counts the pods at 17 only (the push and the status:
    ``Poll.explain``)."""
    context = poll_context(Clocks(wall=1_700_000_000.0, monotonic=100.0))
    pushes: list[tuple[list[str], int]] = []

    def push(addresses, port, token, workers):
        pushes.append((list(addresses), workers))
        return len(addresses), []

    context.push = push
    reports = [{ADDRESS: "10.0.0.1", "workers": 29}, {ADDRESS: "10.0.0.2", "workers": 29}]
    reports.append({ADDRESS: "10.0.0.3", "workers": 16})
    read = PodsRead("token", ["10.0.0.1", "10.0.0.2", "10.0.0.3"], None, [], reports)
    poll = poll_of(context)
    size = Size(4, 17)  # decided a poll ago; the fourth pod still starts
    poll.explain(size, "kept 4 replicas x 17 workers", None, None, size, False, read, hold_workers=True)
    assert pushes == [(["10.0.0.3"], 17)]
    assert poll.patch.status["podsUpdated"] == 1
    assert poll.patch.status["workersPerPod"] == 17
