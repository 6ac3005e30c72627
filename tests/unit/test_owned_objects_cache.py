"""The operator's watched cache (``cache.OwnedObjectsCache``): hits, misses, deletions, groups without pods,
the verification after a kopf re-list, what is kept of an object, and the pods' index."""

from __future__ import annotations

import copy
import json

import kubernetes

from keyorder_operator import cache as cache_module
from keyorder_operator.builders import CUT_OVER, ROLLING_UPDATE, build_deployment, selector_labels, update_strategy
from keyorder_operator.cache import (
    KEPT_SECONDS,
    LISTING_QUIET_SECONDS,
    LISTING_WAIT_SECONDS,
    NO_PODS_SECONDS,
    POD,
    OwnedObjectsCache,
    kept_object,
    kept_pod,
)
from keyorder_operator.kube import (
    FIELD_MANAGER,
    SCALE_FIELD_MANAGER,
    Kube,
    ready_addresses,
    replicas_of,
    replicas_to_hand_over,
    scaler_owns_replicas,
)
from keyorder_operator.spec import OrderedConsumerSpec
from tests.fakes import FakeClock
from tests.operator import server_side_apply
from tests.operator.cluster_objects import as_created, deployment_conditions, long_env, update_entry, with_status
from tests.operator.kubelet import pod_from_template, template_hash


def pod(name: str, instance: str, namespace: str = "ns") -> dict:
    return {"metadata": {"name": name, "namespace": namespace, "labels": selector_labels(instance)}}


def test_objects_are_hits_until_deleted_and_reads_count_hits_and_misses():
    results: list[str] = []
    cache = OwnedObjectsCache(counted=results.append)
    deployment = {"metadata": {"name": "orders", "namespace": "ns", "resourceVersion": "7"}}
    assert cache.get("Deployment", "ns", "orders") is None
    cache.put("Deployment", deployment)
    copy = cache.get("Deployment", "ns", "orders")
    assert copy == kept_object("Deployment", deployment) and copy["metadata"]["resourceVersion"] == "7"
    copy["metadata"]["resourceVersion"] = "8"  # a copy: a caller cannot change the cache
    assert cache.get("Deployment", "ns", "orders")["metadata"]["resourceVersion"] == "7"
    cache.drop("Deployment", "ns", "orders")
    assert cache.get("Deployment", "ns", "orders") is None
    assert results == ["miss", "hit", "hit", "miss"]


def test_a_group_without_pods_is_believed_empty_for_a_while_and_a_new_pod_ends_it_at_once():
    clock = FakeClock()
    cache = OwnedObjectsCache(monotonic=clock)
    orders, other = selector_labels("orders"), selector_labels("refunds")
    assert cache.pods("ns", orders) is None  # never asked: a miss, read from the API server
    cache.listed_pods("ns", orders, [])
    cache.listed_pods("ns", other, [])
    assert cache.pods("ns", orders) == []  # known empty: no read
    cache.put_pod(pod("refunds-1", "refunds"))  # another group's pod: the orders group stays known empty
    assert cache.pods("ns", orders) == [] and [p["metadata"]["name"] for p in cache.pods("ns", other)] == ["refunds-1"]
    clock.sleep(NO_PODS_SECONDS + 1)
    assert cache.pods("ns", orders) is None  # believed long enough: asked again
    cache.listed_pods("ns", orders, [])
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


# -- what vanished during a kopf re-list -------------------------------------------------------------------
def service(name: str, namespace: str = "ns") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace}}


