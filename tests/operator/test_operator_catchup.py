"""Catch-up hand-over by the real kopf operator on the emulator, with lag from the real broker.

The emulator runs no Job controller and no kubelet: the test plays the Jobs' part (the image's
pre-flight Job passes or fails, its pod waits for an image pull; the catch-up Job commits the fence as
``keyorder catchup`` would, then gets its Complete or Failed condition); the operator's part (image
check, trigger, fence, scale to 0, Job spec, resume, conditions, Events) is asserted.
"""

from __future__ import annotations

import json
import threading

import pytest

from keyorder.catchup.exits import RUNTIME, Refusal, RefusalKind
from keyorder.catchup.memory import local_pod_memory_mib
from keyorder.devtools.loadgen import create_topics, produce_keyed
from tests.operator.harness import CR, wait_for, wait_for_polls
from tests.operator.kubelet import consumer_labels, create_pod
from tests.operator.test_operator_e2e import (
    EXACT_END_OFFSETS,
    commit_group,
    condition,
    condition_entry,
    consumer_resource,
    events,
    operator,
    replicas,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]
CATCHUP = {
    "enabled": True,
    "triggerDrainSeconds": 60,
    "image": "registry.example/ledger-spark:1.0",
    "master": "local[4]",
    "resources": {"requests": {"cpu": "4"}},
}
CATCHUP_CONFIRM_POLLS = 3
"""spec.catchup.confirmPolls by default: polls in a row a hand-over must win before it starts."""


def backlog(broker, topic: str) -> dict[int, int]:
    create_topics(broker.bootstrap, [topic], 4)
    produced = produce_keyed(broker.bootstrap, topic, 8_000, 500, extra_config=EXACT_END_OFFSETS)
    commit_group(broker.bootstrap, f"g-{topic}", topic, dict.fromkeys(range(4), 0))
    return produced.end_offsets


def resource(broker, name: str, topic: str, **catchup) -> dict:
    return consumer_resource(
        name,
        broker.bootstrap,
        topic,
        catchup={**CATCHUP, **catchup},
        workers={"min": 1, "initial": 1, "max": 2},
        replicas={"min": 1, "max": 2},
    )


def catchup_status(kube, name: str) -> dict:
    return (kube.get(CR, name).get("status") or {}).get("catchup") or {}


def learned_rate(context, name: str) -> float | None:
    """The per-worker rate the operator's policy remembers (``None`` until it knows one)."""
    return (context.poll_memory("default", name).autoscaler or {}).get("perWorkerRate")


def teach_slow_workers(context, name: str) -> None:
    """Put a learned 1 msg/s per worker into the operator's memory, as slow pods would have taught the policy
    (once it has a memory)."""
    memory = context.poll_memory("default", name)
    if memory.autoscaler is not None:
        memory.autoscaler = {**memory.autoscaler, "perWorkerRate": 1.0}


def image_check_status(kube, name: str) -> dict:
    return (kube.get(CR, name).get("status") or {}).get("catchupImageCheck") or {}


def preflight_jobs(kube, name: str) -> list[dict]:
    """The image pre-flight Jobs of OrderedConsumer ``name`` (recognised by their label)."""
    return [
        job
        for job in kube.list("batch/v1/jobs", "default")
        if job["metadata"]["labels"].get("app.kubernetes.io/component") == "catchup-preflight"
        and job["metadata"]["labels"].get("app.kubernetes.io/instance") == name
    ]


def catchup_jobs(kube, name: str) -> list[str]:
    """The names of the catch-up Jobs (not the pre-flight ones) of OrderedConsumer ``name``."""
    return [
        job["metadata"]["name"]
        for job in kube.list("batch/v1/jobs", "default")
        if job["metadata"]["labels"].get("app.kubernetes.io/component") == "catchup"
        and job["metadata"]["labels"].get("app.kubernetes.io/instance") == name
    ]


def pass_image_check(kube, name: str) -> None:
    """Play the pre-flight Job's part when one is under way: it succeeds (the image runs the pre-flight)."""
    job_name = image_check_status(kube, name).get("jobName")
    job = kube.get("batch/v1/jobs", job_name) if job_name else None
    if job is not None and not (job.get("status") or {}).get("conditions"):
        finish_job(kube, job_name, "Complete")


