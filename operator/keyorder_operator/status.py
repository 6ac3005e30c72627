"""Helpers for the OrderedConsumer status: conditions (API conventions, one writer per type) and the
policy state. Pure, except that ``write_conditions`` hands kopf a function to apply to the patch.

The policy's memory lives in the operator's process between polls (``context.PollMemory``), in the
``state_to_status`` form read back by ``state_from_status``, because status is written only when
something in it changed. What a restarted or failed-over operator resumes from is the part of it kept
in ``status.autoscaler`` (the windows' recommendations, the rate limits' replica changes, what was
learned, the failed observations in a row), written at a bounded rate; what describes the last poll or
two (the lag sample, the pods' totals) is measured again. ``restart`` says what survives and when it
is written.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from keyorder_operator.observe import LagSample
from keyorder_operator.policy import (
    Decision,
    Limited,
    LimitKind,
    RateKind,
    RateLimit,
    RateSource,
    ScalingLimits,
    ScalingState,
    Size,
    unapplied,
)
from keyorder_operator.spec import OrderedConsumerSpec, Ordering, RatePolicySpec, ScalingMode

if TYPE_CHECKING:
    import kopf

SPEC_CONDITIONS = frozenset({"InvalidSpec"})
"""The conditions only the spec handlers (create, update, resume) write."""
POLL_CONDITIONS = frozenset(
    {
        "Ready",
        "Scaling",
        "ScalingLimited",
        "ScalingConflict",
        "LagUnknown",
        "CatchingUp",
        "CatchupFailed",
        "ReconcileFailed",
    }
)
"""The conditions only the poll (the timer, the catch-up hand-over included) writes."""


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


def merge_owned_conditions(
    stored: list[dict[str, Any]], mine: list[dict[str, Any]], owned: frozenset[str]
) -> list[dict[str, Any]]:
    """The conditions as ``stored`` now, with those of the ``owned`` types taken from ``mine``.

    Each handler works from the body it was given, which another handler may have changed since;
    writing its whole list back would undo that handler's conditions (a fixed spec's cleared
    InvalidSpec coming back, say). So a handler writes only the types it owns, onto the freshest list.

    The given body may also be older than the stored list (the watch lags), so a condition whose
    ``status`` the stored one already has keeps the stored ``lastTransitionTime``: it moves only on a
    transition of what is stored, as apimachinery's ``meta.SetStatusCondition`` does
    (k8s.io/apimachinery ``pkg/api/meta/conditions.go``).
    """
    replacements = {c["type"]: c for c in mine if c.get("type") in owned}
    for before in stored:
        mine_now = replacements.get(before.get("type"))
        since = before.get("lastTransitionTime")
        if mine_now is not None and before.get("status") == mine_now.get("status") and since:
            replacements[mine_now["type"]] = {**mine_now, "lastTransitionTime": since}
    merged = [replacements.pop(c.get("type"), c) if c.get("type") in owned else c for c in stored]
    return merged + list(replacements.values())


def write_conditions(patch: kopf.Patch, conditions: list[dict[str, Any]], owned: frozenset[str]) -> None:
    """Record a handler's conditions, changing only the ``owned`` types.

    kopf applies the function to the freshest body and sends the difference as a JSON patch guarded by
    the resourceVersion (retried on the next cycle if the resource changed meanwhile), so two handlers
    never undo each other's conditions the way merge-patching whole lists would.
    """

    def apply(body: kopf.RawBody) -> None:
        status = dict(body.get("status") or {})
        status["conditions"] = merge_owned_conditions(list(status.get("conditions") or []), conditions, owned)
        body["status"] = status

    patch.fns.append(apply)


def condition_is(conditions: list[dict[str, Any]], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _rates(policies: list[RatePolicySpec]) -> tuple[RateLimit, ...]:
    return tuple(RateLimit(RateKind(policy.type.value), policy.value, policy.period_seconds) for policy in policies)


def limits_from_spec(spec: OrderedConsumerSpec) -> ScalingLimits:
    scaling = spec.scaling
    fallback = scaling.fallback
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
        partition_ordering=spec.ordering is Ordering.PARTITION,
        limit_to_partitions_with_lag=scaling.limit_to_partitions_with_lag,
        scale_up_rates=_rates(scaling.scale_up_policies),
        scale_down_rates=_rates(scaling.scale_down_policies),
        fallback_after=fallback.failure_threshold if fallback else 0,
        fallback_replicas=fallback.replicas if fallback else 0,
        tolerance=scaling.tolerance,
        target_utilization=scaling.target_utilization_percent / 100,
        workload=workload_fingerprint(spec),
    )


def workload_fingerprint(spec: OrderedConsumerSpec) -> str:
    """A short digest of what the pods run (handler, image, executor, env, resources, template): the
    autoscaler's learned rate belongs to one workload and restarts when this changes."""
    relevant = {
        "handler": spec.handler.model_dump(mode="json"),
        "ordering": spec.ordering.value,
        "template": spec.template.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def _floats(data: Any) -> tuple[float, ...]:
    return tuple(float(value) for value in data or () if isinstance(value, int | float))


def _optional_float(data: Any) -> float | None:
    return float(data) if isinstance(data, int | float) and not isinstance(data, bool) else None


def _optional_int(data: Any) -> int | None:
    return data if isinstance(data, int) and not isinstance(data, bool) else None


def state_from_status(status: dict[str, Any], spec: OrderedConsumerSpec, replicas: int | None) -> ScalingState:
    """The policy state kept in status (or the starting state of a new resource). Fields written by
    an older release are read where they mean the same, and dropped (learned again) where not."""
    workers = status.get("workersPerPod") or spec.workers.initial
    current = Size(replicas if replicas is not None else max(spec.replicas.min, 1), workers)
    return state_from_memory(status.get("autoscaler") or {}, current)


def state_from_memory(memory: dict[str, Any], current: Size) -> ScalingState:
    """The policy state from its ``state_to_status`` form (times in seconds), at size ``current``."""
    totals = memory.get("podTotals")
    try:
        source = RateSource(memory.get("rateSource") or RateSource.NONE.value)
    except ValueError:
        source = RateSource.NONE
    return ScalingState(
        current=current,
        recommendations=tuple(tuple(item) for item in memory.get("recommendations", [])),
        per_worker_rate=_optional_float(memory.get("perWorkerRate")),
        rate_source=source,
        rate_samples=_floats(memory.get("rateSamples")),
        efficiency_samples=_floats(memory.get("efficiencySamples")),
        handler_time=_optional_float(memory.get("handlerSeconds")),
        arrival_samples=_floats(memory.get("arrivalSamples")),
        arrivals_at=_optional_float(memory.get("arrivalsAt")),
        drainable_lag=_optional_int(memory.get("drainableLag")),
        settled=memory.get("settled", True),
        pod_totals=(
            (
                int(totals[0]),
                float(totals[1]),
                int(totals[2]),
                int(totals[3]),
                float(totals[4] if len(totals) > 4 else 0),
            )
            if totals
            else None
        ),
        pod_totals_at=memory.get("podTotalsAt"),
        idle_polls=int(memory.get("idlePolls") or 0),
        failed_observations=int(memory.get("failedObservations") or 0),
        held_polls=int(memory.get("heldPolls") or 0),
        silent_polls=int(memory.get("silentPolls") or 0),
        replica_changes=tuple((float(at), int(replicas)) for at, replicas in memory.get("replicaChanges") or ()),
        limit=_limit_from_status(memory.get("limit")),
        limit_gone_polls=int(memory.get("limitGonePolls") or 0),
        workload=str(memory.get("workload") or ""),
        cpu_workers_per_pod=_optional_int(memory.get("cpuWorkersPerPod")),
        polled_at=_optional_float(memory.get("polledAt")),
        saturated=bool(memory.get("saturated", False)),
        step_started_at=_optional_float(memory.get("stepStartedAt")),
        step_seconds=_floats(memory.get("stepSeconds")),
    )


def _limit_from_status(data: Any) -> Limited | None:
    if not data:
        return None
    try:
        return Limited(LimitKind(data[0]), str(data[1]))
    except (ValueError, IndexError, TypeError):
        return None  # written by another release: the next decision sets it again


def state_to_status(state: ScalingState) -> dict[str, Any]:
    return {
        "recommendations": [list(item) for item in state.recommendations],
        "perWorkerRate": state.per_worker_rate,
        "rateSource": state.rate_source.value,
        "rateSamples": list(state.rate_samples),
        "efficiencySamples": list(state.efficiency_samples),
        "handlerSeconds": state.handler_time,
        "arrivalSamples": list(state.arrival_samples),
        "arrivalsAt": state.arrivals_at,
        "drainableLag": state.drainable_lag,
        "settled": state.settled,
        "podTotals": list(state.pod_totals) if state.pod_totals else None,
        "podTotalsAt": state.pod_totals_at,
        "idlePolls": state.idle_polls,
        "failedObservations": state.failed_observations,
        "heldPolls": state.held_polls,
        "silentPolls": state.silent_polls,
        "replicaChanges": [list(item) for item in state.replica_changes],
        "limit": [state.limit.kind.value, state.limit.message] if state.limit else None,
        "limitGonePolls": state.limit_gone_polls,
        "workload": state.workload,
        "cpuWorkersPerPod": state.cpu_workers_per_pod,
        "polledAt": state.polled_at,
        "saturated": state.saturated,
        "stepStartedAt": state.step_started_at,
        "stepSeconds": list(state.step_seconds),
    }


def state_after(decision: Decision, spec: OrderedConsumerSpec) -> ScalingState:
    """The policy's state to keep after ``decision``: in recommend-only mode the group kept its size, so
    the state says nothing was applied (``policy.unapplied``)."""
    if spec.scaling.mode is ScalingMode.RECOMMEND:
        return unapplied(decision.state, decision.before)
    return decision.state


def memory_after(decision: Decision, spec: OrderedConsumerSpec) -> dict[str, Any]:
    """The policy's memory to keep after ``decision`` (``state_after``), in the ``state_to_status`` form, as
    ``keyorder simulate`` keeps it. The operator's poll keeps the same, except after a decision whose
    replicas it could not write (``policy.not_resized``: ``poll.Poll.size``)."""
    return state_to_status(state_after(decision, spec))


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
