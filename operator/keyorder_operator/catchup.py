"""When to hand a backlog to a Spark catch-up Job, and the state of one hand-over: pure, no I/O.

A backlog triggers catch-up only when it wins (``catchup_verdict``): even the *largest* size the
autoscaler may reach would take longer than ``spec.catchup.triggerDrainSeconds`` to drain it
(``lag / (max pods x max workers x per-worker rate - arrival rate)``), the Spark job would be
faster than those pods (executors x cores x the per-core rate, which ``keyorder catchup-bench``
measures), and both held on ``confirmPolls`` polls in a row. It never starts while a blocked key
pins the lag (the Job would fail on the same message), nor within ``cooldownSeconds`` of the last
hand-over. The per-worker rate is the scaling policy's; until it is known, nothing triggers.

A hand-over has two phases, kept in ``status.catchup`` so a restarted operator continues it:

1. ``StoppingPods``: the Deployment is scaled to 0 and the operator waits until no consumer pod
   is left (they commit their last offsets on SIGTERM), so the job plans from final offsets;
2. ``Running``: the Job runs ``keyorder catchup --until <fence>``, the fence being the end offsets
   recorded when catch-up was triggered. On success the Job has committed the fence and the pods
   resume from it; on failure the waves it committed stay committed and the pods resume after them.

A failed catch-up is sorted by what ended it (``job_refusal``). A refusal that passes on its own
(``keyorder catchup`` exits ``EXIT_PASSING``: members still in the group, a broker that could not say,
a partition added since the fence) resumes the pods and is tried again after a back-off
(``CatchupRetry``, kept in ``status.catchupRetry``), with a new fence; the image is not blamed. Any other
failure (a poison message under ``block``, a setting or an image that cannot work) needs a person: no
automatic catch-up for the same spec generation, and the message names the spec field to change; any
spec change re-arms it.

After the Job ends, the pods resume only once nothing of it can still handle a message: its driver and
executor pods gone (``catchup_pods_left``), and, on a master whose executors are not pods (standalone,
YARN), a drain window from the Job's end that outlasts an executor cut off from its driver
(``unobserved_executors_left``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from keyorder.catchup.exits import EXIT_CONFIG, EXIT_PASSING, KAFKA, RUNTIME, Refusal, RefusalKind
from keyorder.catchup.sizing import expected_cores, is_local_master, local_master
from keyorder_operator.policy import Limited, LimitKind, Observation, ScalingLimits, Size, duration, shape


class Phase(StrEnum):
    STOPPING_PODS = "StoppingPods"
    RUNNING = "Running"


class JobState(StrEnum):
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    MISSING = "missing"


@dataclass(frozen=True)
class CatchupRun:
    phase: Phase
    job_name: str
    fence: dict[str, int]
    """``"topic:partition" -> end offset`` when catch-up was triggered."""
    started_at: float
    resume_replicas: int
    """Replicas to give back to the Deployment afterwards."""
    job_ended_at: float | None = None
    """When the operator first saw the Job ended (the drain window of executors it cannot see counts from it)."""
    drain_seconds: float = 0.0
    """How long after the Job's end its executors may still handle unseen (``unobserved_drain_seconds`` of the
    master and Spark settings the Job was created with)."""

    def to_status(self) -> dict[str, Any]:
        return {
            "phase": self.phase.value,
            "jobName": self.job_name,
            "fence": dict(self.fence),
            "startedAt": self.started_at,
            "resumeReplicas": self.resume_replicas,
            "jobEndedAt": self.job_ended_at,
            "drainSeconds": self.drain_seconds,
        }

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> CatchupRun | None:
        data = status.get("catchup") or {}
        if not data.get("phase"):
            return None
        return cls(
            phase=Phase(data["phase"]),
            job_name=data["jobName"],
            fence=dict(data.get("fence") or {}),
            started_at=float(data.get("startedAt") or 0),
            resume_replicas=int(data.get("resumeReplicas", 1)),
            job_ended_at=None if data.get("jobEndedAt") is None else float(data["jobEndedAt"]),
            drain_seconds=float(data.get("drainSeconds") or 0),
        )

    def running(self, drain_seconds: float = 0.0) -> CatchupRun:
        return replace(self, phase=Phase.RUNNING, drain_seconds=drain_seconds)

    def job_ended(self, now: float) -> CatchupRun:
        """The run with the time its Job was first seen ended (kept if it was already)."""
        return self if self.job_ended_at is not None else replace(self, job_ended_at=now)


def largest_size(limits: ScalingLimits, partitions: int) -> Size:
    """The most pods x workers the autoscaler may reach for this many partitions."""
    if not partitions:
        return Size(0, 0)
    cap = max(min(limits.max_replicas or partitions, partitions), limits.min_replicas, 1)
    return shape(cap * limits.max_workers, limits, partitions)


def projected_drain_seconds(lag: int, rate: float, arrivals: float) -> float:
    """Seconds to drain ``lag`` at ``rate`` while ``arrivals`` keep coming (``inf``: never)."""
    net_rate = rate - arrivals
    return math.inf if net_rate <= 0 else lag / net_rate


def cpu_cores(quantity: str) -> float | None:
    """A Kubernetes CPU quantity (``2``, ``1.5``, ``500m``) in cores; ``None`` if it is not one."""
    text = quantity.strip()
    try:
        return float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        return None


def spark_cores(master: str, executors: int, executor_cores: int, cpu_limit: str | None) -> tuple[int, str]:
    """The task slots a catch-up Job gets, and the ``--master`` to give it (pure).

    A cluster master gets ``executors x executor_cores`` (the Job asks Spark for exactly that). A local
    master runs in the Job's one pod: ``local[n]`` gets n; ``local[*]`` (and ``local``'s one core aside)
    gets the pod's CPU limit, rounded up, which ``keyorder catchup`` reads from its cgroup; without a
    limit it would see the node's cores, so the Job is given ``local[executors x executor_cores]``,
    the cores the verdict counts.
    """
    if not is_local_master(master):
        return executors * executor_cores, master
    limit = cpu_cores(cpu_limit) if cpu_limit else None
    resolved = local_master(master, limit, executors * executor_cores)  # local[*] as keyorder catchup reads it
    cores, _ = expected_cores(resolved, {})
    return cores or 1, master if limit else resolved


@dataclass(frozen=True)
class CatchupGate:
    """The parts of ``spec.catchup`` that decide whether a hand-over wins."""

    enabled: bool
    trigger_seconds: float
    executors: int = 2
    executor_cores: int = 1
    cores: int | None = None
    """The task slots Spark really gets (``spark_cores``): executors x executorCores on a cluster (the
    default), the pod's CPU on a local master."""
    per_core_rate: float = 2000.0
    """Most messages/s one Spark core handles for this handler (measured by ``keyorder catchup-bench``)."""
    task_workers: int = 16
    confirm_polls: int = 3
    cooldown_seconds: float = 1800.0

    @property
    def slots(self) -> int:
        return self.cores if self.cores is not None else self.executors * self.executor_cores

    def describe_cores(self) -> str:
        if self.cores is None:
            return f"{self.executors} executors x {self.executor_cores} cores"
        return f"{self.cores} cores of the Job's pod"


