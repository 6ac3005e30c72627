"""The kopf handlers: keep each OrderedConsumer's objects in place and its size matched to its lag.

``register(registry, context)`` binds the handlers to a registry, so the operator binary and the
tests (real kopf against an API emulator) run exactly the same code. Per resource:

* on create/update/resume: validate the spec (invalid: ``InvalidSpec`` condition + Event, and
  nothing is touched), then create or patch the admin Secret, ServiceAccount, Deployment,
  metrics Service and PodDisruptionBudget, all owned by the resource;
* every ``scaling.pollIntervalSeconds``: re-apply the owned objects (a deleted or edited one comes
  back within one poll), observe lag in Kafka and the pods' reports, ``decide``, patch the
  Deployment's replicas, push the worker count to ready pods, and explain the decision in status
  and, when the size changes, in an Event;
* when ``spec.catchup`` is enabled and even the largest size would drain too slowly: stop the
  pods, run a Spark catch-up Job up to the fence, then resume the pods (see ``catchup``).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge

from keyorder.config import ConfigError
from keyorder_operator.builders import (
    ADMIN_TOKEN_KEY,
    FENCE_ANNOTATION,
    build_admin_secret,
    build_catchup_job,
    build_deployment,
    build_pdb,
    build_service,
    build_service_account,
    catchup_job_name,
    catchup_selector,
    selector_labels,
)
from keyorder_operator.catchup import (
    CatchupGate,
    CatchupRun,
    JobState,
    Phase,
    catchup_verdict,
    fence_argument,
    fence_from_end_offsets,
    job_state,
    largest_size,
    stopping_pods_deadline,
)
from keyorder_operator.kafka_config import operator_kafka_config
from keyorder_operator.kube import JobConflict, Kube
from keyorder_operator.observe import (
    BoundedLagSource,
    KafkaLagSource,
    LagSample,
    LagSource,
    LagUnavailable,
    observation_from,
)
from keyorder_operator.pod_admin import fetch_reports, push_workers
from keyorder_operator.pod_signals import PodSignals, combine
from keyorder_operator.policy import Limited, LimitKind, Observation, ScalingLimits, Size, decide
from keyorder_operator.spec import (
    GROUP,
    PAUSE_ANNOTATION,
    PLURAL,
    VERSION,
    InvalidSpec,
    OrderedConsumerSpec,
    name_problem,
    parse_spec,
)
from keyorder_operator.status import (
    POLL_CONDITIONS,
    SPEC_CONDITIONS,
    condition_is,
    limits_from_spec,
    merge_owned_conditions,
    sample_from_status,
    sample_to_status,
    set_condition,
    state_from_status,
    state_to_status,
    timestamp,
)

log = logging.getLogger(__name__)


CATCHUP_OUTCOMES = ("started", "succeeded", "failed", "missing")


class OperatorMetrics:
    """The operator's own metrics (decisions, observed lag, errors)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ["namespace", "name"]
        self.decisions = Counter(
            "keyorder_operator_decisions",
            "Scaling decisions that changed the size.",
            [*labels, "direction"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "keyorder_operator_observed_lag_messages",
            "Lag observed in Kafka per resource.",
            labels,
            registry=self.registry,
        )
        self.replicas = Gauge(
            "keyorder_operator_replicas", "Replicas decided per resource.", labels, registry=self.registry
        )
        self.workers = Gauge(
            "keyorder_operator_workers_per_pod",
            "Key workers per pod decided per resource.",
            labels,
            registry=self.registry,
        )
        self.lag_unknown = Counter(
            "keyorder_operator_lag_unavailable",
            "Observations that could not measure lag.",
            labels,
            registry=self.registry,
        )
        self.errors = Counter(
            "keyorder_operator_reconcile_errors", "Reconciles that failed (retried).", labels, registry=self.registry
        )
        self.catchups = Counter(
            "keyorder_operator_catchups",
            "Catch-up Jobs by outcome: started, succeeded, failed.",
            [*labels, "outcome"],
            registry=self.registry,
        )
        self.catching_up = Gauge(
            "keyorder_operator_catching_up",
            "1 while a catch-up hand-over is in progress.",
            labels,
            registry=self.registry,
        )

        self.lag_seconds = Gauge(
            "keyorder_operator_lag_seconds",
            "Lag divided by the drain rate: the drain ETA at the current rate (absent while nothing drains).",
            labels,
            registry=self.registry,
        )
        self.arrival_rate = Gauge(
            "keyorder_operator_arrival_rate", "Messages/s produced to the topics.", labels, registry=self.registry
        )
        self.drain_rate = Gauge(
            "keyorder_operator_drain_rate", "Messages/s committed by the group.", labels, registry=self.registry
        )
        self.target_drain_seconds = Gauge(
            "keyorder_operator_target_drain_seconds",
            "spec.scaling.targetDrainSeconds: the drain time the autoscaler sizes for.",
            labels,
            registry=self.registry,
        )
        self.ceiling_workers = Gauge(
            "keyorder_operator_ceiling_workers",
            "The most key workers the group may reach: min(replicas.max, partitions) x workers.max.",
            labels,
            registry=self.registry,
        )
        self.scaling_limited = Gauge(
            "keyorder_operator_scaling_limited",
            "1 while scaling cannot help, by reason (hot_key, blocked_key, partition_ordering, cpu, "
            "partitions_with_lag, idle_workers).",
            [*labels, "reason"],
            registry=self.registry,
        )
        self.paused = Gauge(
            "keyorder_operator_paused",
            "1 while the resource carries the keyorder.dev/paused annotation.",
            labels,
            registry=self.registry,
        )

    def observed(
        self,
        labels: tuple[str, str],
        sample: LagSample,
        drain: float | None,
        arrival: float | None,
        limits: ScalingLimits,
    ) -> None:
        """The figures of one lag observation."""
        self.lag.labels(*labels).set(sample.lag)
        if drain is not None:
            self.drain_rate.labels(*labels).set(drain)
            if drain > 0:
                self.lag_seconds.labels(*labels).set(sample.lag / drain)
            else:
                with contextlib.suppress(KeyError):
                    self.lag_seconds.remove(*labels)
        if arrival is not None:
            self.arrival_rate.labels(*labels).set(arrival)
        self.target_drain_seconds.labels(*labels).set(limits.target_drain_seconds)
        self.ceiling_workers.labels(*labels).set(largest_size(limits, sample.partitions).capacity)

    def limit(self, labels: tuple[str, str], kind: str | None) -> None:
        """Exactly one reason at 1 while scaling is limited; all at 0 otherwise."""
        for reason in LimitKind:
            self.scaling_limited.labels(*labels, reason.value).set(1 if reason.value == kind else 0)

    def _series(self) -> list[tuple[Any, tuple[str, ...]]]:
        """Every labelled series of a resource: (metric, extra label values)."""
        return [
            (self.decisions, ("up",)),
            (self.decisions, ("down",)),
            (self.lag_unknown, ()),
            (self.errors, ()),
            (self.catching_up, ()),
            *((self.catchups, (outcome,)) for outcome in CATCHUP_OUTCOMES),
        ]

    def track(self, namespace: str, name: str) -> None:
        """Create a resource's counters at 0, so the first increment is an ``increase()`` alerts can see."""
        for metric, extra in self._series():
            metric.labels(namespace, name, *extra)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted resource's series (dashboards and alerts stop showing it)."""
        gauges = [
            self.lag,
            self.replicas,
            self.workers,
            self.lag_seconds,
            self.arrival_rate,
            self.drain_rate,
            self.target_drain_seconds,
            self.ceiling_workers,
            self.paused,
        ]
        limited = [(self.scaling_limited, (kind.value,)) for kind in LimitKind]
        for metric, extra in [*self._series(), *((gauge, ()) for gauge in gauges), *limited]:
            with contextlib.suppress(KeyError):
                metric.remove(namespace, name, *extra)


@dataclass
class OperatorContext:
    """What the handlers need from the outside world; tests replace parts of it."""

    kube: Kube
    lag_source_for: Callable[[dict[str, str]], LagSource] = KafkaLagSource
    clock: Callable[[], float] = time.time
    push: Callable[..., tuple[int, list[str]]] = push_workers
    fetch_reports: Callable[..., tuple[list[dict[str, Any]], list[str]]] = fetch_reports
    tick_seconds: float = 5.0
    handler_threads: int = 32
    """kopf's pool for the (synchronous) handlers: each poll waits on Kafka at most ``lag_wait_seconds``
    and on the pods about 2 s, so a few dozen threads keep many resources on time."""
    lag_wait_seconds: float = 2.0
    lag_backoff_seconds: tuple[float, float] = (15.0, 120.0)
    """A failing cluster is asked again after the first period, doubling up to the second."""
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    _lag_sources: dict[tuple[str, str], tuple[tuple[tuple[str, str], ...], LagSource]] = field(default_factory=dict)
    _lag_sources_lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards ``_lag_sources``: kopf runs the handlers of different resources on different pool threads."""

    def lag_source(self, namespace: str, name: str, properties: dict[str, str]) -> LagSource:
        """The resource's lag source for ``properties``: one per resource, replaced (and the old one
        closed) when its configuration changes, e.g. a rotated password. Raises ``LagUnavailable``."""
        wanted = tuple(sorted(properties.items()))
        with self._lag_sources_lock:
            current = self._lag_sources.get((namespace, name))
            if current is not None and current[0] == wanted:
                return current[1]
            first, longest = self.lag_backoff_seconds
            source: LagSource = BoundedLagSource(
                self.lag_source_for(properties),
                first_seconds=first,
                longest_seconds=longest,
                wait_seconds=self.lag_wait_seconds,
            )
            self._lag_sources[(namespace, name)] = (wanted, source)
        if current is not None:
            current[1].close()
        return source

    def forget_lag_source(self, namespace: str, name: str) -> None:
        """Close a deleted resource's lag source (its Kafka connections)."""
        with self._lag_sources_lock:
            current = self._lag_sources.pop((namespace, name), None)
        if current is not None:
            current[1].close()


