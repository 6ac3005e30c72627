"""What a steady poll asks of the API server: with the owned objects and the consumer pods watched
into the operator's cache, no read; and with status written only when it changed, no write.

The real kopf operator on the API emulator; the lag comes from ``NoKafka`` (no broker), and the one
consumer pod is an object created in the emulator (no kubelet runs it), labelled as the Deployment's
pods are and marked Ready.
"""

from __future__ import annotations

import pytest

from keyorder_operator.builders import selector_labels
from keyorder_operator.cache import CHECK_PAGE, LISTING_CHUNK
from tests.operator.emulator import Emulator
from tests.operator.harness import CR, wait_for, wait_for_polls
from tests.operator.test_operator_deployable import operator, resource

pytestmark = pytest.mark.timeout(120)


def counted(context, result: str) -> float:
    return context.metrics.registry.get_sample_value("keyorder_operator_cache_reads_total", {"result": result}) or 0.0


def consumer_pod(instance: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{instance}-pod-1", "labels": selector_labels(instance)},
        "spec": {"containers": [{"name": "consumer", "image": "registry.example/orders:1.0"}]},
    }


def a_resource_with_a_ready_pod(kube, name: str) -> None:
    """OrderedConsumer ``name``, once its Deployment exists, with one Ready pod at 127.0.0.9 (no kubelet)."""
    kube.create(CR, resource(name))
    wait_for(lambda: kube.get("apps/v1/deployments", name) is not None, 20, "the Deployment")
    kube.create("v1/pods", consumer_pod(name))
    kube.patch(
        "v1/pods",
        f"{name}-pod-1",
        {"status": {"podIP": "127.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}},
        subresource="status",
    )


def test_a_steady_poll_reads_the_owned_objects_and_pods_from_the_cache_and_writes_nothing(kube, monkeypatch):
    writes: list[str] = []
    watches: dict[str, str] = {}
    handle = Emulator._handle

    async def recorded(emulator, request):  # every request the emulator answers, the operator's included
        if str(getattr(request.method, "value", request.method)).upper() != "GET":
            writes.append(f"{request.method} {request.url.path}")
        elif str(request.params.get("watch", "")).lower() in ("true", "1"):
            watches[str(request.url.path).rsplit("/", 1)[-1]] = str(request.params.get("labelSelector", ""))
        return await handle(emulator, request)

    monkeypatch.setattr(Emulator, "_handle", recorded)
    with operator(kube.url) as context:
        a_resource_with_a_ready_pod(kube, "steady")
        wait_for_polls(kube, "steady", 3)  # the watches have delivered everything by now
        misses, hits = counted(context, "miss"), counted(context, "hit")
        writes.clear()
        wait_for_polls(kube, "steady", 4)
        assert writes == [], f"a steady poll wrote: {writes}"
        assert counted(context, "miss") == misses, "a steady poll read an owned object or the pods from the API"
        assert counted(context, "hit") - hits >= 4 * 6  # per poll: the Deployment twice, 4 versions, the pods
        assert len(context.kube.cache) >= 5  # Deployment, Service, PDB, ServiceAccount, the pod
        # the API server filters the watches: the operator is not sent every pod and Deployment of the cluster
        assert watches.get("pods") == "app.kubernetes.io/name=keyorder-consumer", watches
        for plural in ("deployments", "services", "serviceaccounts", "poddisruptionbudgets"):
            assert watches.get(plural) == "app.kubernetes.io/managed-by=keyorder-operator", watches
    assert kube.get(CR, "steady") is not None


def test_what_vanished_while_the_watches_were_down_leaves_the_cache_and_is_recreated_at_once(kube, monkeypatch):
    """kopf lists again after a 410 Gone (``kopf/_cogs/clients/watching.py``: ``continuous_watch`` returns on
    the ERROR of code 410, ``infinite_watch`` lists) and sends no DELETED for what was deleted while it did not
    watch. The cache notices the listing and checks itself against a list of its own: the deleted pod leaves
    it (no report fetch or worker push at its address) and the deleted Service and PodDisruptionBudget are
    recreated within a few polls, not after the cache's ten-minute bound (``KEPT_SECONDS``). Every list, kopf's
    and the cache's own, comes in pages (``LISTING_CHUNK``, ``CHECK_PAGE``)."""
    selector = selector_labels("relist")
    lists: list[tuple[str, str]] = []
    handle = Emulator._handle

    async def recorded(emulator, request):
        watching = str(request.params.get("watch", "")).lower() in ("true", "1")
        listing = request.name is None and getattr(request.resource, "plural", None) and not watching
        if str(getattr(request.method, "value", request.method)).upper() == "GET" and listing:
            lists.append((str(request.url.path), str(request.params.get("limit", ""))))
        return await handle(emulator, request)

    monkeypatch.setattr(Emulator, "_handle", recorded)
    with operator(kube.url) as context:
        a_resource_with_a_ready_pod(kube, "relist")
        cache = context.kube.cache
        wait_for(
            lambda: (
                [(p.get("status") or {}).get("podIP") for p in cache.pods("default", selector) or []] == ["127.0.0.9"]
            ),
            20,
            "the pod in the cache",
        )
        wait_for_polls(kube, "relist", 2)
        for kind, name in (("Service", "relist-metrics"), ("PodDisruptionBudget", "relist")):
            assert cache.get(kind, "default", name) is not None, kind
        service_uid = kube.get("v1/services", "relist-metrics")["metadata"]["uid"]

        with kube.watches_interrupted():
            kube.delete("v1/pods", "relist-pod-1")  # never scheduled: removed at once
            kube.delete("v1/services", "relist-metrics")
            kube.delete("policy/v1/poddisruptionbudgets", "relist")
            assert kube.get("v1/pods", "relist-pod-1") is None and kube.get("v1/services", "relist-metrics") is None

        recreated = wait_for(lambda: kube.get("v1/services", "relist-metrics"), 20, "the deleted Service recreated")
        assert recreated["metadata"]["uid"] != service_uid
        wait_for(lambda: kube.get("policy/v1/poddisruptionbudgets", "relist"), 20, "the deleted PDB recreated")
        wait_for(lambda: not cache.pods("default", selector), 20, "the deleted pod gone from the cache")
        assert context.kube.ready_pod_ips("default", selector) == []
    assert ("/api/v1/pods", str(LISTING_CHUNK)) in lists, "kopf's listing of the pods"
    assert ("/api/v1/namespaces/default/services", str(CHECK_PAGE)) in lists, "the cache's check of the Services"
    unpaged = [path for path, limit in lists if "/namespaces/" not in path and not limit]
    assert not unpaged, f"kopf listed without pages: {unpaged}"