@dataclass(frozen=True)
class CatchupVerdict:
    start: str | None
    """Why catch-up starts now (``None``: it does not)."""
    votes: int
    """Polls in a row on which it would win (kept in status)."""
    waiting: str | None = None
    """Why it does not start although the pods are too slow (for status), if that is the case."""


def catchup_rate(gate: CatchupGate, per_worker_rate: float) -> float:
    """Messages/s the Spark job would reach: each core runs ``task_workers`` handler threads, and no
    core does more than the measured per-core rate (reading, shuffling and Python take the rest)."""
    per_core = min(gate.per_core_rate, gate.task_workers * per_worker_rate)
    return gate.slots * per_core


def catchup_verdict(
    gate: CatchupGate,
    observation: Observation,
    per_worker_rate: float | None,
    limits: ScalingLimits,
    limited: Limited | None,
    votes: int,
    last_ended_at: float | None,
    now: float,
    retry: CatchupRetry | None = None,
) -> CatchupVerdict:
    """Start catch-up only when the pods at their largest size are too slow *and* Spark would be
    faster, on ``confirm_polls`` polls in a row, never while a blocked key pins the lag, and not
    within the cooldown after the last hand-over; after a refusal that passes (``retry``), not before
    its back-off ends, which then stands for the cooldown."""
    if not gate.enabled or observation.lag is None or not observation.partitions or not per_worker_rate:
        return CatchupVerdict(None, 0)
    largest = largest_size(limits, observation.partitions)
    arrivals = observation.arrival_rate or 0.0
    pods_rate = largest.capacity * per_worker_rate
    pods_seconds = projected_drain_seconds(observation.lag, pods_rate, arrivals)
    if pods_seconds <= gate.trigger_seconds:
        return CatchupVerdict(None, 0)
    shown = "never (arrivals outpace it)" if math.isinf(pods_seconds) else duration(pods_seconds)
    too_slow = (
        f"lag {observation.lag}: draining at the largest size ({largest.replicas} pods x {largest.workers} "
        f"workers at {per_worker_rate:.1f} msg/s each) would take {shown}, over the catch-up trigger "
        f"{duration(gate.trigger_seconds)}"
    )
    if limited is not None and limited.kind is LimitKind.BLOCKED_KEY:
        return CatchupVerdict(None, 0, f"{too_slow}; no catch-up: a blocked key would fail the Job too")
    spark_rate = catchup_rate(gate, per_worker_rate)
    if spark_rate <= pods_rate:
        return CatchupVerdict(
            None,
            0,
            f"{too_slow}; no catch-up: Spark would reach about {spark_rate:,.0f} msg/s "
            f"({gate.describe_cores()}), not more than the pods' {pods_rate:,.0f} msg/s",
        )
    if retry is not None:
        if now < retry.not_before:
            return CatchupVerdict(None, 0, f"{too_slow}; {retry.describe(now)}")
    elif last_ended_at is not None and now - last_ended_at < gate.cooldown_seconds:
        left = gate.cooldown_seconds - (now - last_ended_at)
        return CatchupVerdict(None, 0, f"{too_slow}; catch-up cooling down for {duration(left)} more")
    votes += 1
    wins = f"{too_slow}; Spark would reach about {spark_rate:,.0f} msg/s against the pods' {pods_rate:,.0f} msg/s"
    if votes < gate.confirm_polls:
        return CatchupVerdict(None, votes, f"{wins} (confirming: poll {votes} of {gate.confirm_polls})")
    return CatchupVerdict(wins, votes)


