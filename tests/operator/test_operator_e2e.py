"""The real kopf operator, on kmock's API emulator, reading lag from the real broker.

What the emulator cannot do (run pods, garbage-collect) is not asserted; everything the operator
itself writes (objects, ownerReferences, replicas, status, Events) is.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import threading

import pytest
from confluent_kafka import Consumer, TopicPartition

from keyorder.devtools.embedded import EmbeddedBroker
from keyorder.devtools.loadgen import create_topics, produce_keyed
from keyorder_operator.builders import ASSIGNMENT_STRATEGY_VARIABLE
from keyorder_operator.kube import Kube
from keyorder_operator.pod_admin import push_workers
from keyorder_operator.reconcile import OperatorContext, register
from tests.operator.harness import CR, TimerRuns, api_client, last_poll_at, polls_of, run_kopf, wait_for, wait_for_polls
from tests.operator.kubelet import admin_token, consumer_labels, create_pod, report_pod_status, write_admin_token
from tests.support import EXACT_END_OFFSETS

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]


def commit_group(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit offsets as the consumer group would (a stand-in for running consumer pods)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def consumer_resource(name: str, bootstrap: str, topic: str, **overrides) -> dict:
    spec = {
        "kafka": {"bootstrapServers": bootstrap, "topics": [topic], "groupId": f"g-{topic}"},
        "handler": {"image": "registry.example/ledger:1.0", "handler": "keyorder_example.ledger:handle"},
        "workers": {"min": 1, "initial": 4, "max": 64},
        "scaling": {
            "pollIntervalSeconds": 1,
            "targetDrainSeconds": 10,
            "activationLag": 10,
            "scaleDownStabilizationSeconds": 2,
        },
    }
    spec.update(overrides)
    return {
        "apiVersion": "keyorder.dev/v1alpha1",
        "kind": "OrderedConsumer",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


@contextlib.contextmanager
def operator(url: str, **settings):
    """The real handlers registered in a real kopf operator, with a short tick, talking to ``url``."""
    with api_client(url) as client:
        context = OperatorContext(kube=Kube(client), tick_seconds=0.3, **settings)
        with run_kopf(url, lambda registry: register(registry, context)), polls_of(context):
            yield context


def replicas(kube, name: str) -> int | None:
    deployment = kube.get("apps/v1/deployments", name)
    return deployment["spec"]["replicas"] if deployment else None


def condition_entry(resource: dict | None, kind: str) -> dict:
    """The resource's condition of type ``kind`` (``{}`` when it has none)."""
    for item in ((resource or {}).get("status") or {}).get("conditions") or []:
        if item["type"] == kind:
            return item
    return {}


def condition(resource: dict | None, kind: str) -> str | None:
    return condition_entry(resource, kind).get("status")


def events(kube, reason: str) -> list[str]:
    return [event.get("message", "") for event in kube.list("v1/events", "default") if event.get("reason") == reason]


