"""When to hand a backlog to a Spark catch-up Job, and the state of one hand-over: pure, no I/O.

A backlog triggers catch-up when even the *largest* size the autoscaler may reach would take
longer than ``spec.catchup.triggerDrainSeconds`` to drain it:
``lag / (max pods x max workers x per-worker rate - arrival rate)``. The per-worker rate is the
one the scaling policy learned under load; until it is known, nothing triggers.

A hand-over has two phases, kept in ``status.catchup`` so a restarted operator continues it:

1. ``StoppingPods``: the Deployment is scaled to 0 and the operator waits until no consumer pod
   is left (they commit their last offsets on SIGTERM), so the job plans from final offsets;
2. ``Running``: the Job runs ``keyorder catchup --until <fence>``, the fence being the end offsets
   recorded when catch-up was triggered. On success the Job has committed the fence and the pods
   resume from it; on failure nothing was committed and the pods resume from where they were.

A failed catch-up is not retried automatically for the same spec generation: the cause (a
poison message under ``block``, a broken image) needs a person; any spec change re-arms it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from keyorder_operator.policy import Observation, ScalingLimits, Size, duration, shape


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


def projected_drain_seconds_at_max(
    observation: Observation, per_worker_rate: float | None, largest: Size
) -> float | None:
    """Seconds to drain the lag at the largest size (``inf``: it would never catch up; ``None``: unknown)."""
    if observation.lag is None or not per_worker_rate or largest.capacity == 0:
        return None
    net_rate = largest.capacity * per_worker_rate - (observation.arrival_rate or 0.0)
    if net_rate <= 0:
        return math.inf
    return observation.lag / net_rate


def catchup_trigger(
    enabled: bool,
    trigger_seconds: float,
    observation: Observation,
    per_worker_rate: float | None,
    limits: ScalingLimits,
) -> str | None:
    """Why catch-up should start now, or ``None`` when it should not."""
    if not enabled or observation.lag is None or not observation.partitions:
        return None
    largest = largest_size(limits, observation.partitions)
    projected = projected_drain_seconds_at_max(observation, per_worker_rate, largest)
    if projected is None or projected <= trigger_seconds:
        return None
    shown = "never (arrivals outpace it)" if math.isinf(projected) else duration(projected)
    return (
        f"lag {observation.lag}: draining at the largest size ({largest.replicas} pods x {largest.workers} "
        f"workers at {per_worker_rate:.1f} msg/s each) would take {shown}, over the catch-up trigger "
        f"{duration(trigger_seconds)}"
    )


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


STOPPING_PODS_GRACE_SECONDS = 120
"""How long past the pods' termination grace period the operator waits for them to disappear
before it gives up on the hand-over (a pod stuck terminating must not share the group)."""


def stopping_pods_deadline(run: CatchupRun, termination_grace_seconds: int) -> float:
    return run.started_at + termination_grace_seconds + STOPPING_PODS_GRACE_SECONDS