def fence_argument(fence: dict[str, int]) -> str:
    """The ``--until`` value of ``keyorder catchup``: ``topic:partition=offset,...``."""
    return ",".join(f"{where}={offset}" for where, offset in sorted(fence.items()))


def fence_from_end_offsets(end_offsets: tuple[tuple[str, int, int], ...]) -> dict[str, int]:
    return {f"{topic}:{partition}": offset for topic, partition, offset in end_offsets}


def job_state(job: dict[str, Any] | None) -> JobState:
    """A Job's final outcome from its status: only ``Complete`` and ``Failed`` are final (the interim
    ``SuccessCriteriaMet``/``FailureTarget`` are set while its pods may still be terminating)."""
    if job is None:
        return JobState.MISSING
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") == "Complete":
            return JobState.SUCCEEDED
        if condition.get("status") == "True" and condition.get("type") == "Failed":
            return JobState.FAILED
    return JobState.ACTIVE


def catchup_pods_left(job_name: str, outcome: JobState, drivers: int, executors: int) -> str | None:
    """Why the consumer pods may not resume yet after Job ``job_name`` ended (``None``: they may).

    A finished Job's pods can still be handling messages: a driver terminating after a deadline or a
    deletion, and above all Spark executors, which the driver's end does not stop at once (they are
    deleted by garbage collection, or exit after a heartbeat timeout, when the driver ended abruptly or
    a node is cut off). Pods that resumed meanwhile would handle the same keys at the same time."""
    left = [f"{count} {role} pods" for role, count in (("driver", drivers), ("executor", executors)) if count]
    if not left:
        return None
    return (
        f"Job {job_name} {outcome.value}; waiting for {' and '.join(left)} of Job {job_name} to stop "
        "(the consumer pods resume when none is left)"
    )


REFUSAL_EXIT_CODES = (EXIT_CONFIG, EXIT_PASSING)
"""``keyorder catchup``'s exit statuses for a run it refused before it handled or committed anything
(``keyorder.catchup.exits``): its settings or its runtime (2), a state of the group or the topics that
passes (3). The Job fails at once on them (its ``podFailurePolicy``): a retry inside the Job would meet
the same settings, or the same fence, with the consumer pods stopped all the while."""

SPEC_FIELDS = {
    RUNTIME: "spec.catchup.image",
    KAFKA: "spec.kafka (its propertiesSecretRef's principal, or the broker)",
    "--spark-conf": "spec.catchup.sparkConf",
    "--master": "spec.catchup.master",
    "--key-partitions": "spec.catchup.keyPartitions",
    "--task-workers": "spec.catchup.taskWorkers",
}
"""The spec field behind each setting the operator gives ``keyorder catchup`` (``builders.build_catchup_job``)."""