@contextlib.contextmanager
def rollout_reported_done(kube, name: str):
    """A stand-in for the Deployment controller (a fake, named as one): reports every replica of
    Deployment ``name`` updated and ready, and its generation observed, as pods of an older release
    would be that run but send no scaling report. The operator then grows stepwise, doubling per poll.

    It stops before the emulator does (the ``kube`` fixture outlives it), so any error it meets is
    real: the first one ends it and fails the test when the block exits."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def report() -> None:
        while not stop.wait(0.2):
            try:
                deployment = kube.get("apps/v1/deployments", name)
                if deployment is None:
                    continue
                wanted = deployment["spec"].get("replicas") or 0
                generation = deployment["metadata"]["generation"]
                status = {
                    "observedGeneration": generation,
                    "replicas": wanted,
                    "readyReplicas": wanted,
                    "updatedReplicas": wanted,
                }
                if {key: (deployment.get("status") or {}).get(key) for key in status} != status:
                    kube.patch("apps/v1/deployments", name, {"status": status}, subresource="status")
            except Exception as error:  # reported when the block exits
                errors.append(error)
                return

    thread = threading.Thread(target=report, name=f"rollout-{name}", daemon=True)
    thread.start()
    try:
        yield
    except BaseException as failure:
        if errors:
            failure.add_note(f"the rollout stand-in for {name} had failed meanwhile: {errors[0]!r}")
        raise
    finally:
        stop.set()
        thread.join(10)  # hang guard: one emulator request at most
    assert not thread.is_alive(), f"the rollout stand-in for {name} did not stop"
    if errors:
        raise AssertionError(f"the rollout stand-in for {name} failed: {errors[0]!r}") from errors[0]


def test_owned_objects_then_scale_out_to_the_partition_cap_then_workers_then_back(kube, broker):
    topic = "okc-scale"
    create_topics(broker.bootstrap, [topic], 4)
    produced = produce_keyed(broker.bootstrap, topic, 4_000, 100, extra_config=EXACT_END_OFFSETS)
    commit_group(broker.bootstrap, f"g-{topic}", topic, dict.fromkeys(range(4), 0))
    with operator(kube.url), rollout_reported_done(kube, "ledger"):
        created = kube.create(CR, consumer_resource("ledger", broker.bootstrap, topic))
        uid = created["metadata"]["uid"]
        for resource, name in (
            ("apps/v1/deployments", "ledger"),
            ("v1/services", "ledger-metrics"),
            ("policy/v1/poddisruptionbudgets", "ledger"),
            ("v1/serviceaccounts", "ledger"),
            ("v1/secrets", "ledger-admin-token"),
        ):
            found = wait_for(lambda r=resource, n=name: kube.get(r, n), 20, f"{resource} {name}")
            assert found["metadata"]["ownerReferences"][0]["uid"] == uid, f"{resource} is not owned by the CR"
        wait_for(
            lambda: (kube.get(CR, "ledger").get("status") or {}).get("lag") == produced.total,
            20,
            "status.lag to show the backlog",
        )
        wait_for(lambda: replicas(kube, "ledger") == 4, 30, "scale-out to the partition count")
        wait_for(
            lambda: ((kube.get(CR, "ledger").get("status") or {}).get("workersPerPod") or 0) > 4,
            30,
            "workers per pod to grow at the partition cap",
        )
        assert replicas(kube, "ledger") == 4, "replicas went beyond the partition count"
        scaled = events(kube, "Scaled")
        assert any("replicas 1\u21922" in message for message in scaled), scaled
        assert any("workers/pod" in message for message in scaled), scaled
        assert all("lag " in message for message in scaled)

        commit_group(broker.bootstrap, f"g-{topic}", topic, produced.end_offsets)  # the backlog is drained
        wait_for(lambda: (kube.get(CR, "ledger").get("status") or {}).get("lag") == 0, 20, "lag 0")
        wait_for(lambda: replicas(kube, "ledger") == 1, 30, "scale-in after the stabilization window")

        # status is patched after the Deployment is scaled: wait for it rather than read it at once
        def scaled_in_status() -> bool:
            status = kube.get(CR, "ledger").get("status") or {}
            return status.get("replicas") == 1 and status.get("workersPerPod") == 4

        wait_for(scaled_in_status, 20, "status to show 1 replica x 4 workers")
        assert condition(kube.get(CR, "ledger"), "Ready") == "True"
        assert any(event.startswith("scaled") for event in events(kube, "Scaled"))


def test_invalid_spec_sets_invalid_spec_and_touches_nothing(kube_older_crd, broker):
    """The CRD refuses such a spec (CEL); an older CRD lets it through to the operator."""
    kube = kube_older_crd
    with TimerRuns() as ticks, operator(kube.url):
        bad = consumer_resource("broken", broker.bootstrap, "whatever", workers={"min": 8, "initial": 4, "max": 2})
        kube.create(CR, bad)
        wait_for(lambda: condition(kube.get(CR, "broken"), "InvalidSpec") == "True", 20, "InvalidSpec")
        message = condition_entry(kube.get(CR, "broken"), "InvalidSpec")
        assert "spec.workers" in message["message"]
        assert any("spec.workers" in text for text in events(kube, "InvalidSpec"))
        ticks.wait_for_runs("broken", 3)  # the operator's timer ticked on it (an invalid spec is not polled)
        assert kube.get("apps/v1/deployments", "broken") is None
        assert last_poll_at(kube, "broken") is None, "an invalid spec was polled"


def test_unknown_lag_never_scales(kube):
    with EmbeddedBroker() as private:
        topic = "okc-down"
        create_topics(private.bootstrap, [topic], 2)
        produce_keyed(private.bootstrap, topic, 2_000, 50, extra_config=EXACT_END_OFFSETS)
        commit_group(private.bootstrap, f"g-{topic}", topic, {0: 0, 1: 0})
        with operator(kube.url):
            kube.create(
                CR,
                consumer_resource(
                    "orphan",
                    private.bootstrap,
                    topic,
                    scaling={"pollIntervalSeconds": 1, "targetDrainSeconds": 3600, "activationLag": 10_000_000},
                ),
            )
            wait_for(lambda: (kube.get(CR, "orphan").get("status") or {}).get("lag") == 2_000, 20, "lag measured")
            before = replicas(kube, "orphan")
            private.stop()
            wait_for(lambda: condition(kube.get(CR, "orphan"), "LagUnknown") == "True", 40, "LagUnknown")
            assert replicas(kube, "orphan") == before
            assert condition(kube.get(CR, "orphan"), "Ready") == "False"
            assert events(kube, "LagUnknown"), "no LagUnknown Event"


def test_worker_count_reaches_a_running_pod_live(kube, broker, tmp_path, run_pod):
    """The operator pushes its decision to a real keyorder pod through the token-protected endpoint, and
    the pod then handles more keys at once than its starting 4 workers could, still one at a time per key.
    Once the pod reports the decided count, polls that keep it push nothing."""
    from keyorder.devtools.embedded import free_port
    from tests.conftest import Recorder
    from tests.guarantees import assert_key_order

    topic = "okc-push"
    create_topics(broker.bootstrap, [topic], 2)
    produce_keyed(broker.bootstrap, topic, 3_000, 100, extra_config=EXACT_END_OFFSETS)
    commit_group(broker.bootstrap, f"g-{topic}", topic, {0: 0, 1: 0})
    port = free_port()
    recorder = Recorder(0.02, 0.04)
    pushes: list[tuple[tuple[str, ...], int]] = []

    def recorded_push(addresses, port, token, workers):
        pushes.append((tuple(addresses), workers))
        return push_workers(addresses, port, token, workers)

    with operator(kube.url, push=recorded_push):
        kube.create(CR, consumer_resource("live", broker.bootstrap, topic, httpPort=port))
        wait_for(lambda: admin_token(kube, "live"), 20, "the admin token Secret")
        token_file = write_admin_token(kube, "live", tmp_path / "token")
        pod = run_pod(
            topic,
            recorder,
            group=f"g-{topic}",
            workers=4,
            http_port=port,
            admin_token_file=str(token_file),
            shutdown_grace=1.0,  # the test ends with thousands in flight: do not drain them
        )
        create_pod(kube, "live-0", consumer_labels("live"), "consumer", "x")
        # the emulator runs no kubelet: the test reports the (real, in-process) pod as ready on 127.0.0.1
        report_pod_status(kube, "live-0", "127.0.0.1", ready=True)
        # the push reaches the pod before the poll's status patch lands: wait until both say the same
        wait_for(
            lambda: (
                pod.runtime.workers > 4 and pod.runtime.workers == kube.get(CR, "live")["status"].get("workersPerPod")
            ),
            30,
            "the operator's worker count to reach the pod and its status",
        )
        status = kube.get(CR, "live")["status"]
        assert status["podsUpdated"] == 1
        wait_for_polls(kube, "live", 4)
        # a count is pushed once: the pod then reports it, and later polls push only a new decision
        repeated = [later for earlier, later in itertools.pairwise(pushes) if later == earlier]
        assert pushes and not repeated, f"the same count pushed again to a pod that runs it: {pushes}"
        # the pushed count is what the pod runs: more handler calls at once than 4 workers allow
        wait_for(lambda: recorder.serial.peak > 4, 30, "more than 4 handler calls at once on the pod")
    recorder.serial.assert_serial()
    assert_key_order(recorder.records)


def test_an_update_to_an_invalid_spec_leaves_the_objects_untouched(kube_older_crd, broker):
    """The CRD refuses such a handler path (its pattern); an older CRD lets it through to the operator."""
    kube = kube_older_crd
    topic = "okc-update"
    create_topics(broker.bootstrap, [topic], 2)
    with TimerRuns() as ticks, operator(kube.url):
        kube.create(CR, consumer_resource("steady", broker.bootstrap, topic))
        before = wait_for(lambda: kube.get("apps/v1/deployments", "steady"), 20, "the Deployment")
        kube.patch(CR, "steady", {"spec": {"handler": {"handler": "not a handler path"}}})
        wait_for(lambda: condition(kube.get(CR, "steady"), "InvalidSpec") == "True", 20, "InvalidSpec")
        ticks.wait_for_runs("steady", 3)  # the operator's timer ticked on it (an invalid spec is not polled)
        after = kube.get("apps/v1/deployments", "steady")
        assert after["spec"] == before["spec"], "an invalid spec changed the Deployment"
        message = condition_entry(kube.get(CR, "steady"), "InvalidSpec")
        assert "spec.handler.handler" in message["message"]


def test_deleted_and_edited_objects_are_restored_within_a_poll(kube, broker):
    """Self-repair: the owned objects are checked every poll, so a deleted Service or PDB and a
    Deployment edited behind the operator's back are as specified again within one poll."""
    topic = "okc-repair"
    create_topics(broker.bootstrap, [topic], 2)
    with operator(kube.url):
        kube.create(CR, consumer_resource("repair", broker.bootstrap, topic))
        wait_for(lambda: kube.get("v1/services", "repair-metrics"), 20, "the Service")
        wait_for(lambda: kube.get("policy/v1/poddisruptionbudgets", "repair"), 20, "the PDB")
        wait_for(lambda: (kube.get(CR, "repair").get("status") or {}).get("observedGeneration"), 20, "observed")
        kube.delete("v1/services", "repair-metrics")
        kube.delete("policy/v1/poddisruptionbudgets", "repair")
        deployment = kube.get("apps/v1/deployments", "repair")
        handler_env = [
            item
            for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
            if item["name"] == "KEYORDER_HANDLER"
        ]
        assert handler_env[0]["value"] == "keyorder_example.ledger:handle"
        edited = copy.deepcopy(deployment["spec"]["template"]["spec"]["containers"])
        for item in edited[0]["env"]:
            if item["name"] == "KEYORDER_HANDLER":
                item["value"] = "somebody.else:handler"
        kube.patch("apps/v1/deployments", "repair", {"spec": {"template": {"spec": {"containers": edited}}}})

        def handler_of_deployment() -> str:
            containers = kube.get("apps/v1/deployments", "repair")["spec"]["template"]["spec"]["containers"]
            return next(item["value"] for item in containers[0]["env"] if item["name"] == "KEYORDER_HANDLER")

        assert handler_of_deployment() == "somebody.else:handler"
        wait_for(lambda: kube.get("v1/services", "repair-metrics"), 10, "the deleted Service back")
        wait_for(lambda: kube.get("policy/v1/poddisruptionbudgets", "repair"), 10, "the deleted PDB back")
        wait_for(lambda: handler_of_deployment() == "keyorder_example.ledger:handle", 10, "the edit undone")
        restored = wait_for(lambda: events(kube, "Restored"), 10, "a Restored Event")
        assert any("Service" in text for text in restored) and any("PodDisruptionBudget" in text for text in restored)