def slow_workers_until_triggered(kube, context, name: str) -> dict:
    """Teach slow workers until catch-up starts, passing the image's pre-flight when one runs; its
    ``status.catchup``.

    Repeated because the operator's own status patches may overwrite the first one.
    """

    def started() -> dict:
        found = catchup_status(kube, name)
        if not found:
            teach_slow_workers(context, name)
            pass_image_check(kube, name)
        return found

    return wait_for(started, 40, f"catch-up of {name} to start", interval=0.2)


def slow_workers_until_checking(kube, context, name: str) -> dict:
    """Teach slow workers until a catch-up would start and the image's pre-flight begins; its status."""

    def checking() -> dict:
        found = image_check_status(kube, name)
        if not found:
            teach_slow_workers(context, name)
        return found

    return wait_for(checking, 40, f"the image check of {name} to start", interval=0.2)


class ReplicaWatch:
    """Reads a Deployment's ``spec.replicas`` every 50 ms on a thread: every value it held while watched."""

    def __init__(self, kube, name: str) -> None:
        self.kube, self.name = kube, name
        self.seen: set[int | None] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.seen.add(replicas(self.kube, self.name))

    def __enter__(self) -> ReplicaWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(10)  # hang guard


def finish_job(kube, job_name: str, condition_type: str, reason: str = "Test") -> None:
    kube.patch(
        "batch/v1/jobs",
        job_name,
        {
            "status": {
                "conditions": [
                    {"type": condition_type, "status": "True", "reason": reason, "message": "set by the test"}
                ]
            }
        },
        subresource="status",
    )


def test_a_hopeless_backlog_hands_over_to_a_catchup_job_and_back(kube, broker):
    topic = "okc-catchup"
    ends = backlog(broker, topic)
    with operator(kube.url) as context:
        kube.create(CR, resource(broker, "payments", topic))
        # a consumer pod (the emulator runs no kubelet: the test creates it) that is slow to stop
        create_pod(kube, "payments-0", consumer_labels("payments"), "consumer", "x")
        started = slow_workers_until_triggered(kube, context, "payments")

        assert started["fence"] == {f"{topic}:{p}": offset for p, offset in ends.items()}
        wait_for(lambda: replicas(kube, "payments") == 0, 20, "the Deployment scaled to 0")
        wait_for(
            lambda: (
                "waiting for 1 consumer pods to stop"
                in condition_entry(kube.get(CR, "payments"), "CatchingUp").get("message", "")
            ),
            20,
            "CatchingUp to wait for the consumer pod",
        )
        wait_for_polls(kube, "payments", 3)  # polls that saw the pod: none may start the Job
        assert kube.get("batch/v1/jobs", started["jobName"]) is None
        assert "waiting for 1 consumer pods" in condition_entry(kube.get(CR, "payments"), "CatchingUp")["message"]
        kube.delete("v1/pods", "payments-0")
        assert any(
            "would take 33.3 min, over the catch-up trigger 60 s" in message
            for message in events(kube, "CatchupStarted")
        ), events(kube, "CatchupStarted")

        job_name = started["jobName"]
        job = wait_for(lambda: kube.get("batch/v1/jobs", job_name), 20, "the catch-up Job")
        container = job["spec"]["template"]["spec"]["containers"][0]
        fence = ",".join(f"{topic}:{p}={ends[p]}" for p in sorted(ends))
        assert container["args"] == [
            "catchup",
            "--start",
            "committed",
            "--until",
            fence,
            "--commit",
            "auto",
            "--master",
            "local[4]",
            "--task-workers",
            "16",
        ]
        assert container["image"] == "registry.example/ledger-spark:1.0"
        assert {"name": "KEYORDER_GROUP_ID", "value": f"g-{topic}"} in container["env"]
        memory = f"{local_pod_memory_mib(4, 64)}Mi"  # local[4] and no memory given: the driver and 4 tasks
        assert container["resources"] == {"requests": {"cpu": "4", "memory": memory}, "limits": {"memory": memory}}
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        assert job["metadata"]["ownerReferences"][0]["name"] == "payments"
        wait_for(lambda: catchup_status(kube, "payments").get("phase") == "Running", 20, "phase Running")
        assert condition(kube.get(CR, "payments"), "CatchingUp") == "True"
        wait_for_polls(kube, "payments", 3)  # polls while the Job runs: the pods stay at 0
        assert replicas(kube, "payments") == 0
        assert catchup_status(kube, "payments")["phase"] == "Running"

        commit_group(broker.bootstrap, f"g-{topic}", topic, ends)  # what keyorder catchup commits on success
        finish_job(kube, job_name, "Complete")
        wait_for(lambda: replicas(kube, "payments") == started["resumeReplicas"], 20, "the pods resumed")
        wait_for(lambda: condition(kube.get(CR, "payments"), "CatchingUp") == "False", 20, "CatchingUp False")
        assert catchup_status(kube, "payments") == {}
        assert any(job_name in message for message in events(kube, "CatchupSucceeded"))
        wait_for(lambda: (kube.get(CR, "payments").get("status") or {}).get("lag") == 0, 20, "lag 0 after the fence")
        assert condition(kube.get(CR, "payments"), "CatchupFailed") == "False"


