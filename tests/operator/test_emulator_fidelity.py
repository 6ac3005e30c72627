"""The API emulator (a FAKE) is strict where the real API server is: each test names the Kubernetes
documentation behaviour it checks, and each failed against the emulator before it was made strict
(validation, defaulting, the status subresource for PUT, new finalizers on a deleting object, garbage
collection, DELETED events under a new resourceVersion, RBAC).

Plain HTTP against the emulator, no kopf: these run in a fraction of a second each.
"""

from __future__ import annotations

import base64
import copy
import datetime
import json
import urllib.request
from typing import Any

import pytest
import yaml

from tests.operator.admission_policy import ValidatingAdmissionPolicy
from tests.operator.authorization import (
    OPERATOR_TOKEN,
    Attributes,
    Authorizer,
    Identity,
    chart_authorizer,
    operator_identity,
)
from tests.operator.emulator import APPLY_PATCH, CRD_FILE, register_crd
from tests.operator.harness import CR, ApiError, KubeHTTP, RunningEmulator, resource_path, serve_emulator
from tests.operator.kubelet import LocalKubelet
from tests.support import wait_for

pytestmark = pytest.mark.timeout(60)

SPEC = {
    "kafka": {"bootstrapServers": "127.0.0.1:9", "topics": ["orders"], "groupId": "orders"},
    "handler": {"image": "registry.example/orders:1.0", "handler": "orders.handler:handle"},
}


