"""The kopf handlers: keep each OrderedConsumer's objects in place and its size matched to its lag.

``register(registry, context)`` binds the handlers to a registry, so the operator binary and the
tests (real kopf against an API emulator) run exactly the same code. Per resource:

* on create/update/resume: validate the spec (invalid: ``InvalidSpec`` condition + Event, and
  nothing is touched), then apply the owned objects (``objects``): admin Secret, ServiceAccount,
  Deployment, metrics Service and PodDisruptionBudget. An object the API server refuses for what it
  is (``kube.ApplyRefused``: 422 Invalid, a keyed list with a repeated key) makes the spec invalid
  too: ``InvalidSpec`` names the spec field it was built from (one Event per distinct refusal), the
  other objects are applied all the same, and the refused one is sent again only every
  ``refusals.REFUSED_RETRY_SECONDS`` (``retry_refused``), not on every poll: a refusal may come from
  outside the spec (an admission policy) and go away, and then ``InvalidSpec`` clears. Any other
  failure is retried at once;
* on a timer, every ``scaling.pollIntervalSeconds``, unless the spec itself is invalid: one
  ``poll.Poll`` re-applies the owned objects (self-repair; a refused one waits for its retry),
  observes lag in Kafka and the pods' reports, decides, scales the Deployment, pushes the worker count
  to the ready pods and explains it in status, Events and metrics; or it advances a catch-up hand-over
  (``handover``). A refused object stops none of this: the Deployment that exists is scaled as before;
* on every watch event of an owned object or a consumer pod: keep it in the cache the polls read
  (``cache``), so a steady poll reads nothing from the API server;
* on delete: forget the resource's metric series and applied objects, and close its Kafka client;
  no poll of it runs again, and one in flight at the delete is cleaned up after it ends.

Each handler writes only the conditions it owns (``status.SPEC_CONDITIONS``, ``status.POLL_CONDITIONS``).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from keyorder_operator.cache import OwnedObjectsCache
from keyorder_operator.cache import register as watch_owned_objects
from keyorder_operator.context import OperatorContext
from keyorder_operator.kube import ApplyRefused
from keyorder_operator.objects import apply_owned_objects
from keyorder_operator.poll import Poll
from keyorder_operator.spec import GROUP, PLURAL, VERSION, InvalidSpec, OrderedConsumerSpec, name_problem, parse_spec
from keyorder_operator.status import SPEC_CONDITIONS, condition_is, set_condition, write_conditions

__all__ = ["OperatorContext", "register"]

log = logging.getLogger(__name__)


def register(registry: kopf.OperatorRegistry, context: OperatorContext) -> None:
    resource = (GROUP, VERSION, PLURAL)
    if context.kube is not None and context.kube.cache is None:  # the owned objects are watched, not re-read
        context.kube.cache = OwnedObjectsCache(counted=context.metrics.cache_read)
    if context.kube is not None and context.kube.cache is not None:
        watch_owned_objects(registry, context.kube.cache)

    @kopf.on.startup(registry=registry)
    def size_the_handler_pool(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.execution.max_workers = context.handler_threads

    @kopf.on.cleanup(registry=registry)
    def stop_the_lag_readers(**_: Any) -> None:
        """No reader process outlives the operator (each would hold its tenant's Kafka connections)."""
        context.close_lag_sources()

    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, field="spec", registry=registry)
    def reconcile_objects(body: Any, meta: Any, status: Any, patch: kopf.Patch, **_: Any) -> None:
        now = context.clock()
        try:
            spec = checked(body)
        except InvalidSpec as error:
            report_validity(body, patch, error, now)
            return
        try:
            apply_owned_objects(context.kube, spec, meta, status, context.applied, always=True)
        except ApplyRefused:  # sending the same object again soon would fail the same way (retry_refused)
            context.metrics.errors.labels(meta["namespace"], meta["name"]).inc()
            report_validity(body, patch, refused_objects(meta), now)
            return
        except Exception as error:
            report_validity(body, patch, refused_objects(meta), now)
            context.metrics.errors.labels(meta["namespace"], meta["name"]).inc()
            raise kopf.TemporaryError(f"applying objects failed: {error}", delay=10) from error
        report_validity(body, patch, None, now)
        patch.status["observedGeneration"] = meta.get("generation")

    def refused_objects(meta: Any) -> InvalidSpec | None:
        """The resource's objects the API server refused at their last apply, as the spec's problems."""
        refused = context.applied.refusals(meta["namespace"], meta["name"])
        return InvalidSpec([problem for each in refused for problem in each.refusal.problems()]) if refused else None

    def retry_refused(body: Any, meta: Any, status: Any, patch: kopf.Patch, spec: OrderedConsumerSpec) -> None:
        """While ``InvalidSpec`` says the API server refused an owned object, apply the objects again every
        ``context.applied.refused_retry_seconds`` (at once after a restart): what refused them may have gone
        (an admission policy removed), and then the condition clears. Refused again: the condition stays, with
        an Event only if the refusal's message changed. Failed otherwise: logged, tried again after the period."""
        conditions = list((status or {}).get("conditions") or [])
        namespace, name = meta["namespace"], meta["name"]
        if not condition_is(conditions, "InvalidSpec") or not context.applied.retry_due(namespace, name):
            return
        now = context.clock()
        try:
            apply_owned_objects(context.kube, spec, meta, status, context.applied, always=True)
        except ApplyRefused:
            context.metrics.errors.labels(namespace, name).inc()
            report_validity(body, patch, refused_objects(meta), now)
            return
        except Exception as error:  # logged and counted; the poll goes on with what exists
            context.metrics.errors.labels(namespace, name).inc()
            log.warning("%s/%s: applying the refused objects again failed: %s", namespace, name, error)
            return
        log.info("%s/%s: the API server accepts the objects it refused before", namespace, name)
        report_validity(body, patch, None, now)
        patch.status["observedGeneration"] = meta.get("generation")

    # optional: this handler adds no finalizer of its own; kopf still puts one on every OrderedConsumer for
    # the timer below (a timer needs it to stop cleanly), so uninstall order matters (docs/install.md)
    @kopf.on.delete(*resource, registry=registry, optional=True)
    def forget(meta: Any, **_: Any) -> None:
        context.forget(str(meta.get("uid") or ""), meta["namespace"], meta["name"])

    # sharp: ticks on a fixed grid, start to start, so a poll's own duration does not delay the next one
    @kopf.timer(*resource, interval=context.tick_seconds, sharp=True, registry=registry)
    def autoscale(body: Any, meta: Any, status: Any, patch: kopf.Patch, **_: Any) -> None:
        try:
            spec = checked(body)
        except InvalidSpec:
            return  # reported by reconcile_objects; nothing is scaled for an invalid spec
        namespace, name = meta["namespace"], meta["name"]
        with context.polling(str(meta.get("uid") or ""), namespace, name) as alive:
            if not alive:
                return
            # an object the API server refused stops nothing else: the poll scales what exists
            retry_refused(body, meta, status, patch, spec)
            known = context.applied.refusals(namespace, name)
            Poll(context, body, meta, spec, dict(status or {}), patch, context.clock()).run()
            if any(refused not in known for refused in context.applied.refusals(namespace, name)):
                # the poll's repair met a refusal (an edited object re-applied, a policy added): say so
                report_validity(body, patch, refused_objects(meta), context.clock())


