"""One poll of one OrderedConsumer: observe Kafka and the pods, decide the size, act on it, explain it.

The kopf timer (``reconcile.register``) builds a ``Poll`` on every tick and calls ``run``, which does
something every ``scaling.pollIntervalSeconds``. The steps are methods sharing the resource, its patch
and the poll's own conditions (``status.POLL_CONDITIONS``, written once at the end), which ``Poll`` takes
from ``polled_resource.PolledResource``, as the catch-up hand-over (``handover``) does. The decisions are
pure and live elsewhere (``policy.decide``, ``catchup.catchup_verdict``); this module gathers their
inputs and carries out their outputs: the Deployment's replicas, the pods' worker count, status,
Events and metrics.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes.client.rest import ApiException

from keyorder_operator.builders import ADMIN_TOKEN_KEY, selector_labels
from keyorder_operator.catchup import CatchupGate, CatchupRetry, CatchupRun, catchup_verdict, spark_cores
from keyorder_operator.context import kafka_properties
from keyorder_operator.handover import CatchupHandover
from keyorder_operator.key_names import with_key_digests
from keyorder_operator.objects import apply_owned_objects
from keyorder_operator.observe import LagSample, LagUnavailable, observation_from
from keyorder_operator.pod_admin import needing_push
from keyorder_operator.pod_signals import PodSignals, combine
from keyorder_operator.policy import (
    Caveat,
    Decision,
    Limited,
    Observation,
    ScalingLimits,
    ScalingState,
    Size,
    decide,
    net_drain_seconds,
    not_resized,
    resumed,
)
from keyorder_operator.polled_resource import PolledResource
from keyorder_operator.restart import (
    RecordError,
    first_poll_at,
    first_poll_spread,
    record_changes,
    record_of,
    save_due,
    saved_at,
    state_from_record,
)
from keyorder_operator.spec import PAUSE_ANNOTATION, OrderedConsumerSpec, ScalingMode
from keyorder_operator.status import (
    POLL_CONDITIONS,
    condition_is,
    limits_from_spec,
    sample_from_status,
    sample_to_status,
    state_after,
    state_from_status,
    state_to_status,
    timestamp,
    write_conditions,
)
from keyorder_operator.status_view import after_write, changed_conditions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodsRead:
    """What this poll learned from the ready pods, and what it needs to push to them."""

    token: str | None
    addresses: list[str]
    signals: PodSignals | None
    failures: list[str]
    reports: list[dict[str, Any]] = field(default_factory=list)
    """Each pod's report, with the address it came from (``pod_admin.ADDRESS``)."""


@dataclass(frozen=True)
class Observed:
    sample: LagSample | None
    observation: Observation
    pods: PodsRead