def consumer(name: str, **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(SPEC)
    body.update(spec)
    return {"apiVersion": "keyorder.dev/v1alpha1", "kind": "OrderedConsumer", "metadata": {"name": name}, "spec": body}


def refused(call: Any, status: int) -> dict[str, Any]:
    """The Status body of a call that must fail with ``status``."""
    with pytest.raises(ApiError) as failure:
        call()
    assert failure.value.status == status, failure.value.body
    return failure.value.body


def put(kube: KubeHTTP, resource: str, name: str, body: dict[str, Any], subresource: str | None = None) -> Any:
    return kube.call("PUT", resource_path(resource, "default", name, subresource), body)


def apply(kube: KubeHTTP, resource: str, name: str, body: dict[str, Any], subresource: str | None = None) -> Any:
    path = resource_path(resource, "default", name, subresource) + "?fieldManager=tester&force=true"
    return kube.call("PATCH", path, body, content_type=APPLY_PATCH)


# ---------------------------------------------------------------- 1. CRD validation and defaulting


def test_the_crd_schema_refuses_invalid_objects_on_every_write_with_422_naming_the_field(kube: RunningEmulator):
    """https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation
    : a custom resource that does not match the version's openAPIV3Schema is refused (422 Invalid, naming the
    field) on create and on every update (PUT, merge patch, JSON patch, server-side apply), and nothing is stored.
    """
    body = refused(lambda: kube.create(CR, consumer("big", workers={"max": 5000})), 422)
    assert body["reason"] == "Invalid"
    assert 'OrderedConsumer.keyorder.dev "big" is invalid: ' in body["message"]
    assert (
        "spec.workers.max: Invalid value: 5000: spec.workers.max in body should be less than or equal to 4096"
        in (body["message"])
    )
    assert [cause["field"] for cause in body["details"]["causes"]] == ["spec.workers.max"]
    body = refused(lambda: kube.create(CR, consumer("odd", ordering="random")), 422)
    assert 'spec.ordering: Unsupported value: "random"' in body["message"]
    missing = consumer("nokafka")
    del missing["spec"]["kafka"]
    assert "spec.kafka: Required value" in refused(lambda: kube.create(CR, missing), 422)["message"]
    assert kube.list(CR) == []

    stored = kube.create(CR, consumer("ok"))
    bad_port = {"spec": {"httpPort": 80}}
    expected = "spec.httpPort: Invalid value: 80: spec.httpPort in body should be greater than or equal to 1024"
    for write in (
        lambda: kube.patch(CR, "ok", bad_port),
        lambda: kube.patch(CR, "ok", [{"op": "replace", "path": "/spec/httpPort", "value": 80}]),
        lambda: apply(kube, CR, "ok", {**consumer("ok"), "spec": {**consumer("ok")["spec"], "httpPort": 80}}),
        lambda: put(kube, CR, "ok", {**stored, "spec": {**stored["spec"], "httpPort": 80}}),
    ):
        assert expected in refused(write, 422)["message"]
    assert kube.get(CR, "ok") == stored  # no refused write changed anything


BROKEN_BY_RULES = {
    "metadata.name must be at most 55 characters": ("a" * 56, {}),
    "assignmentStrategy applies to groupProtocol classic only": (
        "proto",
        {"kafka": {**SPEC["kafka"], "groupProtocol": "consumer", "assignmentStrategy": "range"}},
    ),
    "staticMembership applies to groupProtocol classic only": (
        "static",
        {"kafka": {**SPEC["kafka"], "groupProtocol": "consumer", "staticMembership": True}},
    ),
    "set value or valueFrom, not both": (
        "env",
        {
            "handler": {
                **SPEC["handler"],
                "env": [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
            }
        },
    ),
    "need min <= initial <= max": ("workers", {"workers": {"min": 32, "initial": 16, "max": 64}}),
    "min must be <= max": ("replicas", {"replicas": {"min": 5, "max": 2}}),
    "replicas.min 0 needs scaling.scaleToZero: true": ("zero", {"replicas": {"min": 0}}),
    "scaling.fallback.replicas 0 needs scaling.scaleToZero: true": (
        "fallback",
        {"scaling": {"fallback": {"failureThreshold": 3, "replicas": 0}}},
    ),
    "spec.catchup.image is required when spec.catchup.enabled": ("catchup", {"catchup": {"enabled": True}}),
    "spec.catchup.sparkConf cannot set spark.speculation to other than false": (
        "speculation",
        {"catchup": {"enabled": True, "image": "catchup:1", "sparkConf": {" spark.speculation ": "true"}}},
    ),
    "spec.catchup.master local[n,f] with f above 1": (
        "failures",
        {"catchup": {"enabled": True, "image": "catchup:1", "master": "local[2,3]"}},
    ),
    "spec.catchup.master spark:// (or local-cluster) needs the secret": (
        "secret",
        {"catchup": {"enabled": True, "image": "catchup:1", "master": "spark://spark-master:7077"}},
    ),
    "maxWaitMs needs maxMessages above 1": ("batchwait", {"handler": {**SPEC["handler"], "batch": {"maxWaitMs": 5}}}),
    "handler.batch.maxMessages above 1 with catchup.enabled": (
        "batchcatchup",
        {"handler": {**SPEC["handler"], "batch": {"maxMessages": 50}}, "catchup": {"enabled": True, "image": "c:1"}},
    ),
}


def test_every_cel_rule_of_the_crd_is_evaluated_on_create_patch_apply_and_put(kube: RunningEmulator):
    """https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#validation-rules
    : every ``x-kubernetes-validations`` rule is evaluated (CEL, here with cel-python), on the defaulted object,
    at create and update; a rule that fails refuses the object with its message, at the rule's field
    (``fieldPath``). Each of the CRD's fourteen rules is broken once."""
    crd = yaml.safe_load(CRD_FILE.read_text())
    rules = [
        rule["message"]
        for node in walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        for rule in node.get("x-kubernetes-validations") or []
    ]
    assert len(rules) == len(BROKEN_BY_RULES) == 14
    for message, (name, spec) in BROKEN_BY_RULES.items():
        assert any(rule.startswith(message) for rule in rules), message
        body = refused(lambda name=name, spec=spec: kube.create(CR, consumer(name, **spec)), 422)
        assert message in body["message"], body["message"]
    assert (
        "spec.replicas.min: Invalid value: "
        in refused(lambda: kube.create(CR, consumer("zero", replicas={"min": 0})), 422)["message"]
    )  # fieldPath places the error

    kube.create(CR, consumer("live"))
    for write in (
        lambda: kube.patch(CR, "live", {"spec": {"replicas": {"min": 5, "max": 2}}}),
        lambda: kube.patch(CR, "live", [{"op": "add", "path": "/spec/replicas", "value": {"min": 5, "max": 2}}]),
        lambda: apply(kube, CR, "live", consumer("live", replicas={"min": 5, "max": 2})),
        lambda: put(
            kube,
            CR,
            "live",
            {**(kube.get(CR, "live") or {}), "spec": consumer("x", replicas={"min": 5, "max": 2})["spec"]},
        ),
    ):
        assert 'spec.replicas: Invalid value: "object": min must be <= max' in refused(write, 422)["message"]
    # defaults count: workers.max 8 leaves the defaulted initial (16) above it
    assert (
        "need min <= initial <= max"
        in refused(lambda: kube.patch(CR, "live", {"spec": {"workers": {"max": 8}}}), 422)["message"]
    )


def test_defaults_are_stored_and_unknown_fields_pruned_or_refused_when_strict(kube: RunningEmulator):
    """https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#defaulting
    and #field-pruning: the schema's defaults are stored (a defaulted ``{}`` gets its own fields' defaults);
    unknown fields are dropped with a warning, or refused with ``fieldValidation=Strict``
    (https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation)."""
    created = kube.create(CR, consumer("defaults", replicaCount=3))
    spec = created["spec"]
    assert spec["workers"]["initial"] == 16 and spec["workers"]["max"] == 256
    assert spec["replicas"]["min"] == 1 and spec["httpPort"] == 8080
    assert spec["kafka"]["groupProtocol"] == "classic" and spec["handler"]["executor"] == "auto"
    assert "replicaCount" not in spec, "an unknown field was stored"
    assert kube.get(CR, "defaults") == created
    request = urllib.request.Request(
        kube.url + resource_path(CR, "default"),
        data=json.dumps(consumer("warned", scaling={"targetLag": 10})).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201
        assert 'unknown field \\"spec.scaling.targetLag\\"' in response.headers["Warning"]
    strict = resource_path(CR, "default") + "?fieldValidation=Strict"
    body = refused(lambda: kube.call("POST", strict, consumer("strict", replicaCount=3)), 400)
    assert 'strict decoding error: unknown field "spec.replicaCount"' in body["message"]


def test_transition_rules_see_old_self_only_on_updates() -> None:
    """https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#transition-rules
    : a rule that refers to ``oldSelf`` is evaluated only on an update, where the old object has a value, with
    ``oldSelf`` bound to it; full CEL (macros) is available."""
    crd = {
        "spec": {
            "group": "example.dev",
            "names": {"kind": "Widget", "plural": "widgets"},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {
                                        "size": {"type": "integer"},
                                        "tags": {"type": "array", "items": {"type": "string"}},
                                    },
                                    "x-kubernetes-validations": [
                                        {"rule": "self.size >= oldSelf.size", "message": "size may only grow"},
                                        {"rule": "self.tags.all(t, t.startsWith('x-'))", "message": "tags start x-"},
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        }
    }

    def setup(emulator: Any) -> None:
        register_crd(emulator, crd)

    with serve_emulator(setup) as kube:
        widgets = "example.dev/v1/widgets"
        kube.create(widgets, {"metadata": {"name": "w"}, "spec": {"size": 5, "tags": ["x-a"]}})
        assert kube.patch(widgets, "w", {"spec": {"size": 6}})["spec"]["size"] == 6
        assert "size may only grow" in refused(lambda: kube.patch(widgets, "w", {"spec": {"size": 1}}), 422)["message"]
        assert "tags start x-" in refused(lambda: kube.patch(widgets, "w", {"spec": {"tags": ["y"]}}), 422)["message"]


# ---------------------------------------------------------------- 2. the status subresource


def sneaky(current: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """``current`` with a new status, and a changed spec and labels (which a write to /status must ignore)."""
    changed = copy.deepcopy(current)
    changed["spec"]["httpPort"] = 9999
    changed["metadata"]["labels"] = {"sneaky": "yes"}
    changed["status"] = status
    return changed


def test_the_status_subresource_splits_every_kind_of_write(kube: RunningEmulator):
    """https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#status-subresource
    : with the status subresource, PUT/POST/PATCH of the resource ignore changes to ``status``, and PUT/PATCH of
    ``/status`` ignore everything but ``status`` (metadata too; a resourceVersion precondition still applies)."""
    created = kube.create(CR, {**consumer("s"), "status": {"ignored": True}})
    assert "status" not in created
    kube.patch(CR, "s", {"status": {"phase": "one"}}, subresource="status")
    writes_to_the_object = [
        lambda: kube.patch(CR, "s", {"spec": {"httpPort": 9001}, "status": {"phase": "merge"}}),
        lambda: kube.patch(CR, "s", [{"op": "replace", "path": "/status", "value": {"phase": "json"}}]),
        lambda: apply(kube, CR, "s", {**consumer("s", httpPort=9002), "status": {"phase": "apply"}}),
        lambda: put(kube, CR, "s", {**(kube.get(CR, "s") or {}), "status": {"phase": "put"}}),
    ]
    for write in writes_to_the_object:
        assert write()["status"] == {"phase": "one"}
    assert kube.get(CR, "s")["spec"]["httpPort"] == 9002  # the spec changes were kept
    before = kube.get(CR, "s")
    assert before is not None
    changes = {"spec": {"httpPort": 9999}, "metadata": {"labels": {"sneaky": "yes"}}}
    writes_to_status = [
        lambda: kube.patch(CR, "s", {**changes, "status": {"phase": "merge"}}, subresource="status"),
        lambda: kube.patch(
            CR,
            "s",
            [
                {"op": "replace", "path": "/spec/httpPort", "value": 9999},
                {"op": "replace", "path": "/status", "value": {"phase": "json"}},
            ],
            subresource="status",
        ),
        lambda: put(kube, CR, "s", sneaky(kube.get(CR, "s") or {}, {"phase": "put"}), "status"),
    ]
    for phase, write in zip(["merge", "json", "put"], writes_to_status, strict=True):
        after = write()
        assert after["status"] == {"phase": phase}
        assert after["spec"] == before["spec"] and "labels" not in after["metadata"]
        assert after["metadata"]["generation"] == before["metadata"]["generation"]
    stale = {"metadata": {"resourceVersion": before["metadata"]["resourceVersion"]}, "status": {"phase": "x"}}
    refused(lambda: kube.patch(CR, "s", stale, subresource="status"), 409)


# ---------------------------------------------------------------- 3. finalizers, 4. garbage collection, 5. watches


def test_finalizers_block_deletion_and_none_can_be_added_meanwhile(kube: RunningEmulator):
    """https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/ : deleting an object with
    finalizers sets ``metadata.deletionTimestamp`` and keeps it until the finalizers are removed, then it goes;
    while it is being deleted no finalizer can be added; an object without finalizers goes at once."""
    kube.create("v1/configmaps", {"metadata": {"name": "held", "finalizers": ["example.dev/a"]}})
    marked = kube.delete("v1/configmaps", "held")
    assert marked["metadata"]["deletionTimestamp"]
    assert kube.get("v1/configmaps", "held") == marked
    assert kube.delete("v1/configmaps", "held") == marked  # a second delete changes nothing
    body = refused(
        lambda: kube.patch("v1/configmaps", "held", {"metadata": {"finalizers": ["example.dev/a", "example.dev/b"]}}),
        422,
    )
    assert "no new finalizers can be added if the object is being deleted" in body["message"]
    kube.patch("v1/configmaps", "held", [{"op": "remove", "path": "/metadata/finalizers"}])
    assert kube.get("v1/configmaps", "held") is None
    kube.create("v1/configmaps", {"metadata": {"name": "free"}})
    kube.delete("v1/configmaps", "free")
    assert kube.get("v1/configmaps", "free") is None


def owned_by(*owners: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"apiVersion": o["apiVersion"], "kind": o["kind"], "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]}
        for o in owners
    ]


def test_the_garbage_collector_deletes_dependents_in_cascade_and_honours_their_finalizers(kube: RunningEmulator):
    """https://kubernetes.io/docs/concepts/architecture/garbage-collection/#cascading-deletion : when an owner is
    deleted (background propagation), every object whose ``ownerReferences`` name its uid is deleted, and their
    own dependents after them; a dependent with finalizers is only marked for deletion; one that still has a
    live owner stays (without the dangling reference); ``propagationPolicy=Orphan`` leaves the dependents."""
    owner = kube.create(CR, consumer("owner"))
    other = kube.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}})
    child = kube.create(
        "apps/v1/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "child", "ownerReferences": owned_by(owner)},
        },
    )
    kube.create("v1/secrets", {"metadata": {"name": "grandchild", "ownerReferences": owned_by(child)}})
    kube.create(
        "v1/services", {"metadata": {"name": "held", "ownerReferences": owned_by(owner), "finalizers": ["x/y"]}}
    )
    kube.create("v1/serviceaccounts", {"metadata": {"name": "shared", "ownerReferences": owned_by(owner, other)}})

    kube.delete(CR, "owner")
    assert kube.get(CR, "owner") is None
    assert kube.get("apps/v1/deployments", "child") is None
    assert kube.get("v1/secrets", "grandchild") is None  # the cascade goes on down
    held = kube.get("v1/services", "held")
    assert held is not None and held["metadata"]["deletionTimestamp"]  # its finalizer holds it
    shared = kube.get("v1/serviceaccounts", "shared")
    assert shared is not None and shared["metadata"]["ownerReferences"] == owned_by(other)

    kube.call("DELETE", resource_path("v1/configmaps", "default", "other") + "?propagationPolicy=Orphan")
    orphan = kube.get("v1/serviceaccounts", "shared")
    assert orphan is not None and "ownerReferences" not in orphan["metadata"]


def watch(kube: KubeHTTP, resource: str, since: str) -> Any:
    return urllib.request.urlopen(f"{kube.url}{resource_path(resource)}?watch=true&resourceVersion={since}", timeout=10)


def next_event(stream: Any) -> dict[str, Any]:
    while line := stream.readline():
        if line.strip():
            return json.loads(line)
    raise AssertionError("the watch stream ended before the next event")


def test_watches_deliver_the_deletion_mark_and_the_deletion_with_the_last_state(kube: RunningEmulator):
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes : a watch
    delivers every change after its resourceVersion, deletions included: MODIFIED when ``deletionTimestamp`` is
    set, then DELETED with the object's last state under a new resourceVersion, also for what the garbage
    collector deletes."""
    owner = kube.create("v1/configmaps", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}})
    since = owner["metadata"]["resourceVersion"]
    with watch(kube, "v1/configmaps", since) as stream:
        kube.create("v1/configmaps", {"metadata": {"name": "held", "finalizers": ["x/y"]}})
        kube.create("v1/configmaps", {"metadata": {"name": "dependent", "ownerReferences": owned_by(owner)}})
        assert [next_event(stream)["type"] for _ in range(2)] == ["ADDED", "ADDED"]
        kube.delete("v1/configmaps", "held")
        marked = next_event(stream)
        assert marked["type"] == "MODIFIED" and marked["object"]["metadata"]["deletionTimestamp"]
        kube.patch("v1/configmaps", "held", {"metadata": {"finalizers": []}})
        released, deleted = next_event(stream), next_event(stream)
        assert (released["type"], deleted["type"]) == ("MODIFIED", "DELETED")
        assert deleted["object"]["metadata"]["name"] == "held" and deleted["object"]["metadata"]["finalizers"] == []
        assert int(deleted["object"]["metadata"]["resourceVersion"]) > int(
            released["object"]["metadata"]["resourceVersion"]
        )
        kube.delete("v1/configmaps", "owner")
        events = [next_event(stream) for _ in range(2)]
        assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
            ("DELETED", "owner"),
            ("DELETED", "dependent"),
        ]


def test_an_expired_watch_history_is_a_410_gone_and_what_vanished_meanwhile_sends_no_deleted(kube: RunningEmulator):
    """kubernetes/apiserver ``pkg/storage/cacher/cacher.go`` and ``watch_cache_history.go``: when the watch cache
    re-initialises, ``terminateAllWatchers`` ends every open watch without an event; a watch from a
    resourceVersion older than the cache's history gets no HTTP error but one ERROR event carrying the Status of
    apimachinery's ``errors.NewResourceExpired`` (``pkg/api/errors/errors.go``: code 410, reason ``Expired``,
    "too old resource version: N (M)"; ``GetIntervalLocked``, ``newErrWatcher``), and the stream ends. The
    client must list again (kopf: ``kopf/_cogs/clients/watching.py``, ``continuous_watch`` returns on an ERROR
    of code 410 and ``infinite_watch`` lists again): an object deleted while no watch could see it is simply
    missing from that list, and no DELETED is ever sent for it."""
    kept = kube.create("v1/configmaps", {"metadata": {"name": "kept"}})
    kube.create("v1/configmaps", {"metadata": {"name": "vanishing"}})
    since = kept["metadata"]["resourceVersion"]
    with watch(kube, "v1/configmaps", since) as stream:
        assert next_event(stream)["object"]["metadata"]["name"] == "vanishing"
        kube.expire_watches()
        assert stream.readline() == b"", "an open watch ends when the watch cache's history is lost"
    with watch(kube, "v1/configmaps", since) as stream:
        gone = next_event(stream)
        assert stream.readline() == b"", "the 410 ends the stream"
    assert gone["type"] == "ERROR"
    assert {key: gone["object"][key] for key in ("kind", "status", "reason", "code")} == {
        "kind": "Status",
        "status": "Failure",
        "reason": "Expired",
        "code": 410,
    }
    assert gone["object"]["message"].startswith(f"too old resource version: {since} (")

    listed = kube.call("GET", resource_path("v1/configmaps", "default"))
    relisted = listed["metadata"]["resourceVersion"]
    with kube.watches_interrupted():
        kube.delete("v1/configmaps", "vanishing")
        kube.create("v1/configmaps", {"metadata": {"name": "newcomer"}})
    with watch(kube, "v1/configmaps", relisted) as stream:
        assert next_event(stream)["object"]["code"] == 410, "a version from before the interruption is gone too"
    after = kube.call("GET", resource_path("v1/configmaps", "default"))
    assert sorted(item["metadata"]["name"] for item in after["items"]) == ["kept", "newcomer"]
    with watch(kube, "v1/configmaps", after["metadata"]["resourceVersion"]) as stream:
        kube.patch("v1/configmaps", "kept", {"data": {"a": "b"}})
        event = next_event(stream)  # the first event after the new list: nothing about the vanished object
    assert (event["type"], event["object"]["metadata"]["name"]) == ("MODIFIED", "kept")


# ---------------------------------------------------------------- 6. RBAC


def test_the_operators_requests_are_authorised_by_the_charts_rbac() -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/rbac/ and
    https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb : the
    operator's ServiceAccount may do what the chart's (Cluster)Role grants it, through its binding, and nothing
    else: a verb the rules lack is a 403 Forbidden worded as the API server words it; discovery is open to any
    authenticated user; an unknown token is a 401. A server-side apply that would create its object is
    authorised as a create as well (the API server's patch handler: kubernetes/apiserver
    pkg/endpoints/handlers/patch.go)."""
    with serve_emulator() as kube:
        operator = KubeHTTP(kube.url, token=OPERATOR_TOKEN)
        user = operator_identity().user
        kube.create(CR, consumer("c"))
        assert [item["metadata"]["name"] for item in operator.list(CR)] == ["c"]  # list: granted
        assert operator.patch(CR, "c", {"status": {"phase": "ok"}}, subresource="status")["status"] == {"phase": "ok"}
        body = refused(lambda: operator.delete(CR, "c"), 403)  # delete: not granted
        assert body["reason"] == "Forbidden"
        assert body["message"] == (
            f'orderedconsumers.keyorder.dev "c" is forbidden: User "{user}" cannot delete resource '
            '"orderedconsumers" in API group "keyorder.dev" in the namespace "default"'
        )
        current = kube.get(CR, "c")
        assert current is not None
        refused(lambda: put(operator, CR, "c", current, "status"), 403)  # update of the status: only patch is granted
        refused(lambda: operator.get("v1/configmaps", "x"), 403)
        assert "APIVersions" in json.dumps(operator.call("GET", "/api"))
        refused(lambda: KubeHTTP(kube.url, token="stolen").list(CR), 401)

        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": 1}}
        if chart_grants("create", "apps", "deployments"):
            assert apply(operator, "apps/v1/deployments", "d", deployment)["metadata"]["name"] == "d"
        else:
            body = refused(lambda: apply(operator, "apps/v1/deployments", "d", deployment), 403)
            assert f'User "{user}" cannot create resource "deployments"' in body["message"]
            kube.create("apps/v1/deployments", deployment)  # once it exists, the apply is a patch: granted
            assert apply(operator, "apps/v1/deployments", "d", deployment)["spec"]["replicas"] == 1
        verbs = [(entry["method"], entry["verb"], entry["resource"]) for entry in kube.refused()]
        assert ("DELETE", "delete", "orderedconsumers") in verbs and (
            "PUT",
            "update",
            "orderedconsumers/status",
        ) in verbs