def checked(body: Any) -> OrderedConsumerSpec:
    """The resource's parsed spec; ``InvalidSpec`` for a bad spec, or a bad name (the CRD refuses one, but an
    older CRD may not)."""
    problem = name_problem(str((body.get("metadata") or {}).get("name") or ""))
    if problem is not None:
        raise InvalidSpec([("metadata.name", problem)])
    return parse_spec(dict(body.get("spec") or {}))


def report_validity(body: Any, patch: kopf.Patch, invalid: InvalidSpec | None, now: float) -> None:
    """The ``InvalidSpec`` condition: true with the problems (and a Warning Event when it starts or its message
    changes) for ``invalid``, else false once a previous one is cleared. Invalid is the spec itself, or the
    objects built from it that the API server refused (``kube.ApplyRefused``, sent again every
    ``refusals.REFUSED_RETRY_SECONDS``)."""
    conditions = list((body.get("status") or {}).get("conditions") or [])
    if invalid is not None:
        before: dict[str, Any] = next((c for c in conditions if c.get("type") == "InvalidSpec"), {})
        if not condition_is(conditions, "InvalidSpec") or before.get("message") != str(invalid):
            kopf.warn(body, reason="InvalidSpec", message=str(invalid))
        updated = set_condition(conditions, "InvalidSpec", True, "InvalidSpec", str(invalid), now)
        write_conditions(patch, updated, SPEC_CONDITIONS)
    elif condition_is(conditions, "InvalidSpec"):
        valid = set_condition(conditions, "InvalidSpec", False, "Valid", "spec is valid", now)
        write_conditions(patch, valid, SPEC_CONDITIONS)
