"""The operator's watched view of the objects it owns, so that a steady poll reads nothing from the API.

A poll needs the Deployment (its replicas and rollout), the resourceVersions of the Service,
PodDisruptionBudget and ServiceAccount (to repair one that somebody changed or deleted), and the
ready pods. Read on every poll, that was about ten GETs and LISTs per resource per poll; with 1,000
resources at a 15 s interval, hundreds of reads a second against the API server. Instead kopf
watches these kinds (only objects labelled as the operator's, ``register``), and every event
updates this cache, as a client-go informer does. ``Kube`` reads through it: an object in the
cache is a hit; a missing one is a miss, read from the API server and kept (so a deleted object is
noticed by the read that finds it gone, and the repair recreates it). The operator's own applies
write through, so its next check sees the version it wrote, not the event still on its way.

**What vanished during a re-list.** kopf lists a kind again when its watch is answered 410 Gone (the
API server's watch history moved past it) and when a paused operator resumes (a standby taking over),
and sends no DELETED for what was deleted meanwhile: such an object would stay here, a pod that gets
worker pushes at a dead or reused IP, a deleted Service that is not recreated. kopf marks the events
of a listing (``type`` None, ``kopf/_cogs/clients/watching.py``) but not its end, and a listing that
came back empty sends nothing at all (the last Service of the operator deleted meanwhile). So a listing
of any watched kind is a notice for all of them (``listing_noticed``; the causes, a restarted API
server, a standby taking over, re-list every kind): once its events stop coming, the first read of each
kind in a namespace lists that kind there itself (``Kube``; ``verification_due``, ``verified``) and
drops every entry last seen before that list started that the list lacks. A re-list costs at most one
list per kind and namespace, not a read per object. What no listing announces (one kind alone re-listed
empty) is bounded by ``KEPT_SECONDS``.

**Only what the operator reads is kept** (``kept_object``, ``kept_pod``): a pod as a cluster returns it
is several kilobytes (``managedFields``, its whole spec, the container statuses), of which a poll
reads the labels, ``deletionTimestamp``, ``podIP`` and the Ready condition. A Deployment keeps its
replicas, strategy, its containers' names and rebalancing variables, its status, and of
``managedFields`` only who owns ``spec.replicas``. A reader of a new field adds it there (the unit
tests compare every reader's answer on whole and kept objects). Pods are indexed by namespace and
``app.kubernetes.io/instance``, so a poll's read walks its own group's pods, never every cached pod
under the lock kopf's event loop also takes.

Counting hits and misses (``keyorder_operator_cache_reads_total{result}``) shows whether the
watches keep up: a steady poll should miss nothing.

Threads: kopf's event loop writes (the watch handlers), the poll threads read and write through;
every method takes the one lock, and none does I/O under it.
"""

from __future__ import annotations

import copy
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import kopf

from keyorder_operator.builders import ASSIGNMENT_STRATEGY_VARIABLE, GROUP_PROTOCOL_VARIABLE
from keyorder_operator.builders import labels as owned_labels