def chart_grants(verb: str, group: str, resource: str) -> bool:
    attributes = Attributes(verb, "/", True, group, resource, "", "default", "d")
    return chart_authorizer().allows(operator_identity(), attributes)


def test_rbac_rules_match_as_kubernetes_matches_them() -> None:
    """https://kubernetes.io/docs/reference/access-authn-authz/rbac/#referring-to-resources : a rule names
    subresources as ``resource/subresource``, may narrow itself to ``resourceNames``, and a RoleBinding grants
    only in its namespace; a ClusterRole with an aggregationRule collects the rules of the roles it selects."""
    sa = Identity.service_account("ops", "bot")
    documents = [
        {
            "kind": "ClusterRole",
            "metadata": {"name": "scaler"},
            "rules": [
                {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["patch"]},
                {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["token"], "verbs": ["get"]},
            ],
        },
        {
            "kind": "ClusterRole",
            "metadata": {"name": "all"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "y"}}]},
        },
        {
            "kind": "ClusterRole",
            "metadata": {"name": "part", "labels": {"agg": "y"}},
            "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}],
        },
        {
            "kind": "RoleBinding",
            "metadata": {"name": "b", "namespace": "team-a"},
            "roleRef": {"kind": "ClusterRole", "name": "scaler"},
            "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "ops"}],
        },
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "c"},
            "roleRef": {"kind": "ClusterRole", "name": "all"},
            "subjects": [{"kind": "Group", "name": "system:serviceaccounts:ops"}],
        },
    ]
    rbac = Authorizer(documents)

    def allows(verb: str, group: str, resource: str, sub: str = "", namespace: str = "team-a", name: str = "n") -> bool:
        return rbac.allows(sa, Attributes(verb, "/", True, group, resource, sub, namespace, name))

    assert allows("patch", "apps", "deployments", "scale")
    assert not allows("patch", "apps", "deployments")  # the subresource's grant is not the resource's
    assert not allows("patch", "apps", "deployments", "scale", namespace="team-b")  # a RoleBinding's namespace only
    assert allows("get", "", "secrets", name="token") and not allows("get", "", "secrets", name="other")
    assert allows("create", "batch", "jobs", namespace="anywhere")  # aggregated, bound to the SA's group


