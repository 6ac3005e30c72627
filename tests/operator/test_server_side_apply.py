"""The emulator's server-side apply, and the operator's apply layer (``Kube``) through it.

A client-side merge patch leaves removed env vars, ports and volumes behind (and an added port next to
the old one, which a real API server refuses): these tests fail for such an apply layer.

The subject here is apply's semantics, not the operator's permissions: ``Kube`` runs as an admin
(``api_client(..., token=None)``). The operator tests run it under the chart's RBAC.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from keyorder_operator.builders import build_deployment
from keyorder_operator.kube import FIELD_MANAGER, SCALE_FIELD_MANAGER, Kube
from keyorder_operator.objects import AppliedObjects, apply_owned_objects
from keyorder_operator.spec import parse_spec
from tests.operator import server_side_apply
from tests.operator.emulator import APPLY_PATCH
from tests.operator.harness import ApiError, api_client


def deployment(env: list[dict[str, Any]], port: int, volumes: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "c", "namespace": "default", "labels": {"app": "c"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "c"}},
            "template": {
                "metadata": {"labels": {"app": "c"}},
                "spec": {
                    "containers": [
                        {
                            "name": "consumer",
                            "image": "img:1",
                            "env": env,
                            "ports": [{"name": "http", "containerPort": port}],
                            "volumeMounts": [{"name": name, "mountPath": f"/{name}"} for name in volumes],
                        }
                    ],
                    "volumes": [{"name": name, "emptyDir": {}} for name in volumes],
                },
            },
        },
    }


def container(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]["containers"][0]


def test_removed_list_items_go_and_changed_keys_replace_the_old_item():
    first = deployment([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}], 8080, ["tmp", "cache"])
    live = server_side_apply.apply(None, None, first)
    second = deployment([{"name": "A", "value": "3"}], 9090, ["tmp"])
    result = server_side_apply.apply(live, first, second)
    assert container(result)["env"] == [{"name": "A", "value": "3"}]
    assert container(result)["ports"] == [{"name": "http", "containerPort": 9090}]
    assert [volume["name"] for volume in result["spec"]["template"]["spec"]["volumes"]] == ["tmp"]
    assert [mount["mountPath"] for mount in container(result)["volumeMounts"]] == ["/tmp"]


def test_what_another_writer_added_stays():
    first = deployment([{"name": "A", "value": "1"}], 8080, [])
    live = server_side_apply.apply(None, None, first)
    live["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "3"}
    container(live)["env"].append({"name": "INJECTED", "value": "by a webhook"})
    result = server_side_apply.apply(live, first, deployment([{"name": "A", "value": "2"}], 8080, []))
    assert result["metadata"]["annotations"] == {"deployment.kubernetes.io/revision": "3"}
    assert container(result)["env"] == [{"name": "A", "value": "2"}, {"name": "INJECTED", "value": "by a webhook"}]


def test_service_ports_are_keyed_by_port_and_protocol():
    def service(port: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "s", "namespace": "default"},
            "spec": {"ports": [{"name": "http-metrics", "port": port}]},
        }

    live = server_side_apply.apply(None, None, service(8080))
    assert server_side_apply.apply(live, service(8080), service(9090))["spec"]["ports"] == [
        {"name": "http-metrics", "port": 9090}
    ]


def test_merge_patch_turns_one_object_into_the_other():
    before = {"a": {"b": 1, "c": 2}, "d": [1, 2], "e": 1}
    after = {"a": {"b": 1}, "d": [1], "f": 2}
    patch = server_side_apply.merge_patch(before, after)
    assert patch == {"a": {"c": None}, "d": [1], "e": None, "f": 2}


def test_kube_apply_converges_through_the_emulator_and_keeps_other_writers_fields(kube):
    with api_client(kube.url, token=None) as client:
        operator = Kube(client)
        operator.apply(deployment([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}], 8080, ["tmp"]))
        kube.patch("apps/v1/deployments", "c", {"metadata": {"annotations": {"owner": "platform-team"}}})
        operator.scale("default", "c", 5)
        assert kube.get("apps/v1/deployments", "c")["spec"]["replicas"] == 5
        changed = deployment([{"name": "A", "value": "1"}], 9090, [])
        changed["spec"]["replicas"] = 5  # reconcile applies the current scale
        operator.apply(copy.deepcopy(changed))
    stored = kube.get("apps/v1/deployments", "c")
    assert container(stored)["env"] == [{"name": "A", "value": "1"}]
    assert container(stored)["ports"] == [{"name": "http", "containerPort": 9090}]
    assert stored["spec"]["template"]["spec"]["volumes"] == []
    assert stored["metadata"]["annotations"] == {"owner": "platform-team"}
    assert stored["spec"]["replicas"] == 5
    managers = kube.call_in_loop(
        lambda: kube.emulator.field_managers("apps/v1/deployments", "default", "c")  # type: ignore[union-attr]
    )
    assert managers == sorted([FIELD_MANAGER, SCALE_FIELD_MANAGER])


DEPLOYMENT_PATH = "/apis/apps/v1/namespaces/default/deployments/c"


def http_apply(kube, manager: str, body: dict[str, Any], force: bool) -> Any:
    query = f"?fieldManager={manager}" + ("&force=true" if force else "")
    return kube.call("PATCH", DEPLOYMENT_PATH + query, body, content_type=APPLY_PATCH)


def replicas_only(replicas: int) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "c"}, "spec": {"replicas": replicas}}


def test_field_ownership_conflicts_forced_takeover_shared_fields_and_managed_fields(kube):
    """As the Kubernetes docs specify server-side apply (kubernetes.io/docs/reference/using-api/server-side-apply):
    a manager that applies a different value to a field another manager owns gets 409 unless it forces;
    forcing moves the ownership; a field two managers applied with the same value is shared, and stays
    when one of them stops applying it; ``metadata.managedFields`` shows who owns what."""
    http_apply(kube, "objects", deployment([], 8080, []), force=False)  # creates it, replicas 2
    with pytest.raises(ApiError) as conflict:
        http_apply(kube, "scaler", replicas_only(3), force=False)
    assert conflict.value.status == 409
    assert '"objects": .spec.replicas' in str(conflict.value.body)
    http_apply(kube, "scaler", replicas_only(2), force=False)  # the same value: no conflict, now shared
    without = deployment([], 8080, [])
    del without["spec"]["replicas"]
    http_apply(kube, "objects", without, force=False)  # "objects" lets go; "scaler" still owns it
    assert kube.get("apps/v1/deployments", "c")["spec"]["replicas"] == 2
    http_apply(kube, "scaler", replicas_only(4), force=False)  # sole owner now: no conflict
    with pytest.raises(ApiError):
        http_apply(kube, "objects", deployment([], 8080, []), force=False)  # applies 2 over the scaler's 4
    http_apply(kube, "objects", deployment([], 8080, []), force=True)  # forced: takes replicas back
    stored = kube.get("apps/v1/deployments", "c")
    assert stored["spec"]["replicas"] == 2
    owners = {entry["manager"]: entry for entry in stored["metadata"]["managedFields"]}
    assert owners["objects"]["operation"] == "Apply" and owners["objects"]["fieldsType"] == "FieldsV1"
    assert "f:replicas" in owners["objects"]["fieldsV1"]["f:spec"]
    assert "scaler" not in owners or "f:replicas" not in owners["scaler"]["fieldsV1"].get("f:spec", {})
    containers = owners["objects"]["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    assert 'k:{"name":"consumer"}' in containers


def test_a_field_only_the_leaving_manager_owned_is_removed():
    live = server_side_apply.apply(None, None, deployment([], 8080, []))
    without = deployment([], 8080, [])
    del without["spec"]["replicas"]
    assert "replicas" not in server_side_apply.apply(live, deployment([], 8080, []), without)["spec"]
    shared = frozenset({("spec", "replicas")})
    assert server_side_apply.apply(live, deployment([], 8080, []), without, shared)["spec"]["replicas"] == 2


def replica_owners(stored: dict[str, Any]) -> list[str]:
    return sorted(
        entry["manager"]
        for entry in stored["metadata"].get("managedFields") or ()
        if "f:replicas" in (entry.get("fieldsV1") or {}).get("f:spec", {})
    )


def test_replicas_have_one_owner_and_re_applying_the_objects_never_resets_them(kube):
    """The scaler (or a person's ``kubectl scale``, which the poll then takes as the current size) sets
    the replicas; the operator re-applying its objects (a spec change, a repair) leaves them alone, and
    a Deployment an older release created (replicas owned by the objects' manager) is handed over."""
    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["t"], "groupId": "g"},
            "handler": {"image": "img:1", "handler": "m:f"},
        }
    )
    meta = {"name": "owned", "namespace": "default", "uid": "uid-1"}
    with api_client(kube.url, token=None) as client:
        operator = Kube(client)
        apply_owned_objects(operator, spec, meta, {}, AppliedObjects(), always=True)
        created = kube.get("apps/v1/deployments", "owned")
        # created with the size by both managers (shared); the objects' next apply lets go of it
        assert created["spec"]["replicas"] == 1
        assert replica_owners(created) == sorted([FIELD_MANAGER, SCALE_FIELD_MANAGER])
        operator.scale("default", "owned", 5)
        apply_owned_objects(operator, spec, meta, {"replicas": 2}, AppliedObjects(), always=True)
        stored = kube.get("apps/v1/deployments", "owned")
        assert stored["spec"]["replicas"] == 5 and replica_owners(stored) == [SCALE_FIELD_MANAGER]

        older = build_deployment(spec, {"metadata": {**meta, "name": "older"}}, 3)
        operator.apply(older)  # an older release applied replicas with the objects' manager
        assert replica_owners(kube.get("apps/v1/deployments", "older")) == [FIELD_MANAGER]
        apply_owned_objects(operator, spec, {**meta, "name": "older"}, {}, AppliedObjects(), always=True)
        handed = kube.get("apps/v1/deployments", "older")
    assert handed["spec"]["replicas"] == 3, "the hand-over kept the size"
    assert replica_owners(handed) == [SCALE_FIELD_MANAGER]