class Poll(PolledResource):
    """One poll of one resource (see the module docstring)."""

    def due(self) -> bool:
        """Every pollIntervalSeconds, whether or not the last poll could read the lag, counted from the last
        poll's start. The timer ticks every ``--tick`` seconds on a fixed grid (kopf's sharp timer), so an
        interval is rounded to the nearest whole number of ticks (at least one). A poll starts when a
        handler thread is free, a little after its tick; half a tick of slack keeps one such delay from
        skipping the next tick (which would double the gap)."""
        last_poll = self.memory.started_at if self.memory.started_at is not None else self.status.get("lastPollAt")
        interval = self.spec.scaling.poll_interval_seconds
        slack = self.context.tick_seconds / 2
        if not isinstance(last_poll, int | float):
            return self.first_poll_due(interval, slack)
        return not self.now - last_poll < max(interval - slack, slack)

    def first_poll_due(self, interval: float, slack: float) -> bool:
        """The first poll of this resource since the operator started or took over (or since its memory was
        dropped, ``restart.memory_lasts``): one that existed before the operator became active waits for
        its own moment of the first interval from then (``restart.first_poll_at``), so a started operator,
        or a standby taking over, does not poll every resource on its first tick; one created since is
        polled at once."""
        if not first_poll_spread(self.meta.get("creationTimestamp"), self.active_since):
            return True
        return self.now >= first_poll_at(str(self.meta.get("uid") or self.name), self.active_since, interval) - slack

    @property
    def paused(self) -> bool:
        return str((self.meta.get("annotations") or {}).get(PAUSE_ANNOTATION, "")).lower() == "true"

    def run(self) -> None:
        """One poll when due. Whatever fails inside is reported (the ``ReconcileFailed`` condition, an
        Event when it starts, ``keyorder_operator_reconcile_errors_total``) and retried on the next tick;
        the conditions are written either way."""
        if not self.due():
            return
        self.memory.started_at = self.now
        self.context.metrics.poll_started(self.labels, self.now)
        for legacy in ("lastPollAt", "lastSample"):  # an older release wrote these every poll; memory holds them now
            if self.status.get(legacy) is not None:
                self.patch.status[legacy] = None
        metrics = self.context.metrics
        metrics.track(*self.labels)
        started = self.context.monotonic()
        try:
            self.poll_once()
        except Exception as error:
            metrics.errors.labels(*self.labels).inc()
            log.exception("%s/%s: the poll failed", self.namespace, self.name)
            # an API error's text carries the response's date and audit id: name it by status instead,
            # so a failure that goes on does not rewrite the condition on every poll
            what = f"{error.status} {error.reason}" if isinstance(error, ApiException) else str(error)
            message = f"the poll failed and is retried every poll: {type(error).__name__}: {what}"[:1000]
            if not condition_is(self.conditions, "ReconcileFailed"):
                self.warn("ReconcileFailed", message)
            self.condition("ReconcileFailed", True, type(error).__name__, message)
        else:
            if condition_is(self.conditions, "ReconcileFailed"):
                self.condition("ReconcileFailed", False, "PollSucceeded", "the last poll succeeded")
        finally:
            metrics.polled(self.labels, self.context.monotonic() - started)
            self.write_status()

    def write_status(self) -> None:
        """Hand kopf what changed in status (nothing for a steady poll: no write at all), and remember it
        as written, to compare the next polls with until the watched body shows it (``status_view``)."""
        changed = changed_conditions(self.status, self.conditions, POLL_CONDITIONS)
        if changed:
            write_conditions(self.patch, self.conditions, POLL_CONDITIONS)
        drop_unchanged(self.patch, self.status)
        fields = dict(self.patch.get("status") or {})
        if fields or changed:
            self.memory.written = after_write(self.memory.written, self.status, fields, changed, self.monotonic)

    def poll_once(self) -> None:
        self.repair_objects()
        replicas = self.context.kube.deployment_replicas(self.namespace, self.name)
        if replicas is None:
            return  # the spec handlers have not created it yet
        # the pods that exist, for the scale subresource (the decided size is status.replicas)
        self.patch.status["observedReplicas"] = self.context.kube.deployment_pods_reported(self.namespace, self.name)
        run = CatchupRun.from_status(self.status)
        self.context.metrics.catching_up.labels(*self.labels).set(1 if run is not None else 0)
        if run is not None and self.paused:  # pause wins: the hand-over waits where it is
            self.condition(
                "CatchingUp", True, "Paused", f"paused: the catch-up hand-over waits in phase {run.phase.value}"
            )
        elif run is not None:
            CatchupHandover(self).follow(run, replicas)
        else:
            self.size(replicas)

    def repair_objects(self) -> None:
        """Re-apply the owned objects changed since the last apply, so a deleted or edited one comes back
        (self-repair); a recreated one gets a ``Restored`` Event."""
        if self.status.get("observedGeneration") is None:
            return  # not created yet: the spec handlers do it
        try:
            missing = apply_owned_objects(
                self.context.kube, self.spec, self.meta, self.status, self.context.applied, always=False
            )
            if missing:
                self.warn("Restored", f"recreated the {', '.join(missing)} that had been deleted")
        except Exception as error:  # reported; the scaling still runs on what exists
            self.context.metrics.errors.labels(*self.labels).inc()
            log.warning("%s/%s: re-applying the owned objects failed: %s", self.namespace, self.name, error)

    def size(self, replicas: int) -> None:
        state = self.remembered_state(replicas)
        paused = self.paused
        observed = self.observe(state, replicas, paused)
        # recommend-only mode changes nothing, so beside another autoscaler is where it belongs
        if self.spec.scaling.mode is not ScalingMode.RECOMMEND and self.other_autoscaler(replicas):
            return
        current = Size(replicas, state.current.workers)
        metrics = self.context.metrics
        if not self.spec.scaling.enabled:
            target = Size(self.spec.replicas.min, self.spec.workers.initial)
            reason = f"scaling disabled: {target.replicas} replicas x {target.workers} workers"
            if self.write_replicas(target, current):
                self.explain(target, reason, None, None, current, paused, observed.pods)
            return
        limits = limits_from_spec(self.spec)
        decision = decide(observed.observation, limits, state, self.now)
        metrics.decided(self.labels, decision)
        if decision.handler_seconds is not None:
            self.patch.status["pods"]["handlerMilliseconds"] = round(decision.handler_seconds * 1000, 3)
        self.explain_caveat(decision.caveat)
        if self.spec.scaling.mode is ScalingMode.RECOMMEND:
            self.remember(state_after(decision, self.spec), limits, resized=False)
            self.recommend(decision, current, paused, observed.pods)
            return
        if self.status.get("recommendation") is not None:
            self.patch.status["recommendation"] = None  # the mode went back to apply
        if self.hand_over(observed, decision, limits, paused, replicas):
            self.remember(not_resized(decision, self.now), limits, resized=False)  # the pods stop instead
            return
        # the memory and the record say the group was resized only once the replicas are written
        if not self.write_replicas(decision.target, current):
            self.remember(not_resized(decision, self.now), limits, resized=False)
            return
        self.remember(decision.state, limits, resized=decision.scaled)
        self.explain(
            decision.target,
            decision.reason,
            decision.limited,
            decision.caveat,
            current,
            paused,
            observed.pods,
            hold_workers=decision.hold_workers,
        )

    def remember(self, state: ScalingState, limits: ScalingLimits, resized: bool) -> None:
        """Keep ``state`` for the next poll (in memory) and, when it matters, for a restart (``keep_record``);
        ``resized``: the replicas were written."""
        self.memory.autoscaler = state_to_status(state)
        self.keep_record(state, limits, resized)

    def remembered_state(self, replicas: int) -> ScalingState:
        """The policy's state: this process's memory of the last poll or, on the first poll since the
        operator started, what its predecessor kept in ``status.autoscaler``, resumed (``policy.resumed``)."""
        remembered = self.memory.autoscaler
        if remembered is not None:
            return state_from_status({**self.status, "autoscaler": remembered}, self.spec, replicas)
        fresh = state_from_status({**self.status, "autoscaler": None}, self.spec, replicas)
        record = self.status.get("autoscaler")
        if record is None:
            return fresh
        try:
            stored = state_from_record(record, fresh.current, self.now)
            self.memory.autoscaler_saved_at = saved_at(record, self.now)
        except RecordError as error:
            log.warning("%s/%s: %s; the autoscaler starts afresh", self.namespace, self.name, error)
            return fresh
        return resumed(stored, self.now)

    def keep_record(self, state: ScalingState, limits: ScalingLimits, resized: bool) -> None:
        """Write ``status.autoscaler`` when what a restarted operator would resume from differs from
        ``state`` in a way that matters, at most once per ``autoscaler_save_seconds`` besides a resize
        (``restart``). Compared with the record in status, so a write that was lost is made again."""
        record = self.status.get("autoscaler")
        stored: ScalingState | None = None
        if record is not None:
            try:
                stored = state_from_record(record, state.current, self.now)
            except RecordError as error:
                log.warning("%s/%s: %s; it is written again", self.namespace, self.name, error)
        changes = record_changes(stored, state, limits, self.now)
        every = self.context.autoscaler_save_seconds
        if save_due(changes, resized, self.memory.autoscaler_saved_at, self.now, every):
            self.patch.status["autoscaler"] = record_of(state, self.now)
            self.memory.autoscaler_saved_at = self.now

    def recommend(self, decision: Decision, current: Size, paused: bool, pods: PodsRead) -> None:
        """``scaling.mode: recommend``: publish the decision (status, an Event when it changes, metrics)
        and change nothing; the pods keep their size and worker count."""
        target = decision.target
        before = self.status.get("recommendation") or {}
        recommendation = {
            "replicas": target.replicas,
            "workersPerPod": target.workers,
            "reason": decision.reason,
            "cause": decision.cause.value,
            "time": decision_record(before, decision.reason, self.now)["time"],
        }
        if (before.get("replicas"), before.get("workersPerPod")) != (target.replicas, target.workers):
            self.info("Recommended", f"recommend only (nothing applied): {decision.reason}")
        self.patch.status["recommendation"] = recommendation
        # nothing is written: the size stays as it is
        self.explain(current, decision.reason, decision.limited, decision.caveat, current, paused, pods, recommend=True)

    def observe(self, state: ScalingState, replicas: int, paused: bool) -> Observed:
        """Lag from Kafka, reports from the pods; the status and metrics of what was seen."""
        kube, status = self.context.kube, self.patch.status
        try:
            properties = kafka_properties(self.context, self.spec, self.namespace)
            source = self.context.lag_source(self.namespace, self.name, properties)
            sample: LagSample | None = source.sample(self.spec.kafka.topics, self.spec.kafka.group_id, self.now)
        except LagUnavailable as error:
            sample, reason, why = None, error.reason, error.condition
        pods = self.read_pods(replicas)
        if sample is None:
            self.context.metrics.lag_unknown.labels(*self.labels).inc()
            if not condition_is(self.conditions, "LagUnknown"):
                self.warn("LagUnknown", f"{reason}; keeping {state.current.replicas} replicas")
            # the reason says whose side failed: Kafka (LagUnavailable), a refused property, the reader process
            self.condition("LagUnknown", True, why, reason)
            observation = Observation(lag=None, partitions=None, paused=paused)
        else:
            observation = observation_from(
                sample_from_status({"lastSample": self.memory.last_sample or self.status.get("lastSample")}),
                sample,
                pods.signals,
                kube.deployment_rolled_out(self.namespace, self.name),
                paused,
                pods_expected=len(pods.addresses) if pods.token is not None else None,
            )
            drain, arrival = observation.drain_rate, observation.arrival_rate
            self.condition("LagUnknown", False, "LagMeasured", "lag read from Kafka")
            self.memory.last_sample = sample_to_status(sample)
            status["lag"] = sample.lag
            status["partitions"] = sample.partitions
            status["drainRate"] = round(drain, 3) if drain is not None else None
            status["arrivalRate"] = round(arrival, 3) if arrival is not None else None
            eta = net_drain_seconds(sample.lag, drain, arrival)
            # net of arrivals; -1 while the lag does not shrink (JSON has no infinity)
            status["drainEtaSeconds"] = None if eta is None else (-1 if math.isinf(eta) else round(eta))
            self.context.metrics.observed(self.labels, sample, drain, arrival, limits_from_spec(self.spec))
        status["pods"] = pods_to_status(pods.signals, pods.failures)
        return Observed(sample, observation, pods)

    def read_pods(self, replicas: int) -> PodsRead:
        """The admin token, the ready pods' addresses and their summed reports (with what failed)."""
        if not replicas:
            return PodsRead(None, [], None, [])
        kube = self.context.kube
        try:
            token = kube.read_secret_key(self.namespace, f"{self.name}-admin-token", ADMIN_TOKEN_KEY)
            addresses = kube.ready_pod_ips(self.namespace, selector_labels(self.name))
        except Exception as error:  # retried next poll; the decision goes on from Kafka's lag alone
            return PodsRead(None, [], None, [f"reading the pods: {error}"])
        reports, failures = self.context.fetch_reports(addresses, self.spec.http_port, token)
        if failures:
            self.context.metrics.pod_report_failures.labels(*self.labels).inc(len(failures))
        signals = combine(reports)
        if not self.spec.observability.show_keys:
            signals = with_key_digests(signals, token)
        return PodsRead(token, addresses, signals, failures, reports)

    def hand_over(
        self, observed: Observed, decision: Decision, limits: ScalingLimits, paused: bool, replicas: int
    ) -> bool:
        """Count the catch-up votes; start the hand-over (True) when the verdict says so."""
        spec, status = self.spec, self.status
        armed = (
            spec.catchup.enabled and not paused and status.get("catchupFailedGeneration") != self.meta.get("generation")
        )
        verdict = catchup_verdict(
            catchup_gate(spec, armed),
            observed.observation,
            decision.state.per_worker_rate,
            limits,
            decision.limited,
            int(status.get("catchupVotes") or 0),
            status.get("lastCatchupEndedAt"),
            self.now,
            CatchupRetry.from_status(status),
        )
        self.patch.status["catchupVotes"] = verdict.votes
        self.patch.status["catchupWaiting"] = verdict.waiting
        handover = CatchupHandover(self)
        trigger = verdict.start if observed.sample is not None else None
        # the image's pre-flight first (a check under way is followed whatever the verdict): the pods stop
        # only for an image that can run the Job
        if handover.image_ready(trigger) and trigger is not None and observed.sample is not None:
            handover.start(trigger, observed.sample.end_offsets, replicas)
            return True
        return False

    def write_replicas(self, target: Size, current: Size) -> bool:
        """Write the Deployment's replicas for ``target``, only while it still has those the decision started
        from (``Kube.scale`` with ``expected``); False when it no longer has them. A size somebody wrote
        after this poll read it (``kubectl scale``, an HPA) is never overwritten unseen: this poll then acts
        on nothing and the next one decides from the new size (and finds the other autoscaler, if one wrote
        it)."""
        if target.replicas == current.replicas:
            return True
        written = self.context.kube.scale(self.namespace, self.name, target.replicas, expected=current.replicas)
        if written is None:
            log.info(
                "%s/%s: the Deployment's replicas are no longer %d, the size this poll decided from; not "
                "scaling to %d, the next poll decides from the new size",
                self.namespace,
                self.name,
                current.replicas,
                target.replicas,
            )
            return False
        return True

    def explain(
        self,
        target: Size,
        reason: str,
        limited: Limited | None,
        caveat: Caveat | None,
        current: Size,
        paused: bool,
        pods: PodsRead,
        *,
        recommend: bool = False,
        hold_workers: bool = False,
    ) -> None:
        """After ``target``'s replicas were written: push the worker count (with ``hold_workers``, until a
        scale step has settled, not to the pods running more: ``policy.workers_while_pods_start``), and say
        why in status, Events and metrics."""
        metrics = self.context.metrics
        changed = target != current
        if changed:
            metrics.decisions.labels(*self.labels, "up" if target.capacity > current.capacity else "down").inc()
            self.info("Scaled", reason)
        metrics.replicas.labels(*self.labels).set(target.replicas)
        metrics.workers.labels(*self.labels).set(target.workers)
        metrics.paused.labels(*self.labels).set(1 if paused else 0)
        metrics.limit(self.labels, limited.kind.value if limited else None)
        self.explain_limit(limited)
        at_size = 0
        failures: list[str] = []
        if recommend:
            failures = pods.failures
        elif target.replicas and pods.token is not None:
            # only pods that run another count or did not report (until a step has settled, not those running
            # more); pods that start after the read get the size on the next poll
            stale = needing_push(pods.addresses, pods.reports, target.workers, lower=not hold_workers)
            pushed = 0
            if stale:
                pushed, failures = self.context.push(stale, self.spec.http_port, pods.token, target.workers)
            elsewhere = needing_push(pods.addresses, pods.reports, target.workers) if hold_workers else stale
            at_size = len(pods.addresses) - len(elsewhere) + pushed
        elif target.replicas and pods.failures:
            failures = pods.failures
        if paused:
            scaling_reason = "Paused"
        elif recommend:
            scaling_reason = "RecommendOnly"
        elif changed:
            scaling_reason = "Scaled"
        else:
            scaling_reason = caveat.reason if caveat is not None else "Stable"
        self.condition("Scaling", changed, scaling_reason, reason)
        ready = not condition_is(self.conditions, "LagUnknown") and not failures
        self.condition(
            "Ready",
            ready,
            "Reconciled" if ready else "Degraded",
            "objects applied, lag measured" if ready else "; ".join(failures) or "lag unknown",
        )
        status = self.patch.status
        status["replicas"] = target.replicas
        status["workersPerPod"] = target.workers
        status["podsUpdated"] = at_size
        status["limit"] = limited.message if limited else None
        status["lastDecision"] = decision_record(self.status.get("lastDecision"), reason, self.now)

    def explain_caveat(self, caveat: Caveat | None) -> None:
        """A Warning Event when decisions start being made without part of their inputs
        (``status.caveat`` remembers the reason, so the Event is sent once per episode)."""
        reason = caveat.reason if caveat is not None else None
        if caveat is not None and self.status.get("caveat") != reason:
            self.warn(caveat.reason, caveat.message)
        self.patch.status["caveat"] = reason

    def explain_limit(self, limited: Limited | None) -> None:
        """The ScalingLimited condition, and an Event when it starts or its cause changes."""
        before = next((c for c in self.conditions if c.get("type") == "ScalingLimited"), None)
        if limited is None:
            if before is not None:
                self.condition("ScalingLimited", False, "ScalingHelps", "scaling can help")
            return
        if before is None or before.get("status") != "True" or before.get("reason") != limited.kind.reason:
            self.warn("ScalingLimited", limited.message)
        self.condition("ScalingLimited", True, limited.kind.reason, limited.message)