def walk(node: dict[str, Any]) -> Any:
    yield node
    for child in (node.get("properties") or {}).values():
        yield from walk(child)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from walk(node[key])


# ---------------------------------------------------------------- terminating pods and the controllers' status


def scheduled_pod(name: str, **spec: Any) -> dict[str, Any]:
    """A pod bound to a node (``spec.nodeName``, as the scheduler binds it)."""
    return {
        "metadata": {"name": name, "labels": {"app": "x"}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x"}], **spec},
    }


def seconds_from_now(timestamp: str) -> float:
    moment = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    return (moment - datetime.datetime.now(tz=datetime.UTC)).total_seconds()


def test_a_running_pod_is_deleted_gracefully_and_stays_terminating_until_deleted_with_period_0(kube: RunningEmulator):
    """kubernetes/kubernetes ``pkg/registry/core/pod/strategy.go`` (``CheckGracefulDelete``) and kubernetes/apiserver
    ``pkg/registry/rest/delete.go`` (``BeforeDelete``), ``pkg/registry/generic/registry/store.go``
    (``Store.Delete``): deleting a pod a node runs sets ``deletionTimestamp`` to now plus its
    ``terminationGracePeriodSeconds`` and ``deletionGracePeriodSeconds`` to that period, bumps the generation,
    and keeps the pod (a MODIFIED event); a later deletion may only shorten the period (moving the timestamp
    back); the kubelet's deletion with period 0 (``pkg/kubelet/status/status_manager.go``) removes it."""
    created = kube.create("v1/pods", scheduled_pod("web-0", terminationGracePeriodSeconds=45))
    with watch(kube, "v1/pods", created["metadata"]["resourceVersion"]) as stream:
        marked = kube.delete("v1/pods", "web-0")
        meta = marked["metadata"]
        assert meta["deletionGracePeriodSeconds"] == 45 and 40 <= seconds_from_now(meta["deletionTimestamp"]) <= 46
        assert meta["generation"] == created["metadata"]["generation"] + 1
        event = next_event(stream)
        assert event["type"] == "MODIFIED" and event["object"]["metadata"]["deletionTimestamp"]
        assert kube.get("v1/pods", "web-0") == marked, "a terminating pod is still there"

        longer = kube.call("DELETE", resource_path("v1/pods", "default", "web-0"), {"gracePeriodSeconds": 60})
        assert longer == marked, "a longer period changes nothing"
        shorter = kube.call("DELETE", resource_path("v1/pods", "default", "web-0"), {"gracePeriodSeconds": 10})
        assert shorter["metadata"]["deletionGracePeriodSeconds"] == 10
        assert 5 <= seconds_from_now(shorter["metadata"]["deletionTimestamp"]) <= 11
        assert next_event(stream)["type"] == "MODIFIED"

        final = {"gracePeriodSeconds": 0, "preconditions": {"uid": created["metadata"]["uid"]}}
        kube.call("DELETE", resource_path("v1/pods", "default", "web-0"), final)
        assert kube.get("v1/pods", "web-0") is None
        assert [next_event(stream)["type"] for _ in range(2)] == ["MODIFIED", "DELETED"]


def test_a_pod_no_node_runs_or_a_finished_one_is_removed_at_once_and_the_default_period_is_30s(kube: RunningEmulator):
    """kubernetes/kubernetes ``pkg/registry/core/pod/strategy.go`` (``CheckGracefulDelete``): the period is 0 for a
    pod without ``spec.nodeName`` and for one in phase Succeeded or Failed, and the one asked for (the query's
    ``gracePeriodSeconds`` when the DELETE has no body: kubernetes/apiserver ``pkg/endpoints/handlers/delete.go``)
    wins over the pod's; ``pkg/apis/core/v1/defaults.go`` defaults ``terminationGracePeriodSeconds`` to 30."""
    kube.create("v1/pods", {"metadata": {"name": "pending"}, "spec": {"containers": [{"name": "c", "image": "x"}]}})
    kube.delete("v1/pods", "pending")
    assert kube.get("v1/pods", "pending") is None

    kube.create("v1/pods", scheduled_pod("done"))
    kube.patch("v1/pods", "done", {"status": {"phase": "Succeeded"}}, subresource="status")
    kube.delete("v1/pods", "done")
    assert kube.get("v1/pods", "done") is None

    kube.create("v1/pods", scheduled_pod("defaulted"))
    assert kube.delete("v1/pods", "defaulted")["metadata"]["deletionGracePeriodSeconds"] == 30

    kube.create("v1/pods", scheduled_pod("forced", terminationGracePeriodSeconds=45))
    kube.call("DELETE", resource_path("v1/pods", "default", "forced") + "?gracePeriodSeconds=0")
    assert kube.get("v1/pods", "forced") is None


def standin_deployment(name: str, strategy: str, replicas: int = 2) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "strategy": {"type": strategy},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{"name": "c", "image": "x", "env": [{"name": "V", "value": "1"}]}],
                },
            },
        },
    }


def pods_of(kube: KubeHTTP, name: str) -> list[dict[str, Any]]:
    return [pod for pod in kube.list("v1/pods", "default") if pod["metadata"]["labels"].get("app") == name]


def until_observed(kube: KubeHTTP, name: str, predicate: Any, what: str) -> dict[str, Any]:
    """The Deployment's status once its controller has observed its current generation and ``predicate(status)``."""

    def probe() -> dict[str, Any] | None:
        deployment = kube.get("apps/v1/deployments", name) or {}
        status = deployment.get("status") or {}
        current = status.get("observedGeneration") == (deployment.get("metadata") or {}).get("generation")
        return status if current and predicate(status) else None

    return wait_for(probe, 10, what)


def test_the_standin_controllers_leave_terminating_pods_out_of_status_replicas_and_report_observed_generation(
    kube: RunningEmulator,
):
    """kubernetes/kubernetes ``pkg/controller/replicaset/replica_set_utils.go`` (``calculateStatus``: ``Replicas`` is
    the number of active pods, ``controller.FilterActivePods``), ``pkg/controller/controller_utils.go``
    (``IsPodActive``: no ``deletionTimestamp``, not Succeeded or Failed) and ``pkg/controller/deployment/sync.go``
    (``calculateStatus``: ``ObservedGeneration`` is the Deployment's generation, ``UpdatedReplicas`` the new
    ReplicaSet's replicas): a scaled-down pod still terminating is listed, yet ``status.replicas`` leaves it
    out; zero counts are omitted (``omitempty`` in k8s.io/api ``apps/v1`` ``DeploymentStatus``), and
    ``terminatingReplicas`` is absent without the ``DeploymentReplicaSetTerminatingReplicas`` feature."""
    kube.create("apps/v1/deployments", standin_deployment("web", "RollingUpdate"))
    with LocalKubelet(kube, "web", processes=False, period=0.05) as kubelet:
        kubelet.hold_terminating.set()
        status = until_observed(kube, "web", lambda s: s.get("readyReplicas") == 2, "2 ready pods")
        assert (status["replicas"], status["updatedReplicas"]) == (2, 2) and "terminatingReplicas" not in status
        assert all(
            pod["spec"]["nodeName"] and pod["metadata"]["labels"]["pod-template-hash"] for pod in pods_of(kube, "web")
        )

        kube.patch("apps/v1/deployments", "web", {"spec": {"replicas": 1}})
        status = until_observed(kube, "web", lambda s: s.get("replicas") == 1, "status.replicas 1")
        terminating = [pod for pod in pods_of(kube, "web") if pod["metadata"].get("deletionTimestamp")]
        assert len(pods_of(kube, "web")) == 2 and len(terminating) == 1, "the scaled-down pod is still there"
        assert status["updatedReplicas"] == 1 and "terminatingReplicas" not in status

        kube.patch("apps/v1/deployments", "web", {"spec": {"replicas": 0}})
        status = until_observed(kube, "web", lambda s: "replicas" not in s, "no replicas")
        assert status == {"observedGeneration": status["observedGeneration"]}, "zero counts are left out"
        kubelet.hold_terminating.clear()
        wait_for(lambda: not pods_of(kube, "web"), 10, "the kubelet to delete the terminated pods")


