"""One owner for the replicas: the operator does not fight another autoscaler over them.

The real kopf operator on the API emulator; no broker (``NoKafka``). With ``scaling.enabled: false``
the operator holds the Deployment at ``replicas.min`` on every poll, so a replica count it leaves
alone for several polls shows it stood back.

An HPA or ``kubectl scale`` writes the replicas through the Deployment's scale subresource, an update
that makes its writer their owner (the emulator records it in ``managedFields`` as the API server does).
The operator learns of it a moment later, by its watch or on its next read: ``watch_lag`` holds the
Deployment events back as a busy cluster does, and a poll held in its lag read (``GatedNoKafka``) decides
from a read older than the write. Either way the operator must never write a size it has not seen over
theirs, and never write the replicas at all while another autoscaler owns them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import kmock
import pytest

from keyorder_operator.kube import SCALE_FIELD_MANAGER
from keyorder_operator.observe import LagSample, LagUnavailable
from tests.operator.emulator import Emulator
from tests.operator.harness import CR, wait_for, wait_for_polls
from tests.operator.test_operator_deployable import condition, events, operator, resource
from tests.operator.test_operator_e2e import operator as e2e_operator
from tests.operator.test_operator_e2e import rollout_reported_done

pytestmark = pytest.mark.timeout(120)


def hpa(name: str, target: str) -> dict:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": 1,
            "maxReplicas": 10,
        },
    }


def deployment_replicas(kube, name: str) -> int:
    return kube.get("apps/v1/deployments", name)["spec"]["replicas"]


def test_an_hpa_on_the_same_deployment_gets_scaling_conflict_and_the_replicas_are_left_alone(kube):
    with operator(kube.url):
        kube.create(CR, resource("fought", scaling={"enabled": False, "pollIntervalSeconds": 1}))
        wait_for(lambda: kube.get("apps/v1/deployments", "fought") is not None, 20, "the Deployment")
        wait_for_polls(kube, "fought", 2)
        kube.create("autoscaling/v2/horizontalpodautoscalers", hpa("cpu", "fought"))
        kube.create("autoscaling/v2/horizontalpodautoscalers", hpa("elsewhere", "another-deployment"))
        kube.patch("apps/v1/deployments", "fought", {"spec": {"replicas": 3}})  # what the HPA does
        wait_for(lambda: condition(kube, "fought", "ScalingConflict").get("status") == "True", 20, "ScalingConflict")
        conflict = condition(kube, "fought", "ScalingConflict")
        assert conflict["reason"] == "OtherAutoscaler"
        assert "HorizontalPodAutoscaler default/cpu also scales Deployment fought" in conflict["message"]
        assert "elsewhere" not in conflict["message"]
        assert any("default/cpu" in message for message in events(kube, "ScalingConflict"))
        wait_for_polls(kube, "fought", 3)
        assert deployment_replicas(kube, "fought") == 3, "the operator fought the HPA over the replicas"
        kube.delete("autoscaling/v2/horizontalpodautoscalers", "cpu")
        wait_for(lambda: condition(kube, "fought", "ScalingConflict").get("status") == "False", 20, "the conflict over")
        wait_for(lambda: deployment_replicas(kube, "fought") == 1, 20, "scaling disabled holds replicas.min again")
    assert kube.get(CR, "fought") is not None


DEPLOYMENTS = "apps/v1/deployments"


def kubectl_scale(kube, name: str, replicas: int) -> dict[str, Any]:
    """What ``kubectl scale`` (and, with a PUT, an HPA) sends: a merge patch of the Deployment's Scale."""
    return kube.patch(DEPLOYMENTS, name, {"spec": {"replicas": replicas}}, subresource="scale")


def replicas_owners(kube, name: str) -> list[tuple[str, str, str]]:
    """(manager, operation, subresource) of every ``managedFields`` entry that owns ``spec.replicas``."""
    return sorted(
        (entry["manager"], entry["operation"], entry.get("subresource", ""))
        for entry in kube.get(DEPLOYMENTS, name)["metadata"].get("managedFields") or []
        if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})
    )