def test_a_steady_resource_costs_reads_not_writes(kube, broker):
    """Objects nobody changed are not applied again: their resourceVersions (which the emulator bumps on
    every write, as the API server does on every change) stay put over several polls."""
    topic = "okc-steady"
    create_topics(broker.bootstrap, [topic], 2)
    with operator(kube.url):
        kube.create(CR, consumer_resource("steady-state", broker.bootstrap, topic))
        wait_for(lambda: condition(kube.get(CR, "steady-state"), "Ready") is not None, 20, "the first poll")
        owned = [
            ("v1/serviceaccounts", "steady-state"),
            ("v1/services", "steady-state-metrics"),
            ("policy/v1/poddisruptionbudgets", "steady-state"),
        ]

        def versions() -> list[str]:
            return [kube.get(kind, name)["metadata"]["resourceVersion"] for kind, name in owned]

        wait_for_polls(kube, "steady-state", 1)  # one poll after creation has recorded what it applied
        before = versions()
        wait_for_polls(kube, "steady-state", 3)
        assert versions() == before, "a poll wrote objects nobody had changed"


def test_resources_on_an_unreachable_kafka_do_not_hold_up_a_healthy_one(kube, broker):
    """Eight resources whose Kafka never answers (the real client, its real timeouts) share a small
    handler pool with a healthy one on purpose: with 3 threads, probes that held the poll (5 s each,
    every 2-4 s here) would starve it; with bounded, backgrounded probes it keeps polling and measuring
    its lag while the others keep failing. (How promptly it polls is a speed: not asserted here.)"""
    from keyorder.devtools.embedded import free_port

    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    topic = "okc-isolated"
    create_topics(broker.bootstrap, [topic], 2)
    produce_keyed(broker.bootstrap, topic, 2_000, 100, extra_config=EXACT_END_OFFSETS)
    commit_group(broker.bootstrap, f"g-{topic}", topic, {0: 0, 1: 0})
    with operator(kube.url, handler_threads=3, lag_backoff_seconds=(2.0, 4.0)) as context:
        names = [f"dead-{index}" for index in range(8)]
        for name in names:
            spec = consumer_resource(name, dead, f"t-{name}")
            kube.create(CR, spec)
        wait_for(
            lambda: all(condition(kube.get(CR, name), "LagUnknown") == "True" for name in names),
            60,
            "every resource on the unreachable Kafka to report LagUnknown",
        )
        kube.create(CR, consumer_resource("healthy", broker.bootstrap, topic))
        wait_for(lambda: condition(kube.get(CR, "healthy"), "LagUnknown") == "False", 20, "the healthy lag")
        dead_polled = {name: last_poll_at(kube, name) for name in names}
        samples = []
        for _ in range(4):
            wait_for_polls(kube, "healthy", 1, timeout_per_poll=30)  # hang guard, generous on purpose
            assert condition(kube.get(CR, "healthy"), "LagUnknown") == "False", "the healthy lag went unknown"
            samples.append((context.poll_memory("default", "healthy").last_sample or {}).get("at"))
        assert len(set(samples)) == 4, f"the healthy polls did not each measure the lag anew: {samples}"
        still_unknown = [name for name in names if condition(kube.get(CR, name), "LagUnknown") == "True"]
        assert still_unknown == names, "the unreachable resources must keep saying so"
        still_polled = [name for name in names if last_poll_at(kube, name) != dead_polled[name]]
        assert still_polled == names, "the unreachable resources must keep being polled meanwhile"


