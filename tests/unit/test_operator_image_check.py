"""The catch-up image's pre-flight, decided before the pods stop: the check Job's spec, what its pod is doing,
and the verdict from the Job's outcome and the time (``keyorder_operator.image_check``)."""

from __future__ import annotations

import pytest

from keyorder_operator.builders import (
    IMAGE_CHECK_ANNOTATION,
    build_catchup_job,
    build_deployment,
    build_image_check_job,
    image_check_job_name,
)
from keyorder_operator.catchup import JobState
from keyorder_operator.image_check import (
    IMAGE_CHECK_SECONDS,
    CheckStep,
    ImageCheck,
    checked_status,
    image_check_verdict,
    image_checked,
    pod_state,
)
from keyorder_operator.spec import parse_spec

OWNER = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}}


def spec(handler: str = "orders.handler:handle", **catchup):
    return parse_spec(
        {
            "kafka": {
                "bootstrapServers": "kafka:9092",
                "topics": ["orders"],
                "groupId": "g",
                "propertiesSecretRef": {"name": "kafka-client"},
            },
            "handler": {
                "image": "reg/orders:1",
                "handler": handler,
                "env": [{"name": "ORDERS_DB", "value": "db:5432"}],
            },
            "template": {"spec": {"imagePullSecrets": [{"name": "registry"}], "nodeSelector": {"pool": "batch"}}},
            "catchup": {"enabled": True, "image": "reg/orders-spark:1", **catchup},
        }
    )


def check_job(**catchup):
    return build_image_check_job(spec(**catchup), OWNER, image_check_job_name("orders", 1700000000.4))