def decision_record(before: Any, reason: str, now: float) -> dict[str, Any]:
    """``status.lastDecision``: the reason, and since when it has held (a poll that decides the same as
    the last one keeps its time, so status is not rewritten for it)."""
    if isinstance(before, dict) and before.get("reason") == reason and before.get("time"):
        return {"reason": reason, "time": before["time"]}
    return {"reason": reason, "time": timestamp(now)}


def without_nulls(value: Any) -> Any:
    """A value as a merge patch leaves it stored: a ``None`` in a map removes the key."""
    if isinstance(value, dict):
        return {key: without_nulls(item) for key, item in value.items() if item is not None}
    return value


def replacing(stored: Any, wanted: Any) -> Any:
    """The merge-patch value that turns ``stored`` into ``wanted``: keys ``wanted`` no longer has are
    set to ``None`` (removed), so a map written whole does not keep a stale key forever."""
    if not (isinstance(stored, dict) and isinstance(wanted, dict)):
        return wanted
    merged = {key: replacing(stored.get(key), item) for key, item in wanted.items()}
    merged.update({key: None for key in stored if key not in wanted})
    return merged


def drop_unchanged(patch: kopf.Patch, status: dict[str, Any]) -> None:
    """Leave out of the status patch every field whose value status already has: a poll that changed
    nothing users see sends no write at all (kopf sends nothing for an empty patch). A changed map is
    sent so that it replaces the stored one (a merge patch would otherwise keep its old keys)."""
    for key in list(patch.status.keys()):
        wanted, stored = patch.status[key], status.get(key)
        if without_nulls(wanted) == stored or (wanted is None and key not in status):
            del patch.status[key]
        elif isinstance(wanted, dict) and isinstance(stored, dict):
            patch.status[key] = replacing(stored, wanted)
    if "status" in patch and not patch["status"]:
        del patch["status"]  # kopf would send an empty status patch


