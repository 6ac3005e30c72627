"""The operator's watched cache (``cache.OwnedObjectsCache``): hits, misses, deletions, and groups without pods."""

from __future__ import annotations

from keyorder_operator.builders import selector_labels
from keyorder_operator.cache import KEPT_SECONDS, NO_PODS_SECONDS, OwnedObjectsCache
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


def test_nothing_is_believed_longer_than_ten_minutes_without_an_event_and_a_list_drops_ghost_pods():
    """A watch that missed an event (a re-list after a 410 sends no DELETED for what vanished meanwhile)
    must not leave a ghost for ever: an object or a group's pods not seen for KEPT_SECONDS are read again,
    and a list from the API server replaces the group's cached pods."""
    clock = FakeClock()
    cache = OwnedObjectsCache(monotonic=clock)
    cache.put("Deployment", {"metadata": {"name": "orders", "namespace": "ns"}})
    cache.put_pod(pod("orders-1", "orders"))
    cache.put_pod(pod("orders-ghost", "orders"))
    clock.sleep(KEPT_SECONDS + 1)
    assert cache.get("Deployment", "ns", "orders") is None  # asked again
    assert cache.pods("ns", selector_labels("orders")) is None
    cache.listed_pods("ns", selector_labels("orders"), [pod("orders-1", "orders")])  # the API server's answer
    assert [p["metadata"]["name"] for p in cache.pods("ns", selector_labels("orders"))] == ["orders-1"]