@pytest.mark.parametrize("strategy", ["Recreate", "RollingUpdate"])
def test_recreate_starts_no_new_pod_while_an_old_one_terminates_a_rolling_update_does(
    kube: RunningEmulator, strategy: str
):
    """kubernetes/kubernetes ``pkg/controller/deployment/recreate.go`` (``rolloutRecreate``: the old ReplicaSets are
    scaled to zero, and while ``oldPodsRunning``, any old pod not Succeeded or Failed, terminating ones included,
    no new pod is made) and ``pkg/controller/replicaset/replica_set_utils.go`` (``calculateStatus``): after a
    template change the Deployment reports 0 replicas and 0 updated while the old pods terminate; a rolling update
    starts the new pods at once, beside the terminating old ones. ``terminatingReplicas`` (the feature
    ``DeploymentReplicaSetTerminatingReplicas``, ``GetTerminatingReplicaCountForReplicaSets`` in
    ``pkg/controller/deployment/util/deployment_util.go``) counts them."""
    kube.create("apps/v1/deployments", standin_deployment("web", strategy))
    with LocalKubelet(kube, "web", processes=False, period=0.05, terminating_replicas=True) as kubelet:
        until_observed(kube, "web", lambda s: s.get("updatedReplicas") == 2, "2 pods of the first template")
        first = {pod["metadata"]["labels"]["pod-template-hash"] for pod in pods_of(kube, "web")}
        kubelet.hold_terminating.set()
        env = [{"name": "V", "value": "2"}]
        kube.patch(
            "apps/v1/deployments",
            "web",
            {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x", "env": env}]}}}},
        )
        status = until_observed(kube, "web", lambda s: s.get("terminatingReplicas") == 2, "2 terminating")
        old = [pod for pod in pods_of(kube, "web") if pod["metadata"]["labels"]["pod-template-hash"] in first]
        assert len(old) == 2 and all(pod["metadata"].get("deletionTimestamp") for pod in old)
        if strategy == "Recreate":
            assert "replicas" not in status and "updatedReplicas" not in status, status
            assert len(pods_of(kube, "web")) == 2, "a new pod started while old ones terminated"
        else:
            status = until_observed(kube, "web", lambda s: s.get("updatedReplicas") == 2, "new pods")
            assert status["replicas"] == 2 and status["terminatingReplicas"] == 2
            assert len(pods_of(kube, "web")) == 4, "the new pods run beside the terminating old ones"
        kubelet.hold_terminating.clear()
        status = until_observed(kube, "web", lambda s: s.get("terminatingReplicas") == 0, "the old pods gone")
        status = until_observed(kube, "web", lambda s: s.get("updatedReplicas") == 2, "the rollout")
        assert status["replicas"] == 2 and status["terminatingReplicas"] == 0
        assert not first & {pod["metadata"]["labels"]["pod-template-hash"] for pod in pods_of(kube, "web")}


def test_kopf_s_peering_objects_are_served_with_their_crds_and_a_missing_one_is_a_404_naming_it() -> None:
    """With kopf's peering CRDs installed, a missing peering object's GET and PATCH (kopf's keep-alive) answer 404
    NotFound naming the object: kubernetes/apiserver ``pkg/registry/generic/registry/store.go`` (``Get`` through
    ``pkg/storage/errors/storage.go`` ``InterpretGetError``; ``Update`` returns ``NewNotFound`` since a custom
    resource does not allow create-on-update: kubernetes/apiextensions-apiserver
    ``pkg/registry/customresource/strategy.go``), worded by k8s.io/apimachinery ``NewNotFound``:
    ``<plural>.<group> "<name>" not found`` with ``details`` name, group, kind. Without the CRDs the same GET is a
    404 naming nothing: apiextensions-apiserver's ``crdHandler.ServeHTTP`` (``pkg/apiserver/customresource_handler.go``)
    hands a resource no CRD defines to its delegate, ending in kubernetes/apiserver
    ``pkg/util/notfoundhandler/not_found_handler.go`` (``http.NotFound``). The CRDs have no status subresource, so
    kopf's merge-patch of ``status`` is stored through the object itself. The operator tells "create the object"
    from "install the CRDs" by exactly this difference (``keyorder_operator.peering.interpret``)."""
    from tests.operator.emulator import register_peering_crds

    peerings = "kopf.dev/v1/clusterkopfpeerings"
    path = resource_path(peerings, None, "keyorder-operator")
    with serve_emulator(rbac=False) as bare:
        unserved = refused(lambda: bare.call("GET", path), 404)
        assert not (unserved.get("details") or {}).get("name"), unserved

    with serve_emulator(lambda emulator: register_peering_crds(emulator), rbac=False) as kube:
        for call in (lambda: kube.call("GET", path), lambda: kube.patch(peerings, "keyorder-operator", {}, None)):
            missing = refused(call, 404)
            assert missing["reason"] == "NotFound"
            assert missing["message"] == 'clusterkopfpeerings.kopf.dev "keyorder-operator" not found'
            assert missing["details"] == {
                "name": "keyorder-operator",
                "group": "kopf.dev",
                "kind": "clusterkopfpeerings",
            }
        in_namespace = resource_path("kopf.dev/v1/kopfpeerings", "default", "keyorder-operator")
        namespaced = refused(lambda: kube.call("GET", in_namespace), 404)
        assert namespaced["message"] == 'kopfpeerings.kopf.dev "keyorder-operator" not found'

        peering = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "keyorder-operator"}}
        kube.create(peerings, peering, namespace=None)
        keepalive = {"status": {"pod-a": {"priority": 7, "lifetime": 60, "lastseen": "2026-01-01T00:00:00+00:00"}}}
        patched = kube.patch(peerings, "keyorder-operator", keepalive, None)
        assert patched["status"] == keepalive["status"]
        assert kube.get(peerings, "keyorder-operator", None)["status"] == keepalive["status"]


# ---------------------------------------------------------------- list-map keys: duplicates refused


def deployment(name: str, env: list[dict[str, Any]]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "consumer", "image": "registry.example/x:1", "env": env}]},
            },
        },
    }