def test_replicas_somebody_else_scaled_stay_theirs_and_the_scaler_writes_only_over_the_size_it_read(kube):
    """``kubectl scale`` (or an HPA) writes the replicas by an update, which makes its writer their owner: the
    operator re-applying its objects does not take them back (they are not an older release's to hand over),
    and the scaler's compare-and-swap (``Kube.scale`` with ``expected``) writes only over the size it read."""
    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["t"], "groupId": "g"},
            "handler": {"image": "img:1", "handler": "m:f"},
        }
    )
    meta = {"name": "scaled", "namespace": "default", "uid": "uid-2"}
    with api_client(kube.url, token=None) as client:
        operator = Kube(client)
        apply_owned_objects(operator, spec, meta, {}, AppliedObjects(), always=True)
        kube.patch("apps/v1/deployments", "scaled", {"spec": {"replicas": 4}}, subresource="scale")
        apply_owned_objects(operator, spec, meta, {"replicas": 1}, AppliedObjects(), always=True)
        stored = kube.get("apps/v1/deployments", "scaled")
        assert stored["spec"]["replicas"] == 4 and replica_owners(stored) == ["Python-urllib"]
        assert operator.scale("default", "scaled", 2, expected=1) is None, "decided from a size no longer there"
        assert kube.get("apps/v1/deployments", "scaled")["spec"]["replicas"] == 4
        assert operator.scale("default", "scaled", 2, expected=4) is not None
    stored = kube.get("apps/v1/deployments", "scaled")
    assert stored["spec"]["replicas"] == 2 and replica_owners(stored) == [SCALE_FIELD_MANAGER]