def test_the_check_job_runs_the_preflight_in_the_catchup_jobs_image_account_env_and_secrets() -> None:
    job = check_job()
    catchup = build_catchup_job(spec(), OWNER, "orders-catchup-1", "orders:0=10")
    pod, catchup_pod = job["spec"]["template"]["spec"], catchup["spec"]["template"]["spec"]
    container, catchup_container = pod["containers"][0], catchup_pod["containers"][0]
    assert job["metadata"]["name"] == "orders-preflight-1700000000"
    assert container["image"] == catchup_container["image"] == "reg/orders-spark:1"
    assert container["args"] == ["catchup", "--preflight"]
    assert container["env"] == catchup_container["env"]  # KEYORDER_HANDLER and the handler's own variables
    assert {"name": "KEYORDER_HANDLER", "value": "orders.handler:handle"} in container["env"]
    assert container["volumeMounts"] == catchup_container["volumeMounts"]  # the Kafka Secret where the Job has it
    assert pod["volumes"] == catchup_pod["volumes"]
    for field in ("serviceAccountName", "imagePullSecrets", "nodeSelector", "securityContext", "restartPolicy"):
        assert pod[field] == catchup_pod[field], field
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"  # the failed checks reach the pod status
    assert container["resources"]["limits"]["memory"] == "512Mi"
    assert job["spec"]["backoffLimit"] == 0
    assert IMAGE_CHECK_SECONDS < job["spec"]["activeDeadlineSeconds"] <= IMAGE_CHECK_SECONDS + 120
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    assert job["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "catchup-preflight"
    consumers = build_deployment(spec(), OWNER, 1)["spec"]["selector"]["matchLabels"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(key) == value for key, value in consumers.items()), "the consumers would select it"


def test_a_k8s_master_checks_with_the_drivers_account_and_still_no_token() -> None:
    job = check_job(master="k8s://https://kubernetes.default.svc", serviceAccountName="spark-driver")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "spark-driver" and pod["automountServiceAccountToken"] is False


def test_the_digest_names_what_was_checked_not_when() -> None:
    digest = check_job()["metadata"]["annotations"][IMAGE_CHECK_ANNOTATION]
    later = build_image_check_job(spec(), OWNER, image_check_job_name("orders", 1800000000))
    assert later["metadata"]["annotations"][IMAGE_CHECK_ANNOTATION] == digest
    assert check_job(image="reg/orders-spark:2")["metadata"]["annotations"][IMAGE_CHECK_ANNOTATION] != digest
    other_handler = spec(handler="orders.v2:handle")
    moved = build_image_check_job(other_handler, OWNER, "x")["metadata"]["annotations"][IMAGE_CHECK_ANNOTATION]
    assert moved != digest


def test_an_image_counts_as_checked_only_with_the_same_digest() -> None:
    check = ImageCheck("reg/orders-spark:1", "abc", "orders-preflight-1", 100.0)
    status = {"catchupImageChecked": checked_status(check, "2026-11-25T10:00:00Z")}
    assert image_checked(status, "reg/orders-spark:1", "abc")
    assert not image_checked(status, "reg/orders-spark:2", "abc")
    assert not image_checked(status, "reg/orders-spark:1", "def")
    assert not image_checked({}, "reg/orders-spark:1", "abc")


def test_a_check_survives_the_status_round_trip() -> None:
    check = ImageCheck("reg/x:1", "abc", "orders-preflight-1", 100.0, "its pod is waiting: ErrImagePull")
    assert ImageCheck.from_status({"catchupImageCheck": check.to_status()}) == check
    assert ImageCheck.from_status({}) is None


def pod(status: dict, created: str = "2026-11-25T10:00:00Z") -> dict:
    return {"metadata": {"name": "p", "creationTimestamp": created}, "status": status}


def waiting(reason: str, message: str = "", created: str = "2026-11-25T10:00:00Z") -> dict:
    state = {"waiting": {"reason": reason, "message": message}}
    return pod({"phase": "Pending", "containerStatuses": [{"state": state}]}, created)


@pytest.mark.parametrize(
    ("pods", "state"),
    [
        ([], None),
        (
            [waiting("ImagePullBackOff", 'Back-off pulling image "reg/x:1"')],
            'its pod is waiting: ImagePullBackOff (Back-off pulling image "reg/x:1")',
        ),
        ([waiting("CreateContainerConfigError")], "its pod is waiting: CreateContainerConfigError"),
        (
            [
                pod(
                    {
                        "phase": "Failed",
                        "containerStatuses": [
                            {
                                "state": {
                                    "terminated": {
                                        "exitCode": 2,
                                        "reason": "Error",
                                        "message": "ok   java: Java 17\nFAIL pyspark: No module named 'pyspark'\n"
                                        "FAIL handler: module 'orders' not found\n",
                                    }
                                }
                            }
                        ],
                    }
                )
            ],
            "its pod exited with code 2: pyspark: No module named 'pyspark'; handler: module 'orders' not found",
        ),
        (
            [pod({"containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]})],
            "its pod exited with code 137 (OOMKilled)",
        ),
        (
            [
                pod(
                    {
                        "phase": "Pending",
                        "conditions": [
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "Unschedulable",
                                "message": "0/3 nodes are available",
                            }
                        ],
                    }
                )
            ],
            "its pod is not scheduled: Unschedulable (0/3 nodes are available)",
        ),
        ([pod({"phase": "Running"})], "its pod is Running"),
        (  # the newest pod tells
            [
                waiting("ErrImagePull", created="2026-11-25T10:00:00Z"),
                waiting("ImagePullBackOff", created="2026-11-25T10:01:00Z"),
            ],
            "its pod is waiting: ImagePullBackOff",
        ),
    ],
)
def test_the_pods_state_says_why_it_waits_or_how_it_ended(pods: list[dict], state: str | None) -> None:
    assert pod_state(pods) == state


CHECK = ImageCheck("reg/x:1", "abc", "orders-preflight-1", 1000.0)


def test_a_succeeded_job_passes_the_image() -> None:
    verdict = image_check_verdict(CHECK, JobState.SUCCEEDED, "its pod exited with code 0", 1042.0)
    assert verdict.step is CheckStep.PASSED
    assert verdict.message == (
        "image reg/x:1 passed its pre-flight (Job orders-preflight-1: Java, PySpark and the handler) in 42 s"
    )


def test_a_failed_job_fails_the_image_naming_it_and_why() -> None:
    verdict = image_check_verdict(CHECK, JobState.FAILED, "its pod exited with code 2: java: not found", 1010.0)
    assert verdict.step is CheckStep.FAILED
    assert verdict.message == (
        "image reg/x:1 failed its pre-flight (Job orders-preflight-1): its pod exited with code 2: java: not found"
    )
    gone = image_check_verdict(CHECK, JobState.FAILED, None, 1010.0)  # its pod deleted already
    assert "kubectl logs job/orders-preflight-1" in gone.message
    assert image_check_verdict(CHECK, JobState.MISSING, None, 1010.0).step is CheckStep.FAILED


def test_a_check_waits_until_its_bound_then_fails_with_what_its_pod_did() -> None:
    pulling = "its pod is waiting: ImagePullBackOff"
    verdict = image_check_verdict(CHECK, JobState.ACTIVE, pulling, 1000.0 + IMAGE_CHECK_SECONDS - 1)
    assert verdict.step is CheckStep.WAIT
    assert "checking image reg/x:1 before stopping the pods" in verdict.message
    assert "299 s of at most 5.0 min): its pod is waiting: ImagePullBackOff; the pods keep running" in verdict.message
    timed_out = image_check_verdict(CHECK, JobState.ACTIVE, pulling, 1000.0 + IMAGE_CHECK_SECONDS)
    assert timed_out.step is CheckStep.FAILED
    assert timed_out.message == (
        "image reg/x:1 did not pass its pre-flight (Job orders-preflight-1) within 5.0 min: "
        "its pod is waiting: ImagePullBackOff"
    )
    # the pod gone by then (deleted, evicted): what it did at the last poll still tells why
    remembered = CHECK.seen(pulling)
    assert remembered.seen(None).waiting == pulling
    assert pulling in image_check_verdict(remembered, JobState.ACTIVE, None, 1000.0 + IMAGE_CHECK_SECONDS).message
    no_pod = image_check_verdict(CHECK, JobState.ACTIVE, None, 1000.0 + IMAGE_CHECK_SECONDS)
    assert "no pod was created for it (kubectl describe job/orders-preflight-1)" in no_pod.message