def test_a_list_map_key_given_twice_is_refused_on_create_and_update_but_not_when_the_old_object_had_one(
    kube: RunningEmulator,
):
    """kubernetes/apiextensions-apiserver ``pkg/apiserver/schema/listtype/validation.go``
    (``ValidateListSetsAndMaps``, ``validateListMap``): an item of an ``x-kubernetes-list-type: map`` list whose
    key an earlier item has is a ``field.Duplicate`` at the later item's index, its value the key fields (one
    key: ``{key: value}``; several: the ones present). ``pkg/registry/customresource/strategy.go``: checked on
    create (``Validate``) and update (``ValidateUpdate``), an update only if the old object had no such error
    (ratcheting). The value is printed by k8s.io/apimachinery ``pkg/util/validation/field/errors.go``
    (``ErrorBody``; ``%#v`` up to Kubernetes 1.33, JSON from 1.34)."""
    body = refused(
        lambda: kube.create(
            CR,
            consumer(
                "twice",
                handler={**SPEC["handler"], "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
            ),
        ),
        422,
    )
    assert body["reason"] == "Invalid"
    assert body["message"] == (
        'OrderedConsumer.keyorder.dev "twice" is invalid: '
        'spec.handler.env[1]: Duplicate value: map[string]interface {}{"name":"A"}'
    )
    assert kube.get(CR, "twice") is None
    spread = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
    kube.create(CR, consumer("spread", template={"spec": {"topologySpreadConstraints": [spread]}}))
    patch = {"spec": {"template": {"spec": {"topologySpreadConstraints": [spread, {**spread, "maxSkew": 2}]}}}}
    body = refused(lambda: kube.patch(CR, "spread", patch), 422)
    assert (
        "spec.template.spec.topologySpreadConstraints[1]: Duplicate value: "
        'map[string]interface {}{"topologyKey":"zone", "whenUnsatisfiable":"DoNotSchedule"}'
    ) in body["message"]
    kube.patch(
        CR, "spread", {"spec": {"template": {"spec": {"topologySpreadConstraints": [{**spread, "maxSkew": 3}]}}}}
    )

    from tests.operator.crd_validation import CustomResourceSchema

    schema = CustomResourceSchema.of(yaml.safe_load(CRD_FILE.read_text()))
    stored = consumer("old", handler={**SPEC["handler"], "env": [{"name": "A"}, {"name": "A"}]})
    stored["metadata"]["namespace"] = "default"
    updated = copy.deepcopy(stored)
    updated["spec"]["ordering"] = "partition"
    assert schema.admit(updated, old=stored)["spec"]["ordering"] == "partition", "stored under an older CRD"


def test_an_applied_configuration_with_a_repeated_key_is_refused_with_a_500_while_a_live_duplicate_is_not(
    kube: RunningEmulator,
):
    """k8s.io/apimachinery ``pkg/util/managedfields/internal/structuredmerge.go`` (``Apply``): the applied
    configuration is typed without ``typed.AllowDuplicates`` ("Don't allow duplicates in the applied object"),
    the live object with it; kubernetes-sigs/structured-merge-diff ``typed/validate.go`` (``visitListItems``:
    "duplicate entries for key %v") and ``fieldpath/element.go`` (``PathElement.String``) word the error, and
    kube-openapi ``pkg/schemaconv/smd.go`` (``getListElementRelationship``) makes a ``merge`` patch strategy's
    merge key (a container's env by ``name``) a list-map key. The manager's plain error ("failed to create
    typed patch object (%v): %v", ``objectGVKNN``) is a 500 without a reason: kubernetes/apiserver
    ``pkg/endpoints/handlers/responsewriters/status.go`` (``ErrorToAPIStatus``). A custom resource is typed by
    its CRD's schema, its list-map keys included."""
    twice = [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "A", "value": "3"}]
    body = refused(lambda: apply(kube, "apps/v1/deployments", "orders", deployment("orders", twice)), 500)
    assert body["message"] == (
        "failed to create typed patch object (default/orders; apps/v1, Kind=Deployment): "
        '.spec.template.spec.containers[name="consumer"].env: duplicate entries for key [name="A"]'
    )
    assert not body.get("reason")
    assert kube.get("apps/v1/deployments", "orders") is None
    ports = [{"containerPort": 8080}, {"containerPort": 8080, "protocol": "TCP"}]
    both = deployment("orders", twice)
    both["spec"]["template"]["spec"]["containers"][0]["ports"] = ports
    body = refused(lambda: apply(kube, "apps/v1/deployments", "orders", both), 500)
    assert body["message"].endswith(
        "errors:\n"
        '  .spec.template.spec.containers[name="consumer"].env: duplicate entries for key [name="A"]\n'
        '  .spec.template.spec.containers[name="consumer"].ports: duplicate entries for key '
        '[containerPort=8080,protocol="TCP"]'
    )

    kube.create("apps/v1/deployments", deployment("legacy", twice))  # a create keeps duplicates
    apply(kube, "apps/v1/deployments", "legacy", deployment("legacy", [{"name": "A", "value": "9"}]))

    custom = consumer("typed", handler={**SPEC["handler"], "env": [{"name": "A"}, {"name": "A"}]})
    body = refused(lambda: apply(kube, CR, "typed", custom), 500)
    assert body["message"] == (
        "failed to create typed patch object (/typed; keyorder.dev/v1alpha1, Kind=OrderedConsumer): "
        '.spec.handler.env: duplicate entries for key [name="A"]'
    )


# ---------------------------------------------------------------- ownership taken by updates; the scale subresource

DEPLOYMENTS = "apps/v1/deployments"


def scalable(name: str, replicas: int = 2) -> dict[str, Any]:
    labels = {"app": name, "tier": "a"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {
                "matchLabels": {"app": name},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}],
            },
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "img:1"}]}},
        },
    }


def apply_as(kube: KubeHTTP, manager: str, resource: str, body: dict[str, Any], force: bool = False) -> Any:
    path = resource_path(resource, "default", body["metadata"]["name"]) + f"?fieldManager={manager}"
    return kube.call("PATCH", path + ("&force=true" if force else ""), body, content_type=APPLY_PATCH)


def entries_of(obj: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """``managedFields`` by (manager, operation, subresource)."""
    return {
        (entry["manager"], entry["operation"], entry.get("subresource", "")): entry
        for entry in obj["metadata"].get("managedFields") or []
    }


def owns(entry: dict[str, Any] | None, *path: str) -> bool:
    node = (entry or {}).get("fieldsV1") or {}
    for name in path:
        if f"f:{name}" not in node:
            return False
        node = node[f"f:{name}"]
    return True


def test_creates_updates_and_patches_take_the_fields_they_change_and_a_later_apply_conflicts_with_them(
    kube: RunningEmulator,
):
    """Every write that is not an apply records its field manager's ownership (``operation: Update``): the
    manager is ``?fieldManager=``, else the User-Agent up to its first ``/`` (kubernetes/apiserver
    ``pkg/endpoints/handlers/create.go`` ``managerOrUserAgent``/``prefixFromUserAgent``, called from
    ``create.go``, ``update.go`` and ``patch.go`` through ``FieldManager.UpdateNoErrors``); it gains the fields it
    added or changed and every other manager, appliers included, loses them (kubernetes-sigs/structured-merge-diff
    ``merge/update.go``, ``Updater.Update`` and ``update``); its entry is keyed by name, API version and
    subresource (k8s.io/apimachinery ``pkg/util/managedfields/internal/buildmanagerinfo.go``), dated when it took
    fields (``internal/managedfieldsupdater.go``), and never holds name, uid, resourceVersion... (``stripmeta.go``).
    An apply that changes such a field without force is a 409 naming the updater as ``internal/conflict.go``
    ``printManager`` does; the same value is shared without conflict; a forced apply takes the field back.
    An apply carrying a stale ``metadata.resourceVersion`` is refused like any update with one
    (kubernetes/apiserver ``pkg/registry/generic/registry/store.go``, ``Store.Update``)."""
    created = kube.call("POST", resource_path(DEPLOYMENTS, "default") + "?fieldManager=creator", scalable("web"))
    [entry] = created["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"], entry["apiVersion"]) == ("creator", "Update", "apps/v1")
    assert entry["time"] and entry["fieldsType"] == "FieldsV1" and "subresource" not in entry
    assert owns(entry, "spec", "replicas") and owns(entry, "spec", "template", "spec", "containers")
    assert not owns(entry, "metadata", "name") and not owns(entry, "metadata", "uid"), "stripped: nobody owns them"

    patched = kube.patch(DEPLOYMENTS, "web", {"metadata": {"labels": {"team": "a"}}, "spec": {"replicas": 3}})
    entries = entries_of(patched)
    patcher = entries[("Python-urllib", "Update", "")]  # urllib's User-Agent is "Python-urllib/3.11"
    assert owns(patcher, "spec", "replicas") and owns(patcher, "metadata", "labels", "team")
    assert not owns(patcher, "spec", "template"), "only what the patch changed"
    assert not owns(entries[("creator", "Update", "")], "spec", "replicas"), "taken from the creator"
    assert owns(entries[("creator", "Update", "")], "spec", "template", "spec", "containers")

    request = urllib.request.Request(
        kube.url + resource_path(DEPLOYMENTS, "default", "web"),
        data=json.dumps({"metadata": {"labels": {"team": "b"}}}).encode(),
        method="PATCH",
        headers={"Content-Type": "application/merge-patch+json", "User-Agent": "kubectl-edit/v1.31.0 (linux/amd64)"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        edited = json.loads(response.read())
    assert owns(entries_of(edited)[("kubectl-edit", "Update", "")], "metadata", "labels", "team")
    assert not owns(entries_of(edited)[("Python-urllib", "Update", "")], "metadata", "labels")

    replicas = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"replicas": 5}}
    body = refused(lambda: apply_as(kube, "applier", DEPLOYMENTS, replicas), 409)
    assert body["reason"] == "Conflict"
    assert (
        body["message"] == 'Apply failed with 1 conflict: conflict with "Python-urllib" using apps/v1: .spec.replicas'
    )
    shared = apply_as(kube, "applier", DEPLOYMENTS, {**replicas, "spec": {"replicas": 3}})  # the same value
    assert owns(entries_of(shared)[("applier", "Apply", "")], "spec", "replicas")
    assert owns(entries_of(shared)[("Python-urllib", "Update", "")], "spec", "replicas"), "shared, not taken"
    forced = apply_as(kube, "applier", DEPLOYMENTS, replicas, force=True)
    assert forced["spec"]["replicas"] == 5
    assert not owns(entries_of(forced).get(("Python-urllib", "Update", "")), "spec", "replicas"), "taken back"

    status = kube.patch(DEPLOYMENTS, "web", {"status": {"replicas": 1}}, subresource="status")
    assert owns(entries_of(status)[("Python-urllib", "Update", "status")], "status", "replicas")

    stale = {**replicas, "metadata": {"name": "web", "resourceVersion": created["metadata"]["resourceVersion"]}}
    body = refused(lambda: apply_as(kube, "applier", DEPLOYMENTS, {**stale, "spec": {"replicas": 6}}, force=True), 409)
    assert "the object has been modified" in body["message"]
    assert kube.get(DEPLOYMENTS, "web")["spec"]["replicas"] == 5


def scale_path(resource: str, name: str) -> str:
    return resource_path(resource, "default", name, "scale")