def test_a_failed_catchup_resumes_the_pods_and_is_not_retried_for_the_same_spec(kube, broker):
    topic = "okc-catchup-fail"
    backlog(broker, topic)
    with operator(kube.url) as context:
        # no cooldown: only the failed spec generation may keep a second hand-over from starting
        kube.create(CR, resource(broker, "refunds", topic, cooldownSeconds=0))
        started = slow_workers_until_triggered(kube, context, "refunds")
        job_name = started["jobName"]
        wait_for(lambda: kube.get("batch/v1/jobs", job_name), 20, "the catch-up Job")
        # the Job's driver pod is still terminating when the Job is marked Failed: the pods must wait for it
        create_pod(kube, f"{job_name}-driver", {"job-name": job_name}, "catchup", "x")
        finish_job(kube, job_name, "Failed")
        wait_for(
            lambda: condition_entry(kube.get(CR, "refunds"), "CatchingUp").get("reason") == "Finishing",
            20,
            "CatchingUp Finishing",
        )
        wait_for_polls(kube, "refunds", 3)  # polls while the driver pod exists
        assert replicas(kube, "refunds") == 0, "the pods resumed while the Job's driver still ran"
        kube.delete("v1/pods", f"{job_name}-driver")

        wait_for(lambda: replicas(kube, "refunds") == started["resumeReplicas"], 20, "the pods resumed")
        wait_for(lambda: condition(kube.get(CR, "refunds"), "CatchupFailed") == "True", 20, "CatchupFailed")
        failed = condition_entry(kube.get(CR, "refunds"), "CatchupFailed")
        assert (
            "keeps the waves it committed" in failed["message"]
            and "resume from the group's committed offsets" in failed["message"]
        )
        assert any(job_name in message for message in events(kube, "CatchupFailed"))
        # a fresh observation after the hand-over: the backlog is all still there for the pods
        wait_for(lambda: context.poll_memory("default", "refunds").last_sample, 20, "a new observation")
        assert kube.get(CR, "refunds")["status"]["lag"] == 8_000

        # The backlog still looks hopeless (slow workers, no cooldown: see above) on more polls than
        # confirmPolls, but the same spec is not retried: no votes, no hand-over.
        polls_with_slow_workers = 0
        for _ in range(20):  # bounded: the operator's own patches may overwrite the taught rate now and then
            if polls_with_slow_workers > CATCHUP_CONFIRM_POLLS:
                break
            wait_for(
                lambda: teach_slow_workers(context, "refunds") or learned_rate(context, "refunds") == 1.0, 20, "1 msg/s"
            )
            wait_for_polls(kube, "refunds", 2)  # the second one started after the rate was in status
            if learned_rate(context, "refunds") == 1.0:  # and it kept it: it decided with it
                polls_with_slow_workers += 1
            status = kube.get(CR, "refunds")["status"]
            assert (status.get("catchup"), status.get("catchupVotes")) == (None, 0), "a failed spec was retried"
        assert polls_with_slow_workers > CATCHUP_CONFIRM_POLLS, "the slow workers were not in force long enough"
        assert catchup_jobs(kube, "refunds") == [job_name]