def _kafka_properties(context: OperatorContext, spec: OrderedConsumerSpec, namespace: str) -> dict[str, str]:
    """The operator's Kafka configuration for a resource (``kafka_config``); any failure is ``LagUnavailable``
    naming the Secret or property (never a value)."""
    reference = spec.kafka.properties_secret_ref
    if reference is None:
        return operator_kafka_config(spec.kafka.bootstrap_servers)
    try:
        secret = context.kube.read_secret(namespace, reference.name)
        return operator_kafka_config(
            spec.kafka.bootstrap_servers, secret, reference.key, f"{namespace}/{reference.name}"
        )
    except ApiException as error:
        what = "does not exist" if error.status == 404 else f"cannot be read: {error.status} {error.reason}"
        raise LagUnavailable(f"Secret {namespace}/{reference.name} (spec.kafka.propertiesSecretRef) {what}") from None
    except ConfigError as error:
        raise LagUnavailable(str(error)) from None


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


def poll_conditions(patch: kopf.Patch, conditions: list[dict[str, Any]]) -> None:
    """The poll's conditions (``POLL_CONDITIONS``); see ``write_conditions``."""
    write_conditions(patch, conditions, POLL_CONDITIONS)


def register(registry: kopf.OperatorRegistry, context: OperatorContext) -> None:
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.startup(registry=registry)
    def size_the_handler_pool(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.execution.max_workers = context.handler_threads

    def validated(body: Any, patch: kopf.Patch, now: float) -> OrderedConsumerSpec | None:
        """The parsed spec, or None after reporting it (the name too: the CRD refuses a bad one, but an
        older CRD may not); a valid spec clears a previous InvalidSpec."""
        conditions = list((body.get("status") or {}).get("conditions") or [])
        try:
            problem = name_problem(str((body.get("metadata") or {}).get("name") or ""))
            if problem is not None:
                raise InvalidSpec([("metadata.name", problem)])
            spec = parse_spec(dict(body.get("spec") or {}))
        except InvalidSpec as error:
            if not condition_is(conditions, "InvalidSpec") or next(
                c for c in conditions if c["type"] == "InvalidSpec"
            ).get("message") != str(error):
                kopf.warn(body, reason="InvalidSpec", message=str(error))
            write_conditions(
                patch, set_condition(conditions, "InvalidSpec", True, "InvalidSpec", str(error), now), SPEC_CONDITIONS
            )
            return None
        if condition_is(conditions, "InvalidSpec"):
            write_conditions(
                patch, set_condition(conditions, "InvalidSpec", False, "Valid", "spec is valid", now), SPEC_CONDITIONS
            )
        return spec

    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, field="spec", registry=registry)
    def reconcile_objects(body: Any, meta: Any, status: Any, patch: kopf.Patch, **_: Any) -> None:
        now = context.clock()
        spec = validated(body, patch, now)
        if spec is None:
            return
        try:
            apply_objects(spec, meta, status)
        except Exception as error:
            context.metrics.errors.labels(meta["namespace"], meta["name"]).inc()
            raise kopf.TemporaryError(f"applying objects failed: {error}", delay=10) from error
        patch.status["observedGeneration"] = meta.get("generation")

    def apply_objects(spec: OrderedConsumerSpec, meta: Any, status: Any) -> None:
        """Server-side apply of every owned object (idempotent). Also run on every poll, so a deleted
        or edited object comes back within one poll interval (self-repair)."""
        owner = {"metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}}
        kube = context.kube
        kube.ensure_secret(build_admin_secret(owner, secrets.token_urlsafe(32)), ADMIN_TOKEN_KEY)
        kube.apply(build_service_account(owner))
        replicas = kube.deployment_replicas(meta["namespace"], meta["name"])
        if replicas is None:  # new, or deleted behind our back: the size last decided, else the minimum
            decided = (status or {}).get("replicas")
            replicas = (
                decided
                if isinstance(decided, int)
                else (max(spec.replicas.min, 1) if spec.scaling.enabled or spec.replicas.min else 1)
            )
        kube.apply(build_deployment(spec, owner, replicas))
        kube.apply(build_service(spec, owner))
        kube.apply(build_pdb(owner))

    @kopf.on.delete(*resource, registry=registry, optional=True)  # optional: no finalizer is added for this
    def forget_metrics(meta: Any, **_: Any) -> None:
        context.metrics.forget(meta["namespace"], meta["name"])
        context.forget_lag_source(meta["namespace"], meta["name"])

    def start_catchup(
        body: Any,
        meta: Any,
        spec: OrderedConsumerSpec,
        trigger: str,
        end_offsets: tuple[tuple[str, int, int], ...],
        replicas: int,
        conditions: list,
        patch: kopf.Patch,
        now: float,
    ) -> None:
        """Record the fence, scale the pods to 0; the Job starts once they are gone."""
        namespace, name = meta["namespace"], meta["name"]
        run = CatchupRun(
            Phase.STOPPING_PODS,
            catchup_job_name(name, now),
            fence_from_end_offsets(end_offsets),
            now,
            resume_replicas=max(replicas, spec.replicas.min, 1),
        )
        context.kube.scale(namespace, name, 0)
        context.metrics.catchups.labels(namespace, name, "started").inc()
        context.metrics.catching_up.labels(namespace, name).set(1)
        kopf.info(
            body,
            reason="CatchupStarted",
            message=f"{trigger}; stopping the pods for Job {run.job_name} (fence in status.catchup)",
        )
        patch.status["catchup"] = run.to_status()
        patch.status["replicas"] = 0
        poll_conditions(patch, set_condition(conditions, "CatchingUp", True, "StoppingPods", trigger, now))
        patch.status["lastDecision"] = {"reason": f"catch-up: {trigger}", "time": timestamp(now)}

    def follow_catchup(
        body: Any,
        meta: Any,
        spec: OrderedConsumerSpec,
        run: CatchupRun,
        replicas: int,
        conditions: list,
        patch: kopf.Patch,
        now: float,
    ) -> None:
        """Advance a hand-over: pods gone -> create the Job; Job finished and its pods gone -> resume the pods."""
        namespace, name = meta["namespace"], meta["name"]
        kube = context.kube
        if replicas != 0:
            kube.scale(namespace, name, 0)  # nothing may consume the group while the Job owns it
        if run.phase is Phase.STOPPING_PODS:
            left = max(kube.pod_count(namespace, selector_labels(name)), kube.deployment_pods_reported(namespace, name))
            if left and now > stopping_pods_deadline(run, spec.handler.termination_grace_period_seconds):
                finish_catchup(
                    body,
                    meta,
                    run,
                    conditions,
                    patch,
                    now,
                    JobState.FAILED,
                    f"{left} consumer pods did not stop within {now - run.started_at:.0f} s; no Job was started",
                )
            elif left:
                poll_conditions(
                    patch,
                    set_condition(
                        conditions, "CatchingUp", True, "StoppingPods", f"waiting for {left} consumer pods to stop", now
                    ),
                )
            else:
                start_job(body, meta, spec, run, conditions, patch, now)
            return
        outcome = job_state(kube.job(namespace, run.job_name))
        if outcome is JobState.ACTIVE:
            return
        still_running = kube.pod_count(namespace, catchup_selector(run.job_name))
        if still_running:  # a deleted or failed Job's driver may still be handling messages
            poll_conditions(
                patch,
                set_condition(
                    conditions,
                    "CatchingUp",
                    True,
                    "Finishing",
                    f"Job {run.job_name} {outcome.value}; waiting for its {still_running} pods to stop",
                    now,
                ),
            )
            return
        if outcome is JobState.SUCCEEDED:
            detail = f"Job {run.job_name} committed the fence after {now - run.started_at:.0f} s"
        else:
            what = "failed" if outcome is JobState.FAILED else "disappeared"
            detail = (
                f"Job {run.job_name} {what} after {now - run.started_at:.0f} s (a failed catch-up keeps "
                "the waves it committed; the rest is the pods' again)"
            )
        finish_catchup(body, meta, run, conditions, patch, now, outcome, detail)

    def start_job(
        body: Any,
        meta: Any,
        spec: OrderedConsumerSpec,
        run: CatchupRun,
        conditions: list,
        patch: kopf.Patch,
        now: float,
    ) -> None:
        namespace, name = meta["namespace"], meta["name"]
        owner = {"metadata": {"name": name, "namespace": namespace, "uid": meta["uid"]}}
        try:
            context.kube.create_job(
                build_catchup_job(spec, owner, run.job_name, fence_argument(run.fence)), FENCE_ANNOTATION
            )
        except (ApiException, JobConflict) as error:
            reason = error.reason if isinstance(error, ApiException) else str(error)
            finish_catchup(
                body,
                meta,
                run,
                conditions,
                patch,
                now,
                JobState.FAILED,
                f"Job {run.job_name} could not be created: {reason}",
            )
            return
        kopf.info(body, reason="CatchupRunning", message=f"pods stopped; Job {run.job_name} started")
        patch.status["catchup"] = run.running().to_status()
        poll_conditions(
            patch,
            set_condition(
                conditions,
                "CatchingUp",
                True,
                "Running",
                f"Job {run.job_name} handles the backlog up to the fence",
                now,
            ),
        )

    def finish_catchup(
        body: Any,
        meta: Any,
        run: CatchupRun,
        conditions: list,
        patch: kopf.Patch,
        now: float,
        outcome: JobState,
        detail: str,
    ) -> None:
        """Give the group back to the pods, and say how the hand-over ended."""
        namespace, name = meta["namespace"], meta["name"]
        context.kube.scale(namespace, name, run.resume_replicas)
        if outcome is JobState.SUCCEEDED:
            message = f"{detail}; {run.resume_replicas} pods resume from it"
            kopf.info(body, reason="CatchupSucceeded", message=message)
            conditions = set_condition(conditions, "CatchupFailed", False, "Succeeded", message, now)
        else:
            message = (
                f"{detail}; {run.resume_replicas} pods resume from the group's committed offsets. "
                "Automatic catch-up is off until the spec changes."
            )
            kopf.warn(body, reason="CatchupFailed", message=message)
            conditions = set_condition(conditions, "CatchupFailed", True, "JobFailed", message, now)
            patch.status["catchupFailedGeneration"] = meta.get("generation")
        context.metrics.catchups.labels(namespace, name, outcome.value).inc()
        context.metrics.catching_up.labels(namespace, name).set(0)
        poll_conditions(patch, set_condition(conditions, "CatchingUp", False, outcome.value.capitalize(), message, now))
        patch.status["catchup"] = None
        patch.status["lastCatchupEndedAt"] = now  # the cooldown counts from here
        patch.status["catchupVotes"] = 0
        patch.status["lastSample"] = None  # rates must not span the hand-over
        patch.status["replicas"] = run.resume_replicas
        patch.status["lastDecision"] = {"reason": message, "time": timestamp(now)}

    @kopf.timer(*resource, interval=context.tick_seconds, registry=registry)
    def autoscale(body: Any, meta: Any, status: Any, patch: kopf.Patch, **_: Any) -> None:
        now = context.clock()
        status = dict(status or {})
        try:
            spec = parse_spec(dict(body.get("spec") or {}))
        except InvalidSpec:
            return  # reported by reconcile_objects; nothing is scaled for an invalid spec
        previous = sample_from_status(status)
        last_poll = status.get("lastPollAt")
        if isinstance(last_poll, int | float) and now - last_poll < spec.scaling.poll_interval_seconds - 0.5:
            return  # every pollIntervalSeconds, whether or not the last poll could read the lag
        patch.status["lastPollAt"] = now
        namespace, name = meta["namespace"], meta["name"]
        labels = (namespace, name)
        context.metrics.track(namespace, name)
        kube = context.kube
        if status.get("observedGeneration") is not None:  # created once: keep it as specified (self-repair)
            try:
                apply_objects(spec, meta, status)
            except Exception as error:  # reported; the scaling below still runs on what exists
                context.metrics.errors.labels(*labels).inc()
                log.warning("%s/%s: re-applying the owned objects failed: %s", namespace, name, error)
        replicas = kube.deployment_replicas(namespace, name)
        if replicas is None:
            return  # reconcile_objects has not created it yet
        conditions = list(status.get("conditions") or [])
        run = CatchupRun.from_status(status)
        context.metrics.catching_up.labels(*labels).set(1 if run is not None else 0)
        if run is not None:
            follow_catchup(body, meta, spec, run, replicas, conditions, patch, now)
            return
        state = state_from_status(status, spec, replicas)
        paused = str((meta.get("annotations") or {}).get(PAUSE_ANNOTATION, "")).lower() == "true"
        try:
            properties = _kafka_properties(context, spec, namespace)
            sample = context.lag_source(namespace, name, properties).sample(spec.kafka.topics, spec.kafka.group_id, now)
        except LagUnavailable as error:
            sample, reason = None, str(error)
        token, addresses, signals, report_failures = read_pods(namespace, name, spec, replicas)
        if sample is None:
            context.metrics.lag_unknown.labels(*labels).inc()
            if not condition_is(conditions, "LagUnknown"):
                kopf.warn(body, reason="LagUnknown", message=f"{reason}; keeping {state.current.replicas} replicas")
            conditions = set_condition(conditions, "LagUnknown", True, "LagUnavailable", reason, now)
            observation = Observation(lag=None, partitions=None, paused=paused)
        else:
            observation = observation_from(
                previous, sample, signals, kube.deployment_rolled_out(namespace, name), paused
            )
            drain, arrival = observation.drain_rate, observation.arrival_rate
            conditions = set_condition(conditions, "LagUnknown", False, "LagMeasured", "lag read from Kafka", now)
            patch.status["lastSample"] = sample_to_status(sample)
            patch.status["lag"] = sample.lag
            patch.status["partitions"] = sample.partitions
            patch.status["drainRate"] = round(drain, 3) if drain is not None else None
            patch.status["arrivalRate"] = round(arrival, 3) if arrival is not None else None
            eta = sample.lag / drain if drain else None
            patch.status["drainEtaSeconds"] = round(eta) if eta is not None else None
            context.metrics.observed(labels, sample, drain, arrival, limits_from_spec(spec))
        patch.status["pods"] = pods_to_status(signals, report_failures)

        limited = None
        if spec.scaling.enabled:
            limits = limits_from_spec(spec)
            decision = decide(observation, limits, state, now)
            target, reason, limited = decision.target, decision.reason, decision.limited
            patch.status["autoscaler"] = state_to_status(decision.state)
            if decision.handler_seconds is not None:
                patch.status["pods"]["handlerMilliseconds"] = round(decision.handler_seconds * 1000, 3)
            armed = (
                spec.catchup.enabled and not paused and status.get("catchupFailedGeneration") != meta.get("generation")
            )
            verdict = catchup_verdict(
                catchup_gate(spec, armed),
                observation,
                decision.state.per_worker_rate,
                limits,
                limited,
                int(status.get("catchupVotes") or 0),
                status.get("lastCatchupEndedAt"),
                now,
            )
            patch.status["catchupVotes"] = verdict.votes
            patch.status["catchupWaiting"] = verdict.waiting
            if verdict.start and sample is not None:
                start_catchup(body, meta, spec, verdict.start, sample.end_offsets, replicas, conditions, patch, now)
                return
        else:
            target = Size(spec.replicas.min, spec.workers.initial)
            reason = f"scaling disabled: {target.replicas} replicas x {target.workers} workers"
        if target.replicas != replicas:
            kube.scale(namespace, name, target.replicas)
        changed = target != Size(replicas, state.current.workers)
        if changed:
            direction = "up" if target.capacity > replicas * state.current.workers else "down"
            context.metrics.decisions.labels(*labels, direction).inc()
            kopf.info(body, reason="Scaled", message=reason)
        context.metrics.replicas.labels(*labels).set(target.replicas)
        context.metrics.workers.labels(*labels).set(target.workers)
        context.metrics.paused.labels(*labels).set(1 if paused else 0)
        context.metrics.limit(labels, limited.kind.value if limited else None)
        conditions = explain_limit(body, conditions, limited, now)
        pushed = 0
        failures: list[str] = []
        if target.replicas and token is not None:
            # pods that started after the read get the size on the next poll (the push is idempotent)
            pushed, failures = context.push(addresses, spec.http_port, token, target.workers)
        elif target.replicas and report_failures:
            failures = report_failures
        scaling_reason = "Paused" if paused else ("Scaled" if changed else "Stable")
        conditions = set_condition(conditions, "Scaling", changed, scaling_reason, reason, now)
        ready = not condition_is(conditions, "LagUnknown") and not failures
        conditions = set_condition(
            conditions,
            "Ready",
            ready,
            "Reconciled" if ready else "Degraded",
            "objects applied, lag measured" if ready else "; ".join(failures) or "lag unknown",
            now,
        )
        poll_conditions(patch, conditions)
        patch.status["replicas"] = target.replicas
        patch.status["workersPerPod"] = target.workers
        patch.status["podsUpdated"] = pushed
        patch.status["limit"] = limited.message if limited else None
        patch.status["lastDecision"] = {"reason": reason, "time": timestamp(now)}

    def read_pods(
        namespace: str, name: str, spec: OrderedConsumerSpec, replicas: int
    ) -> tuple[str | None, list[str], PodSignals | None, list[str]]:
        """(admin token, ready pod addresses, their summed reports, failures) for this poll."""
        if not replicas:
            return None, [], None, []
        try:
            token = context.kube.read_secret_key(namespace, f"{name}-admin-token", ADMIN_TOKEN_KEY)
            addresses = context.kube.ready_pod_ips(namespace, selector_labels(name))
        except Exception as error:  # retried next poll; the decision goes on from Kafka's lag alone
            return None, [], None, [f"reading the pods: {error}"]
        reports, failures = context.fetch_reports(addresses, spec.http_port, token)
        return token, addresses, combine(reports), failures

    def explain_limit(body: Any, conditions: list, limited: Limited | None, now: float) -> list:
        """The ScalingLimited condition, and an Event when it starts or its cause changes."""
        before = next((c for c in conditions if c.get("type") == "ScalingLimited"), None)
        if limited is None:
            if before is None:
                return conditions
            return set_condition(conditions, "ScalingLimited", False, "ScalingHelps", "scaling can help", now)
        new_cause = before is None or before.get("status") != "True" or before.get("reason") != limited.kind.reason
        if new_cause:
            kopf.warn(body, reason="ScalingLimited", message=limited.message)
        return set_condition(conditions, "ScalingLimited", True, limited.kind.reason, limited.message, now)


def catchup_gate(spec: OrderedConsumerSpec, armed: bool) -> CatchupGate:
    catchup = spec.catchup
    return CatchupGate(
        enabled=armed,
        trigger_seconds=catchup.trigger_drain_seconds,
        executors=catchup.executors,
        executor_cores=catchup.executor_cores,
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
        "failures": failures[:5],
    }