def test_the_scale_subresource_of_a_deployment_reads_and_writes_spec_replicas_and_its_writer_owns_them(
    kube: RunningEmulator,
):
    """``deployments/scale`` as kubernetes/kubernetes ``pkg/registry/apps/deployment/storage/storage.go`` serves
    it (``ScaleREST``, ``scaleFromDeployment``, ``scaleUpdatedObjectInfo``): an ``autoscaling/v1`` Scale with the
    object's name, namespace, uid, resourceVersion and creationTimestamp, ``spec.replicas`` (omitempty: 0 is
    left out), ``status.replicas`` and ``status.selector`` (``LabelSelectorAsSelector(...).String()``); a write
    (PUT, or a patch of the Scale: kubectl scale's merge patch) moves the replicas to the Deployment, a set
    ``resourceVersion`` a precondition, ``ValidateScale`` refusing a negative count. Its writer owns
    ``spec.replicas`` from then on, through an Update entry with ``subresource: scale`` and no time
    (k8s.io/apimachinery ``pkg/util/managedfields/scalehandler.go``, ``ToParent``), so the applier who had them
    conflicts with it (a 409 unless forced). A resource without the subresource answers 404."""
    applied = apply_as(kube, "objects", DEPLOYMENTS, scalable("web"))
    scale = kube.call("GET", scale_path(DEPLOYMENTS, "web"))
    meta = applied["metadata"]
    assert scale == {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {key: meta[key] for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")},
        "spec": {"replicas": 2},
        "status": {"replicas": 0, "selector": "app=web,tier in (a,b)"},
    }

    scaled = kube.patch(DEPLOYMENTS, "web", {"spec": {"replicas": 3}}, subresource="scale")  # kubectl scale
    assert scaled["kind"] == "Scale" and scaled["spec"] == {"replicas": 3}
    stored = kube.get(DEPLOYMENTS, "web")
    assert stored["spec"]["replicas"] == 3 and stored["metadata"]["generation"] == 2
    assert stored["spec"]["template"] == applied["spec"]["template"], "only the replicas change"
    entries = entries_of(stored)
    scaler = entries[("Python-urllib", "Update", "scale")]
    assert owns(scaler, "spec", "replicas") and scaler["apiVersion"] == "apps/v1" and "time" not in scaler
    assert not owns(entries[("objects", "Apply", "")], "spec", "replicas"), "the scale write took it"

    hpa = resource_path(DEPLOYMENTS, "default", "web", "scale") + "?fieldManager=horizontal-pod-autoscaler"
    stale = {**scaled, "metadata": {**scaled["metadata"], "resourceVersion": meta["resourceVersion"]}}
    body = refused(lambda: kube.call("PUT", hpa, {**stale, "spec": {"replicas": 4}}), 409)
    assert "the object has been modified" in body["message"]
    assert kube.call("PUT", hpa, {**scaled, "spec": {"replicas": 4}})["spec"] == {"replicas": 4}
    entries = entries_of(kube.get(DEPLOYMENTS, "web"))
    assert owns(entries[("horizontal-pod-autoscaler", "Update", "scale")], "spec", "replicas")
    assert ("Python-urllib", "Update", "scale") not in entries, "an entry left with nothing goes"

    body = refused(lambda: kube.patch(DEPLOYMENTS, "web", {"spec": {"replicas": -1}}, subresource="scale"), 422)
    assert body["message"] == (
        'Scale.autoscaling "web" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0'
    )
    zero = kube.call(
        "PATCH",
        scale_path(DEPLOYMENTS, "web"),
        [{"op": "replace", "path": "/spec/replicas", "value": 0}],
        "application/json-patch+json",
    )
    assert zero["spec"] == {} and kube.get(DEPLOYMENTS, "web")["spec"]["replicas"] == 0
    assert ("horizontal-pod-autoscaler", "Update", "scale") not in entries_of(kube.get(DEPLOYMENTS, "web"))

    body = refused(lambda: apply_as(kube, "objects", DEPLOYMENTS, scalable("web")), 409)
    assert body["message"] == (
        'Apply failed with 1 conflict: conflict with "Python-urllib" with subresource "scale" using apps/v1: '
        ".spec.replicas"
    )
    taken = apply_as(kube, "objects", DEPLOYMENTS, scalable("web"), force=True)
    assert taken["spec"]["replicas"] == 2 and ("Python-urllib", "Update", "scale") not in entries_of(taken)

    kube.create("v1/services", {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})
    refused(lambda: kube.call("GET", scale_path("v1/services", "web")), 404)


WIDGETS = "example.com/v1/widgets"


def widget_crd(plural: str, scale: bool) -> dict[str, Any]:
    kind = plural.capitalize()[:-1]
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "properties": {
                            "replicas": {"type": "integer", "minimum": 0, "maximum": 10},
                            "size": {"type": "string"},
                        },
                    },
                    "status": {
                        "type": "object",
                        "properties": {"replicas": {"type": "integer"}, "selector": {"type": "string"}},
                    },
                },
            }
        },
        "subresources": {"status": {}},
    }
    if scale:
        version["subresources"]["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": kind, "listKind": f"{kind}List"},
            "versions": [version],
        },
    }


def test_the_scale_subresource_of_a_custom_resource_follows_its_crds_paths_and_changes_no_owner() -> None:
    """A custom resource's ``/scale`` as kubernetes/apiextensions-apiserver ``pkg/registry/customresource/etcd.go``
    serves it: ``ScaleREST.Get`` builds the Scale from ``specReplicasPath``, ``statusReplicasPath`` and
    ``labelSelectorPath`` (``scaleFromCustomResource``) and answers 500 when the spec replicas field is missing;
    ``scaleUpdatedObjectInfo.UpdatedObject`` sets the spec replicas field, which is then validated by the CRD's
    schema like any update, and a new generation is counted. Unlike a Deployment's, the write changes no owner:
    the scale scope's field manager (``pkg/apiserver/customresource_handler.go``) is built from the CRD's models,
    which have no ``autoscaling/v1`` Scale, so ``FieldManager.UpdateNoErrors`` (k8s.io/apimachinery
    ``pkg/util/managedfields/internal/fieldmanager.go``) keeps the live managedFields (kubernetes/kubernetes issues
    #116311 and #131892). A CRD without ``subresources.scale`` serves none. The OrderedConsumer's scale is
    ``spec.replicas.min`` (what ``kubectl scale okc`` sets) and ``status.observedReplicas``."""

    def with_widgets(emulator: Any) -> None:
        register_crd(emulator, widget_crd("widgets", scale=True))
        register_crd(emulator, widget_crd("gadgets", scale=False))

    with serve_emulator(with_widgets) as kube:
        created = kube.create(
            WIDGETS,
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": "s"}},
        )
        body = refused(lambda: kube.call("GET", scale_path(WIDGETS, "w")), 500)
        assert body["reason"] == "InternalError"
        assert 'the spec replicas field ".spec.replicas" does not exist' in body["message"]

        scaled = kube.patch(WIDGETS, "w", {"spec": {"replicas": 2}}, subresource="scale")
        assert scaled["spec"] == {"replicas": 2} and scaled["status"] == {"replicas": 0}
        stored = kube.get(WIDGETS, "w")
        assert stored["spec"] == {"size": "s", "replicas": 2} and stored["metadata"]["generation"] == 2
        assert stored["metadata"]["managedFields"] == created["metadata"]["managedFields"], "no owner changed"

        kube.patch(WIDGETS, "w", {"status": {"replicas": 1, "selector": "app=w"}}, subresource="status")
        scale = kube.call("GET", scale_path(WIDGETS, "w"))
        assert scale["status"] == {"replicas": 1, "selector": "app=w"} and scale["kind"] == "Scale"

        body = refused(lambda: kube.patch(WIDGETS, "w", {"spec": {"replicas": 11}}, subresource="scale"), 422)
        assert 'Widget.example.com "w" is invalid: spec.replicas: Invalid value: 11' in body["message"]
        stale = {**scale, "metadata": {**scale["metadata"], "resourceVersion": created["metadata"]["resourceVersion"]}}
        refused(lambda: kube.call("PUT", scale_path(WIDGETS, "w"), {**stale, "spec": {"replicas": 3}}), 409)
        assert kube.get(WIDGETS, "w")["spec"]["replicas"] == 2

        kube.create(
            "example.com/v1/gadgets", {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}}
        )
        refused(lambda: kube.call("GET", scale_path("example.com/v1/gadgets", "g")), 404)

        kube.create(CR, consumer("ledger"))
        kube.patch(CR, "ledger", {"status": {"observedReplicas": 1}}, subresource="status")
        okc = kube.patch(CR, "ledger", {"spec": {"replicas": 3}}, subresource="scale")  # kubectl scale okc ledger
        assert okc["spec"] == {"replicas": 3} and okc["status"] == {"replicas": 1}
        assert kube.get(CR, "ledger")["spec"]["replicas"]["min"] == 3