def test_a_relisting_is_verified_once_its_events_stop_and_what_the_list_lacks_is_dropped():
    """kopf lists again after a 410 Gone and sends no DELETED for what vanished meanwhile: once the listing's
    events (``type`` None) stop, the first read in a namespace is told to list it (``verification_due``),
    and every entry last seen before that list started and missing from it goes."""
    clock = FakeClock()
    cache = OwnedObjectsCache(monotonic=clock)
    cache.put("Service", service("kept"))
    cache.put("Service", service("vanished"))
    cache.put("Service", service("elsewhere", namespace="other"))
    assert cache.verification_due("Service", "ns") is None  # no listing since: nothing to check
    clock.sleep(30)
    cache.listing_noticed()  # the re-list's event for "kept"
    cache.put("Service", service("kept"))
    assert cache.verification_due("Service", "ns") is None, "the listing's events are still coming"
    clock.sleep(LISTING_QUIET_SECONDS)
    started = cache.verification_due("Service", "ns")
    assert started == clock.now
    assert cache.verification_due("Service", "ns") is None, "one verification at a time"
    assert cache.verification_due("Service", "other") is None, "one verification at a time, whatever it checks"
    cache.put("Service", service("created-meanwhile"))  # an event after the list started: newer than it
    assert cache.verified("Service", "ns", started, ["kept"]) == 1
    assert cache.get("Service", "ns", "vanished") is None
    assert cache.get("Service", "ns", "kept") is not None
    assert cache.get("Service", "ns", "created-meanwhile") is not None
    assert cache.verification_due("Service", "ns") is None, "verified since the listing"
    assert cache.verification_due("Service", "other") is not None, "each namespace is verified on its own"
    assert cache.verification_due("Deployment", "ns") is None, "no Deployment cached before the listing"


def test_a_listing_of_one_kind_verifies_every_kind_for_an_empty_listing_sends_nothing():
    """The operator's last PodDisruptionBudget deleted while the watches were down: kopf's re-list of PDBs is
    empty and sends no event at all, but the other kinds' listings (a restarted API server, a standby taking
    over re-list them all) have the cache check the PDBs too."""
    clock = FakeClock()
    cache = OwnedObjectsCache(monotonic=clock)
    cache.put("PodDisruptionBudget", {"metadata": {"name": "orders", "namespace": "ns"}})
    cache.put("Service", service("orders-metrics"))
    clock.sleep(30)
    cache.listing_noticed()  # the Service listing's event; none for the PDBs
    cache.put("Service", service("orders-metrics"))
    clock.sleep(LISTING_QUIET_SECONDS)
    started = cache.verification_due("PodDisruptionBudget", "ns")
    assert started is not None
    assert cache.verified("PodDisruptionBudget", "ns", started, []) == 1
    assert cache.get("PodDisruptionBudget", "ns", "orders") is None


def test_a_listing_that_goes_on_is_verified_every_while_and_again_once_it_stops():
    clock = FakeClock()
    cache = OwnedObjectsCache(monotonic=clock)
    cache.put("Service", service("old"))
    clock.sleep(30)
    for _ in range(int(LISTING_WAIT_SECONDS / 0.5) + 1):
        cache.listing_noticed()
        clock.sleep(0.5)
    started = cache.verification_due("Service", "ns")
    assert started is not None, "a long listing is verified before it ends"
    cache.verified("Service", "ns", started, ["old"])
    lists = 0
    for _ in range(int(2 * LISTING_WAIT_SECONDS / 0.5) + 2):  # the listing's events trickle on for a minute
        clock.sleep(0.5)
        cache.listing_noticed()
        due = cache.verification_due("Service", "ns")
        if due is not None:
            lists += 1
            cache.verified("Service", "ns", due, ["old"])
    assert lists == 2, f"{lists} verification lists while the listing went on, not one every {LISTING_WAIT_SECONDS} s"
    clock.sleep(LISTING_QUIET_SECONDS)
    assert cache.verification_due("Service", "ns") is not None, "checked again once the listing stopped"


def test_a_failed_verification_is_due_again_and_a_listing_of_fresh_entries_needs_none():
    clock = FakeClock()
    cache = OwnedObjectsCache(monotonic=clock)
    cache.put("Service", service("old"))
    clock.sleep(30)
    cache.listing_noticed()
    clock.sleep(LISTING_QUIET_SECONDS)
    assert cache.verification_due("Service", "ns") is not None
    cache.verification_failed("Service", "ns")
    assert cache.verification_due("Service", "ns") is not None, "due again after a failed list"

    fresh = OwnedObjectsCache(monotonic=clock)  # an operator starting: its first listing fills the cache
    fresh.listing_noticed()
    fresh.put("Service", service("listed"))
    clock.sleep(LISTING_QUIET_SECONDS)
    assert fresh.verification_due("Service", "ns") is None, "nothing was seen before the listing: no list"