def test_a_deleted_job_ends_the_hand_over_and_the_pods_resume(kube, broker):
    topic = "okc-catchup-gone"
    backlog(broker, topic)
    with operator(kube.url) as context:
        kube.create(CR, resource(broker, "ledger", topic))
        started = slow_workers_until_triggered(kube, context, "ledger")
        job_name = started["jobName"]
        wait_for(lambda: catchup_status(kube, "ledger").get("phase") == "Running", 20, "phase Running")
        kube.delete("batch/v1/jobs", job_name)  # someone deleted it (its pods are gone too here)

        wait_for(lambda: replicas(kube, "ledger") == started["resumeReplicas"], 20, "the pods resumed")
        wait_for(lambda: condition(kube.get(CR, "ledger"), "CatchupFailed") == "True", 20, "CatchupFailed")
        catching_up = condition_entry(kube.get(CR, "ledger"), "CatchingUp")
        assert catching_up["status"] == "False" and catching_up["reason"] == "Missing"
        assert f"Job {job_name} disappeared" in catching_up["message"]


def create_executor_pod(kube, name: str, job: dict, app_id: str) -> None:
    """An executor pod as Spark on Kubernetes creates it for the Job's driver: from the pod template the operator
    rendered into the driver pod's annotation (its labels), plus Spark's own labels. Spark never gives an executor
    the Job's ``job-name``; and here it has no ownerReference to the driver, as executors outlive a driver whose
    end the garbage collector has not caught up with yet (or that a partition cut off)."""
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    template = json.loads(annotations["keyorder.dev/executor-pod-template"])
    labels = {**template["metadata"]["labels"], "spark-app-selector": app_id, "spark-role": "executor"}
    create_pod(kube, name, labels, "executor", "registry.example/ledger-spark:1.0")


def test_the_pods_resume_only_after_the_jobs_spark_executors_are_gone(kube, broker):
    topic = "okc-catchup-executors"
    backlog(broker, topic)
    with operator(kube.url) as context:
        kube.create(CR, resource(broker, "wallets", topic, master="k8s://https://kubernetes.default.svc"))
        started = slow_workers_until_triggered(kube, context, "wallets")
        job_name = started["jobName"]
        job = wait_for(lambda: kube.get("batch/v1/jobs", job_name), 20, "the catch-up Job")
        create_pod(kube, f"{job_name}-driver", {"job-name": job_name}, "catchup", "x")
        executors = [f"{job_name}-exec-{n}" for n in (1, 2)]
        for name in executors:
            create_executor_pod(kube, name, job, "spark-0123456789abcdef")
        # an abrupt end of the driver (the Job's deadline): the driver pod is gone, its executors are not
        finish_job(kube, job_name, "Failed")
        kube.delete("v1/pods", f"{job_name}-driver")

        waiting = f"waiting for 2 executor pods of Job {job_name} to stop"
        wait_for(
            lambda: waiting in condition_entry(kube.get(CR, "wallets"), "CatchingUp").get("message", ""),
            20,
            "CatchingUp to wait for the executors",
        )
        assert condition_entry(kube.get(CR, "wallets"), "CatchingUp")["reason"] == "Finishing"
        wait_for_polls(kube, "wallets", 3)  # polls that saw the executors: none may resume the pods
        assert replicas(kube, "wallets") == 0, "the pods resumed while the Job's Spark executors still ran"
        assert any(waiting in message for message in events(kube, "CatchupFinishing")), events(kube, "CatchupFinishing")
        kube.delete("v1/pods", executors[0])
        wait_for(
            lambda: (
                f"waiting for 1 executor pods of Job {job_name}"
                in condition_entry(kube.get(CR, "wallets"), "CatchingUp").get("message", "")
            ),
            20,
            "CatchingUp to count the executor left",
        )
        wait_for_polls(kube, "wallets", 2)
        assert replicas(kube, "wallets") == 0, "the pods resumed while a Spark executor still ran"
        kube.delete("v1/pods", executors[1])

        wait_for(lambda: replicas(kube, "wallets") == started["resumeReplicas"], 20, "the pods resumed")
        wait_for(lambda: condition(kube.get(CR, "wallets"), "CatchupFailed") == "True", 20, "CatchupFailed")