def test_a_deployment_whose_pod_template_labels_are_invalid_is_refused_with_422_at_spec_template_labels(
    kube: RunningEmulator,
):
    """kubernetes/kubernetes ``pkg/apis/apps/validation/validation.go`` (``ValidateDeploymentSpec`` ->
    ``ValidatePodTemplateSpecForReplicaSet``) -> ``pkg/apis/core/validation/validation.go``
    (``ValidatePodTemplateSpec``: ``unversionedvalidation.ValidateLabels(spec.Labels, fldPath.Child("labels"))``):
    every write of a Deployment, an apply included, is refused (422 Invalid) for a bad label key or value, the
    error at ``spec.template.labels`` (k8s.io/apimachinery ``pkg/apis/meta/v1/validation/validation.go``
    ``ValidateLabels``), worded by ``pkg/util/validation/validation.go`` (``IsValidLabelValue``,
    ``IsQualifiedName``, ``RegexError``; Kubernetes 1.29)."""
    bad = deployment("labelled", [])
    bad["spec"]["template"]["metadata"]["labels"]["team"] = "data platform"
    body = refused(lambda: apply(kube, "apps/v1/deployments", "labelled", bad), 422)
    assert body["reason"] == "Invalid"
    assert body["message"] == (
        'Deployment.apps "labelled" is invalid: spec.template.labels: Invalid value: "data platform": a valid label '
        "must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end "
        "with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation "
        "is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    )
    assert kube.get("apps/v1/deployments", "labelled") is None
    kube.create("apps/v1/deployments", deployment("labelled", []))
    key = deployment("labelled", [])
    key["spec"]["template"]["metadata"]["labels"]["example.com/a/b"] = "x"
    body = refused(lambda: kube.call("PUT", resource_path("apps/v1/deployments", "default", "labelled"), key), 422)
    message = body["message"]
    assert 'spec.template.labels: Invalid value: "example.com/a/b": a qualified name must consist of' in message
    patch = {"spec": {"template": {"metadata": {"labels": {"Team_": "ok"}}}}}
    body = refused(lambda: kube.patch("apps/v1/deployments", "labelled", patch), 422)
    assert 'spec.template.labels: Invalid value: "Team_": name part must consist of' in body["message"]


def test_a_list_comes_in_pages_with_a_continue_token_as_the_api_server_encodes_it(kube: RunningEmulator):
    """kubernetes/apiserver ``pkg/storage/continue.go`` (``EncodeContinue``, ``PrepareContinueToken``): with
    ``limit`` a list returns that many objects in key order and ``metadata.continue``, unpadded URL-safe base64
    of ``{"v": "meta.k8s.io/v1", "rv": <the first page's version>, "start": <last key + NUL>}``, plus
    ``remainingItemCount`` when no selector filters; the last page has no token. Every page reports the first
    page's resourceVersion. A token from before the history was compacted is a 410 Expired
    (``pkg/storage/etcd3/errors.go``, ``continueExpired``); kopf lists in such pages with
    ``settings.watching.chunk_size`` (``kopf/_cogs/clients/fetching.py``, ``fetch_objs``)."""
    for name in ("e", "c", "a", "d", "b"):
        kube.create("v1/configmaps", {"metadata": {"name": name, "labels": {"set": "x"}}})
    path = resource_path("v1/configmaps", "default")
    first = kube.call("GET", path + "?limit=2")
    assert [item["metadata"]["name"] for item in first["items"]] == ["a", "b"]
    token = first["metadata"]["continue"]
    assert "=" not in token
    decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    version = first["metadata"]["resourceVersion"]
    assert decoded == {"v": "meta.k8s.io/v1", "rv": int(version), "start": "b\x00"}
    assert first["metadata"]["remainingItemCount"] == 3
    kube.create("v1/configmaps", {"metadata": {"name": "f"}})  # a later write: the pages keep the first version
    second = kube.call("GET", path + f"?limit=2&continue={token}")
    assert [item["metadata"]["name"] for item in second["items"]] == ["c", "d"]
    assert second["metadata"]["resourceVersion"] == version
    third = kube.call("GET", path + f"?limit=3&continue={second['metadata']['continue']}")
    assert [item["metadata"]["name"] for item in third["items"]] == ["e", "f"]
    assert "continue" not in third["metadata"] and "remainingItemCount" not in third["metadata"]
    selected = kube.call("GET", path + "?limit=2&labelSelector=set%3Dx")
    assert "continue" in selected["metadata"] and "remainingItemCount" not in selected["metadata"]
    across = kube.call("GET", resource_path("v1/configmaps") + "?limit=1")
    assert json.loads(base64.urlsafe_b64decode(across["metadata"]["continue"] + "==="))["start"] == "default/a\x00"
    kube.expire_watches()
    expired = refused(lambda: kube.call("GET", path + f"?limit=2&continue={token}"), 410)
    assert expired["reason"] == "Expired" and "continue parameter is too old" in expired["message"]
    assert refused(lambda: kube.call("GET", path + "?continue=not-a-token"), 400)["reason"] == "BadRequest"


# ---------------------------------------------------------------- validating admission policies


def no_debug(obj: dict[str, Any], old: dict[str, Any] | None) -> str | None:
    """A policy's rule: no container of a Deployment sets ``DEBUG``."""
    containers = ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    if any(item.get("name") == "DEBUG" for container in containers for item in container.get("env") or []):
        return "DEBUG may not be set in this namespace"
    return None


def test_a_validating_admission_policy_refuses_what_its_rule_denies_as_the_api_server_words_it(
    kube: RunningEmulator,
):
    """kubernetes/apiserver ``pkg/admission/plugin/policy/validating/dispatcher.go`` (``Dispatch``): the first
    denial, ``ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>``, goes
    through ``admission.NewForbidden`` (``pkg/admission/errors.go``; k8s.io/apimachinery
    ``pkg/api/errors/errors.go`` ``NewForbidden``: ``deployments.apps "<name>" is forbidden: ...``, details with
    the group, the resource as kind, the name), then gets the validation's reason (``Invalid`` when it has none)
    with its code (``policy_decision.go`` ``reasonToCode``: 422; 403 for ``Forbidden``) and one cause with the
    message and no field. ``pkg/registry/generic/registry/store.go`` (``Create``, ``Update``): the kind's own
    validation runs first, and admission sees the object as it would be stored (an apply merged with the live
    object). A rule for ``deployments`` does not match ``deployments/scale``."""
    policy = ValidatingAdmissionPolicy("no-debug", "apps/v1/deployments", no_debug, binding="no-debug-here")
    assert kube.emulator is not None
    emulator = kube.emulator
    kube.call_in_loop(lambda: emulator.admission_policies.append(policy))
    kube.create("apps/v1/deployments", deployment("held", []))

    debug_env = [{"name": "DEBUG", "value": "1"}]
    debug = deployment("held", debug_env)
    body = refused(lambda: apply(kube, "apps/v1/deployments", "held", debug), 422)
    denied = (
        "ValidatingAdmissionPolicy 'no-debug' with binding 'no-debug-here' denied request: "
        "DEBUG may not be set in this namespace"
    )
    assert body["reason"] == "Invalid"
    assert body["message"] == f'deployments.apps "held" is forbidden: {denied}'
    assert body["details"] == {"name": "held", "group": "apps", "kind": "deployments", "causes": [{"message": denied}]}
    created = refused(lambda: kube.create("apps/v1/deployments", deployment("new", debug_env)), 422)
    assert created["message"].startswith('deployments.apps "new" is forbidden: ValidatingAdmissionPolicy')

    # the object as it would be stored: an apply of the replicas alone, onto a Deployment without DEBUG, passes
    replicas = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "held"}, "spec": {"replicas": 3}}
    apply(kube, "apps/v1/deployments", "held", replicas)
    assert kube.get("apps/v1/deployments", "held")["spec"]["replicas"] == 3
    kube.patch("apps/v1/deployments", "held", {"spec": {"replicas": 4}}, subresource="scale")  # not matched
    assert policy.denied == 2  # the apply and the create

    # the kind's own validation first
    labelled = deployment("labelled", debug_env)
    labelled["spec"]["template"]["metadata"]["labels"]["team"] = "data platform"
    body = refused(lambda: apply(kube, "apps/v1/deployments", "labelled", labelled), 422)
    assert body["message"].startswith('Deployment.apps "labelled" is invalid: spec.template.labels')
    assert policy.denied == 2

    policy.reason = "Forbidden"
    assert refused(lambda: apply(kube, "apps/v1/deployments", "held", debug), 403)["reason"] == "Forbidden"

    kube.call_in_loop(lambda: emulator.admission_policies.remove(policy))
    apply(kube, "apps/v1/deployments", "held", debug)  # the policy gone, the same apply passes
    assert kube.get("apps/v1/deployments", "held")["spec"]["template"]["spec"]["containers"][0]["env"] == debug_env