def test_pods_vanished_during_a_relisting_leave_their_group():
    clock = FakeClock()
    cache = OwnedObjectsCache(monotonic=clock)
    orders = selector_labels("orders")
    cache.put_pod(pod("orders-1", "orders"))
    cache.put_pod(pod("orders-dead", "orders"))
    clock.sleep(30)
    cache.listing_noticed()
    cache.put_pod(pod("orders-1", "orders"))
    clock.sleep(LISTING_QUIET_SECONDS)
    started = cache.verification_due(POD, "ns")
    assert started is not None
    assert cache.verified(POD, "ns", started, ["orders-1"]) == 1
    assert [p["metadata"]["name"] for p in cache.pods("ns", orders)] == ["orders-1"]


# -- what is kept, and how a poll finds a group's pods -------------------------------------------------------
def test_a_read_walks_only_its_own_groups_pods(monkeypatch):
    """A poll reads its group's pods from an index (namespace, instance): with thousands of other pods
    cached, it compares labels of its own pods only (the old scan compared every cached pod, under the lock
    kopf's event loop takes for every watch event)."""
    cache = OwnedObjectsCache()
    for group in range(300):
        for index in range(5):
            cache.put_pod(pod(f"g{group}-{index}", f"g{group}"))
    compared: list[str] = []
    original = cache_module._matches

    def counting(pod: dict, selector: dict) -> bool:
        compared.append(pod["metadata"]["name"])
        return original(pod, selector)

    monkeypatch.setattr(cache_module, "_matches", counting)
    found = cache.pods("ns", selector_labels("g7"))
    assert sorted(p["metadata"]["name"] for p in found) == [f"g7-{index}" for index in range(5)]
    assert len(compared) <= 5, f"compared {len(compared)} pods for a group of 5"
    cache.drop_pod("ns", "g7-0")
    cache.put_pod(pod("g7-0", "g8"))  # relabelled into another group: the index follows
    assert len(cache.pods("ns", selector_labels("g7"))) == 4 and len(cache.pods("ns", selector_labels("g8"))) == 6


def served_deployment(
    spec: OrderedConsumerSpec, strategy: dict, status: dict, replicas_by: str = SCALE_FIELD_MANAGER
) -> dict:
    """The Deployment the operator applies, as a cluster returns it: metadata, the appliers' and the
    controller's ``managedFields``, and ``status``. ``replicas_by``: who owns ``spec.replicas`` (the scaler's
    apply, the objects' apply of an older release, an HPA's update through the scale subresource)."""
    owner = {"metadata": {"name": "orders", "namespace": "ns", "uid": "u-1"}}
    applied = build_deployment(spec, owner, None, strategy)
    served = copy.deepcopy(applied)
    served["spec"]["replicas"] = 3
    paths = server_side_apply.field_paths(applied, server_side_apply.Schema.of(applied))
    owners = {FIELD_MANAGER: paths | ({("spec", "replicas")} if replicas_by == FIELD_MANAGER else set())}
    if replicas_by == SCALE_FIELD_MANAGER:
        owners[SCALE_FIELD_MANAGER] = {("spec", "replicas")}
    served["metadata"].update(uid="d-1", resourceVersion="4711", generation=3)
    served["status"] = status
    served["metadata"]["managedFields"] = [
        *server_side_apply.managed_fields(owners, "apps/v1", NOW),
        update_entry(served, {"status": status}, "kube-controller-manager", NOW, subresource="status"),
    ]
    if replicas_by not in (SCALE_FIELD_MANAGER, FIELD_MANAGER):
        scaled = {"spec": {"replicas": 3}}
        served["metadata"]["managedFields"].append(update_entry(served, scaled, replicas_by, NOW, subresource="scale"))
    return served


NOW = "2026-07-01T10:00:00Z"