def failed_by_policy(job: dict[str, Any] | None) -> bool:
    """The Job controller failed the Job on its ``podFailurePolicy`` (the driver exited with a refusal status):
    the ``Failed`` condition with reason ``PodFailurePolicy``."""
    status = (job or {}).get("status") or {}
    return any(
        condition.get("type") == "Failed"
        and condition.get("status") == "True"
        and condition.get("reason") == "PodFailurePolicy"
        for condition in status.get("conditions") or []
    )


def driver_ending(pods: list[dict[str, Any]]) -> tuple[int, str] | None:
    """The exit status and termination message of the newest driver pod's ``catchup`` container that ended
    (``None``: no pod, or none ended)."""
    ended = []
    for pod in pods:
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated")
            if container.get("name") == "catchup" and terminated and terminated.get("exitCode") is not None:
                created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
                ended.append((created, int(terminated["exitCode"]), str(terminated.get("message") or "")))
    if not ended:
        return None
    _, code, message = max(ended)
    return code, message


def job_refusal(job: dict[str, Any] | None, driver_pods: list[dict[str, Any]]) -> Refusal | None:
    """Why ``keyorder catchup`` refused to run, when it did (pure; ``None`` for any other outcome): from the
    driver's termination message (``exits.Refusal``), else its exit status; a Job failed on its policy
    whose driver pod is gone (its TTL) counts as refused for its settings, as before passing refusals
    were told apart."""
    if job is None or not failed_by_policy(job):
        return None
    ending = driver_ending(driver_pods)
    if ending is None:
        return Refusal(RefusalKind.SETTINGS, "its driver pod is gone: the reason is in kubectl logs only")
    code, message = ending
    told = Refusal.parse(message)
    if told is not None:
        return told
    if code == EXIT_PASSING:
        return Refusal(RefusalKind.PASSING, f"its driver exited with code {EXIT_PASSING} (the group or the topics)")
    return Refusal(RefusalKind.SETTINGS, f"its driver exited with code {code}")


def refusal_detail(refusal: Refusal, image: str | None, job_name: str) -> str:
    """What a Job refused at start says in its Event and condition: for a setting, the spec field to change."""
    if refusal.kind is RefusalKind.PASSING:
        return f"keyorder catchup refused to run for now: {refusal.reason}"
    if refusal.setting == RUNTIME:
        return (
            f"image {image} cannot run keyorder catchup ({refusal.reason}): fix spec.catchup.image (build it from "
            "the image's `catchup` target with your handler)"
        )
    field = SPEC_FIELDS.get(refusal.setting or "")
    where = (
        f"change {field}"
        if field
        else "change the setting it names (spec.catchup, spec.kafka or spec.handler.env; "
        f"or spec.catchup.image if it cannot run keyorder catchup: kubectl logs job/{job_name})"
    )
    return f"keyorder catchup refused its settings before it touched the group: {refusal.reason}; {where}"


RETRY_FIRST_SECONDS = 60.0
"""The back-off after a first passing refusal: longer than a coordinator move and a consumer's default
session timeout (45 s), after which a killed pod's membership is gone."""
RETRY_MAX_SECONDS = 1800.0
"""The longest back-off (the default cooldown): a refusal that keeps passing is tried twice an hour."""


RETRY_LIMIT = 5
"""Passing refusals in a row after which catch-up goes off (``CatchupRetry.exhausted``): with the back-off
doubling from a minute, the fifth comes some 15 minutes after the first, longer than any coordinator move
or session timeout."""


def retry_delay(failures: int) -> float:
    """Seconds before the next try after ``failures`` passing refusals in a row (pure): doubling from
    ``RETRY_FIRST_SECONDS``, at most ``RETRY_MAX_SECONDS``."""
    return min(RETRY_FIRST_SECONDS * 2 ** max(failures - 1, 0), RETRY_MAX_SECONDS)


@dataclass(frozen=True)
class CatchupRetry:
    """A catch-up refused for a passing reason, to be tried again (``status.catchupRetry``)."""

    failures: int
    """Passing refusals in a row (a success or another ending clears them)."""
    not_before: float
    reason: str

    @classmethod
    def after(cls, previous: CatchupRetry | None, reason: str, now: float) -> CatchupRetry:
        failures = (previous.failures if previous else 0) + 1
        return cls(failures, now + retry_delay(failures), reason)

    @property
    def exhausted(self) -> bool:
        """So many passing refusals in a row (``RETRY_LIMIT``) that this one is taken as lasting: a consumer
        outside the operator keeping the group non-empty, say. Catch-up goes off until the spec changes."""
        return self.failures >= RETRY_LIMIT

    def describe(self, now: float) -> str:
        left = max(self.not_before - now, 0.0)
        return f"catch-up tried again in {duration(left)} (passing refusal {self.failures} in a row: {self.reason})"

    def to_status(self) -> dict[str, Any]:
        return {"failures": self.failures, "notBefore": self.not_before, "reason": self.reason}

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> CatchupRetry | None:
        data = status.get("catchupRetry") or {}
        if not data.get("failures"):
            return None
        return cls(int(data["failures"]), float(data.get("notBefore") or 0), str(data.get("reason") or ""))


