"""Pure catch-up decisions of the operator: the trigger, the fence, the Job's outcome and spec."""

from __future__ import annotations

import math

import pytest

from keyorder_operator.builders import build_catchup_job, build_deployment, catchup_job_name
from keyorder_operator.catchup import (
    CatchupRun,
    JobState,
    Phase,
    catchup_trigger,
    fence_argument,
    fence_from_end_offsets,
    job_state,
    largest_size,
    projected_drain_seconds_at_max,
)
from keyorder_operator.policy import Observation, ScalingLimits, Size
from keyorder_operator.spec import parse_spec

LIMITS = ScalingLimits(max_replicas=None, max_workers=64, initial_workers=16)


def test_largest_size_is_the_partition_cap_times_max_workers() -> None:
    assert largest_size(LIMITS, 8) == Size(8, 64)
    assert largest_size(ScalingLimits(max_replicas=3, max_workers=10, initial_workers=4), 8) == Size(3, 10)
    assert largest_size(LIMITS, 0) == Size(0, 0)


@pytest.mark.parametrize(
    ("lag", "arrivals", "rate", "expected"),
    [
        (51_200, 0.0, 1.0, 100.0),  # 8 x 64 workers at 1 msg/s: 512 msg/s
        (51_200, 256.0, 1.0, 200.0),  # arrivals eat half of it
        (51_200, 600.0, 1.0, math.inf),  # arrivals outpace the largest size
        (51_200, 0.0, None, None),  # per-worker rate not learned yet
        (None, 0.0, 1.0, None),  # lag unknown
    ],
)
def test_projected_drain_time_at_the_largest_size(lag, arrivals, rate, expected) -> None:
    observation = Observation(lag=lag, partitions=8, arrival_rate=arrivals)
    assert projected_drain_seconds_at_max(observation, rate, Size(8, 64)) == expected


def test_trigger_fires_only_past_the_threshold_and_explains_the_numbers() -> None:
    observation = Observation(lag=51_200, partitions=8, arrival_rate=0.0)
    assert catchup_trigger(True, 99, observation, 1.0, LIMITS) == (
        "lag 51200: draining at the largest size (8 pods x 64 workers at 1.0 msg/s each) would take 1.7 min, "
        "over the catch-up trigger 1.6 min"
    )
    assert catchup_trigger(True, 100, observation, 1.0, LIMITS) is None
    assert catchup_trigger(False, 99, observation, 1.0, LIMITS) is None
    assert catchup_trigger(True, 99, observation, None, LIMITS) is None
    hopeless = Observation(lag=10, partitions=8, arrival_rate=10_000.0)
    assert "never (arrivals outpace it)" in catchup_trigger(True, 3600, hopeless, 1.0, LIMITS)


def test_fence_round_trips_to_the_until_argument() -> None:
    fence = fence_from_end_offsets((("orders", 1, 20), ("orders", 0, 10), ("audit", 0, 5)))
    assert fence_argument(fence) == "audit:0=5,orders:0=10,orders:1=20"


def test_run_state_survives_the_status_round_trip() -> None:
    run = CatchupRun(Phase.STOPPING_PODS, "x-catchup-1", {"t:0": 5}, 1.5, 3)
    assert CatchupRun.from_status({"catchup": run.to_status()}) == run
    assert CatchupRun.from_status({"catchup": run.to_status()}).running().phase is Phase.RUNNING
    assert CatchupRun.from_status({}) is None