def ended_driver_pod(kube, job_name: str, refusal: Refusal) -> None:
    """The catch-up Job's driver pod as the kubelet reports it after ``keyorder catchup`` refused to run: its
    container ended with the refusal's exit status and the termination message the command wrote."""
    create_pod(kube, f"{job_name}-driver", {"job-name": job_name}, "catchup", "registry.example/spark:1.0")
    terminated = {"exitCode": refusal.exit_status, "reason": "Error", "message": refusal.message()}
    container = {
        "name": "catchup",
        "image": "registry.example/spark:1.0",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": terminated},
    }
    status = {"phase": "Failed", "containerStatuses": [container]}
    kube.patch("v1/pods", f"{job_name}-driver", {"status": status}, subresource="status")


def test_executors_that_are_not_pods_get_their_drain_window_before_the_pods_resume(kube, broker):
    """Issue 38, defect 7: with a standalone master the executors are not pods, so counting pods saw none and
    the consumer pods resumed as soon as the driver pod was gone, while an executor cut off from the driver
    could still handle its task. Now they wait the executors' heartbeat give-up time after the Job's end
    (here 2 x 2 x 1 s, from sparkConf), and say so."""
    topic = "okc-catchup-standalone"
    backlog(broker, topic)
    heartbeats = {
        "spark.executor.heartbeatInterval": "1s",
        "spark.executor.heartbeat.maxFailures": "2",
        "spark.authenticate.secret": "s3",  # the cluster's shared secret (the spec check requires it)
    }
    with operator(kube.url) as context:
        kube.create(CR, resource(broker, "tokens", topic, master="spark://spark-master:7077", sparkConf=heartbeats))
        started = slow_workers_until_triggered(kube, context, "tokens")
        job_name = started["jobName"]
        wait_for(lambda: catchup_status(kube, "tokens").get("phase") == "Running", 20, "phase Running")
        finish_job(kube, job_name, "Failed")  # the driver ended abruptly; its pod is gone, no executor pod exists

        waiting = f"Job {job_name} ended; its Spark executors are not pods the operator can see"
        wait_for(
            lambda: waiting in condition_entry(kube.get(CR, "tokens"), "CatchingUp").get("message", ""),
            20,
            "CatchingUp to wait for the executors it cannot see",
        )
        assert replicas(kube, "tokens") == 0, "the pods resumed while executors outside Kubernetes could still run"
        assert catchup_status(kube, "tokens")["drainSeconds"] == 4.0  # from sparkConf when the Job was created
        ended_at = catchup_status(kube, "tokens")["jobEndedAt"]
        wait_for(lambda: replicas(kube, "tokens") == started["resumeReplicas"], 20, "the pods resumed")
        # the poll scales the pods, then writes its status: the end's time lands a moment after the replicas
        wait_for(lambda: "lastCatchupEndedAt" in kube.get(CR, "tokens")["status"], 20, "the end in the status")
        resumed_at = kube.get(CR, "tokens")["status"]["lastCatchupEndedAt"]
        assert resumed_at >= ended_at + 4.0, (ended_at, resumed_at)


def test_a_job_refused_at_start_resumes_the_pods_at_once_and_names_the_image(kube, broker):
    topic = "okc-catchup-no-spark"
    backlog(broker, topic)
    with operator(kube.url) as context:
        kube.create(CR, resource(broker, "vouchers", topic, image="registry.example/vouchers:1.0", backoffLimit=3))
        started = slow_workers_until_triggered(kube, context, "vouchers")
        job_name = started["jobName"]
        job = wait_for(lambda: kube.get("batch/v1/jobs", job_name), 20, "the catch-up Job")
        rule = job["spec"]["podFailurePolicy"]["rules"][0]
        assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [2, 3]  # despite backoffLimit 3
        # what the Job controller does when the driver exits 2 (no PySpark/Java in the image): Failed at once
        ended_driver_pod(kube, job_name, Refusal(RefusalKind.SETTINGS, "pyspark is not installed", RUNTIME))
        finish_job(kube, job_name, "Failed", reason="PodFailurePolicy")

        wait_for(lambda: replicas(kube, "vouchers") == started["resumeReplicas"], 20, "the pods resumed")
        wait_for(lambda: condition(kube.get(CR, "vouchers"), "CatchupFailed") == "True", 20, "CatchupFailed")
        failed = condition_entry(kube.get(CR, "vouchers"), "CatchupFailed")["message"]
        assert "image registry.example/vouchers:1.0 cannot run keyorder catchup (pyspark is not installed)" in failed
        assert "fix spec.catchup.image" in failed, failed
        assert any("registry.example/vouchers:1.0" in message for message in events(kube, "CatchupFailed"))


