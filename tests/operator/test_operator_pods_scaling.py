"""The real kopf operator sizing real ``keyorder run`` pods from what they report.

Real parts: the embedded Kafka broker, kopf on the API emulator, ``keyorder run`` processes. The
one fake is the kubelet/Deployment controller (``tests.operator.kubelet.LocalKubelet``), which
runs the Deployment's pods as local processes. Scenarios from the control-loop issue: a spike
reaches its size within two polls of the first report; pause freezes the size; a hot key stops
at the bound with ``ScalingLimited`` instead of growing to max x max; a blocked poison key gives
``ScalingLimited`` and no catch-up.
"""

from __future__ import annotations

import pytest

from keyorder.devtools.loadgen import create_topics, key_name, produce_keyed
from keyorder_operator.key_names import key_digest
from keyorder_operator.spec import PAUSE_ANNOTATION
from tests.operator.harness import CR, wait_for, wait_for_polls
from tests.operator.kubelet import LocalKubelet, admin_token
from tests.operator.test_operator_e2e import condition, condition_entry, consumer_resource, events, operator
from tests.support import EXACT_END_OFFSETS

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(240)]
HTTP_PORT = 18_431


def resource(name: str, bootstrap: str, topic: str, **overrides) -> dict:
    body = consumer_resource(
        name,
        bootstrap,
        topic,
        handler={
            "image": "registry.example/ledger:1.0",
            "handler": "keyorder_example.ledger:handle",
            "env": [{"name": "KEYORDER_EXAMPLE_LATENCY_MS", "value": "10"}],
            "terminationGracePeriodSeconds": 5,  # pods stopped with a backlog do not wait to drain it
        },
        httpPort=HTTP_PORT,
        **overrides,
    )
    body["spec"]["workers"] = {"min": 1, "initial": 4, "max": 32}
    body["spec"]["scaling"].update({"targetDrainSeconds": 4, "scaleDownStabilizationSeconds": 30})
    return body


def sizes_per_poll(kube, name: str, polls: int) -> list[tuple[int, int]]:
    """``(replicas, workersPerPod)`` from the CR's status after each of the next ``polls`` polls (a poll's
    status is written before the next one starts): a window counted in decisions, not in seconds. A poll
    that decided nothing yet (before the Deployment exists) adds nothing."""
    record = []
    for _ in range(polls):
        wait_for_polls(kube, name, 1)
        status = kube.get(CR, name)["status"]
        if status.get("replicas") is not None:
            record.append((status["replicas"], status.get("workersPerPod") or 0))
    return record


def test_pause_freezes_the_size_then_a_spike_reaches_its_size_within_two_polls(kube, broker, tmp_path):
    topic = "pods-spike"
    create_topics(broker.bootstrap, [topic], 4)
    with operator(kube.url):
        paused = resource("spike", broker.bootstrap, topic)
        paused["metadata"]["annotations"] = {PAUSE_ANNOTATION: "true"}
        kube.create(CR, paused)
        with LocalKubelet(kube, "spike", tmp_path) as kubelet:
            wait_for(lambda: kubelet.pods and kubelet.pods[0].ready, 60, "the first pod to be ready")
            produce_keyed(broker.bootstrap, topic, 12_000, 400, seed=3, extra_config=EXACT_END_OFFSETS)
            wait_for(lambda: (kube.get(CR, "spike").get("status") or {}).get("lag", 0) > 1_000, 30, "the backlog")
            frozen = sizes_per_poll(kube, "spike", 3)
            status = kube.get(CR, "spike")["status"]
            assert status["lag"] > 1_000, "the backlog is there while paused"
            assert set(frozen) == {(1, 4)}, f"paused, yet the size moved: {frozen}"
            assert condition_entry(kube.get(CR, "spike"), "Scaling")["reason"] == "Paused"

            kube.patch(CR, "spike", {"metadata": {"annotations": {PAUSE_ANNOTATION: None}}})
            first = wait_for(
                lambda: (
                    (found := kube.get(CR, "spike"))
                    and condition_entry(found, "Scaling").get("reason") not in (None, "Paused")
                    and found["status"]
                ),
                20,
                "the first poll after the pause",
            )
            grown = [(first["replicas"], first["workersPerPod"]), *sizes_per_poll(kube, "spike", 7)]
            assert not kubelet.crashed(), kubelet.crashed()
    capacities = [replicas * workers for replicas, workers in grown]  # poll by poll, from the paused 1 x 4
    peak = max(capacities)
    assert peak > 4, f"the spike never scaled the group: {grown}"
    reached = 1 + next(poll for poll, capacity in enumerate(capacities) if capacity >= 0.7 * peak)
    assert reached <= 2, f"took {reached} polls to come within 70% of the peak {peak} (size per poll: {grown})"