@pytest.mark.parametrize(
    ("job", "state"),
    [
        (None, JobState.MISSING),
        ({"status": {"active": 1}}, JobState.ACTIVE),
        ({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}, JobState.SUCCEEDED),
        ({"status": {"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}}, JobState.ACTIVE),  # interim
        ({"status": {"conditions": [{"type": "FailureTarget", "status": "True"}]}}, JobState.ACTIVE),  # interim
        ({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}, JobState.FAILED),
        ({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}, JobState.ACTIVE),
    ],
)
def test_job_state_reads_the_job_controllers_conditions(job, state) -> None:
    assert job_state(job) is state


def test_catchup_job_runs_keyorder_catchup_with_the_pods_settings() -> None:
    spec = parse_spec(
        {
            "kafka": {
                "bootstrapServers": "kafka:9092",
                "topics": ["orders"],
                "groupId": "g",
                "propertiesSecretRef": {"name": "kafka-client"},
            },
            "handler": {
                "image": "reg/orders:1",
                "handler": "orders.handler:handle",
                "env": [{"name": "ORDERS_DB", "value": "db:5432"}],
            },
            "retry": {"maxAttempts": 7, "onExhausted": "dlq"},
            "catchup": {
                "enabled": True,
                "master": "spark://spark-master:7077",
                "executors": 6,
                "keyPartitions": 96,
                "backoffLimit": 1,
                "sparkConf": {"spark.kubernetes.namespace": "shop"},
            },
        }
    )
    owner = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}}
    job = build_catchup_job(spec, owner, catchup_job_name("orders", 1700000000.7), "orders:0=10")
    assert job["metadata"]["name"] == "orders-catchup-1700000000"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "reg/orders:1"  # no catch-up image: the handler's
    assert container["args"] == [
        "catchup",
        "--start",
        "committed",
        "--until",
        "orders:0=10",
        "--commit",
        "auto",
        "--master",
        "spark://spark-master:7077",
        "--key-partitions",
        "96",
        "--task-workers",
        "16",
        "--spark-conf",
        "spark.executor.instances=6",
        "--spark-conf",
        "spark.executorEnv.ORDERS_DB=db:5432",  # the handler's own variables reach standalone/YARN executors
        "--spark-conf",
        "spark.kubernetes.namespace=shop",
    ]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["KEYORDER_MAX_ATTEMPTS"] == "7" and env["KEYORDER_GROUP_ID"] == "g"
    assert env["KEYORDER_KAFKA_PROPERTIES_FILE"] == "/etc/keyorder/kafka/client.properties"
    assert "KEYORDER_ADMIN_TOKEN_FILE" not in env and "KEYORDER_WORKERS" not in env  # pod-only settings
    assert job["spec"]["backoffLimit"] == 1 and job["spec"]["ttlSecondsAfterFinished"] > 0
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "catchup"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert job["spec"]["activeDeadlineSeconds"] == 6 * 3600 and job["spec"]["podReplacementPolicy"] == "Failed"
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    consumers = build_deployment(spec, owner, 1)["spec"]["selector"]["matchLabels"]
    assert not all(pod_labels.get(key) == value for key, value in consumers.items()), (
        "the consumers' Deployment, Service and PDB would select the Job's pod"
    )


def test_a_k8s_master_gets_a_client_mode_driver_and_its_service_account() -> None:
    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "g"},
            "handler": {"image": "reg/orders:1", "handler": "orders.handler:handle"},
            "catchup": {
                "enabled": True,
                "master": "k8s://https://kubernetes.default.svc",
                "image": "reg/spark:1",
                "serviceAccountName": "spark-driver",
            },
        }
    )
    job = build_catchup_job(spec, {"metadata": {"name": "o", "namespace": "shop", "uid": "u"}}, "o-catchup-1", "o:0=1")
    pod = job["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    for setting in (
        "spark.kubernetes.container.image=reg/spark:1",
        "spark.kubernetes.namespace=shop",
        "spark.driver.host=$(POD_IP)",
        "spark.kubernetes.authenticate.driver.serviceAccountName=spark-driver",
    ):
        assert setting in args
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in pod["containers"][0]["env"]
    assert pod["serviceAccountName"] == "spark-driver" and pod["automountServiceAccountToken"] is True
    # Executors are owned by the driver pod, run as the consumers' account and get the pods' setup.
    assert "spark.kubernetes.driver.pod.name=$(POD_NAME)" in args
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in pod["containers"][0][
        "env"
    ]
    assert "spark.kubernetes.authenticate.executor.serviceAccountName=o" in args
    assert "spark.kubernetes.executor.podTemplateFile=/etc/keyorder/spark/executor-pod-template.json" in args
    assert "spark.kubernetes.executor.podTemplateContainerName=executor" in args
    local = spec.model_copy(update={"catchup": spec.catchup.model_copy(update={"master": "local[*]"})})
    local_pod = build_catchup_job(
        local, {"metadata": {"name": "o", "namespace": "shop", "uid": "u"}}, "o-catchup-1", "o:0=1"
    )["spec"]["template"]["spec"]
    assert local_pod["serviceAccountName"] == "o" and local_pod["automountServiceAccountToken"] is False


def test_job_names_fit_63_characters_and_keep_the_time() -> None:
    assert catchup_job_name("a" * 80, 1700000000) == "a" * 44 + "-catchup-1700000000"
    assert catchup_job_name("ab-" + "c" * 40 + "-" * 5, 1700000000).endswith("c-catchup-1700000000")


def test_k8s_executors_get_the_handler_env_the_kafka_secret_and_the_hardened_context_by_a_pod_template() -> None:
    import json

    import kubernetes_validate

    spec = parse_spec(
        {
            "kafka": {
                "bootstrapServers": "kafka:9092",
                "topics": ["orders"],
                "groupId": "g",
                "propertiesSecretRef": {"name": "kafka-client"},
            },
            "handler": {
                "image": "reg/orders:1",
                "handler": "orders.handler:handle",
                "env": [{"name": "ORDERS_DB", "value": "db:5432"}],
            },
            "catchup": {"enabled": True, "master": "k8s://https://kubernetes.default.svc"},
        }
    )
    job = build_catchup_job(spec, {"metadata": {"name": "o", "namespace": "shop", "uid": "u"}}, "o-catchup-1", "o:0=1")
    pod = job["spec"]["template"]
    template = json.loads(pod["metadata"]["annotations"]["keyorder.dev/executor-pod-template"])
    # The driver reads the template as a file: a downward-API volume of that annotation.
    (volume,) = [v for v in pod["spec"]["volumes"] if "downwardAPI" in v]
    (item,) = volume["downwardAPI"]["items"]
    assert item == {
        "path": "executor-pod-template.json",
        "fieldRef": {"fieldPath": "metadata.annotations['keyorder.dev/executor-pod-template']"},
    }
    mount = {"name": volume["name"], "mountPath": "/etc/keyorder/spark", "readOnly": True}
    assert mount in pod["spec"]["containers"][0]["volumeMounts"]

    executor = template["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in executor["env"]}
    assert env["ORDERS_DB"] == "db:5432" and env["KEYORDER_HANDLER"] == "orders.handler:handle"
    assert env["KEYORDER_KAFKA_PROPERTIES_FILE"] == "/etc/keyorder/kafka/client.properties"
    assert {"name": "kafka-properties", "secret": {"secretName": "kafka-client"}} in template["spec"]["volumes"]
    assert {"name": "kafka-properties", "mountPath": "/etc/keyorder/kafka", "readOnly": True} in executor[
        "volumeMounts"
    ]
    assert executor["securityContext"] == {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert template["spec"]["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert template["spec"]["automountServiceAccountToken"] is False
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] == "keyorder-catchup"  # never a consumer
    kubernetes_validate.validate(template, "1.30", strict=True)
    kubernetes_validate.validate(job, "1.30", strict=True)
