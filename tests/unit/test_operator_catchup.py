"""Pure catch-up decisions of the operator: the trigger, the fence, the Job's outcome and spec."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from keyorder.catchup.exits import RUNTIME, Refusal, RefusalKind
from keyorder.catchup.memory import executor_memory_overhead_mib
from keyorder_operator.builders import build_catchup_job, build_deployment, catchup_job_name
from keyorder_operator.catchup import (
    CatchupGate,
    CatchupRun,
    JobState,
    Phase,
    catchup_pods_left,
    catchup_verdict,
    fence_argument,
    fence_from_end_offsets,
    job_refusal,
    job_state,
    largest_size,
    projected_drain_seconds,
    refusal_detail,
)
from keyorder_operator.policy import Limited, LimitKind, Observation, ScalingLimits, Size
from keyorder_operator.spec import InvalidSpec, parse_spec

LIMITS = ScalingLimits(max_replicas=None, max_workers=64, initial_workers=16)


def test_largest_size_is_the_partition_cap_times_max_workers() -> None:
    assert largest_size(LIMITS, 8) == Size(8, 64)
    assert largest_size(ScalingLimits(max_replicas=3, max_workers=10, initial_workers=4), 8) == Size(3, 10)
    assert largest_size(LIMITS, 0) == Size(0, 0)


@pytest.mark.parametrize(
    ("lag", "arrivals", "rate", "expected"),
    [
        (51_200, 0.0, 512.0, 100.0),  # 8 x 64 workers at 1 msg/s: 512 msg/s
        (51_200, 256.0, 512.0, 200.0),  # arrivals eat half of it
        (51_200, 600.0, 512.0, math.inf),  # arrivals outpace the largest size
    ],
)
def test_projected_drain_time(lag, arrivals, rate, expected) -> None:
    assert projected_drain_seconds(lag, rate, arrivals) == expected


# 8 x 64 pod workers at 1 msg/s = 512 msg/s; Spark: 4 executors x 2 cores x min(2000, 16 x 1) = 128 msg/s
GATE = CatchupGate(enabled=True, trigger_seconds=99, executors=4, executor_cores=2, per_core_rate=2000, confirm_polls=1)
SLOW = Observation(lag=51_200, partitions=8, arrival_rate=0.0)


def verdict(gate=GATE, observation=SLOW, rate=1.0, limited=None, votes=0, ended=None, now=10_000.0):
    return catchup_verdict(gate, observation, rate, LIMITS, limited, votes, ended, now)


def test_catchup_that_would_not_beat_the_pods_does_not_start_and_says_so() -> None:
    result = verdict()
    assert result.start is None and result.votes == 0
    assert result.waiting == (
        "lag 51200: draining at the largest size (8 pods x 64 workers at 1.0 msg/s each) would take 1.7 min, "
        "over the catch-up trigger 1.6 min; no catch-up: Spark would reach about 128 msg/s (4 executors x 2 cores), "
        "not more than the pods' 512 msg/s"
    )


def test_catchup_starts_when_spark_wins_past_the_threshold() -> None:
    gate = replace(GATE, executors=64)  # 64 x 2 x 16 = 2,048 msg/s > 512
    result = verdict(gate)
    assert (
        result.start is not None and "Spark would reach about 2,048 msg/s against the pods' 512 msg/s" in result.start
    )
    assert verdict(replace(gate, trigger_seconds=100)).start is None  # 100 s at the largest size: the pods suffice
    assert verdict(replace(gate, enabled=False)).start is None
    assert verdict(gate, rate=None).start is None  # per-worker rate unknown: never
    hopeless = Observation(lag=10, partitions=8, arrival_rate=10_000.0)
    assert "never (arrivals outpace it)" in verdict(replace(gate, trigger_seconds=3600), hopeless).start


def test_catchup_needs_consecutive_winning_polls() -> None:
    gate = replace(GATE, executors=64, confirm_polls=3)
    first = verdict(gate)
    second = verdict(gate, votes=first.votes)
    third = verdict(gate, votes=second.votes)
    assert (first.start, second.start) == (None, None)
    assert "confirming: poll 2 of 3" in second.waiting
    assert third.start is not None
    assert verdict(gate, observation=replace(SLOW, lag=10), votes=2).votes == 0, "a poll that does not win resets"


def test_catchup_never_starts_while_a_blocked_key_pins_the_lag() -> None:
    blocked = Limited(LimitKind.BLOCKED_KEY, "scaling cannot help: a blocked key holds ...")
    result = verdict(replace(GATE, executors=64), limited=blocked)
    assert result.start is None and "a blocked key would fail the Job too" in result.waiting


def test_catchup_waits_for_the_cooldown_after_a_hand_over() -> None:
    gate = replace(GATE, executors=64, cooldown_seconds=600)
    assert "cooling down for 5.0 min more" in verdict(gate, ended=9_700.0, now=10_000.0).waiting
    assert verdict(gate, ended=9_300.0, now=10_000.0).start is not None


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
                "image": "reg/orders-spark:1",
                "master": "spark://spark-master:7077",
                "executors": 6,
                "keyPartitions": 96,
                "backoffLimit": 1,
                "sparkConf": {"spark.kubernetes.namespace": "shop", "spark.authenticate.secret": "s3"},
            },
        }
    )
    owner = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}}
    job = build_catchup_job(spec, owner, catchup_job_name("orders", 1700000000.7), "orders:0=10")
    assert job["metadata"]["name"] == "orders-catchup-1700000000"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "reg/orders-spark:1"  # the catch-up image, never the handler's (no Java)
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
        "spark.authenticate.secret=s3",  # the cluster's shared secret (the spec check requires it on spark://)
        "--spark-conf",
        "spark.executor.cores=1",  # the verdict's executorCores (the default 1) reach Spark
        "--spark-conf",
        "spark.executor.instances=6",
        "--spark-conf",
        "spark.executor.memoryOverhead=913m",  # 384 MiB + a task's Python workers (memory.task_python_mib(64): 529)
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


@pytest.mark.parametrize(
    ("drivers", "executors", "expected"),
    [
        (0, 0, None),
        (1, 0, "Job j failed; waiting for 1 driver pods of Job j to stop"),
        (0, 3, "Job j failed; waiting for 3 executor pods of Job j to stop"),
        (1, 2, "Job j failed; waiting for 1 driver pods and 2 executor pods of Job j to stop"),
    ],
)
def test_the_pods_resume_only_when_neither_the_driver_nor_an_executor_of_the_job_is_left(
    drivers, executors, expected
) -> None:
    waiting = catchup_pods_left("j", JobState.FAILED, drivers, executors)
    assert waiting == expected or (expected is not None and waiting is not None and waiting.startswith(expected))


def test_an_enabled_catchup_needs_its_own_image_and_says_why() -> None:
    """The handler image is the runtime image plus the handler: no Java, no PySpark. A Job from it exited 2
    after the pods were already stopped; so an enabled catch-up without an image is refused, naming the field."""
    base = {
        "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "g"},
        "handler": {"image": "reg/orders:1", "handler": "orders.handler:handle"},
    }
    with pytest.raises(InvalidSpec) as refused:
        parse_spec({**base, "catchup": {"enabled": True}})
    (path, message), *_ = refused.value.problems
    assert path == "spec.catchup"
    assert "spec.catchup.image is required when spec.catchup.enabled" in message
    assert "no Java/PySpark" in message and "`catchup` target" in message
    assert parse_spec({**base, "catchup": {"enabled": False}}).catchup.image is None  # off: no image needed
    disabled = parse_spec(base)
    with pytest.raises(ValueError, match=r"spec\.catchup\.image is required"):  # never the handler's image
        build_catchup_job(disabled, {"metadata": {"name": "o", "namespace": "shop", "uid": "u"}}, "o-1", "o:0=1")


def test_a_job_refused_at_start_fails_at_once_and_names_its_image_when_the_runtime_is_the_cause() -> None:
    """Exit 2 is keyorder catchup refusing its settings or its runtime (no PySpark/Java: the handler image),
    exit 3 a state of the group that passes, both before it touched the group: the Job fails on them at once,
    whatever backoffLimit says, so the pods resume now; the driver's termination message says which, and the
    outcome names the spec field to change (the image only when the runtime was the cause)."""
    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "g"},
            "handler": {"image": "reg/orders:1", "handler": "orders.handler:handle"},
            "catchup": {"enabled": True, "image": "reg/orders:1", "backoffLimit": 3},
        }
    )
    job = build_catchup_job(spec, {"metadata": {"name": "o", "namespace": "shop", "uid": "u"}}, "o-catchup-1", "o:0=1")
    assert job["spec"]["podFailurePolicy"] == {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "catchup", "operator": "In", "values": [2, 3]}}
        ]
    }
    assert job["spec"]["template"]["spec"]["containers"][0]["name"] == "catchup"

    def finished(reason: str) -> dict:
        condition = {"type": "Failed", "status": "True", "reason": reason}
        return {**job, "status": {"conditions": [condition]}}

    def driver(code: int, message: str) -> dict:
        terminated = {"exitCode": code, "message": message}
        return {"status": {"containerStatuses": [{"name": "catchup", "state": {"terminated": terminated}}]}}

    no_runtime = Refusal(RefusalKind.SETTINGS, "pyspark is not installed", RUNTIME)
    refused = job_refusal(finished("PodFailurePolicy"), [driver(2, no_runtime.message())])
    assert refused == no_runtime and job_state(finished("PodFailurePolicy")) is JobState.FAILED
    told = refusal_detail(refused, "reg/orders:1", "o-catchup-1")
    assert "image reg/orders:1 cannot run keyorder catchup (pyspark is not installed)" in told
    assert "spec.catchup.image" in told and "`catchup` target" in told
    secret = Refusal(RefusalKind.SETTINGS, "a spark://h master needs spark.authenticate.secret", "--spark-conf")
    told = refusal_detail(job_refusal(finished("PodFailurePolicy"), [driver(2, secret.message())]), "i", "j")
    assert "change spec.catchup.sparkConf" in told and "image" not in told
    gone = job_refusal(finished("PodFailurePolicy"), [])  # the driver pod gone: refused, reason in the logs
    assert gone is not None and gone.kind is RefusalKind.SETTINGS
    assert "kubectl logs job/j" in refusal_detail(gone, "i", "j")
    assert job_refusal(finished("DeadlineExceeded"), [driver(1, "")]) is None
    assert job_refusal(finished("BackoffLimitExceeded"), [driver(1, "")]) is None
    assert job_refusal(job, []) is None and job_refusal(None, []) is None


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
            "catchup": {"enabled": True, "master": "k8s://https://kubernetes.default.svc", "image": "reg/spark:1"},
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
    # the hand-over waits for the executors by their Job's name (Spark gives them no job-name label), also
    # when a sparkConf replaces the template
    assert template["metadata"]["labels"]["keyorder.dev/catchup-job"] == "o-catchup-1"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    spark = dict(value.split("=", 1) for value in args if value.startswith("spark."))
    assert spark["spark.kubernetes.executor.label.keyorder.dev/catchup-job"] == "o-catchup-1"
    kubernetes_validate.validate(template, "1.30", strict=True)
    kubernetes_validate.validate(job, "1.30", strict=True)


KUBELET_FIELDS = {"POD_IP": "10.1.2.3", "POD_NAME": "orders-catchup-1700000000-abcde"}
"""What the kubelet resolves the Job's ``fieldRef`` variables to (any values do)."""


