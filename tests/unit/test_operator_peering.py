"""The peering check's decisions, with no cluster: which objects, what an API answer means, the start-up
wait (a fake clock) and the running check's logs and gauge."""

from __future__ import annotations

import json
import logging
import re

import pytest
from prometheus_client import CollectorRegistry

from keyorder_operator.operator_metrics import OperatorMetrics
from keyorder_operator.peering import (
    CHECK_BUDGET_SECONDS,
    READ_TIMEOUT_SECONDS,
    PeeringCheck,
    PeeringObject,
    PeeringUnusable,
    Presence,
    Reading,
    interpret,
    peering_objects,
    wait_for_peering_objects,
)

CLUSTER = PeeringObject("ClusterKopfPeering", "clusterkopfpeerings", None, "keyorder-operator")


def status(code: int, reason: str, message: str, details: dict) -> str:
    return json.dumps(
        {"kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": message, "details": details}
    )


def test_the_operator_peers_cluster_wide_or_in_each_watched_namespace() -> None:
    assert peering_objects("keyorder-operator", []) == [CLUSTER]
    assert peering_objects("p", ["team-a", "team-b"]) == [
        PeeringObject("KopfPeering", "kopfpeerings", "team-a", "p"),
        PeeringObject("KopfPeering", "kopfpeerings", "team-b", "p"),
    ]


MISSING_OBJECT = status(
    404,
    "NotFound",
    'clusterkopfpeerings.kopf.dev "keyorder-operator" not found',
    {"name": "keyorder-operator", "group": "kopf.dev", "kind": "clusterkopfpeerings"},
)


@pytest.mark.parametrize(
    ("code", "body", "presence"),
    [
        (200, "{}", Presence.PRESENT),
        (404, MISSING_OBJECT, Presence.ABSENT),
        # another object's 404 is not this one's
        (404, MISSING_OBJECT.replace('"keyorder-operator"', '"other"'), Presence.UNSERVED),
        # no CRD serves the resource: Go's http.NotFound text, or a Status naming nothing
        (404, "404 page not found\n", Presence.UNSERVED),
        (404, status(404, "NotFound", "the server could not find the requested resource", {}), Presence.UNSERVED),
        (403, status(403, "Forbidden", "cannot get resource", {}), Presence.FORBIDDEN),
        (500, status(500, "InternalError", "etcd timeout", {}), Presence.UNREADABLE),
        (503, "", Presence.UNREADABLE),
    ],
)
def test_an_api_answer_tells_a_missing_object_from_a_missing_crd(code: int, body: str, presence: Presence) -> None:
    assert interpret(CLUSTER, code, body).presence is presence


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def answers(*presences: Presence):
    """A reader answering these in turn (the last one for ever after)."""
    remaining = list(presences)

    def read(_: PeeringObject) -> Reading:
        return Reading(remaining.pop(0) if len(remaining) > 1 else remaining[0], "detail")

    return read


def test_a_start_with_the_object_there_does_not_wait() -> None:
    time = FakeTime()
    wait_for_peering_objects([CLUSTER], answers(Presence.PRESENT), clock=time.clock, sleep=time.sleep)
    assert time.slept == []


def test_a_start_waits_for_an_object_created_a_moment_later(caplog) -> None:
    """Helm creates the peering object (a custom kind) after the Deployment."""
    time = FakeTime()
    read = answers(Presence.ABSENT, Presence.ABSENT, Presence.PRESENT)
    with caplog.at_level(logging.WARNING, logger="keyorder_operator.peering"):
        wait_for_peering_objects([CLUSTER], read, grace_seconds=10, retry_seconds=1, clock=time.clock, sleep=time.sleep)
    assert time.slept == [1, 1]
    [warning] = caplog.records  # said once, not per retry
    said = warning.getMessage()
    assert 'ClusterKopfPeering "keyorder-operator"' in said and "waiting up to 10s" in said


