"""Pure helpers for the OrderedConsumer status: conditions (API conventions) and the policy state.

The policy's memory (recent recommendations, learned per-worker rate, last lag sample) lives in
the resource's status, so the operator itself is stateless: a restarted or failed-over operator
continues exactly where the previous one stopped.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from keyorder_operator.observe import LagSample
from keyorder_operator.policy import ScalingLimits, ScalingState, Size
from keyorder_operator.spec import OrderedConsumerSpec

CONDITION_TYPES = ("Ready", "Scaling", "LagUnknown", "InvalidSpec", "CatchingUp", "CatchupFailed")


def timestamp(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]], kind: str, active: bool, reason: str, message: str, now: float
) -> list[dict[str, Any]]:
    """Conditions with ``kind`` updated; ``lastTransitionTime`` changes only when the status flips."""
    status = "True" if active else "False"
    updated, found = [], False
    for condition in conditions:
        if condition.get("type") == kind:
            found = True
            since = condition.get("lastTransitionTime") if condition.get("status") == status else timestamp(now)
            condition = {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since or timestamp(now),
            }
        updated.append(condition)
    if not found:
        updated.append(
            {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": timestamp(now)}
        )
    return updated


def condition_is(conditions: list[dict[str, Any]], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def limits_from_spec(spec: OrderedConsumerSpec) -> ScalingLimits:
    scaling = spec.scaling
    return ScalingLimits(
        min_replicas=spec.replicas.min,
        max_replicas=spec.replicas.max,
        min_workers=spec.workers.min,
        max_workers=spec.workers.max,
        initial_workers=spec.workers.initial,
        target_drain_seconds=scaling.target_drain_seconds,
        activation_lag=scaling.activation_lag,
        scale_up_window_seconds=scaling.scale_up_stabilization_seconds,
        scale_down_window_seconds=scaling.scale_down_stabilization_seconds,
        scale_to_zero=scaling.scale_to_zero,
    )


def state_from_status(status: dict[str, Any], spec: OrderedConsumerSpec, replicas: int | None) -> ScalingState:
    """The policy state kept in status (or the starting state of a new resource)."""
    memory = status.get("autoscaler") or {}
    workers = status.get("workersPerPod") or spec.workers.initial
    current = Size(replicas if replicas is not None else max(spec.replicas.min, 1), workers)
    return ScalingState(
        current=current,
        recommendations=tuple(tuple(item) for item in memory.get("recommendations", [])),
        per_worker_rate=memory.get("perWorkerRate"),
        settled=memory.get("settled", True),
    )


def state_to_status(state: ScalingState) -> dict[str, Any]:
    return {
        "recommendations": [list(item) for item in state.recommendations],
        "perWorkerRate": state.per_worker_rate,
        "settled": state.settled,
    }


def sample_from_status(status: dict[str, Any]) -> LagSample | None:
    last = status.get("lastSample")
    if not last:
        return None
    return LagSample(
        at=last["at"], partitions=last["partitions"], end_total=last["endTotal"], committed_total=last["committedTotal"]
    )


def sample_to_status(sample: LagSample) -> dict[str, Any]:
    return {
        "at": sample.at,
        "partitions": sample.partitions,
        "endTotal": sample.end_total,
        "committedTotal": sample.committed_total,
    }