def as_the_kubelet_starts_it(container: dict) -> tuple[list[str], dict[str, str]]:
    """The container's arguments and environment as the process gets them: ``fieldRef`` variables
    resolved and ``$(NAME)`` in the arguments expanded, as the kubelet does."""
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    fields = [item["name"] for item in container["env"] if "fieldRef" in item.get("valueFrom", {})]
    env |= {name: KUBELET_FIELDS[name] for name in fields}
    args = list(container["args"])
    for name, value in env.items():
        args = [arg.replace(f"$({name})", value) for arg in args]
    return args, env


@pytest.mark.parametrize(
    "catchup",
    [
        {"enabled": True, "master": "local[4]", "taskWorkers": 32, "image": "reg/spark:1"},
        {
            "enabled": True,
            "image": "reg/spark:1",
            "master": "spark://spark-master:7077",
            "executors": 6,
            "keyPartitions": 96,
            "sparkConf": {"spark.sql.shuffle.partitions": "256", "spark.authenticate.secret": "s3"},
        },
        {
            "enabled": True,
            "master": "k8s://https://kubernetes.default.svc",
            "image": "reg/spark:1",
            "serviceAccountName": "spark-driver",
        },
    ],
    ids=["local", "standalone", "k8s"],
)
def test_the_catchup_jobs_command_is_what_keyorder_catchup_parses_into_the_spec(catchup) -> None:
    """The contract between the operator and ``keyorder catchup`` (the pods' side has one with
    ``load_run_config``): the Job's arguments and environment, run through the image's entrypoint and the
    real parser and settings model, give the job the spec's range, commit mode, Spark settings, Kafka
    and handler settings. A flag renamed on either side, or a setting the job would ignore, fails here."""
    from keyorder.catchup.entrypoint import spark_command
    from keyorder.catchup.plan import CommitMode
    from keyorder.catchup.positions import Position, PositionKind
    from keyorder.catchup.settings import BATCH_VARIABLE, ENFORCED_SPARK_SETTINGS, CatchupConfig, environment_problem
    from keyorder.cli import build_parser
    from keyorder.config import env_name, load_config

    spec = parse_spec(
        {
            "kafka": {
                "bootstrapServers": "kafka-0:9092,kafka-1:9092",
                "topics": ["orders", "refunds"],
                "groupId": "orders-g",
                "propertiesSecretRef": {"name": "kafka-client"},
            },
            "handler": {
                "image": "reg/orders:1",
                "handler": "orders.handler:handle",
                "env": [{"name": "ORDERS_DB", "value": "db:5432"}],
            },
            "ordering": "key",
            "retry": {"maxAttempts": 7, "initialBackoffSeconds": 0.5, "onExhausted": "dlq", "dlqTopic": "orders.dlq"},
            "catchup": catchup,
        }
    )
    fence = fence_from_end_offsets((("orders", 0, 10), ("orders", 1, 20), ("refunds", 0, 5)))
    owner = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}}
    job = build_catchup_job(spec, owner, catchup_job_name("orders", 1700000000), fence_argument(fence))
    args, env = as_the_kubelet_starts_it(job["spec"]["template"]["spec"]["containers"][0])

    assert spark_command(args, env) is None, "the catch-up image's entrypoint would not hand this to keyorder"
    parsed = build_parser("catchup").parse_args(args)
    assert parsed.command == "catchup" and not parsed.plan
    config = load_config(CatchupConfig, vars(parsed), environ=env)

    assert config.start_position() == Position(PositionKind.COMMITTED)
    assert config.until_position() == Position(
        PositionKind.OFFSETS, offsets={("orders", 0): 10, ("orders", 1): 20, ("refunds", 0): 5}
    )
    assert config.commit is CommitMode.AUTO  # the fence is committed: the pods resume from it
    assert config.master == spec.catchup.master
    assert config.key_partitions == spec.catchup.key_partitions
    assert config.task_workers == spec.catchup.task_workers
    spark = config.spark_settings()
    assert {key: spark[key] for key in spec.catchup.spark_conf} == spec.catchup.spark_conf
    assert {key: spark[key] for key in ENFORCED_SPARK_SETTINGS} == ENFORCED_SPARK_SETTINGS
    if spec.catchup.master.startswith("local"):
        assert "spark.executor.instances" not in spark
    else:
        assert spark["spark.executor.instances"] == str(spec.catchup.executors)
        assert spark["spark.executor.cores"] == str(spec.catchup.executor_cores)  # what the verdict counts
        if "spark.executor.memoryOverhead" not in spec.catchup.spark_conf:  # a task's Python workers per core fit
            overhead = executor_memory_overhead_mib(spec.catchup.executor_cores, config.task_lookahead_mb)
            assert spark["spark.executor.memoryOverhead"] == f"{overhead}m"
    if spec.catchup.master.startswith("k8s://"):
        assert spark["spark.kubernetes.container.image"] == "reg/spark:1"
        assert spark["spark.kubernetes.namespace"] == "shop"
        assert spark["spark.kubernetes.executor.request.cores"] == str(spec.catchup.executor_cores)
        assert spark["spark.driver.host"] == KUBELET_FIELDS["POD_IP"]
        assert spark["spark.driver.bindAddress"] == KUBELET_FIELDS["POD_IP"]  # not every interface
        assert spark["spark.kubernetes.driver.pod.name"] == KUBELET_FIELDS["POD_NAME"]
        assert spark["spark.kubernetes.authenticate.driver.serviceAccountName"] == "spark-driver"
    elif spec.catchup.master.startswith("spark://"):
        assert spark["spark.executorEnv.ORDERS_DB"] == "db:5432"  # standalone executors get the handler's env

    assert (config.topics, config.group_id, config.bootstrap_servers) == (
        ["orders", "refunds"],
        "orders-g",
        "kafka-0:9092,kafka-1:9092",
    )
    assert str(config.kafka_properties_file) == "/etc/keyorder/kafka/client.properties"
    assert (config.handler, config.ordering.value) == ("orders.handler:handle", "key")
    assert (config.max_attempts, config.retry_initial_backoff) == (7, 0.5)
    assert (config.on_exhausted.value, config.dlq_topic) == ("dlq", "orders.dlq")
    # the batch size is read too: environment_problem refuses it above 1 (set to 1, envFrom cannot change it)
    assert env["KEYORDER_BATCH_MAX_MESSAGES"] == "1"
    settings = {env_name(field) for field in CatchupConfig.model_fields} | {BATCH_VARIABLE}
    ignored = sorted(name for name in env if name.startswith("KEYORDER_") and name not in settings)
    assert ignored == [], f"the Job sets variables keyorder catchup ignores: {ignored}"
    assert environment_problem(env) is None, "the Job's own environment is refused by the job"