def test_a_hot_key_stops_at_the_bound_with_scaling_limited(kube, broker, tmp_path):
    topic = "pods-hot"
    create_topics(broker.bootstrap, [topic], 4)
    produce_keyed(broker.bootstrap, topic, 6_000, 40, seed=4, hot_key_share=0.8, extra_config=EXACT_END_OFFSETS)
    with operator(kube.url):
        # Paused until the pod's lanes show the hot key: librdkafka hands out one partition at a time, and
        # the hot key's may come last. Until then the pods report a lag of 6,000 spread over light keys,
        # and growing is the policy's right answer to that (make test once saw 4 x 5 before the hot key).
        # What this test checks is the step taken once the hot key is seen.
        body = resource("hot", broker.bootstrap, topic)
        body["metadata"]["annotations"] = {PAUSE_ANNOTATION: "true"}
        kube.create(CR, body)
        with LocalKubelet(kube, "hot", tmp_path) as kubelet:
            hot_seen = wait_for(
                lambda: (
                    (token := admin_token(kube, "hot"))
                    and ((kube.get(CR, "hot").get("status") or {}).get("pods") or {}).get("busiestKey")
                    == key_digest(key_name(0), token)
                ),
                60,
                "the pod's lanes to show the hot key while paused",
            )
            assert hot_seen
            kube.patch(CR, "hot", {"metadata": {"annotations": {PAUSE_ANNOTATION: None}}})
            record: list[tuple[int, int]] = [(1, 4)]  # the paused size, the step's starting point

            def limited() -> bool:
                record.extend(sizes_per_poll(kube, "hot", 1))  # every poll's size on the way
                return condition(kube.get(CR, "hot"), "ScalingLimited") == "True"

            wait_for(limited, 60, "ScalingLimited")
            record.extend(sizes_per_poll(kube, "hot", 4))  # and on more polls once limited
            print(f"size per poll: {record}")
            resource_now = kube.get(CR, "hot")
            token = admin_token(kube, "hot")
            assert not kubelet.crashed(), kubelet.crashed()
    # the key is named by its digest under the resource's admin token, never as itself (keys are often ids)
    hot = key_digest(key_name(0), token)
    limited = condition_entry(resource_now, "ScalingLimited")
    assert limited["status"] == "True" and limited["reason"] == "HotKey", limited
    assert f"key '{hot}' holds" in limited["message"], limited["message"]
    assert "bound" in limited["message"] or "longer than the 4 s target" in limited["message"], limited["message"]
    warnings = events(kube, "ScalingLimited")
    assert any(f"key '{hot}'" in message for message in warnings)
    assert not any(key_name(0) in message for message in warnings), warnings
    peak = max(replicas * workers for replicas, workers in record)
    assert peak <= 2 * 4, (
        f"grew more than one step past the starting 1 x 4 although one key holds the backlog: {record}"
    )
    assert resource_now["status"]["pods"]["busiestKey"] == hot
    assert key_name(0) not in str(resource_now["status"]), "a key in status, readable by the view role"


def test_a_blocked_poison_key_gives_scaling_limited_and_no_catchup(kube, broker, tmp_path):
    topic = "pods-poison"
    create_topics(broker.bootstrap, [topic], 2)
    produce_keyed(broker.bootstrap, topic, 3_000, 30, seed=5, extra_config=EXACT_END_OFFSETS)
    poison = key_name(7)
    with operator(kube.url):
        body = resource(
            "poison",
            broker.bootstrap,
            topic,
            retry={"maxAttempts": 2, "initialBackoffSeconds": 0.05, "maxBackoffSeconds": 0.2, "onExhausted": "block"},
            catchup={
                "enabled": True,
                "image": "registry.example/ledger-spark:1.0",
                "triggerDrainSeconds": 60,
                "executors": 1000,
                "confirmPolls": 1,
            },
        )
        body["spec"]["handler"]["env"].append({"name": "KEYORDER_EXAMPLE_POISON_KEY", "value": poison})
        kube.create(CR, body)
        with LocalKubelet(kube, "poison", tmp_path) as kubelet:
            # other limits may come and go while the light keys drain (the last keys of a nearly
            # drained partition can look hot); the blocked key must be named once it is blocked
            wait_for(
                lambda: condition_entry(kube.get(CR, "poison"), "ScalingLimited").get("reason") == "BlockedKey",
                60,
                "ScalingLimited with reason BlockedKey",
            )
            wait_for_polls(kube, "poison", 3)  # more polls (confirmPolls is 1): none may start a catch-up
            resource_now = kube.get(CR, "poison")
            assert not kubelet.crashed(), kubelet.crashed()
    limited = condition_entry(resource_now, "ScalingLimited")
    assert limited["reason"] == "BlockedKey", limited
    assert f"{topic}[" in limited["message"] and "cannot drain" in limited["message"]
    assert resource_now["status"]["limit"] == limited["message"]
    assert condition(resource_now, "CatchingUp") in (None, "False")
    assert not kube.list("batch/v1/jobs", "default"), "a catch-up Job was started behind a blocked key"