HEARTBEAT_INTERVAL_SECONDS = 10.0
"""Spark's ``spark.executor.heartbeatInterval`` by default."""
HEARTBEAT_MAX_FAILURES = 60
"""Spark's ``spark.executor.heartbeat.maxFailures`` by default."""
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_SPARK_TIME = re.compile(r"^\s*(\d+)\s*([a-z]*)\s*$")


def spark_seconds(value: str, default_unit: str = "ms") -> float | None:
    """A Spark time setting in seconds (``10s``, ``500ms``, ``2m``; a bare number in ``default_unit``, as
    ``JavaUtils.timeStringAs`` reads it); ``None`` if it is not one."""
    found = _SPARK_TIME.match(value.lower())
    if not found or (found.group(2) or default_unit) not in _TIME_UNITS:
        return None
    return int(found.group(1)) * _TIME_UNITS[found.group(2) or default_unit]


def executors_are_pods(master: str) -> bool:
    """The operator sees every process of a Job on this master as a pod: its driver (local masters run the
    executors inside it) and, on ``k8s://``, the executor pods Spark creates."""
    return is_local_master(master) or master.startswith("k8s://")


def executor_drain_seconds(spark_conf: dict[str, str]) -> float:
    """How long an executor cut off from its driver may go on running tasks (pure): it exits on its own after
    ``spark.executor.heartbeat.maxFailures`` heartbeats in a row failed, one every
    ``spark.executor.heartbeatInterval``, each waiting up to that interval for the driver's answer
    (``Executor.reportHeartBeat`` in apache/spark core: ``System.exit(HEARTBEAT_FAILURE)``); counted twice
    over, for the waits and the beats. Spark's defaults: 60 x 10 s x 2 = 20 minutes."""
    interval = spark_seconds(spark_conf.get("spark.executor.heartbeatInterval", ""))
    try:
        failures = int(spark_conf.get("spark.executor.heartbeat.maxFailures", HEARTBEAT_MAX_FAILURES))
    except ValueError:
        failures = HEARTBEAT_MAX_FAILURES
    return 2 * max(failures, 1) * (interval if interval is not None else HEARTBEAT_INTERVAL_SECONDS)


def unobserved_drain_seconds(master: str, spark_conf: dict[str, str]) -> float:
    """How long after a Job on ``master`` ended its executors may still handle messages unseen (pure): none
    when they are pods the operator counts (``executors_are_pods``), else ``executor_drain_seconds``."""
    return 0.0 if executors_are_pods(master) else executor_drain_seconds(spark_conf)


def unobserved_executors_left(run: CatchupRun, now: float) -> str | None:
    """Why the consumer pods may not resume yet for executors the operator cannot see (``None``: they may).

    On a standalone or YARN master the executors are not pods: the driver's end stops them when they hear
    of it, but one cut off from the driver (a node or network partition, an abrupt driver end) goes on
    handling its task until its heartbeats give up (``executor_drain_seconds``). Pods resumed meanwhile
    would handle the same keys at the same time, so they wait ``run.drain_seconds`` after the Job ended."""
    if not run.drain_seconds or run.job_ended_at is None:
        return None
    left = run.job_ended_at + run.drain_seconds - now
    if left <= 0:
        return None
    return (
        f"Job {run.job_name} ended; its Spark executors are not pods the operator can see (a standalone or YARN "
        f"master): waiting {duration(left)} more, until one cut off from its driver has given up its heartbeats "
        "(spark.executor.heartbeatInterval x spark.executor.heartbeat.maxFailures, twice over), before the "
        "consumer pods resume"
    )


STOPPING_PODS_GRACE_SECONDS = 120
"""How long past the pods' termination grace period the operator waits for them to disappear
before it gives up on the hand-over (a pod stuck terminating must not share the group)."""


def stopping_pods_deadline(run: CatchupRun, termination_grace_seconds: int) -> float:
    return run.started_at + termination_grace_seconds + STOPPING_PODS_GRACE_SECONDS