@pytest.mark.parametrize(
    ("master", "limit", "cores", "job_master"),
    [
        ("local[*]", None, 8, "local[8]"),  # no CPU limit: the cores the verdict counts, not the node's
        ("local[*]", "2", 2, "local[*]"),  # keyorder catchup reads the limit from its cgroup
        ("local[*]", "1500m", 2, "local[*]"),
        ("local[3]", None, 3, "local[3]"),
        ("local[3,2]", None, 3, "local[3,2]"),
        ("local", None, 1, "local"),
        ("k8s://https://kubernetes.default.svc", "2", 8, "k8s://https://kubernetes.default.svc"),
    ],
)
def test_the_verdict_counts_the_cores_the_job_really_gets(master: str, limit, cores: int, job_master: str) -> None:
    from keyorder_operator.catchup import spark_cores

    assert spark_cores(master, 4, 2, limit) == (cores, job_master)


def test_a_local_catchup_job_without_a_cpu_limit_runs_on_the_cores_the_verdict_counts() -> None:
    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "g"},
            "handler": {"image": "reg/orders:1", "handler": "orders.handler:handle"},
            "catchup": {"enabled": True, "image": "reg/spark:1", "executors": 3, "executorCores": 2},
        }
    )
    job = build_catchup_job(spec, {"metadata": {"name": "o", "namespace": "shop", "uid": "u"}}, "o-catchup-1", "o:0=1")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--master") + 1] == "local[6]"  # the old Job ran local[*]: every core of the node