@contextlib.contextmanager
def writes_to_replicas(monkeypatch: pytest.MonkeyPatch, name: str) -> Iterator[list[tuple[str, int, int]]]:
    """Every write the emulator stores to Deployment ``name`` by the operator's scaler, as (field manager,
    replicas before, replicas after), while inside: the proof of what the operator wrote and over what."""
    writes: list[tuple[str, int, int]] = []
    original = Emulator._write
    deployments = kmock.resource(DEPLOYMENTS)

    def replicas(emulator: Emulator, request: Any) -> Any:
        live = emulator._live(request.resource, request.namespace, request.name)
        return None if live is None else (live.raw.get("spec") or {}).get("replicas")

    async def recorded(self: Emulator, request: Any, *args: Any, **kwargs: Any) -> Any:
        ours = request.resource == deployments and request.name == name
        before = replicas(self, request) if ours else None
        result = await original(self, request, *args, **kwargs)
        if ours and request.params.get("fieldManager") == SCALE_FIELD_MANAGER:
            writes.append((SCALE_FIELD_MANAGER, before, replicas(self, request)))
        return result

    monkeypatch.setattr(Emulator, "_write", recorded)
    yield writes


def test_during_a_conflict_the_operator_writes_no_replicas_though_its_watch_is_behind_the_hpas_writes(
    kube, monkeypatch
):
    """The HPA scales twice in a row; the operator's watch shows the first size while the second is live.
    The replicas are the HPA's (its update took them from the operator's scaler): the operator says so
    (ScalingConflict) and writes nothing to them, not the size it last saw and not its own."""
    with writes_to_replicas(monkeypatch, "fought") as writes, operator(kube.url):
        kube.create(CR, resource("fought", scaling={"enabled": False, "pollIntervalSeconds": 1}))
        wait_for(lambda: kube.get(DEPLOYMENTS, "fought") is not None, 20, "the Deployment")
        wait_for_polls(kube, "fought", 2)
        assert replicas_owners(kube, "fought") == [(SCALE_FIELD_MANAGER, "Apply", "")]
        kube.create("autoscaling/v2/horizontalpodautoscalers", hpa("cpu", "fought"))
        kube.call_in_loop(lambda: kube.emulator.watch_lag.update({kmock.resource(DEPLOYMENTS): 3.0}))
        before = list(writes)
        kubectl_scale(kube, "fought", 3)  # the HPA, twice: the operator's watch shows 3 while 4 is live
        kubectl_scale(kube, "fought", 4)
        wait_for(lambda: condition(kube, "fought", "ScalingConflict").get("status") == "True", 30, "ScalingConflict")
        wait_for(lambda: (kube.get(CR, "fought").get("status") or {}).get("replicas") == 4, 30, "the HPA's size seen")
        wait_for_polls(kube, "fought", 6)  # past the held-back events (3 s each), the conflict going on
        assert writes[len(before) :] == [], "the operator wrote the replicas while the HPA owns them"
        assert kube.get(DEPLOYMENTS, "fought")["spec"]["replicas"] == 4
        assert replicas_owners(kube, "fought") == [("Python-urllib", "Update", "scale")]
        assert condition(kube, "fought", "ScalingConflict").get("status") == "True"


class GatedNoKafka:
    """``NoKafka`` whose first lag read waits at a gate until the test opens it (``arrived``, ``opened``): a poll
    held between its read of the Deployment and its decision, at a moment the test chooses (a slow Kafka would
    hold it at a moment nobody chooses). Every read fails (no broker), so with a fallback of threshold 1 each
    poll decides the fallback size, and says from which size (``... (was N)``)."""

    arrived = threading.Event()
    opened = threading.Event()

    def __init__(self, properties: dict[str, str]) -> None:
        self.properties = properties

    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample:
        GatedNoKafka.arrived.set()
        assert GatedNoKafka.opened.wait(60), "the test never opened the gate"  # hang guard
        raise LagUnavailable("no broker in this test")

    def close(self) -> None:
        pass


def test_a_size_written_while_a_poll_is_in_flight_is_never_overwritten_by_that_polls_decision(kube, monkeypatch):
    """``kubectl scale`` lands after a poll read the Deployment and before it acts on its decision (the
    fallback size, decided from the size it read). That poll must not write its size over one it never saw;
    the next poll starts from the new size, as docs/operator.md says a ``kubectl scale`` does."""
    GatedNoKafka.arrived.clear()
    GatedNoKafka.opened.clear()
    fallback = {"enabled": True, "pollIntervalSeconds": 1, "fallback": {"failureThreshold": 1, "replicas": 2}}
    try:
        with (
            writes_to_replicas(monkeypatch, "held") as writes,
            e2e_operator(kube.url, lag_source_for=GatedNoKafka, lag_wait_seconds=60),
        ):
            kube.create(CR, resource("held", scaling=fallback))
            assert GatedNoKafka.arrived.wait(30), "no poll read the lag"  # the first one, from 1 replica, waits
            assert kube.get(DEPLOYMENTS, "held")["spec"]["replicas"] == 1
            before = list(writes)
            kubectl_scale(kube, "held", 3)
            GatedNoKafka.opened.set()  # it decides "fallback to 2 replicas (was 1)", from a size no longer there
            wait_for(lambda: kube.get(DEPLOYMENTS, "held")["spec"]["replicas"] == 2, 30, "the fallback size")
            wait_for(lambda: events(kube, "Scaled"), 10, "the Scaled Event")
        scaled = events(kube, "Scaled")
        assert not any("(was 1)" in message for message in scaled), f"scaled from a size it never saw: {scaled}"
        assert any("(was 3)" in message for message in scaled), scaled
        assert writes[len(before) :] == [(SCALE_FIELD_MANAGER, 3, 2)], "one write, from the size kubectl set"
    finally:
        GatedNoKafka.opened.set()