def test_recommend_only_mode_publishes_the_decision_and_changes_nothing(kube, broker):
    """``scaling.mode: recommend`` beside (say) KEDA: the decision an ``apply`` resource would act on is in
    status, an Event and a metric; the Deployment keeps its replicas and no worker count is pushed."""
    topic = "okc-recommend"
    create_topics(broker.bootstrap, [topic], 4)
    produce_keyed(broker.bootstrap, topic, 4_000, 100, extra_config=EXACT_END_OFFSETS)
    commit_group(broker.bootstrap, f"g-{topic}", topic, dict.fromkeys(range(4), 0))
    pushes: list[int] = []

    def record_push(addresses, port, token, workers):
        pushes.append(workers)
        return len(addresses), []

    scaling = {"mode": "recommend", "pollIntervalSeconds": 1, "targetDrainSeconds": 10, "activationLag": 10}
    with operator(kube.url, push=record_push) as context, rollout_reported_done(kube, "advisor"):
        kube.create(CR, consumer_resource("advisor", broker.bootstrap, topic, scaling=scaling))
        wait_for(
            lambda: ((kube.get(CR, "advisor").get("status") or {}).get("recommendation") or {}).get("replicas", 0) > 1,
            30,
            "a recommendation above the current size",
        )
        wait_for_polls(kube, "advisor", 3)
        status = kube.get(CR, "advisor")["status"]
        assert replicas(kube, "advisor") == 1, "recommend-only mode scaled the Deployment"
        assert status["replicas"] == 1 and status["workersPerPod"] == 4
        # the scale subresource's status path: the pods the Deployment has (its status.replicas)
        assert status["observedReplicas"] == kube.get("apps/v1/deployments", "advisor")["status"]["replicas"] == 1
        assert status["recommendation"]["cause"] in ("scale_up", "reshape")
        assert pushes == [], "recommend-only mode pushed a worker count"
        assert condition_entry(kube.get(CR, "advisor"), "Scaling")["reason"] == "RecommendOnly"
        assert any("recommend only (nothing applied)" in message for message in events(kube, "Recommended"))
        assert not events(kube, "Scaled")
        recommended = context.metrics.registry.get_sample_value(
            "keyorder_operator_recommended_replicas", {"namespace": "default", "name": "advisor"}
        )
        assert recommended is not None and recommended > 1