def test_a_start_refuses_once_the_grace_is_over_naming_the_object_and_the_fix() -> None:
    time = FakeTime()
    with pytest.raises(PeeringUnusable) as refused:
        wait_for_peering_objects(
            [CLUSTER], answers(Presence.ABSENT), grace_seconds=10, retry_seconds=3, clock=time.clock, sleep=time.sleep
        )
    assert time.now == 1010.0 and time.slept == [3, 3, 3, 1]  # never past the deadline
    message = str(refused.value)
    assert 'ClusterKopfPeering "keyorder-operator" (clusterkopfpeerings.kopf.dev) does not exist' in message
    assert "peering.create=true" in message and "without --peering" in message
    assert '"kind": "ClusterKopfPeering"' in message  # a manifest to kubectl apply


@pytest.mark.parametrize(
    ("presence", "said"),
    [
        (Presence.UNSERVED, "the kopf peering CRDs are not installed"),
        (Presence.FORBIDDEN, "Grant get, list, watch and patch on clusterkopfpeerings.kopf.dev"),
    ],
)
def test_a_start_does_not_wait_for_what_waiting_cannot_mend(presence: Presence, said: str) -> None:
    time = FakeTime()
    with pytest.raises(PeeringUnusable, match=said):
        wait_for_peering_objects([CLUSTER], answers(presence), clock=time.clock, sleep=time.sleep)
    assert time.slept == []


def test_every_namespace_s_object_is_waited_for_within_one_grace() -> None:
    team_a, team_b = peering_objects("p", ["team-a", "team-b"])
    time = FakeTime()

    def read(obj: PeeringObject) -> Reading:
        return Reading(Presence.PRESENT if obj == team_a else Presence.ABSENT)

    with pytest.raises(
        PeeringUnusable, match=re.escape('KopfPeering "p" (kopfpeerings.kopf.dev) in namespace "team-b"')
    ):
        wait_for_peering_objects([team_a, team_b], read, grace_seconds=5, clock=time.clock, sleep=time.sleep)
    assert time.now == 1005.0


def gauge_value(metrics: OperatorMetrics, obj: PeeringObject) -> float | None:
    return metrics.registry.get_sample_value(
        "keyorder_operator_peering_object_present",
        {"kind": obj.kind, "namespace": obj.namespace or "", "name": obj.name},
    )


def test_the_running_check_says_once_when_the_object_goes_and_when_it_is_back(caplog) -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    presence = [Presence.PRESENT]
    check = PeeringCheck([CLUSTER], lambda _, __: Reading(presence[0], "detail"), metrics.peering_object_present)
    assert gauge_value(metrics, CLUSTER) == 1  # the start-up wait has just seen it
    with caplog.at_level(logging.INFO, logger="keyorder_operator.peering"):
        assert check.check() == {"ClusterKopfPeering/keyorder-operator": "present"}
        assert caplog.records == []

        presence[0] = Presence.ABSENT
        assert check.check() == {"ClusterKopfPeering/keyorder-operator": "absent"}
        check.check()
        [error] = caplog.records
        assert error.levelno == logging.ERROR and "does not exist" in error.getMessage()
        assert "none will take over" in error.getMessage()
        assert gauge_value(metrics, CLUSTER) == 0

        presence[0] = Presence.UNREADABLE  # e.g. a timeout: nothing is known, the gauge stays
        check.check()
        assert caplog.records[-1].levelno == logging.WARNING and gauge_value(metrics, CLUSTER) == 0

        presence[0] = Presence.PRESENT
        check.check()
        back = caplog.records[-1]
        assert back.levelno == logging.WARNING and "is back" in back.getMessage()
        assert "all resume handling resources until their next keep-alives" in back.getMessage()
        assert gauge_value(metrics, CLUSTER) == 1
        assert len(caplog.records) == 3


def test_the_running_check_shows_each_namespace_s_object() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    objects = peering_objects("p", ["team-a", "team-b"])
    check = PeeringCheck(
        objects,
        lambda obj, _: Reading(Presence.ABSENT if obj.namespace == "team-b" else Presence.PRESENT),
        metrics.peering_object_present,
    )
    assert check.check() == {"KopfPeering/team-a/p": "present", "KopfPeering/team-b/p": "absent"}
    assert [gauge_value(metrics, obj) for obj in objects] == [1, 0]


