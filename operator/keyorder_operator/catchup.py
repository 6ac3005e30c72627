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

A failed catch-up is not retried automatically for the same spec generation: the cause (a
poison message under ``block``, a broken image) needs a person; any spec change re-arms it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

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

    def to_status(self) -> dict[str, Any]:
        return {
            "phase": self.phase.value,
            "jobName": self.job_name,
            "fence": dict(self.fence),
            "startedAt": self.started_at,
            "resumeReplicas": self.resume_replicas,
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
        )

    def running(self) -> CatchupRun:
        return CatchupRun(Phase.RUNNING, self.job_name, self.fence, self.started_at, self.resume_replicas)


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
) -> CatchupVerdict:
    """Start catch-up only when the pods at their largest size are too slow *and* Spark would be
    faster, on ``confirm_polls`` polls in a row, never while a blocked key pins the lag, and not
    within the cooldown after the last hand-over."""
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
    if last_ended_at is not None and now - last_ended_at < gate.cooldown_seconds:
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


CONFIG_EXIT_CODE = 2
"""``keyorder catchup``'s exit status for what it refuses before it reads or commits anything: its settings,
and a runtime without PySpark or Java (the handler image, for one). The Job fails at once on it (its
``podFailurePolicy``): a retry would fail the same way, with the consumer pods stopped all the while."""


def config_failure(job: dict[str, Any] | None) -> str | None:
    """Why a Job failed at once, when its driver exited with ``CONFIG_EXIT_CODE`` (the Job controller's
    ``Failed`` condition with reason ``PodFailurePolicy``): the likely cause, naming the image. ``None``
    for any other outcome."""
    status = (job or {}).get("status") or {}
    failed_by_policy = any(
        condition.get("type") == "Failed"
        and condition.get("status") == "True"
        and condition.get("reason") == "PodFailurePolicy"
        for condition in status.get("conditions") or []
    )
    if job is None or not failed_by_policy:
        return None
    containers = ((job.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or [{}]
    name = (job.get("metadata") or {}).get("name")
    return (
        f"its driver exited with code {CONFIG_EXIT_CODE} before it touched the group: keyorder catchup refused "
        f"to start, most likely because image {containers[0].get('image')} cannot run it (no Java or PySpark: "
        "spec.catchup.image must be built from the image's `catchup` target), else a setting it names "
        f"(kubectl logs job/{name})"
    )


STOPPING_PODS_GRACE_SECONDS = 120
"""How long past the pods' termination grace period the operator waits for them to disappear
before it gives up on the hand-over (a pod stuck terminating must not share the group)."""


def stopping_pods_deadline(run: CatchupRun, termination_grace_seconds: int) -> float:
    return run.started_at + termination_grace_seconds + STOPPING_PODS_GRACE_SECONDS
