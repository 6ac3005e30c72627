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

Counting hits and misses (``keyorder_operator_cache_reads_total{result}``) shows whether the
watches keep up: a steady poll should miss nothing.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import kopf

from keyorder_operator.builders import labels as owned_labels

WATCHED_KINDS = {
    "Deployment": ("apps", "v1", "deployments"),
    "Service": ("", "v1", "services"),
    "PodDisruptionBudget": ("policy", "v1", "poddisruptionbudgets"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
}
"""The owned kinds kept in the cache (the admin Secret is not watched: listing Secrets would let the
operator enumerate every Secret of the cluster; it is read rarely instead, ``context.SecretReads``)."""

MANAGED_BY = "app.kubernetes.io/managed-by"
POD_APP = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"

KEPT_SECONDS = 600.0
"""How long a cached object or pod is believed without an event about it: then the next read asks the
API server once (a watch that missed an event, or a re-list that dropped one, cannot leave a ghost for
longer). A steady group costs one read per kind every ten minutes."""

NO_PODS_SECONDS = 60.0
"""How long "the API server has no pod for this group" is believed without asking again (a pod created
meanwhile arrives by the watch at once; this bounds the wait should the watch miss it)."""

ObjectKey = tuple[str, str, str]
"""(kind, namespace, name)."""


class OwnedObjectsCache:
    """Watched copies of the owned objects and pods; thread-safe (kopf's loop writes, poll threads read)."""

    def __init__(
        self, counted: Callable[[str], None] = lambda result: None, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._lock = threading.Lock()
        self._objects: dict[ObjectKey, tuple[float, dict[str, Any]]] = {}
        """(kind, namespace, name) -> (when it was last seen, the object)."""
        self._pods: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}
        """(namespace, pod name) -> (when it was last seen, the pod); grouped by selector on reading."""
        self._no_pods: dict[tuple[str, str], tuple[float, dict[str, str]]] = {}
        """(namespace, selector) -> when a read from the API server found no pod for it."""
        self._monotonic = monotonic
        self._counted = counted

    # -- fed by the watches (and by the operator's own writes) -----------------------------------------
    def put(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        with self._lock:
            self._objects[(kind, meta.get("namespace") or "", meta.get("name") or "")] = (
                self._monotonic(),
                copy.deepcopy(obj),
            )

    def drop(self, kind: str, namespace: str, name: str) -> None:
        with self._lock:
            self._objects.pop((kind, namespace, name), None)

    def put_pod(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace") or ""
        with self._lock:
            self._pods[(namespace, meta.get("name") or "")] = (self._monotonic(), copy.deepcopy(pod))
            for key, (_, selector) in list(self._no_pods.items()):
                if key[0] == namespace and _matches(pod, selector):
                    del self._no_pods[key]  # the group has a pod now: read it from here

    def listed_pods(self, namespace: str, selector: dict[str, str], pods: list[dict[str, Any]]) -> None:
        """A list from the API server: these are the group's pods, and no other cached one is."""
        names = {(pod.get("metadata") or {}).get("name") for pod in pods}
        with self._lock:
            for key, (_, cached) in list(self._pods.items()):
                if key[0] == namespace and key[1] not in names and _matches(cached, selector):
                    del self._pods[key]
        for pod in pods:
            self.put_pod(pod)
        if not pods:
            self.found_no_pods(namespace, selector)

    def forget_pods(self, namespace: str, selector: dict[str, str]) -> None:
        """Drop what is kept of a deleted group's pods (their own DELETED events come too)."""
        with self._lock:
            self._no_pods.pop((namespace, _selector_key(selector)), None)

    def found_no_pods(self, namespace: str, selector: dict[str, str]) -> None:
        """The API server has no pod for ``selector`` (a group at zero, or pods not created yet): kept for
        ``NO_PODS_SECONDS``, so a group without pods is not listed on every poll either."""
        with self._lock:
            self._no_pods[(namespace, _selector_key(selector))] = (self._monotonic(), dict(selector))

    def drop_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pods.pop((namespace, name), None)

    # -- read by the polls ----------------------------------------------------------------------------
    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The cached object (a copy), or ``None``: a miss, to be read from the API server."""
        with self._lock:
            found = self._objects.get((kind, namespace, name))
            fresh = found is not None and self._monotonic() - found[0] < KEPT_SECONDS
            result = copy.deepcopy(found[1]) if found is not None and fresh else None
        self._counted("hit" if result is not None else "miss")
        return result

    def pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]] | None:
        """The cached pods matching ``selector`` (copies), or ``None`` when none is cached (a miss: a
        group without pods and a group not seen yet look the same, so both are read)."""
        now = self._monotonic()
        with self._lock:
            matching = [
                (seen, pod)
                for (pod_namespace, _), (seen, pod) in self._pods.items()
                if pod_namespace == namespace and _matches(pod, selector)
            ]
            if any(now - seen >= KEPT_SECONDS for seen, _ in matching):
                matching = []  # one of them not seen for long: list the group again
            found = [copy.deepcopy(pod) for _, pod in matching]
            seen_empty = self._no_pods.get((namespace, _selector_key(selector)))
            known_empty = seen_empty is not None and now - seen_empty[0] < NO_PODS_SECONDS
        self._counted("hit" if found or known_empty else "miss")
        return found if found or known_empty else None

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects) + len(self._pods)


class QuietCacheHandlers(logging.Filter):
    """Drops kopf's "Handler 'cache-…' succeeded." line: logged at INFO for every watch event of every
    owned object and pod, it would bury the operator's own log. Failures are still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not SUCCEEDED.match(record.getMessage())


SUCCEEDED = re.compile(r"Handler '(cache-[a-z]+)' succeeded\.")


def _matches(pod: dict[str, Any], selector: dict[str, str]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def _selector_key(selector: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


def register(registry: kopf.OperatorRegistry, cache: OwnedObjectsCache) -> None:
    """Watch the owned kinds and the consumer pods (by their labels) into ``cache``."""
    managed_by, pod_app = owned_labels("any")[MANAGED_BY], owned_labels("any")[POD_APP]

    @kopf.on.startup(registry=registry)
    def watch_only_the_operators_objects(settings: kopf.OperatorSettings, **_: Any) -> None:
        """Filter the watches on the API server (a ``labelSelector``): kopf's ``labels=`` filter alone runs
        after every object of the kind in the cluster was sent to the operator."""
        for group, _version, plural in WATCHED_KINDS.values():
            settings.watching.label_selectors[(group, plural) if group else plural] = f"{MANAGED_BY}={managed_by}"
        settings.watching.label_selectors["pods"] = f"{POD_APP}={pod_app}"

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
        else:
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
        else:
            cache.put(kind, obj)