class GatedBacklog:
    """A lag source with a backlog (6,000,000 messages on 4 partitions) whose reads wait, each at its own gate,
    until the test opens it (``arrived[n]``, ``opened[n]``, n counting the reads): polls held between their read
    of the Deployment and their decision, as in ``GatedNoKafka``, but deciding to scale up."""

    reads = 0
    arrived = [threading.Event() for _ in range(3)]
    opened = [threading.Event() for _ in range(3)]

    def __init__(self, properties: dict[str, str]) -> None:
        self.properties = properties

    @classmethod
    def reset(cls) -> None:
        cls.reads = 0
        for event in (*cls.arrived, *cls.opened):
            event.clear()

    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample:
        read, GatedBacklog.reads = GatedBacklog.reads, GatedBacklog.reads + 1
        if read < len(GatedBacklog.arrived):
            GatedBacklog.arrived[read].set()
            assert GatedBacklog.opened[read].wait(60), f"the test never opened the gate of read {read}"  # hang guard
        return LagSample(at=now, partitions=4, end_total=6_000_000, committed_total=0)

    def close(self) -> None:
        pass


def test_a_scale_up_whose_write_was_refused_is_no_replica_change_and_no_step(kube, monkeypatch):
    """``kubectl scale`` to 3 lands while a poll decides 1 -> 2 from 1: its write is refused (review F1). The
    autoscaler's memory, and its record in status, must not say the group was resized: with a replica change
    from 1 and a step started, the next polls applied the rate limits from 1 and timed a step that never ran."""
    GatedBacklog.reset()
    quiet_pods = {"fetch_reports": lambda *_: ([], []), "push": lambda *_: (0, [])}
    with (
        writes_to_replicas(monkeypatch, "held") as writes,
        rollout_reported_done(kube, "held"),
        e2e_operator(kube.url, lag_source_for=GatedBacklog, lag_wait_seconds=60, **quiet_pods) as context,
    ):
        try:
            kube.create(CR, resource("held", scaling={"pollIntervalSeconds": 1}))
            assert GatedBacklog.arrived[0].wait(30), "no poll read the lag"  # the first one, from 1 replica, waits
            assert kube.get(DEPLOYMENTS, "held")["spec"]["replicas"] == 1
            before = list(writes)
            kubectl_scale(kube, "held", 3)
            # the rollout of 3 done, as the operator's watch shows it: else the poll holds the size while it runs
            seen = context.kube
            wait_for(
                lambda: (
                    seen.deployment_replicas("default", "held") == 3 and seen.deployment_rolled_out("default", "held")
                ),
                10,
                "the rollout of 3 seen",
            )
            GatedBacklog.opened[0].set()  # it decides 1 -> 2, from a size no longer there
            # the next poll, held before it decides: the memory and the record as the first one left them
            assert GatedBacklog.arrived[1].wait(30), "no second poll"
            assert writes[len(before) :] == [], "the refused poll wrote the replicas"
            record = (kube.get(CR, "held").get("status") or {}).get("autoscaler") or {}
            memory = context.poll_memory("default", "held").autoscaler or {}
            assert [replicas for _, replicas, _ in record.get("recommendations") or []] == [2], record
            assert "replicaChanges" not in record and "stepStartedAt" not in record, record
            assert memory.get("replicaChanges") == [] and memory.get("stepStartedAt") is None, memory
            GatedBacklog.opened[1].set()
            GatedBacklog.opened[2].set()
            wait_for(lambda: writes[len(before) :], 30, "a scale-up from the size kubectl set")
            assert writes[len(before)][1] == 3, writes
        finally:  # a poll held at a gate would hold kopf's exit
            for gate in GatedBacklog.opened:
                gate.set()
