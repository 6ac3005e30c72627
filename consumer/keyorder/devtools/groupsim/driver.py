"""The operator's poll against a simulated group: what ``Poll.size`` does, with the group in place of
Kafka, the pods and the API server.

Every ``scaling.pollIntervalSeconds`` of simulated time: the spec is parsed as the operator parses a
resource, the policy's memory comes back from the status dict (through JSON, as the API server
stores it), the lag sample and the ready pods' reports (built by the pods' report code, parsed and
summed by the operator's) become the ``Observation`` through ``observation_from``, ``decide`` runs,
and its target is applied: the Deployment's replicas, and the worker count pushed to the ready pods
that answer (until a scale step has settled, not to those running more: ``Decision.hold_workers``).
Everything is recorded in the run's timeline.

With ``keda``, the same scenario (the same arrivals and seed) runs under the reference policy instead:
KEDA's Kafka scaler and the HPA (``keda``) every HPA sync, scaling a plain consumer (one handler thread
per partition, ``GroupSettings.thread_per_partition``); it reads Kafka's lag only.

With ``restart_every``, the operator also restarts that often: the memory it kept between polls is lost,
and the next poll resumes from the record ``status.autoscaler`` held, written by the operator's own rule
(``keyorder_operator.restart``: what is worth a write, at most once per ``AUTOSCALER_SAVE_SECONDS``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from keyorder.devtools.groupsim.definitions import Point, PollRecord, Run, Scenario
from keyorder.devtools.groupsim.keda import KedaSettings, KedaState
from keyorder.devtools.groupsim.keda import decide as keda_decide
from keyorder.devtools.groupsim.model import TOPIC, SimPod, SimulatedGroup
from keyorder_operator.observe import LagSample, observation_from
from keyorder_operator.pod_signals import combine, parse_report
from keyorder_operator.policy import Decision, Observation, Size, decide, resumed
from keyorder_operator.restart import (
    AUTOSCALER_SAVE_SECONDS,
    record_changes,
    record_of,
    save_due,
    saved_at,
    state_from_record,
)
from keyorder_operator.spec import OrderedConsumerSpec, ScalingMode, parse_spec
from keyorder_operator.status import (
    limits_from_spec,
    memory_after,
    sample_from_status,
    sample_to_status,
    state_after,
    state_from_status,
)

EPOCH = 1_700_000_000.0
"""Simulated second 0 as a Unix time (the policy stores times; they must look like real ones)."""


@dataclass
class KeptInStatus:
    """What a restarted operator finds: ``status.autoscaler`` as the operator's rule last wrote it."""

    record: dict[str, Any] | None = None
    saved_at: float | None = None
    """When the running operator last wrote it (the write rate counts from it)."""


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def parsed_spec_at(
    scenario: Scenario, t: float, parsed: dict[tuple[bool, ...], OrderedConsumerSpec]
) -> OrderedConsumerSpec:
    """The operator's parse of ``scenario.spec_at(t)``, parsed once per set of spec changes in effect (the
    spec changes a few times a run, and parsing it every simulated second was a third of a run's time)."""
    in_effect = tuple(t >= at for at, _ in scenario.spec_changes)
    if in_effect not in parsed:
        parsed[in_effect] = parse_spec(scenario.spec_at(t))
    return parsed[in_effect]


def keda_settings_for(spec: OrderedConsumerSpec, base: KedaSettings) -> KedaSettings:
    """The ScaledObject a user would write for the same group: the resource's replica bounds and
    ``limitToPartitionsWithLag``; the rest (``lagThreshold`` and the timings) from ``base``."""
    return replace(
        base,
        min_replicas=spec.replicas.min,
        max_replicas=spec.replicas.max or base.max_replicas,
        limit_to_partitions_with_lag=spec.scaling.limit_to_partitions_with_lag or base.limit_to_partitions_with_lag,
    )


