"""The worker count is pushed only to the pods that need it: a steady poll pushes nothing."""

from __future__ import annotations

from typing import Any

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


def three_pods_mid_step() -> tuple[Any, list[tuple[list[str], int]], PodsRead]:
    """A poll's context whose pushes are recorded, and the pods read in the middle of a step to 4 x 17: two in
    place at 29 workers, a new one ready at 16."""
    context = poll_context(Clocks(wall=1_700_000_000.0, monotonic=100.0))
    pushes: list[tuple[list[str], int]] = []

    def push(addresses, port, token, workers):
        pushes.append((list(addresses), workers))
        return len(addresses), []

    context.push = push
    reports = [{ADDRESS: "10.0.0.1", "workers": 29}, {ADDRESS: "10.0.0.2", "workers": 29}]
    reports.append({ADDRESS: "10.0.0.3", "workers": 16})
    return context, pushes, PodsRead("token", ["10.0.0.1", "10.0.0.2", "10.0.0.3"], None, [], reports)


def test_while_a_steps_new_pods_start_the_poll_pushes_only_to_pods_running_fewer():
    """``Decision.hold_workers``: the 2 pods in place keep their 29 workers, the new one that is ready with
    16 gets the decided 17; ``podsUpdated`` counts the pods at 17 only (the push and the status:
    ``Poll.explain``)."""
    context, pushes, read = three_pods_mid_step()
    poll = poll_of(context)
    size = Size(4, 17)  # decided a poll ago; the fourth pod still starts
    poll.explain(size, "kept 4 replicas x 17 workers", None, None, size, False, read, hold_workers=True)
    assert pushes == [(["10.0.0.3"], 17)]
    assert poll.patch.status["podsUpdated"] == 1
    assert poll.patch.status["workersPerPod"] == 17


def test_a_hold_push_still_reaches_a_ready_pod_that_did_not_report():
    """While a step has not settled (``lower`` False) a pod without a report is pushed all the same: it is
    new, restarted or was unreachable, and runs ``spec.workers.initial`` or what it last got, so it may sit
    below the count; a pod reporting more keeps its workers, one reporting fewer or the count is as always."""
    reports = [{ADDRESS: "10.0.0.1", "workers": 29}, {ADDRESS: "10.0.0.2", "workers": 16}]
    reports.append({ADDRESS: "10.0.0.3", "workers": 17})
    addresses = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]  # .4 is ready and did not report
    assert needing_push(addresses, reports, 17, lower=False) == ["10.0.0.2", "10.0.0.4"]
    assert needing_push(addresses, [], 17, lower=False) == addresses


def test_the_poll_hands_the_decisions_hold_to_the_push(monkeypatch):
    """``Poll.size`` passes ``Decision.hold_workers`` on to ``Poll.explain``: the two pods in place that run
    29 keep them while the step to 4 x 17 decided a poll ago has not settled, and only the new pod at 16
    gets the count (with the hold dropped on the way, all three would be pushed 17)."""
    from keyorder_operator import poll as poll_module
    from keyorder_operator.policy import Cause, Decision, Observation, ScalingState

    context, pushes, read = three_pods_mid_step()
    size = Size(4, 17)  # the fourth pod still starts
    held = Decision(
        before=size,
        target=size,
        reason="kept 4 replicas x 17 workers; 1 of 4 pods starting; the ready pods keep up to 29 workers per pod",
        state=ScalingState(size, step_started_at=1_699_999_985.0),
        cause=Cause.STEADY,
        hold_workers=True,
    )
    observed = poll_module.Observed(None, Observation(lag=12_000, partitions=12), read)
    poll = poll_of(context)
    monkeypatch.setattr(poll_module, "decide", lambda *args: held)
    monkeypatch.setattr(poll, "remembered_state", lambda replicas: ScalingState(size))
    monkeypatch.setattr(poll, "observe", lambda state, replicas, paused: observed)
    monkeypatch.setattr(poll, "other_autoscaler", lambda replicas: False)
    monkeypatch.setattr(poll, "hand_over", lambda *args: False)
    monkeypatch.setattr(poll, "write_replicas", lambda target, current: True)
    monkeypatch.setattr(poll, "remember", lambda state, limits, resized: None)
    poll.patch.status["pods"] = {}
    poll.size(size.replicas)
    assert pushes == [(["10.0.0.3"], 17)], "the poll pushed past the decision's hold"
    assert poll.patch.status["workersPerPod"] == 17


def test_keyorder_dev_pushes_as_the_operator_does_and_keeps_a_steps_hold():
    """``keyorder dev`` drives its pods with the operator's policy: while a step has not settled the pod
    running 32 keeps them (the demo's line says so), the new pod at 16 and the silent one get the decided
    16, and a pod a scale-in just stopped gets nothing; once settled, every pod not at the count gets it."""
    from keyorder.devtools.demo import addresses_to_push
    from keyorder_operator.policy import Decision, ScalingState

    size = Size(3, 16)
    held = Decision(before=size, target=size, reason="kept", state=ScalingState(size), hold_workers=True)
    reports = [{ADDRESS: "10.0.0.1", "workers": 32}, {ADDRESS: "10.0.0.2", "workers": 8}]
    addresses = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]  # .3 did not report, .4 was just stopped
    kept = addresses[:3]
    assert addresses_to_push(addresses, kept, reports, held) == ["10.0.0.2", "10.0.0.3"]
    settled = Decision(before=size, target=size, reason="kept", state=ScalingState(size))
    assert addresses_to_push(addresses, kept, reports, settled) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