def test_a_failing_poll_sets_reconcile_failed_until_a_poll_succeeds(kube, broker):
    """A poll that raises (here reading the pods' reports fails in a way the operator does not expect: a
    FAKE ``fetch_reports``) is reported in the ReconcileFailed condition, an Event and the errors metric,
    not only a log line; the next successful poll clears it."""
    topic = "okc-failing"
    create_topics(broker.bootstrap, [topic], 2)
    broken = threading.Event()
    broken.set()

    def fetch_reports(addresses, port, token):
        if broken.is_set():
            raise RuntimeError("the push client is broken")
        return [], []

    with operator(kube.url, fetch_reports=fetch_reports) as context:
        kube.create(CR, consumer_resource("fragile", broker.bootstrap, topic))
        wait_for(lambda: condition(kube.get(CR, "fragile"), "ReconcileFailed") == "True", 30, "ReconcileFailed")
        entry = condition_entry(kube.get(CR, "fragile"), "ReconcileFailed")
        assert entry["reason"] == "RuntimeError" and "the push client is broken" in entry["message"]
        assert any("the push client is broken" in message for message in events(kube, "ReconcileFailed"))
        errors = context.metrics.registry.get_sample_value(
            "keyorder_operator_reconcile_errors_total", {"namespace": "default", "name": "fragile"}
        )
        assert errors is not None and errors >= 1
        broken.clear()
        wait_for(lambda: condition(kube.get(CR, "fragile"), "ReconcileFailed") == "False", 30, "recovery")
        assert condition_entry(kube.get(CR, "fragile"), "ReconcileFailed")["reason"] == "PollSucceeded"