def run(
    scenario: Scenario,
    seed: int = 1,
    progress: Callable[[float], None] | None = None,
    restart_every: float | None = None,
    keda: KedaSettings | None = None,
) -> Run:
    """Simulate ``scenario`` with the random ``seed``; ``progress(t)`` is called every simulated minute;
    the operator restarts every ``restart_every`` simulated seconds (``None``: never). With ``keda``,
    KEDA's Kafka scaler and the HPA (``keda``) scale a plain consumer instead (one thread per partition),
    on the same arrivals: the arrivals' noise has its own random stream, so both runs see the same."""
    rng = random.Random(seed)
    arrivals_rng = random.Random(f"arrivals-{seed}")
    parsed_specs: dict[tuple[bool, ...], OrderedConsumerSpec] = {}
    spec = parsed_spec_at(scenario, 0.0, parsed_specs)
    settings = replace(scenario.group, thread_per_partition=True) if keda is not None else scenario.group
    group = SimulatedGroup(
        settings=settings,
        workloads=dict(scenario.workloads),
        workload=spec.handler.image,
        rng=rng,
        replicas=scenario.initial_replicas,
        initial_workers=spec.workers.initial,
    )
    keda_state = KedaState()
    for partition, share in scenario.hot_keys:
        group.partitions[partition].hot_share = share
    if scenario.initial_backlog:
        group.add_arrivals(scenario.initial_backlog, scenario.weights_at(0.0))
    status: dict[str, Any] = {"workersPerPod": spec.workers.initial}
    kept = KeptInStatus()
    next_restart = restart_every
    result = Run(scenario, seed, policy="keda" if keda is not None else "keyorder")
    next_poll = keda.sync_period if keda is not None else spec.scaling.poll_interval_seconds
    dt = scenario.step_seconds
    t = 0.0
    committed_before = sum(partition.last_commit for partition in group.partitions)
    while t < scenario.duration - 1e-9:
        new_spec = parsed_spec_at(scenario, t, parsed_specs)
        if new_spec.handler.image != spec.handler.image:
            group.roll_out(new_spec.handler.image)
        spec = new_spec
        produced = scenario.arrivals(t) * dt
        if scenario.noise:
            produced *= 1.0 + arrivals_rng.uniform(-scenario.noise, scenario.noise)
        produced += sum(size for at, size in scenario.bursts if t <= at < t + dt)
        group.add_arrivals(produced, scenario.weights_at(t))
        for partition, at in scenario.blocked_keys:
            if t <= at < t + dt:
                group.partitions[partition].blocked_at = group.partitions[partition].end
        group.step(dt)
        t = round(t + dt, 6)
        if next_restart is not None and restart_every is not None and t >= next_restart - 1e-9:
            # the operator's process memory is gone: the last lag sample and the policy's memory
            status.pop("lastSample", None)
            status.pop("autoscaler", None)
            next_restart += restart_every
        if keda is not None and t >= next_poll - 1e-9:
            keda_state = _keda_sync(scenario, keda_settings_for(spec, keda), group, keda_state, result, t)
            next_poll += keda.sync_period
        elif t >= next_poll - 1e-9:
            _poll(scenario, spec, group, status, kept, result, t)
            next_poll += spec.scaling.poll_interval_seconds
        committed = sum(partition.last_commit for partition in group.partitions)
        result.points.append(
            Point(
                t=t,
                lag=group.lag(),
                arrival_rate=produced / dt,
                drain_rate=max(committed - committed_before, 0.0) / dt,
                replicas=group.replicas,
                ready=sum(1 for pod in group.pods if pod.joined),
                workers=_threads_per_pod(group.replicas, group.settings.partitions)
                if keda is not None
                else int(status.get("workersPerPod") or spec.workers.initial),
                capacity=group.ready_capacity(),
                per_worker_rate=group.true_rate(),
                paused=scenario.paused_at(t),
                lag_unknown=scenario.lag_unknown_at(t),
            )
        )
        committed_before = committed
        if progress is not None and int(t) % 60 == 0 and abs(t - int(t)) < 1e-9:
            progress(t)
    return result


def _threads_per_pod(replicas: int, partitions: int) -> int:
    """A plain consumer's threads in its busiest pod: one per partition it owns."""
    return math.ceil(partitions / min(replicas, partitions)) if replicas else 0


