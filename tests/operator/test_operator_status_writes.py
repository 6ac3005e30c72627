"""A fleet at rest writes no status, even when the operator's watch lags behind its own writes (issue 35,
defect 8).

The real kopf operator on the API emulator. Two resources read an empty topic (``EmptyTopic``) and scale to
zero; one points at a Kafka that never answers (``LagUnknown``). The emulator holds back each watch event of
the OrderedConsumers (``Emulator.watch_lag``, events queued behind each other), as a busy cluster delivers
them to an informer: kopf hands each poll a body older than the operator's own last write. At 500 resources
the same thing happened without a test's help (``tools/operator_scale_bench.py --scale-to-zero``): a poll
compared with the old body, wrote its last write again with other times (``lastDecision.time``, conditions'
``lastTransitionTime``), every write was one more event to fall behind on, and the writes never stopped.

``StatusAudit`` counts the status writes as the emulator stores them; the HorizontalPodAutoscaler lists are
counted too (a poll lists them when the replicas seem to have moved without the operator, which a stale
body's ``status.replicas`` makes them seem).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kmock
import pytest

from keyorder_operator.kube import AUTOSCALERS_SECONDS, Kube
from keyorder_operator.observe import LagSample, LagUnavailable
from tests.fakes import FakeClock
from tests.operator.emulator import Emulator
from tests.operator.harness import CR, api_client, wait_for, wait_for_polls
from tests.operator.status_audit import StatusAudit
from tests.operator.test_operator_conflicts import hpa
from tests.operator.test_operator_deployable import condition, operator, resource

pytestmark = pytest.mark.timeout(150)

UNREACHABLE = "127.0.0.1:9"
WATCH_LAG_SECONDS = 0.8
"""Each OrderedConsumer watch event is held back this long behind the one before it: with a poll a second
per resource, a write on every poll falls further behind for good; a fleet that stops writing catches up."""


class EmptyTopic:
    """A lag source for a topic of 4 partitions that nobody produces to (lag 0); a stand-in that never answers
    for the unreachable bootstrap."""

    def __init__(self, properties: dict[str, str]) -> None:
        self.unreachable = properties.get("bootstrap.servers") == UNREACHABLE

    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample:
        if self.unreachable:
            raise LagUnavailable("Kafka does not answer")
        return LagSample(at=now, partitions=4, end_total=0, committed_total=0, partition_lags=(0, 0, 0, 0))

    def close(self) -> None:
        pass


def at_rest(name: str, bootstrap: str = "127.0.0.1:9092") -> dict[str, Any]:
    return resource(
        name,
        kafka={"bootstrapServers": bootstrap, "topics": ["orders"], "groupId": name},
        replicas={"min": 0},
        scaling={"pollIntervalSeconds": 1, "scaleToZero": True, "scaleDownStabilizationSeconds": 0},
    )


def stored_status(kube, name: str) -> dict[str, Any]:
    return (kube.get(CR, name) or {}).get("status") or {}


def test_a_fleet_at_rest_writes_no_status_though_the_watch_lags_behind_the_operators_own_writes(kube, monkeypatch):
    hpa_lists: list[str] = []
    handle = Emulator._handle

    async def recorded(emulator: Emulator, request: Any) -> Any:
        method = str(getattr(request.method, "value", request.method)).upper()
        if request.resource is not None and request.resource.plural == "horizontalpodautoscalers" and method == "GET":
            hpa_lists.append(str(request.url.path))
        return await handle(emulator, request)

    monkeypatch.setattr(Emulator, "_handle", recorded)
    kube.call_in_loop(lambda: kube.emulator.watch_lag.update({kmock.resource(CR): WATCH_LAG_SECONDS}))
    healthy, names = ["rest-a", "rest-b"], ["rest-a", "rest-b", "dead"]
    with StatusAudit().installed() as audit, operator(kube.url, lag_source_for=EmptyTopic):
        for name in healthy:
            kube.create(CR, at_rest(name))
        kube.create(CR, at_rest("dead", UNREACHABLE))
        for name in healthy:  # the API server's state, not the lagging watch's
            wait_for(lambda name=name: stored_status(kube, name).get("replicas") == 0, 60, f"{name} at zero")
            wait_for(lambda name=name: condition(kube, name, "Scaling").get("reason") == "Stable", 30, f"{name} stable")
        wait_for(lambda: condition(kube, "dead", "LagUnknown").get("status") == "True", 60, "dead's LagUnknown")
        for name in names:
            wait_for_polls(kube, name, 2)  # the writes of the polls that brought them to rest are done
        before, hpa_lists_before = audit.counts(), len(hpa_lists)
        for name in names:
            wait_for_polls(kube, name, 3)
        steady = audit.counts() - before
        assert steady.write_requests == 0, f"a steady poll wrote status: {steady.summary()}"
        assert steady.moved == [], steady.summary()
        assert hpa_lists[hpa_lists_before:] == [], "a steady poll listed the HorizontalPodAutoscalers"
        # what the fleet shows is what it did: the times date the transitions and the decisions
        for name in healthy:
            status = stored_status(kube, name)
            assert status["lastDecision"]["reason"].startswith("kept 0 replicas"), status["lastDecision"]
            statuses = {c["type"]: c["status"] for c in status["conditions"]}
            assert {kind: statuses.get(kind) for kind in ("Ready", "Scaling", "LagUnknown")} == {
                "Ready": "True",
                "Scaling": "False",
                "LagUnknown": "False",
            }
    total = audit.counts()
    assert total.moved == [], f"a time moved without a change while the fleet came to rest: {total.summary()}"


def test_a_namespaces_hpas_are_listed_once_for_all_its_resources_while_the_list_is_young(kube, monkeypatch):
    """``Kube.autoscalers_of`` on the emulator: the polls of a namespace's resources share one list of its
    HorizontalPodAutoscalers, reused for ``AUTOSCALERS_SECONDS`` while a conflict lasts and listed afresh
    when the replicas just moved, so an HPA created a moment ago is seen at once (even within a second of the
    last list) and a fleet in conflict costs a list per namespace, not one per poll."""
    lists: list[str] = []
    handle = Emulator._handle

    async def recorded(emulator: Emulator, request: Any) -> Any:
        method = str(getattr(request.method, "value", request.method)).upper()
        if request.resource is not None and request.resource.plural == "horizontalpodautoscalers" and method == "GET":
            lists.append(str(request.namespace))
        return await handle(emulator, request)

    monkeypatch.setattr(Emulator, "_handle", recorded)
    clock = FakeClock()
    kube.create("autoscaling/v2/horizontalpodautoscalers", hpa("cpu", "orders-1"))
    with api_client(kube.url) as client:
        operator_kube = Kube(client, monotonic=clock)
        for index in range(50):  # a poll of each of 50 resources in conflict
            found = operator_kube.autoscalers_of("default", f"orders-{index}")
            assert found == (["cpu"] if index == 1 else [])
        assert lists == ["default"]
        operator_kube.autoscalers_of("other", "orders-1")
        assert lists == ["default", "other"]  # one list per namespace

        kube.create("autoscaling/v2/horizontalpodautoscalers", hpa("keda-hpa-orders-2", "orders-2"))
        assert operator_kube.autoscalers_of("default", "orders-2") == []  # in conflict: the young list
        assert operator_kube.autoscalers_of("default", "orders-2", max_age=0.0) == ["keda-hpa-orders-2"]
        assert len(lists) == 3  # moved: listed now, though the last list is not a second old
        assert operator_kube.autoscalers_of("default", "orders-3") == []  # in conflict: that fresh list
        assert len(lists) == 3
        clock.sleep(AUTOSCALERS_SECONDS)
        assert operator_kube.autoscalers_of("default", "orders-1") == ["cpu"]
        assert len(lists) == 4