def catchup_gate(spec: OrderedConsumerSpec, armed: bool) -> CatchupGate:
    catchup = spec.catchup
    return CatchupGate(
        enabled=armed,
        trigger_seconds=catchup.trigger_drain_seconds,
        executors=catchup.executors,
        executor_cores=catchup.executor_cores,
        cores=spark_cores(
            catchup.master, catchup.executors, catchup.executor_cores, catchup.resources.limits.get("cpu")
        )[0],
        per_core_rate=catchup.per_core_rate,
        task_workers=catchup.task_workers,
        confirm_polls=catchup.confirm_polls,
        cooldown_seconds=catchup.cooldown_seconds,
    )


def pods_to_status(signals: PodSignals | None, failures: list[str]) -> dict[str, Any]:
    """What the pods reported, for ``kubectl get okc -o yaml``."""
    if signals is None:
        return {"reporting": 0, "failures": failures[:5]}
    busiest = signals.busiest
    return {
        "reporting": signals.pods,
        "workers": signals.workers,
        "busy": signals.busy,
        "lanesReady": signals.lanes_ready,
        "queued": signals.queued,
        "busiestKey": busiest.key if busiest else None,
        "busiestKeyPartition": busiest.where if busiest else None,
        "busiestKeyShare": round(signals.busiest_share, 3),
        "blockedLag": signals.blocked_lag,
        # what rebalances cost the reporting pods since they started (docs/rebalancing.md)
        "partitionsRevokedTotal": signals.partitions_revoked_total,
        "rebalanceIdleSecondsTotal": round(signals.rebalance_idle_seconds_total, 3),
        "failures": failures[:5],
    }
