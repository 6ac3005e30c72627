"""Make kopf's peering fail loudly: with ``--peering NAME`` the peering object must exist.

Why this exists: kopf's peering has no check of its own. ``kopf.run(peering_name=NAME)`` makes the peering
mandatory (``settings.peering.mandatory = True``, kopf/_core/reactor/running.py), so each replica starts
*paused*: ``spawn_missing_peerings`` (kopf/_core/reactor/orchestration.py) pre-activates the replica's
``conflicts_found`` toggle, and only ``process_peering_event`` (kopf/_core/engines/peering.py) turns it
off, when the watch of the peering resource delivers the object named NAME. Without that object no event
ever comes: every replica stays paused for good and handles nothing, and kopf says so only at DEBUG (its
keep-alive's PATCH gets a 404: "Keep-alive in 'NAME' cluster-wide: not found."). An object deleted while
the operator runs leaves the active replica working, but the standbys never get another event: when the
active one stops, none takes over.

So, around kopf:

* **At start-up** ``wait_for_peering_objects`` reads every object the peering uses (a ClusterKopfPeering
  when the operator watches the whole cluster, else a KopfPeering in each watched namespace, as kopf's
  ``guess_selectors`` picks them), waits up to ``START_GRACE_SECONDS`` for a missing one (Helm creates
  objects of custom kinds after the Deployment: helm/helm pkg/release/util/kind_sorter.go sorts unknown
  kinds last), then refuses to start with one line naming the object and how to create it.
* **While running** ``PeeringCheck`` reads them again on every health probe (kopf's ``/healthz``; kopf
  runs the probes at most every 10 s), logs an ERROR when one is gone and a WARNING when it is back, sets
  ``keyorder_operator_peering_object_present``, and shows the state in ``/healthz``'s answer. It never
  fails the probe: a liveness restart would turn a working replica into one that refuses to start. Nor
  may it outlast the probe: all its reads share one deadline, ``CHECK_BUDGET_SECONDS``, inside the
  chart's liveness ``timeoutSeconds``; the objects it had no time for are shown ``unchecked`` and read
  first on the next probe.

The decisions (which objects, what an answer means, the message, the waiting, the check's deadline) are
pure and take the reader, the clock and the sleep as parameters; ``read_peering_object`` is the one call to
the API (on the probe, through ``probe_api_client``: no retries, so a read ends within its timeout).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

logger = logging.getLogger(__name__)

GROUP = "kopf.dev"
VERSION = "v1"
START_GRACE_SECONDS = 10.0
"""How long a start waits for a missing peering object before it refuses (Helm creates it just after the
Deployment, usually before a pod of it has started)."""
START_RETRY_SECONDS = 1.0
AT_START = "so kopf would keep every replica paused"
WHILE_RUNNING = (
    "the replica handling resources goes on, but the standby replicas get no more peering events: none will "
    "take over from it"
)
BACK_EMPTY = (
    "kopf's replicas find it without their records and all resume handling resources until their next "
    "keep-alives (within a minute) record them again and the standbys pause"
)
READ_TIMEOUT_SECONDS = 3.0
"""A read of one peering object gives up after this."""
CHECK_BUDGET_SECONDS = 3.0
"""All the reads of one health probe's check together give up after this (one deadline, however many
namespaces): the chart's liveness and readiness probes time out after 5 s (``timeoutSeconds``), and kopf's
``/healthz`` answers only once every probe handler has, so a check that read its objects one after another,
each with its own timeout, would fail the probe with two namespaces and a hung API server."""
MIN_READ_SECONDS = 0.2
"""A read is not started with less time than this left before the check's deadline."""
UNCHECKED = "unchecked"
"""What ``/healthz`` shows for an object the check had no time left to read."""


class PeeringUnusable(Exception):
    """The peering object cannot be confirmed at start-up; the message names it and the fix."""


@dataclass(frozen=True)
class PeeringObject:
    """One object kopf's peering keeps alive."""

    kind: str
    plural: str
    namespace: str | None
    name: str

    def __str__(self) -> str:
        where = f' in namespace "{self.namespace}"' if self.namespace else ""
        return f'{self.kind} "{self.name}" ({self.plural}.{GROUP}){where}'

    def manifest(self) -> str:
        """The object as one line of YAML-compatible JSON, for ``kubectl apply -f -``."""
        metadata: dict[str, str] = {"name": self.name}
        if self.namespace:
            metadata["namespace"] = self.namespace
        return json.dumps({"apiVersion": f"{GROUP}/{VERSION}", "kind": self.kind, "metadata": metadata})


def peering_objects(name: str, namespaces: Sequence[str]) -> list[PeeringObject]:
    """The objects ``keyorder operator --peering NAME`` uses: kopf peers cluster-wide when the operator
    watches the whole cluster, else in each watched namespace (``settings.peering.clusterwide`` follows
    ``clusterwide``: kopf/_core/reactor/running.py; ``guess_selectors``: kopf/_core/engines/peering.py)."""
    if not namespaces:
        return [PeeringObject("ClusterKopfPeering", "clusterkopfpeerings", None, name)]
    return [PeeringObject("KopfPeering", "kopfpeerings", namespace, name) for namespace in namespaces]