WATCHED_KINDS = {
    "Deployment": ("apps", "v1", "deployments"),
    "Service": ("", "v1", "services"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
}
"""The owned kinds kept in the cache (the admin Secret is not watched: listing Secrets would let the
operator enumerate every Secret of the cluster; it is read rarely instead, ``context.SecretReads``)."""

POD = "Pod"
"""The consumer pods' kind in the cache's bookkeeping (listings, verifications)."""

MANAGED_BY = "app.kubernetes.io/managed-by"
POD_APP = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"

WATCH_SELECTORS = {
    **{kind: f"{MANAGED_BY}={owned_labels('any')[MANAGED_BY]}" for kind in WATCHED_KINDS},
    POD: f"{POD_APP}={owned_labels('any')[POD_APP]}",
}
"""kind -> the ``labelSelector`` kopf watches it with, and the cache's own verification lists it with."""

KEPT_SECONDS = 600.0
"""How long a cached object or pod is believed without an event about it: then the next read asks the
API server once (a watch that missed an event, or a re-list that came back empty, cannot leave a ghost
for longer). A steady group costs one read per kind every ten minutes."""

NO_PODS_SECONDS = 60.0
"""How long "the API server has no pod for this group" is believed without asking again (a pod created
meanwhile arrives by the watch at once; this bounds the wait should the watch miss it)."""

LISTING_QUIET_SECONDS = 1.0
"""A kopf listing is taken as complete once none of its events came for this long; then the cache is
verified against a list of its own (``verification_due``)."""

LISTING_WAIT_SECONDS = 30.0
"""A listing whose events keep coming is verified this long after it began, and at most once this often while
they go on (a list of a namespace's pods is no small request); once more when they stop."""

LISTING_CHUNK = 100
"""kopf lists every watched kind in pages of this many objects (``settings.watching.chunk_size``): a listing of
a thousand pods is never held whole, and kopf's per-object queues fill a page at a time. This sets the
operator's peak memory, reached after a re-list: at 500 resources with 1,500 pods as a cluster returns them,
322 MiB with pages of 100 against 402 MiB with client-go's 500 (docs/operator.md, "Memory")."""

CHECK_PAGE = 100
"""The cache's own verification lists come in pages of this many objects, one list at a time: only the names
are kept, but each page is parsed whole (a hundred pods as a cluster returns them are a few megabytes)."""

REBALANCING_VARIABLES = frozenset({ASSIGNMENT_STRATEGY_VARIABLE, GROUP_PROTOCOL_VARIABLE})
"""The Deployment's environment variables the operator reads back (``builders.update_strategy``); the pods'
environment is read from a list of the API server during a cut-over, never from the cache."""

ObjectKey = tuple[str, str, str]
"""(kind, namespace, name)."""
GroupKey = tuple[str, str]
"""(namespace, ``app.kubernetes.io/instance``): the pods of one OrderedConsumer."""
Kept = tuple[float, dict[str, Any]]
"""(when it was last seen, the kept object)."""


# -- what is kept of an object: pure functions -----------------------------------------------------------
def _kept_metadata(meta: dict[str, Any], *fields: str) -> dict[str, Any]:
    names = ("name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp", *fields)
    return {name: copy.deepcopy(meta[name]) for name in names if meta.get(name) is not None}


def owns_replicas(entry: dict[str, Any]) -> bool:
    """Whether a Deployment's ``managedFields`` entry owns ``spec.replicas``."""
    return "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})


def _replicas_owners(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The ``managedFields`` entries that own ``spec.replicas``, with only that field (who owns the size is
    what the operator reads; the rest of ``fieldsV1`` is most of a Deployment's ``managedFields``)."""
    kept = []
    for entry in entries or ():
        if owns_replicas(entry):
            reduced = {key: value for key, value in entry.items() if key != "fieldsV1"}
            kept.append({**reduced, "fieldsV1": {"f:spec": {"f:replicas": {}}}})
    return kept


def kept_object(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What the cache keeps of an owned object (a new dict; ``obj`` is not changed): its identity and
    version, and of a Deployment what the polls read (``spec.replicas``, ``spec.strategy``, its containers'
    names and rebalancing variables, ``status``, who owns ``spec.replicas``)."""
    meta = obj.get("metadata") or {}
    kept: dict[str, Any] = {key: obj[key] for key in ("apiVersion", "kind") if key in obj}
    kept["metadata"] = _kept_metadata(meta)
    if kind != "Deployment":
        return kept
    owners = _replicas_owners(meta.get("managedFields"))
    if owners:
        kept["metadata"]["managedFields"] = owners
    spec = obj.get("spec") or {}
    kept_spec: dict[str, Any] = {key: copy.deepcopy(spec[key]) for key in ("replicas", "strategy") if key in spec}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers")
    if containers:
        kept_spec["template"] = {
            "spec": {
                "containers": [
                    {
                        "name": container.get("name"),
                        "env": [
                            copy.deepcopy(item)
                            for item in container.get("env") or ()
                            if item.get("name") in REBALANCING_VARIABLES
                        ],
                    }
                    for container in containers
                ]
            }
        }
    kept["spec"] = kept_spec
    if obj.get("status") is not None:
        kept["status"] = copy.deepcopy(obj["status"])
    return kept


def kept_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What the cache keeps of a consumer pod (a new dict): its identity, labels and ``deletionTimestamp``,
    and of its status the phase, ``podIP`` and the Ready condition (``kube.ready_addresses``)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    kept_status: dict[str, Any] = {key: status[key] for key in ("phase", "podIP") if status.get(key) is not None}
    ready = [
        {"type": "Ready", "status": condition.get("status")}
        for condition in status.get("conditions") or ()
        if condition.get("type") == "Ready"
    ]
    if ready:
        kept_status["conditions"] = ready
    kept: dict[str, Any] = {key: pod[key] for key in ("apiVersion", "kind") if key in pod}
    return {**kept, "metadata": _kept_metadata(meta, "labels"), "status": kept_status}


class OwnedObjectsCache:
    """Watched copies of the owned objects and pods; thread-safe (kopf's loop writes, poll threads read)."""

    def __init__(
        self, counted: Callable[[str], None] = lambda result: None, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._lock = threading.Lock()
        self._objects: dict[tuple[str, str], dict[str, Kept]] = {}
        """(kind, namespace) -> name -> (seen, object); pods under ``POD``."""
        self._groups: dict[GroupKey, dict[str, None]] = {}
        """(namespace, instance label) -> the names of its cached pods: the index the polls read by."""
        self._no_pods: dict[GroupKey, dict[str, tuple[float, dict[str, str]]]] = {}
        """(namespace, instance) -> selector -> (when a read from the API server found no pod for it, it)."""
        self._listing: tuple[float, float] | None = None
        """(first, last) event of kopf's latest listing of any watched kind (a burst of ``type`` None events)."""
        self._verified: dict[tuple[str, str], float] = {}
        """(kind, namespace) -> when the last verification list of it started."""
        self._verifying: set[tuple[str, str]] = set()
        self._monotonic = monotonic
        self._counted = counted

    # -- fed by the watches (and by the operator's own writes) -----------------------------------------
    def put(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        kept = kept_object(kind, obj)
        with self._lock:
            self._objects.setdefault((kind, meta.get("namespace") or ""), {})[meta.get("name") or ""] = (
                self._monotonic(),
                kept,
            )

    def drop(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self._drop(kind, namespace, name)

    def put_pod(self, pod: dict[str, Any]) -> None:
        kept = kept_pod(pod)
        with self._lock:
            self._put_pod(kept)

    def listed_pods(self, namespace: str, selector: dict[str, str], pods: list[dict[str, Any]]) -> None:
        """A list from the API server: these are the group's pods, and no other cached one is."""
        kept = [kept_pod(pod) for pod in pods]
        names = {pod["metadata"].get("name") for pod in kept}
        group = (namespace, _instance(selector))
        with self._lock:
            cached = self._objects.get((POD, namespace), {})
            for name in list(self._groups.get(group, ())):
                if name not in names and _matches(cached[name][1], selector):
                    self._drop(POD, namespace, name)
            for pod in kept:
                self._put_pod(pod)
            if not kept:
                self._found_no_pods(namespace, selector)

    def forget_pods(self, namespace: str, selector: dict[str, str]) -> None:
        """Drop what is kept of a deleted group's pods (their own DELETED events come too)."""
        group = (namespace, _instance(selector))
        with self._lock:
            empty = self._no_pods.get(group)
            if empty is not None:
                empty.pop(_selector_key(selector), None)
                if not empty:
                    del self._no_pods[group]

    def drop_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._drop(POD, namespace, name)

    # -- kopf's listings, and the verification that follows them ----------------------------------------
    def listing_noticed(self) -> None:
        """kopf delivered an object from a listing (``type`` None): at start-up, after a 410 Gone, when a
        paused operator resumes. A listing says nothing of what it lacks, and an empty one says nothing at
        all, so every kind is verified once the listing's events stop (``verification_due``)."""
        now = self._monotonic()
        with self._lock:
            first, last = self._listing if self._listing is not None else (now, -math.inf)
            self._listing = (first if now - last < LISTING_QUIET_SECONDS else now, now)

    def verification_due(self, kind: str, namespace: str) -> float | None:
        """Whether ``kind`` in ``namespace`` must be listed to drop what vanished during a kopf listing: the
        time to pass to ``verified`` (the caller lists now), or None. Due once per listing (burst of listing
        events of any kind), after its events stopped for ``LISTING_QUIET_SECONDS``; while they keep coming (a
        listing of thousands of objects on a busy event loop), once every ``LISTING_WAIT_SECONDS``. One
        verification at a time, whatever the kind (its pages are what the operator's memory peaks on). Not due
        when no entry there was last seen before the listing began (nothing can be a ghost). The caller must
        call ``verified`` or ``verification_failed``."""
        now = self._monotonic()
        key = (kind, namespace)
        with self._lock:
            listing = self._listing
            if listing is None or self._verifying:
                return None
            first, last = listing
            verified = self._verified.get(key, -math.inf)
            if verified >= last:
                return None  # verified since the last listing event
            if now - last < LISTING_QUIET_SECONDS and now - max(first, verified) < LISTING_WAIT_SECONDS:
                return None  # the listing is still coming, and was verified (or began) a moment ago
            if all(seen >= first for seen, _ in self._objects.get(key, {}).values()):
                self._verified[key] = now  # everything here was seen during or after the listing
                return None
            self._verifying.add(key)
            return now

    def verified(self, kind: str, namespace: str, started: float, present: Collection[str]) -> int:
        """A list of ``kind`` in ``namespace``, requested at ``started`` (``verification_due``), named
        ``present``: every entry last seen before ``started`` that it lacks was deleted (or lost the label).
        Returns how many were dropped."""
        key = (kind, namespace)
        names = set(present)
        with self._lock:
            self._verifying.discard(key)
            self._verified[key] = max(self._verified.get(key, -math.inf), started)
            gone = [
                name for name, (seen, _) in self._objects.get(key, {}).items() if seen < started and name not in names
            ]
            for name in gone:
                self._drop(kind, namespace, name)
        return len(gone)

    def verification_failed(self, kind: str, namespace: str) -> None:
        """The verification list failed: it is due again on a later read."""
        with self._lock:
            self._verifying.discard((kind, namespace))

    # -- read by the polls ----------------------------------------------------------------------------
    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The cached object (a copy of what is kept, ``kept_object``), or ``None``: a miss, to be read from
        the API server."""
        with self._lock:
            found = self._objects.get((kind, namespace), {}).get(name)
            fresh = found is not None and self._monotonic() - found[0] < KEPT_SECONDS
            result = copy.deepcopy(found[1]) if found is not None and fresh else None
        self._counted("hit" if result is not None else "miss")
        return result

    def holds(self, kind: str, namespace: str, name: str) -> bool:
        """Whether the cache has the object, however long ago it was seen, without counting a read: for an
        object that is normally absent (the pods' NetworkPolicy with the chart's switch off), whose watch
        would bring it in."""
        with self._lock:
            return name in self._objects.get((kind, namespace), {})

    def pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]] | None:
        """The cached pods matching ``selector`` (copies of what is kept, ``kept_pod``), or ``None`` when
        none is cached (a miss: a group without pods and a group not seen yet look the same, so both are
        read). ``selector`` names the group's ``app.kubernetes.io/instance``: the read walks that group only."""
        now = self._monotonic()
        with self._lock:
            cached = self._objects.get((POD, namespace), {})
            matching = [
                cached[name]
                for name in self._groups.get((namespace, _instance(selector)), ())
                if _matches(cached[name][1], selector)
            ]
            if any(now - seen >= KEPT_SECONDS for seen, _ in matching):
                matching = []  # one of them not seen for long: list the group again
            found = [copy.deepcopy(pod) for _, pod in matching]
            seen_empty = self._no_pods.get((namespace, _instance(selector)), {}).get(_selector_key(selector))
            known_empty = seen_empty is not None and now - seen_empty[0] < NO_PODS_SECONDS
        self._counted("hit" if found or known_empty else "miss")
        return found if found or known_empty else None

    def __len__(self) -> int:
        with self._lock:
            return sum(len(entries) for entries in self._objects.values())

    # -- under the lock ---------------------------------------------------------------------------------
    def _drop(self, kind: str, namespace: str, name: str) -> None:
        entries = self._objects.get((kind, namespace))
        found = entries.pop(name, None) if entries is not None else None
        if entries is not None and not entries:
            del self._objects[(kind, namespace)]
        if found is not None and kind == POD:
            self._unindex(namespace, name, found[1])

    def _put_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        namespace, name = meta.get("namespace") or "", meta.get("name") or ""
        entries = self._objects.setdefault((POD, namespace), {})
        before = entries.get(name)
        if before is not None:
            self._unindex(namespace, name, before[1])
        entries[name] = (self._monotonic(), pod)
        group = (namespace, (meta.get("labels") or {}).get(INSTANCE, ""))
        self._groups.setdefault(group, {})[name] = None
        empty = self._no_pods.get(group)
        if empty is not None:
            for key, (_, selector) in list(empty.items()):
                if _matches(pod, selector):
                    del empty[key]  # the group has a pod now: read it from here
            if not empty:
                del self._no_pods[group]  # no entry kept for a group with nothing believed empty

    def _unindex(self, namespace: str, name: str, pod: dict[str, Any]) -> None:
        group = (namespace, ((pod.get("metadata") or {}).get("labels") or {}).get(INSTANCE, ""))
        names = self._groups.get(group)
        if names is not None:
            names.pop(name, None)
            if not names:
                del self._groups[group]

    def _found_no_pods(self, namespace: str, selector: dict[str, str]) -> None:
        """The API server has no pod for ``selector`` (a group at zero, or pods not created yet): kept for
        ``NO_PODS_SECONDS``, so a group without pods is not listed on every poll either."""
        self._no_pods.setdefault((namespace, _instance(selector)), {})[_selector_key(selector)] = (
            self._monotonic(),
            dict(selector),
        )


class QuietCacheHandlers(logging.Filter):
    """Drops kopf's "Handler 'cache-…' succeeded." line: logged at INFO for every watch event of every
    owned object and pod, it would bury the operator's own log. Failures are still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not SUCCEEDED.match(record.getMessage())


SUCCEEDED = re.compile(r"Handler '(cache-[a-z]+)' succeeded\.")


def _instance(selector: dict[str, str]) -> str:
    instance = selector.get(INSTANCE)
    if instance is None:
        raise ValueError(f"a pod selector read through the cache must name {INSTANCE}, got {selector}")
    return instance


def _matches(pod: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def _selector_key(selector: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


def register(registry: kopf.OperatorRegistry, cache: OwnedObjectsCache) -> None:
    """Watch the owned kinds and the consumer pods (by their labels) into ``cache``."""
    pod_app = owned_labels("any")[POD_APP]

    @kopf.on.startup(registry=registry)
    def watch_only_the_operators_objects(settings: kopf.OperatorSettings, **_: Any) -> None:
        """Filter the watches on the API server (a ``labelSelector``): kopf's ``labels=`` filter alone runs
        after every object of the kind in the cluster was sent to the operator. List in pages
        (``LISTING_CHUNK``)."""
        settings.watching.chunk_size = LISTING_CHUNK
        for kind, (group, _version, plural) in WATCHED_KINDS.items():
            settings.watching.label_selectors[(group, plural) if group else plural] = WATCH_SELECTORS[kind]
        settings.watching.label_selectors["pods"] = WATCH_SELECTORS[POD]

    objects_log = logging.getLogger("kopf.objects")
    if not any(isinstance(existing, QuietCacheHandlers) for existing in objects_log.filters):
        objects_log.addFilter(QuietCacheHandlers())
    for kind, (group, version, plural) in WATCHED_KINDS.items():
        _watch_kind(registry, cache, kind, group, version, plural)

    @kopf.on.event("", "v1", "pods", labels={POD_APP: pod_app}, registry=registry, id="cache-pods")
    async def cache_pod(event: Any, **_: Any) -> None:
        pod = event.get("object") or {}
        meta = pod.get("metadata") or {}
        if event.get("type") == "DELETED":
            cache.drop_pod(meta.get("namespace") or "", meta.get("name") or "")
            return
        if event.get("type") is None:  # kopf's listing (kopf/_cogs/clients/watching.py: continuous_watch)
            cache.listing_noticed()
        cache.put_pod(pod)


def _watch_kind(
    registry: kopf.OperatorRegistry, cache: OwnedObjectsCache, kind: str, group: str, version: str, plural: str
) -> None:
    managed_by = owned_labels("any")[MANAGED_BY]

    @kopf.on.event(group, version, plural, labels={MANAGED_BY: managed_by}, registry=registry, id=f"cache-{plural}")
    async def cache_object(event: Any, **_: Any) -> None:
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if event.get("type") == "DELETED":
            cache.drop(kind, meta.get("namespace") or "", meta.get("name") or "")
            return
        if event.get("type") is None:  # kopf's listing (kopf/_cogs/clients/watching.py: continuous_watch)
            cache.listing_noticed()
        cache.put(kind, obj)