def _keda_sync(
    scenario: Scenario, settings: KedaSettings, group: SimulatedGroup, state: KedaState, result: Run, t: float
) -> KedaState:
    """One HPA sync (and KEDA's own loop when due) at simulated second ``t``: the lag per partition as
    Kafka reports it, ``keda.decide``, the Deployment's replicas."""
    lags = None
    if not scenario.lag_unknown_at(t):
        lags = tuple(int(partition.end) - int(partition.last_commit) for partition in group.partitions)
    current = group.replicas
    decision = keda_decide(t, current, lags, state, settings, paused=scenario.paused_at(t))
    group.scale(decision.replicas)
    partitions = group.settings.partitions
    result.polls.append(
        PollRecord(
            t=t,
            before=Size(current, _threads_per_pod(current, partitions)),
            target=Size(decision.replicas, _threads_per_pod(decision.replicas, partitions)),
            recommended=None,
            cause="keda",
            reason=decision.reason,
            limited=None,
            caveat=None,
        )
    )
    return decision.state


def _poll(
    scenario: Scenario,
    spec: OrderedConsumerSpec,
    group: SimulatedGroup,
    status: dict[str, Any],
    kept: KeptInStatus,
    result: Run,
    t: float,
) -> None:
    """One operator poll (``Poll.size``) at simulated second ``t``. ``status`` holds the running operator's
    memory (``autoscaler``, ``lastSample``: gone after a restart), ``kept`` what status holds for a restart."""
    now = EPOCH + t
    limits = limits_from_spec(spec)
    state = state_from_status(status, spec, group.replicas)
    if "autoscaler" not in status and kept.record is not None:  # restarted: resume as Poll.remembered_state
        state = resumed(state_from_record(_json(kept.record), state.current), now)
        kept.saved_at = saved_at(kept.record)
    paused = scenario.paused_at(t)

    def answers(pod: SimPod) -> bool:
        return not scenario.silent_at(t, pod.name, group)

    if scenario.lag_unknown_at(t):
        observation = Observation(lag=None, partitions=None, paused=paused)
    else:
        lags = tuple(int(partition.end) - int(partition.last_commit) for partition in group.partitions)
        sample = LagSample(
            at=now,
            partitions=len(group.partitions),
            end_total=sum(int(partition.end) for partition in group.partitions),
            committed_total=sum(int(partition.last_commit) for partition in group.partitions),
            partition_lags=lags,
            end_offsets=tuple((TOPIC, p.index, int(p.end)) for p in group.partitions),
        )
        ready = [pod for pod in group.pods if pod.joined]
        reports = [parse_report(_json(group.report(pod))) for pod in ready if answers(pod)]
        observation = observation_from(
            sample_from_status(status),
            sample,
            combine(reports),
            group.rollout_settled,
            paused,
            pods_expected=len(ready),
        )
        status["lastSample"] = sample_to_status(sample)
    current = state.current
    try:
        decision: Decision = decide(observation, limits, state, now)
    except Exception as error:  # a criterion: every exception is recorded, and the size is kept
        result.polls.append(
            PollRecord(t, current, current, None, "exception", "", None, None, f"{type(error).__name__}: {error}")
        )
        return
    target = decision.target
    status["autoscaler"] = _json(memory_after(decision, spec))
    after = state_after(decision, spec)
    stored = state_from_record(kept.record, after.current) if kept.record is not None else None
    resized = decision.scaled and spec.scaling.mode is not ScalingMode.RECOMMEND
    if save_due(record_changes(stored, after, limits, now), resized, kept.saved_at, now, AUTOSCALER_SAVE_SECONDS):
        kept.record, kept.saved_at = _json(record_of(after, now)), now
    if spec.scaling.mode is ScalingMode.RECOMMEND:
        target = current
    else:
        status["workersPerPod"] = target.workers
        group.scale(target.replicas)
        group.push_workers(target.workers, answers, lower=not decision.hold_workers)
    result.polls.append(
        PollRecord(
            t=t,
            before=current,
            target=target,
            recommended=decision.recommended,
            cause=decision.cause.value,
            reason=decision.reason,
            limited=decision.limited.kind.value if decision.limited else None,
            caveat=decision.caveat.reason if decision.caveat else None,
        )
    )