class Presence(Enum):
    """What a read of a peering object found."""

    PRESENT = "present"
    ABSENT = "absent"
    """The peering resource is served, the object is not there."""
    UNSERVED = "unserved"
    """The peering resource itself is not served: the kopf.dev CRDs are not installed."""
    FORBIDDEN = "forbidden"
    """The operator's RBAC does not let it read the object."""
    UNREADABLE = "unreadable"
    """Anything else (the API server unreachable, a timeout, a 5xx): nothing is known."""


@dataclass(frozen=True)
class Reading:
    presence: Presence
    detail: str = ""
    """For UNREADABLE and FORBIDDEN: what the API answered."""


def interpret(obj: PeeringObject, status: int, body: str) -> Reading:
    """An API answer to a GET of ``obj``. A 404 for a missing object is a ``Status`` naming it
    (kubernetes/apiserver pkg/storage/errors/storage.go ``InterpretGetError``: ``NewNotFound(resource, name)``);
    a 404 for a resource nobody serves names nothing (apiextensions-apiserver's ``crdHandler`` hands a request
    for an unknown CRD to the not-found handler: pkg/apiserver/customresource_handler.go)."""
    if 200 <= status < 300:
        return Reading(Presence.PRESENT)
    if status == 404:
        try:
            details = json.loads(body).get("details") or {}
        except (ValueError, AttributeError):
            details = {}
        named = isinstance(details, dict) and details.get("name") == obj.name
        return Reading(Presence.ABSENT if named else Presence.UNSERVED)
    if status == 403:
        return Reading(Presence.FORBIDDEN, _status_message(body) or "403 Forbidden")
    return Reading(Presence.UNREADABLE, _status_message(body) or f"HTTP {status}")


def _status_message(body: str) -> str:
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        return body.strip()[:200]
    return str(message) if message else ""


def problem(obj: PeeringObject, reading: Reading, consequence: str = AT_START) -> str:
    """One line saying why ``obj`` is not usable and what to do (``consequence``: what kopf does without the
    object, at start-up or while running)."""
    kubectl = f"kubectl apply -f - <<<'{obj.manifest()}'"
    if reading.presence is Presence.ABSENT:
        return (
            f"--peering: the peering object {obj} does not exist, {consequence}. "
            f"Create it (helm: peering.create=true; or {kubectl}), or run without --peering"
        )
    if reading.presence is Presence.UNSERVED:
        return (
            f"--peering: the API server does not serve {obj.plural}.{GROUP}: the kopf peering CRDs are not "
            "installed (the chart's crds/kopf-peerings.yaml). Install them and create the peering object, "
            "or run without --peering"
        )
    if reading.presence is Presence.FORBIDDEN:
        return (
            f"--peering: the operator may not read the peering object {obj} ({reading.detail}). Grant get, "
            f"list, watch and patch on {obj.plural}.{GROUP} (the chart does with peering.enabled=true)"
        )
    return f"--peering: cannot read the peering object {obj}: {reading.detail}"