def test_a_passing_refusal_resumes_the_pods_and_is_retried_without_blaming_the_image(kube, broker, monkeypatch):
    """Issue 38, defect 3: a member still in the group when the Job planned (a pod killed after its grace)
    made keyorder catchup exit 2 (now 3), and the operator switched catch-up off for the spec generation,
    blaming the image that had just passed its pre-flight. Now the pods resume, status.catchupRetry holds
    the back-off (here shortened to 1 s; it replaces the 30 min cooldown), and the hand-over starts again."""
    monkeypatch.setattr("keyorder_operator.catchup.RETRY_FIRST_SECONDS", 1.0)
    topic = "okc-catchup-passing"
    backlog(broker, topic)
    member = f"group 'g-{topic}' has 1 active members: stop its consumers first"
    with operator(kube.url) as context:
        kube.create(CR, resource(broker, "rebates", topic))  # cooldownSeconds: the default 1800
        started = slow_workers_until_triggered(kube, context, "rebates")
        job_name = started["jobName"]
        wait_for(lambda: kube.get("batch/v1/jobs", job_name), 20, "the catch-up Job")
        ended_driver_pod(kube, job_name, Refusal(RefusalKind.PASSING, member))
        finish_job(kube, job_name, "Failed", reason="PodFailurePolicy")

        wait_for(lambda: replicas(kube, "rebates") == started["resumeReplicas"], 20, "the pods resumed")
        wait_for(lambda: condition(kube.get(CR, "rebates"), "CatchupFailed") == "False", 20, "CatchupFailed False")
        deferred = condition_entry(kube.get(CR, "rebates"), "CatchupFailed")
        assert deferred["reason"] == "Passing", deferred
        assert member in deferred["message"] and "catch-up tried again in" in deferred["message"], deferred
        assert "image" not in deferred["message"], deferred
        status = kube.get(CR, "rebates")["status"]
        assert status.get("catchupFailedGeneration") is None, "a passing refusal switched catch-up off"
        assert status["catchupRetry"]["failures"] == 1 and member in status["catchupRetry"]["reason"]
        assert any(member in message for message in events(kube, "CatchupDeferred"))

        retried = slow_workers_until_triggered(kube, context, "rebates")  # well within the cooldown
        # a fence recorded anew (nothing was produced since, so the same offsets)
        assert retried["jobName"] != job_name and retried["fence"] == started["fence"]
        wait_for(lambda: kube.get("batch/v1/jobs", retried["jobName"]), 20, "the second catch-up Job")
        assert sorted(catchup_jobs(kube, "rebates")) == sorted([job_name, retried["jobName"]])