def test_a_move_to_an_eager_strategy_is_a_cut_over_until_no_old_pod_is_left(kube, broker):
    """One group cannot mix eager and cooperative members, so the operator rolls such a change out
    with ``Recreate`` and goes back to rolling updates once the Deployment reports no old pod (and no
    pod of the old kind is listed: here none was ever made). The Deployment's status is written here,
    standing in for the Deployment controller (a fake, named as one); ``test_operator_deployable`` has
    the cut-over with pods that stay terminating."""
    topic = "okc-cut-over"
    create_topics(broker.bootstrap, [topic], 2)

    def deployment() -> dict:
        return kube.get("apps/v1/deployments", "cutover")

    def strategy_variable() -> str:
        container = deployment()["spec"]["template"]["spec"]["containers"][0]
        return next(item["value"] for item in container["env"] if item["name"] == ASSIGNMENT_STRATEGY_VARIABLE)

    def report_rollout(replicas: int, updated: int) -> None:
        generation = deployment()["metadata"]["generation"]
        status = {"observedGeneration": generation, "replicas": replicas, "updatedReplicas": updated}
        kube.patch("apps/v1/deployments", "cutover", {"status": status}, subresource="status")

    with operator(kube.url):
        kube.create(CR, consumer_resource("cutover", broker.bootstrap, topic))
        wait_for(lambda: kube.get("apps/v1/deployments", "cutover"), 20, "the Deployment")
        assert strategy_variable() == "cooperative-sticky"
        assert deployment()["spec"]["strategy"]["type"] == "RollingUpdate"
        kube.patch(CR, "cutover", {"spec": {"kafka": {"assignmentStrategy": "range"}}})
        wait_for(lambda: strategy_variable() == "range", 20, "the eager strategy in the pod template")
        cut_over = deployment()["spec"]["strategy"]
        assert cut_over == {"type": "Recreate"}, "Recreate refuses rollingUpdate; the defaulted one must go"
        report_rollout(replicas=2, updated=1)  # an old pod is still there
        wait_for_polls(kube, "cutover", 2)
        assert deployment()["spec"]["strategy"]["type"] == "Recreate", "went back to rolling while old pods ran"
        report_rollout(replicas=1, updated=1)
        wait_for(lambda: deployment()["spec"]["strategy"]["type"] == "RollingUpdate", 20, "rolling updates again")
        assert strategy_variable() == "range"