def test_the_cache_keeps_only_what_the_operator_reads_and_every_reader_answers_as_on_the_whole_object():
    """Every reader of a cached object (the replicas and who owns them, the update strategy and whether a
    rollout is done, the pods reported, the ready pods' addresses) answers on the kept object exactly as on
    the object a cluster returns, which is many times larger (``managedFields``, the pod spec, the kubelet's
    status). A reader of a field the cache drops fails here."""
    specs = [
        OrderedConsumerSpec.model_validate(
            {
                "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "orders", **kafka},
                "handler": {
                    "image": "registry.example/orders:1.0",
                    "handler": "orders.handler:handle",
                    "env": long_env(),
                },
            }
        )
        for kafka in ({}, {"assignmentStrategy": "range"}, {"groupProtocol": "consumer"})
    ]
    statuses = [
        {},
        {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3, "availableReplicas": 3},
        {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3},
        {"observedGeneration": 3, "replicas": 4, "updatedReplicas": 2, "readyReplicas": 1, "terminatingReplicas": 1},
    ]
    for status in statuses:
        status["conditions"] = deployment_conditions(bool(status.get("readyReplicas")), "orders-5d8f", NOW)
    client = kubernetes.client.ApiClient()
    checked = 0
    variants = [
        (live_spec, strategy, status, owner)
        for live_spec in specs
        for strategy in (ROLLING_UPDATE, CUT_OVER)
        for status in statuses
        for owner in (SCALE_FIELD_MANAGER, FIELD_MANAGER, "horizontal-pod-autoscaler")
    ]
    for live_spec, strategy, status, owner in variants:
        whole = served_deployment(live_spec, strategy, status, owner)
        cache = OwnedObjectsCache()
        cache.put("Deployment", whole)
        cached, uncached = Kube(client, cache=cache), Kube(client)
        uncached._read = lambda read, namespace, name, whole=whole: whole  # type: ignore[method-assign]
        kept = cached.deployment("ns", "orders")
        assert kept is not None and "managedFields" in whole["metadata"]
        for reader in (replicas_of, scaler_owns_replicas, replicas_to_hand_over):
            assert reader(kept) == reader(whole), reader
        for spec in specs:
            assert update_strategy(spec, kept) == update_strategy(spec, whole)
        for method in ("deployment_rolled_out", "deployment_pods_reported", "deployment_replicas"):
            assert getattr(cached, method)("ns", "orders") == getattr(uncached, method)("ns", "orders"), method
        assert len(json.dumps(kept)) < len(json.dumps(whole)) / 4
        checked += 1
    assert checked == 72
    assert replicas_to_hand_over(served_deployment(specs[0], ROLLING_UPDATE, {}, FIELD_MANAGER))  # both kinds seen
    assert not replicas_to_hand_over(served_deployment(specs[0], ROLLING_UPDATE, {}, "horizontal-pod-autoscaler"))

    deployment = served_deployment(specs[0], ROLLING_UPDATE, statuses[1])
    hashed = template_hash(deployment["spec"]["template"])
    made = pod_from_template(deployment["spec"]["template"], "orders-abc12", hashed)
    created = as_created(made, f"orders-{hashed}", NOW)
    variants = [
        with_status(created, "10.1.2.3", ready=True, now=NOW),
        with_status(created, "10.1.2.4", ready=False, now=NOW),
        {**with_status(created, "10.1.2.5", ready=True, now=NOW), "status": {"phase": "Pending"}},
    ]
    terminating = copy.deepcopy(variants[0])
    terminating["metadata"]["deletionTimestamp"] = NOW
    other = copy.deepcopy(variants[0])
    other["metadata"]["labels"]["app.kubernetes.io/instance"] = "refunds"
    pods = [*variants, terminating, other]
    kept_pods = [kept_pod(pod) for pod in pods]
    for selector in (selector_labels("orders"), selector_labels("refunds")):
        assert ready_addresses(kept_pods, selector) == ready_addresses(pods, selector)
    assert ready_addresses(kept_pods, selector_labels("orders")) == ["10.1.2.3"]
    served_size, kept_size = len(json.dumps(variants[0])), len(json.dumps(kept_pods[0]))
    assert served_size > 10_000 and kept_size < served_size / 20, (served_size, kept_size)
    assert set(kept_pods[0]) <= {"apiVersion", "kind", "metadata", "status"}
    assert "managedFields" not in kept_pods[0]["metadata"]