def test_a_refusal_on_a_standalone_master_skips_the_drain_and_refusals_in_a_row_switch_catchup_off(
    kube, broker, monkeypatch
):
    """Review of issue 38, findings 1 and 2. Before: a Job whose driver refused before Spark started (exit 3)
    on a spark:// master kept the pods stopped for the executors' drain window (20 min by Spark's
    heartbeat defaults), though no executor ever had a task, and every passing retry paid it again; and a
    refusal that kept "passing" (a consumer outside the operator in the group) was retried forever. Now the
    pods resume at once, and the RETRY_LIMIT-th passing refusal in a row (here 2) switches catch-up off."""
    monkeypatch.setattr("keyorder_operator.catchup.RETRY_FIRST_SECONDS", 1.0)
    monkeypatch.setattr("keyorder_operator.catchup.RETRY_LIMIT", 2)
    topic = "okc-catchup-standalone-refused"
    backlog(broker, topic)
    member = f"group 'g-{topic}' has 1 active members: stop its consumers first"
    with operator(kube.url) as context:
        secret = {"spark.authenticate.secret": "s3"}
        kube.create(CR, resource(broker, "stamps", topic, master="spark://spark-master:7077", sparkConf=secret))
        for attempt in (1, 2):
            started = slow_workers_until_triggered(kube, context, "stamps")
            job_name = started["jobName"]
            wait_for(lambda: catchup_status(kube, "stamps").get("phase") == "Running", 20, "phase Running")
            assert catchup_status(kube, "stamps")["drainSeconds"] == 1200.0  # Spark's heartbeat defaults
            ended_driver_pod(kube, job_name, Refusal(RefusalKind.PASSING, member))
            finish_job(kube, job_name, "Failed", reason="PodFailurePolicy")
            # the drain window is 20 min: resuming within this wait means it was skipped
            resume = started["resumeReplicas"]
            wait_for(lambda: replicas(kube, "stamps") == resume, 20, f"resume after {attempt}")  # noqa: B023
            wait_for(lambda: not catchup_status(kube, "stamps"), 20, "the hand-over ended")
        failed = wait_for(
            lambda: condition(kube.get(CR, "stamps"), "CatchupFailed") == "True" and kube.get(CR, "stamps"),
            20,
            "CatchupFailed after the second passing refusal in a row",
        )
        entry = condition_entry(failed, "CatchupFailed")
        assert entry["reason"] == "PassingRefusalsInARow" and member in entry["message"], entry
        assert failed["status"].get("catchupFailedGeneration") is not None
        assert failed["status"].get("catchupRetry") is None
        assert any("2 refusals in a row" in message for message in events(kube, "CatchupFailed"))


def waiting_pod(kube, job_name: str, reason: str, message: str) -> None:
    """The pre-flight Job's pod as a kubelet reports one whose image it cannot pull."""
    create_pod(kube, f"{job_name}-pod", {"job-name": job_name}, "preflight", "registry.example/missing:1.0")
    waiting = {"reason": reason, "message": message}
    container = {
        "name": "preflight",
        "image": "registry.example/missing:1.0",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": waiting},
    }
    status = {"phase": "Pending", "containerStatuses": [container]}
    kube.patch("v1/pods", f"{job_name}-pod", {"status": status}, subresource="status")


def test_an_image_that_fails_its_preflight_never_stops_the_pods_and_names_the_image(kube, broker):
    topic = "okc-catchup-bad-image"
    backlog(broker, topic)
    image = "registry.example/missing:1.0"
    with operator(kube.url) as context, ReplicaWatch(kube, "coupons") as watch:
        kube.create(CR, resource(broker, "coupons", topic, image=image, cooldownSeconds=0))
        check = slow_workers_until_checking(kube, context, "coupons")
        job = wait_for(lambda: kube.get("batch/v1/jobs", check["jobName"]), 20, "the pre-flight Job")
        container = job["spec"]["template"]["spec"]["containers"][0]
        assert (container["image"], container["args"]) == (image, ["catchup", "--preflight"])
        assert job["spec"]["backoffLimit"] == 0 and job["metadata"]["ownerReferences"][0]["name"] == "coupons"
        assert any(image in message for message in events(kube, "CatchupCheckingImage"))

        # the kubelet cannot pull the image: status says so while the operator waits, the pods keep running
        waiting_pod(kube, check["jobName"], "ImagePullBackOff", f'Back-off pulling image "{image}"')
        wait_for(
            lambda: "ImagePullBackOff" in condition_entry(kube.get(CR, "coupons"), "CatchingUp").get("message", ""),
            20,
            "CatchingUp to say why the check waits",
        )
        checking = condition_entry(kube.get(CR, "coupons"), "CatchingUp")
        assert checking["reason"] == "CheckingImage" and "the pods keep running" in checking["message"]
        assert replicas(kube, "coupons") != 0 and catchup_status(kube, "coupons") == {}

        # the Job's deadline ends it (what the Job controller does; its pod is still being deleted)
        finish_job(kube, check["jobName"], "Failed", reason="DeadlineExceeded")
        wait_for(lambda: condition(kube.get(CR, "coupons"), "CatchupFailed") == "True", 20, "CatchupFailed")
        failed = condition_entry(kube.get(CR, "coupons"), "CatchupFailed")
        assert failed["reason"] == "ImageCheckFailed"
        assert f"image {image} failed its pre-flight" in failed["message"], failed
        assert "ImagePullBackOff" in failed["message"] and "The pods were not stopped" in failed["message"]
        assert any(image in message and "ImagePullBackOff" in message for message in events(kube, "CatchupFailed"))
        assert condition_entry(kube.get(CR, "coupons"), "CatchingUp")["status"] == "False"
        outcomes = {
            outcome: context.metrics.registry.get_sample_value(
                "keyorder_operator_catchups_total", {"namespace": "default", "name": "coupons", "outcome": outcome}
            )
            for outcome in ("image_failed", "started")
        }
        assert outcomes == {"image_failed": 1.0, "started": 0.0}  # KeyorderCatchupFailed fires on image_failed

        # the backlog still looks hopeless (no cooldown), but this spec is not tried again: no second check
        for _ in range(CATCHUP_CONFIRM_POLLS + 1):
            teach_slow_workers(context, "coupons")
            wait_for_polls(kube, "coupons", 1)
        assert [job["metadata"]["name"] for job in preflight_jobs(kube, "coupons")] == [check["jobName"]]
        assert catchup_jobs(kube, "coupons") == []
    assert 0 not in watch.seen and watch.seen, f"the pods were scaled to 0: {watch.seen}"
    assert events(kube, "CatchupStarted") == []