def wait_for_peering_objects(
    objects: Sequence[PeeringObject],
    read: Callable[[PeeringObject], Reading],
    *,
    grace_seconds: float = START_GRACE_SECONDS,
    retry_seconds: float = START_RETRY_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once every object is there; raise ``PeeringUnusable`` naming the first that is still not
    after ``grace_seconds`` (a missing CRD and a refusal are not waited for: waiting mends neither)."""
    deadline = clock() + grace_seconds
    waiting_said = False
    for obj in objects:
        while True:
            reading = read(obj)
            if reading.presence is Presence.PRESENT:
                break
            if reading.presence in (Presence.UNSERVED, Presence.FORBIDDEN) or clock() >= deadline:
                raise PeeringUnusable(problem(obj, reading))
            if not waiting_said:
                logger.warning("%s; waiting up to %gs for it", problem(obj, reading), grace_seconds)
                waiting_said = True
            sleep(max(0.0, min(retry_seconds, deadline - clock())))


class PeeringCheck:
    """The running check: ``check()`` on every health probe (kopf runs the probe handlers one at a time).

    Logs each change of an object's presence (ERROR when it goes; WARNING when it is back, since a recreated
    object is empty and kopf's ``process_peering_event`` then resumes every replica until the keep-alives,
    every 50-55 s, record them again; WARNING when it cannot be read) and sets the gauge: 1 present, 0 absent,
    not served or not readable for RBAC; a read that failed otherwise (timeout, 5xx) leaves it as it was, since
    nothing is known. ``read(obj, timeout)`` reads one object within ``timeout`` seconds; all the reads of one
    check end by ``budget_seconds`` after it starts (``clock``: monotonic seconds). An object left unread is
    shown ``unchecked``, its gauge and state as they were, and is read first by the next check."""

    def __init__(
        self,
        objects: Sequence[PeeringObject],
        read: Callable[[PeeringObject, float], Reading],
        gauge: Any,
        budget_seconds: float = CHECK_BUDGET_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.objects = list(objects)
        self.read = read
        self.gauge = gauge
        self.budget_seconds = budget_seconds
        self.clock = clock
        self.last: dict[PeeringObject, Presence] = {}
        self._first = 0
        """Where the next check starts: at the first object the last one had no time for."""
        self._short = False
        """The last check ran out of time (said once, when it starts)."""
        for obj in self.objects:
            self._series(obj).set(1)  # the start-up wait has just seen every one of them

    def _series(self, obj: PeeringObject) -> Any:
        return self.gauge.labels(obj.kind, obj.namespace or "", obj.name)

    def check(self) -> dict[str, str]:
        """Read every object once, within the budget; the answer is what ``/healthz`` shows under ``peering``."""
        deadline = self.clock() + self.budget_seconds
        order = self.objects[self._first :] + self.objects[: self._first]
        shown: dict[str, str] = {}
        for position, obj in enumerate(order):
            left = deadline - self.clock()
            if left < MIN_READ_SECONDS:
                unread = order[position:]
                shown.update((_shown_name(each), UNCHECKED) for each in unread)
                self._first = self.objects.index(unread[0])
                if not self._short:
                    logger.warning(
                        "The peering check ran out of its %gs before it read %s (%d of %d objects): the API server "
                        "answers slowly or not at all; they are read first on the next health probe",
                        self.budget_seconds,
                        ", ".join(str(each) for each in unread),
                        len(unread),
                        len(order),
                    )
                self._short = True
                return shown
            reading = self.read(obj, min(READ_TIMEOUT_SECONDS, left))
            before = self.last.get(obj, Presence.PRESENT)
            self.last[obj] = reading.presence
            if reading.presence is Presence.PRESENT:
                self._series(obj).set(1)
                if before is not Presence.PRESENT:
                    logger.warning("The peering object %s is back. %s", obj, BACK_EMPTY)
            elif reading.presence is Presence.UNREADABLE:
                if before is not Presence.UNREADABLE:
                    logger.warning("%s (checked again on the next health probe)", problem(obj, reading))
            else:
                self._series(obj).set(0)
                if before is not reading.presence:
                    logger.error("%s", problem(obj, reading, WHILE_RUNNING))
            shown[_shown_name(obj)] = reading.presence.value
        self._first, self._short = 0, False
        return shown


def _shown_name(obj: PeeringObject) -> str:
    """How ``/healthz`` names an object: ``Kind/[namespace/]name``."""
    return f"{obj.kind}/{obj.namespace + '/' if obj.namespace else ''}{obj.name}"


def probe_api_client(api_client: Any) -> Any:
    """A client for the health probe's reads: the operator's configuration (credentials, token refresh) without
    urllib3's retries. By default urllib3 retries a GET that timed out three times, each with the whole timeout
    again, so a read meant to give up after 3 s would take 12 s against a hung API server, past the probe's."""
    import copy

    import kubernetes

    configuration = copy.deepcopy(api_client.configuration)
    configuration.retries = False
    return kubernetes.client.ApiClient(configuration)


def read_peering_object(api_client: Any, obj: PeeringObject, timeout: float = READ_TIMEOUT_SECONDS) -> Reading:
    """GET ``obj`` with the operator's credentials (the kubernetes client's ``CustomObjectsApi``), giving up
    after ``timeout`` seconds in all (the client's ``_request_timeout`` as one number is urllib3's total)."""
    import kubernetes
    import urllib3

    api = kubernetes.client.CustomObjectsApi(api_client)
    try:
        if obj.namespace is None:
            api.get_cluster_custom_object(GROUP, VERSION, obj.plural, obj.name, _request_timeout=timeout)
        else:
            api.get_namespaced_custom_object(
                GROUP, VERSION, obj.namespace, obj.plural, obj.name, _request_timeout=timeout
            )
    except kubernetes.client.ApiException as error:
        body = error.body.decode(errors="replace") if isinstance(error.body, bytes) else str(error.body or "")
        return interpret(obj, int(error.status or 0), body)
    except (urllib3.exceptions.HTTPError, OSError) as error:
        return Reading(Presence.UNREADABLE, f"{type(error).__name__}: {error}")
    except Exception as error:  # anything else is reported too (logged by the caller): the probe must not fail
        return Reading(Presence.UNREADABLE, f"unexpected {type(error).__name__}: {error}")
    return Reading(Presence.PRESENT)


def register_peering_probe(registry: Any, check: PeeringCheck) -> None:
    """Run ``check`` on kopf's health probes, off kopf's event loop and off the handlers' thread pool
    (a busy pool must not delay ``/healthz``)."""
    import kopf

    @kopf.on.probe(id="peering", registry=registry)
    async def peering(**_: Any) -> dict[str, str]:
        return await asyncio.to_thread(check.check)


__all__ = [
    "PeeringCheck",
    "PeeringObject",
    "PeeringUnusable",
    "Presence",
    "Reading",
    "interpret",
    "peering_objects",
    "probe_api_client",
    "problem",
    "read_peering_object",
    "register_peering_probe",
    "wait_for_peering_objects",
]
