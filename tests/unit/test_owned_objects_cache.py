"""The operator's watched cache (``cache.OwnedObjectsCache``): hits, misses, deletions, and groups without pods."""

from __future__ import annotations

from keyorder_operator.builders import selector_labels
from keyorder_operator.cache import NO_PODS_SECONDS, OwnedObjectsCache
from tests.fakes import FakeClock


def pod(name: str, instance: str, namespace: str = "ns") -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "labels": selector_labels(instance)}}


def test_objects_are_hits_until_deleted_and_reads_count_hits_and_misses():
    results: list[str] = []
    cache = OwnedObjectsCache(counted=results.append)
    deployment = {"metadata": {"name": "orders", "namespace": "ns", "resourceVersion": "7"}}
    assert cache.get("Deployment", "ns", "orders") is None
    cache.put("Deployment", deployment)
    copy = cache.get("Deployment", "ns", "orders")
    assert copy == deployment and copy is not deployment  # a copy: a caller cannot change the cache
    cache.drop("Deployment", "ns", "orders")
    assert cache.get("Deployment", "ns", "orders") is None
    assert results == ["miss", "hit", "miss"]


def test_a_group_without_pods_is_believed_empty_for_a_while_and_a_new_pod_ends_it_at_once():
    clock = FakeClock()
    cache = OwnedObjectsCache(monotonic=clock)
    orders, other = selector_labels("orders"), selector_labels("refunds")
    assert cache.pods("ns", orders) is None  # never asked: a miss, read from the API server
    cache.found_no_pods("ns", orders)
    cache.found_no_pods("ns", other)
    assert cache.pods("ns", orders) == []  # known empty: no read
    cache.put_pod(pod("refunds-1", "refunds"))  # another group's pod: the orders group stays known empty
    assert cache.pods("ns", orders) == [] and [p["metadata"]["name"] for p in cache.pods("ns", other)] == ["refunds-1"]
    clock.sleep(NO_PODS_SECONDS + 1)
    assert cache.pods("ns", orders) is None  # believed long enough: asked again
    cache.found_no_pods("ns", orders)
    cache.put_pod(pod("orders-1", "orders"))
    assert [p["metadata"]["name"] for p in cache.pods("ns", orders)] == ["orders-1"]
    cache.drop_pod("ns", "orders-1")
    assert cache.pods("ns", orders) is None