def test_an_image_that_passed_its_preflight_hands_over_and_is_not_checked_again(kube, broker):
    topic = "okc-catchup-checked"
    ends = backlog(broker, topic)
    with operator(kube.url) as context:
        kube.create(CR, resource(broker, "credits", topic, cooldownSeconds=0))
        check = slow_workers_until_checking(kube, context, "credits")
        wait_for(lambda: kube.get("batch/v1/jobs", check["jobName"]), 20, "the pre-flight Job")
        wait_for_polls(kube, "credits", 2)  # polls while the check runs: the pods keep running, no Job yet
        assert replicas(kube, "credits") != 0
        assert catchup_jobs(kube, "credits") == [] and catchup_status(kube, "credits") == {}

        finish_job(kube, check["jobName"], "Complete")  # the image ran the pre-flight
        started = slow_workers_until_triggered(kube, context, "credits")
        wait_for(lambda: replicas(kube, "credits") == 0, 20, "the Deployment scaled to 0")
        checked = kube.get(CR, "credits")["status"]["catchupImageChecked"]
        assert checked["image"] == CATCHUP["image"] and checked["jobName"] == check["jobName"]
        assert any(CATCHUP["image"] in message for message in events(kube, "CatchupImageChecked"))
        job_name = started["jobName"]
        wait_for(lambda: kube.get("batch/v1/jobs", job_name), 20, "the catch-up Job")
        commit_group(broker.bootstrap, f"g-{topic}", topic, ends)
        # a second backlog, the same image: the hand-over starts without another check. Produced while the
        # Job still runs, so no hand-over can start (and fence) before all of it is in the log
        more = produce_keyed(broker.bootstrap, topic, 8_000, 500, extra_config=EXACT_END_OFFSETS)
        finish_job(kube, job_name, "Complete")
        wait_for(lambda: replicas(kube, "credits") == started["resumeReplicas"], 20, "the pods resumed")

        def new_backlog_seen() -> bool:  # the lag, or already a hand-over for it (the learned rate is still slow)
            status = kube.get(CR, "credits").get("status") or {}
            return status.get("lag") == 8_000 or (status.get("catchup") or {}).get("jobName") not in (None, job_name)

        wait_for(new_backlog_seen, 60, "the new lag")
        second = slow_workers_until_triggered(kube, context, "credits")
        assert second["jobName"] != job_name
        assert second["fence"] == {f"{topic}:{p}": offset for p, offset in more.end_offsets.items()}
        assert [job["metadata"]["name"] for job in preflight_jobs(kube, "credits")] == [check["jobName"]]
        assert image_check_status(kube, "credits") == {}
        assert sum(CATCHUP["image"] in message for message in events(kube, "CatchupCheckingImage")) == 1
