"""An OrderedConsumer's end of life and the operator's own: deletion (also mid hand-over, and with a
poll in flight) and an operator restart mid hand-over (a new operator, fresh memory, same status).

Real kopf on the API emulator, lag from the real broker. The emulator's garbage collector deletes what
a deleted resource owns, from the ``ownerReferences`` the operator wrote (background propagation, as
Kubernetes), so whatever the operator made without owning it survives and fails the test. After a
deletion, "the operator leaves it alone" is checked only after a sibling resource was polled again (the
operator still ticks) and the deleted one's timer was seen to stop (``TimerRuns``).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from keyorder.devtools.loadgen import create_topics, produce_keyed
from keyorder_operator.observe import KafkaLagSource
from tests.operator.harness import CR, TimerRuns, wait_for, wait_for_polls
from tests.operator.kubelet import consumer_labels, create_pod
from tests.operator.test_operator_catchup import (
    backlog,
    catchup_jobs,
    catchup_status,
    finish_job,
    resource,
    slow_workers_until_triggered,
)
from tests.operator.test_operator_e2e import (
    commit_group,
    condition,
    condition_entry,
    consumer_resource,
    events,
    operator,
    replicas,
)
from tests.support import EXACT_END_OFFSETS

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(180)]

OWNABLE = (
    "apps/v1/deployments",
    "v1/services",
    "policy/v1/poddisruptionbudgets",
    "v1/serviceaccounts",
    "v1/secrets",
    "v1/configmaps",
    "batch/v1/jobs",
    "v1/pods",
)
"""Every kind the operator creates (or a Job's controller would), scanned for what a resource owns."""


def objects_of(kube, predicate) -> list[tuple[str, str]]:
    """``(kind, name)`` of every object of an OWNABLE kind in ``default`` for which ``predicate(object)``."""
    return [
        (kind, item["metadata"]["name"]) for kind in OWNABLE for item in kube.list(kind, "default") if predicate(item)
    ]


def owned_by(uid: str):
    return lambda item: any(reference.get("uid") == uid for reference in item["metadata"].get("ownerReferences") or [])


def named_for(name: str):
    """Objects named after resource ``name`` (the operator names what it makes ``<name>`` or ``<name>-...``)."""
    return lambda item: item["metadata"]["name"] == name or item["metadata"]["name"].startswith(f"{name}-")


def owned_closure(kube, uid: str) -> list[tuple[str, str]]:
    """``(kind, name)`` of every object whose ownerReferences name ``uid``, then of their own dependents:
    what the garbage collector deletes when the owner goes (background propagation)."""
    found: list[tuple[str, str]] = []
    owners = [uid]
    while owners:
        dependents = [
            (kind, item)
            for kind in OWNABLE
            for item in kube.list(kind, "default")
            if any(reference.get("uid") in owners for reference in item["metadata"].get("ownerReferences") or [])
        ]
        found += [(kind, item["metadata"]["name"]) for kind, item in dependents]
        owners = [item["metadata"]["uid"] for _, item in dependents]
    return found


def collected_by_the_garbage_collector(kube, owned: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``owned``, once the emulator's garbage collector has deleted every one of them (it does so at once)."""
    left = [(kind, name) for kind, name in owned if kube.get(kind, name) is not None]
    assert left == [], f"the garbage collector left owned objects: {left}"
    return owned


def series_of(context, name: str) -> list[str]:
    """The operator's metric series labelled with resource ``name``."""
    return [
        f"{sample.name}{sample.labels}"
        for metric in context.metrics.registry.collect()
        for sample in metric.samples
        if sample.labels.get("name") == name
    ]


class ClosingRecorded(KafkaLagSource):
    """The real lag source, recording the order sources were built in and whether each was closed."""

    def __init__(self, properties: dict[str, str], built: list[ClosingRecorded]) -> None:
        super().__init__(properties)
        self.closed_by_owner = False
        built.append(self)

    def close(self) -> None:
        self.closed_by_owner = True
        super().close()


def create_topics_with_backlog(broker, topic: str) -> None:
    """A 2-partition topic with a small backlog for group ``g-<topic>``: a resource on it has lag to measure."""
    create_topics(broker.bootstrap, [topic], 2)
    produce_keyed(broker.bootstrap, topic, 1_000, 50, extra_config=EXACT_END_OFFSETS)
    commit_group(broker.bootstrap, f"g-{topic}", topic, {0: 0, 1: 0})


def delete_and_wait_until_gone(kube, name: str) -> str:
    """Delete OrderedConsumer ``name`` and wait until it is gone (kopf released its finalizer); its uid."""
    uid = kube.get(CR, name)["metadata"]["uid"]
    kube.delete(CR, name)
    wait_for(lambda: kube.get(CR, name) is None, 30, f"{name} to be gone (kopf's finalizer released)")
    return uid


def assert_left_alone(kube, ticks: TimerRuns, deleted: str, sibling: str, collected: list[tuple[str, str]]) -> None:
    """After more polls of ``sibling`` (the operator still ticks), ``deleted``'s timer has not run again
    and nothing the garbage collector removed came back."""
    runs = ticks.runs(deleted)
    wait_for_polls(kube, sibling, 3)
    assert ticks.runs(deleted) == runs, f"the operator still runs the timer of the deleted {deleted}"
    back = [(kind, name) for kind, name in collected if kube.get(kind, name) is not None]
    assert back == [], f"the operator recreated objects of the deleted {deleted}: {back}"
    assert objects_of(kube, named_for(deleted)) == [], "objects of the deleted resource remain"


def test_deleting_a_resource_removes_what_it_owns_and_the_operator_lets_go_of_it(kube, broker):
    """Everything the operator made for a resource is owned by it (so the garbage collector removes it),
    the delete is not blocked, the operator stops polling it and does not recreate what was collected,
    closes its Kafka client and drops its metric series; a sibling resource goes on as before."""
    topic = "okc-delete"
    create_topics_with_backlog(broker, topic)
    built: list[ClosingRecorded] = []
    with (
        TimerRuns() as ticks,
        operator(kube.url, lag_source_for=lambda properties: ClosingRecorded(properties, built)) as context,
    ):
        kube.create(CR, consumer_resource("doomed", broker.bootstrap, topic))
        wait_for(lambda: (kube.get(CR, "doomed").get("status") or {}).get("lag"), 20, "doomed's lag measured")
        [doomed_source] = built  # the sibling does not exist yet: the one source is doomed's
        kube.create(CR, consumer_resource("sibling", broker.bootstrap, topic))
        wait_for(lambda: (kube.get(CR, "sibling").get("status") or {}).get("lag"), 20, "sibling's lag measured")
        wait_for_polls(kube, "doomed", 2)
        made = objects_of(kube, named_for("doomed"))
        assert {kind for kind, _ in made} >= {
            "apps/v1/deployments",
            "v1/services",
            "policy/v1/poddisruptionbudgets",
            "v1/serviceaccounts",
            "v1/secrets",
        }, made
        assert series_of(context, "doomed"), "no metric series to drop: the check below would prove nothing"
        assert not doomed_source.closed_by_owner

        owned = owned_closure(kube, kube.get(CR, "doomed")["metadata"]["uid"])
        assert sorted(owned) == sorted(made), f"made for it but not owned by it (the GC keeps those): {made}"
        delete_and_wait_until_gone(kube, "doomed")
        collected = collected_by_the_garbage_collector(kube, owned)

        assert_left_alone(kube, ticks, "doomed", "sibling", collected)
        assert doomed_source.closed_by_owner, "the deleted resource's Kafka client was not closed"
        assert series_of(context, "doomed") == [], "metric series of the deleted resource remain"
        assert series_of(context, "sibling"), "the sibling's series went too"
        assert condition(kube.get(CR, "sibling"), "Ready") == "True"
        assert kube.get("apps/v1/deployments", "sibling") is not None


class HeldSamples(ClosingRecorded):
    """The real lag source, but a sample waits while ``hold`` is set (``entered`` says one is waiting),
    until ``release``: a FAKE delay that pins a poll in flight at a chosen moment (a slow cluster would,
    at a moment nobody chooses)."""

    def __init__(self, properties: dict[str, str], built: list[ClosingRecorded]) -> None:
        super().__init__(properties, built)
        self.hold, self.entered, self.release = threading.Event(), threading.Event(), threading.Event()

    def sample(self, topics, group, now):
        if self.hold.is_set():
            self.entered.set()
            assert self.release.wait(60), "the test never released the held sample"  # hang guard
        return super().sample(topics, group, now)


def test_a_poll_in_flight_when_the_resource_is_deleted_leaves_no_metric_series_behind(kube, broker):
    """kopf runs the delete handler while the timer's last poll may still be running (it only asks the
    timer to stop): what that poll writes afterwards must not bring back the series the delete dropped."""
    topic = "okc-delete-in-flight"
    create_topics_with_backlog(broker, topic)
    built: list[ClosingRecorded] = []
    with (
        TimerRuns() as ticks,
        operator(
            kube.url, lag_source_for=lambda properties: HeldSamples(properties, built), lag_wait_seconds=60
        ) as context,
    ):
        kube.create(CR, consumer_resource("in-flight", broker.bootstrap, topic))
        wait_for(lambda: (kube.get(CR, "in-flight").get("status") or {}).get("lag"), 20, "the lag measured")
        [source] = built
        source.hold.set()
        wait_for(source.entered.is_set, 20, "a poll waiting on its sample")
        kube.delete(CR, "in-flight")
        wait_for(lambda: source.closed_by_owner, 20, "the delete handler to run (it closes the Kafka client)")
        runs_before = ticks.runs("in-flight")
        source.release.set()
        # the held poll has ended (kopf logs its timer run), so whatever it wrote is in the registry now
        wait_for(lambda: ticks.runs("in-flight") > runs_before, 30, "the held poll to end")
        wait_for(lambda: kube.get(CR, "in-flight") is None, 30, "the resource gone (kopf's finalizer released)")
        assert series_of(context, "in-flight") == [], "the last poll wrote back series of the deleted resource"


def test_deleting_a_resource_mid_hand_over_leaves_no_job_running_and_no_pods_paused(kube, broker):
    """Deleted while its catch-up Job runs and its pods are scaled to 0: the Job and the Deployment are
    owned by the resource, so the garbage collector removes both (the Job's pods with it); the operator
    neither finishes the hand-over afterwards (no Deployment recreated at the resume size) nor starts the
    Job again, and its catching-up gauge goes."""
    topic = "okc-delete-handover"
    backlog(broker, topic)
    create_topics_with_backlog(broker, "okc-delete-sibling")
    with TimerRuns() as ticks, operator(kube.url) as context:
        kube.create(CR, resource(broker, "midway", topic))
        kube.create(CR, consumer_resource("bystander", broker.bootstrap, "okc-delete-sibling"))
        started = slow_workers_until_triggered(kube, context, "midway")
        job_name = started["jobName"]
        wait_for(lambda: catchup_status(kube, "midway").get("phase") == "Running", 20, "phase Running")
        # the Job's controller would have started its driver pod, owned by the Job
        job = kube.get("batch/v1/jobs", job_name)
        driver = create_job_pod(kube, job)
        assert replicas(kube, "midway") == 0
        assert (
            context.metrics.registry.get_sample_value(
                "keyorder_operator_catching_up", {"namespace": "default", "name": "midway"}
            )
            == 1
        )

        uid = kube.get(CR, "midway")["metadata"]["uid"]
        assert ("batch/v1/jobs", job_name) in objects_of(kube, owned_by(uid)), "the Job is not owned by the resource"
        owned = owned_closure(kube, uid)
        assert {("batch/v1/jobs", job_name), ("v1/pods", driver), ("apps/v1/deployments", "midway")} <= set(owned), (
            owned
        )
        delete_and_wait_until_gone(kube, "midway")
        collected = collected_by_the_garbage_collector(kube, owned)

        assert_left_alone(kube, ticks, "midway", "bystander", collected)
        assert [job["metadata"]["name"] for job in kube.list("batch/v1/jobs", "default")] == []
        assert series_of(context, "midway") == [], "metric series of the deleted resource remain"


def create_job_pod(kube, job: dict[str, Any]) -> str:
    """The pod a Job's controller would start for ``job`` (owned by it, labelled with its name)."""
    name = f"{job['metadata']['name']}-driver"
    kube.create(
        "v1/pods",
        {
            "metadata": {
                "name": name,
                "namespace": "default",
                "labels": {"job-name": job["metadata"]["name"]},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job["metadata"]["name"],
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"containers": [{"name": "catchup", "image": "x"}]},
        },
    )
    return name


def catching_up(context, name: str) -> float | None:
    return context.metrics.registry.get_sample_value(
        "keyorder_operator_catching_up", {"namespace": "default", "name": name}
    )


def test_a_restarted_operator_resumes_the_hand_over_where_the_status_says(kube, broker):
    """The hand-over lives in ``status.catchup``, not in the operator's memory: an operator started
    after another stopped mid hand-over carries on from there. Stopped while the pods stop, the next one
    waits for them and starts the Job the first one named, with its fence; stopped while the Job runs,
    the next one keeps the pods at 0, starts no second Job, and resumes the pods when the Job ends."""
    topic = "okc-restart"
    ends = backlog(broker, topic)
    fence = ",".join(f"{topic}:{p}={ends[p]}" for p in sorted(ends))
    with operator(kube.url) as first:
        kube.create(CR, resource(broker, "steadfast", topic))
        create_pod(kube, "steadfast-0", consumer_labels("steadfast"), "consumer", "x")  # slow to stop
        started = slow_workers_until_triggered(kube, first, "steadfast")
        wait_for(
            lambda: condition_entry(kube.get(CR, "steadfast"), "CatchingUp").get("reason") == "StoppingPods",
            20,
            "the hand-over to wait for the consumer pod",
        )
    job_name = started["jobName"]

    with operator(kube.url) as second:  # a new operator, mid StoppingPods
        wait_for_polls(kube, "steadfast", 3)
        assert catchup_status(kube, "steadfast") == started, "the new operator did not continue the hand-over"
        assert kube.get("batch/v1/jobs", job_name) is None, "a Job started while a consumer pod was left"
        assert replicas(kube, "steadfast") == 0
        assert catching_up(second, "steadfast") == 1
        kube.delete("v1/pods", "steadfast-0")
        job = wait_for(lambda: kube.get("batch/v1/jobs", job_name), 20, "the Job the first operator named")
        assert job["spec"]["template"]["spec"]["containers"][0]["args"][3:5] == ["--until", fence]
        wait_for(lambda: catchup_status(kube, "steadfast").get("phase") == "Running", 20, "phase Running")

    with operator(kube.url) as third:  # and another one, while the Job runs
        wait_for_polls(kube, "steadfast", 3)
        running = catchup_status(kube, "steadfast")
        assert (running["phase"], running["jobName"], running["fence"]) == ("Running", job_name, started["fence"])
        assert replicas(kube, "steadfast") == 0, "the pods resumed while the Job owns the group"
        assert catching_up(third, "steadfast") == 1
        commit_group(broker.bootstrap, f"g-{topic}", topic, ends)  # what keyorder catchup commits on success
        finish_job(kube, job_name, "Complete")
        wait_for(lambda: replicas(kube, "steadfast") == started["resumeReplicas"], 20, "the pods resumed")
        wait_for(lambda: condition(kube.get(CR, "steadfast"), "CatchingUp") == "False", 20, "CatchingUp False")
        assert catchup_status(kube, "steadfast") == {}
        assert any(job_name in message for message in events(kube, "CatchupSucceeded"))
        assert catching_up(third, "steadfast") == 0
    jobs = catchup_jobs(kube, "steadfast")
    assert jobs == [job_name], f"one hand-over, one Job: {jobs}"
    assert sum(job_name in message for message in events(kube, "CatchupRunning")) == 1