LIVENESS_TIMEOUT_SECONDS = 5
"""The chart's ``livenessProbe.timeoutSeconds`` (charts/keyorder-operator/values.yaml)."""


class SlowServer:
    """An API server that answers each read after ``seconds`` of the fake clock (``None``: never, the read uses
    its whole timeout up), presence ``PRESENT``; records each read's timeout."""

    def __init__(self, time: FakeTime, seconds: float | None) -> None:
        self.time, self.seconds = time, seconds
        self.timeouts: list[tuple[str | None, float]] = []

    def read(self, obj: PeeringObject, timeout: float) -> Reading:
        self.timeouts.append((obj.namespace, timeout))
        if self.seconds is None or self.seconds > timeout:
            self.time.sleep(timeout)
            return Reading(Presence.UNREADABLE, "timed out")
        self.time.sleep(self.seconds)
        return Reading(Presence.PRESENT)


def test_the_running_check_ends_within_one_deadline_whatever_the_number_of_namespaces(caplog) -> None:
    """A hung API server: each read would take its whole timeout; three namespaces must not make the check
    outlast the liveness probe's timeout. What it had no time for is shown unchecked, kept as it was, and read
    first on the next probe."""
    assert READ_TIMEOUT_SECONDS <= CHECK_BUDGET_SECONDS < LIVENESS_TIMEOUT_SECONDS
    metrics = OperatorMetrics(CollectorRegistry())
    objects = peering_objects("p", ["team-a", "team-b", "team-c"])
    time = FakeTime()
    hung = SlowServer(time, None)
    check = PeeringCheck(objects, hung.read, metrics.peering_object_present, clock=time.clock)
    with caplog.at_level(logging.WARNING, logger="keyorder_operator.peering"):
        started = time.now
        shown = check.check()
        assert time.now - started <= CHECK_BUDGET_SECONDS
        assert shown == {
            "KopfPeering/team-a/p": "unreadable",
            "KopfPeering/team-b/p": "unchecked",
            "KopfPeering/team-c/p": "unchecked",
        }
        assert [gauge_value(metrics, obj) for obj in objects] == [1, 1, 1]  # nothing known: as they were
        assert any("ran out of its 3s before it read" in record.getMessage() for record in caplog.records)

        hung.timeouts.clear()
        started = time.now
        assert check.check()["KopfPeering/team-b/p"] == "unreadable"  # the unread ones first
        assert time.now - started <= CHECK_BUDGET_SECONDS
        assert [namespace for namespace, _ in hung.timeouts] == ["team-b"]
        said = len([record for record in caplog.records if "ran out" in record.getMessage()])
        assert said == 1  # said when it starts, not on every probe


def test_a_slow_api_server_gets_what_is_left_of_the_deadline_for_each_read() -> None:
    metrics = OperatorMetrics(CollectorRegistry())
    objects = peering_objects("p", ["team-a", "team-b", "team-c"])
    time = FakeTime()
    slow = SlowServer(time, 1.2)
    check = PeeringCheck(objects, slow.read, metrics.peering_object_present, budget_seconds=3.0, clock=time.clock)
    started = time.now
    shown = check.check()
    assert time.now - started <= 3.0
    assert [namespace for namespace, _ in slow.timeouts] == ["team-a", "team-b", "team-c"]
    assert [timeout for _, timeout in slow.timeouts] == pytest.approx([3.0, 1.8, 0.6])  # what is left, each
    assert list(shown.values()) == ["present", "present", "unreadable"]

    fast = SlowServer(time, 0.1)
    check.read = fast.read
    assert set(check.check().values()) == {"present"}  # all read: the next check starts from the first again
    assert [namespace for namespace, _ in fast.timeouts] == ["team-a", "team-b", "team-c"]
