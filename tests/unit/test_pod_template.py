"""The pod template: merged onto the consumer and catch-up pods, never replacing or weakening what the operator sets."""

from __future__ import annotations

import copy
import types
import typing
from typing import Any

import pytest
from pydantic import BaseModel

from keyorder_operator.builders import (
    CONTAINER_SECURITY,
    POD_SECURITY,
    build_catchup_job,
    build_deployment,
    consumer_env,
)
from keyorder_operator.spec import (
    MAX_NAME_LENGTH,
    OPERATOR_ANNOTATIONS,
    OPERATOR_ENV,
    OPERATOR_LABELS,
    OPERATOR_MOUNT_PATHS,
    OPERATOR_VOLUMES,
    InvalidSpec,
    OrderedConsumerSpec,
    name_problem,
    parse_spec,
)

OWNER = {"metadata": {"name": "payments", "namespace": "pay", "uid": "uid-1"}}
TEMPLATE = {
    "metadata": {"labels": {"team": "payments"}, "annotations": {"vault.hashicorp.com/agent-inject": "true"}},
    "spec": {
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "serviceAccountName": "payments-irsa",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "kafka", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "priorityClassName": "payments-high",
        "volumes": [{"name": "fx-rates", "configMap": {"name": "fx-rates"}}],
    },
}
HANDLER_EXTRAS = {
    "env": [
        {"name": "PLAIN", "value": "1"},
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "payments-db", "key": "password"}}},
    ],
    "envFrom": [{"configMapRef": {"name": "payments-settings"}}],
    "volumeMounts": [{"name": "fx-rates", "mountPath": "/etc/payments/fx", "readOnly": True}],
}


def spec_dict(template: dict[str, Any] | None = None, **handler: Any) -> dict[str, Any]:
    return {
        "kafka": {
            "bootstrapServers": "kafka:9092",
            "topics": ["payments"],
            "groupId": "payments",
            "propertiesSecretRef": {"name": "kafka-client"},
        },
        "handler": {"image": "registry.example/payments:1.0", "handler": "payments.handler:handle", **handler},
        "template": copy.deepcopy(TEMPLATE) if template is None else template,
        "catchup": {"image": CATCHUP_IMAGE},
    }


CATCHUP_IMAGE = "registry.example/payments-catchup:1.0"


def pods(spec_value: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    spec = parse_spec(spec_value)
    deployment = build_deployment(spec, OWNER, replicas=2)
    job = build_catchup_job(spec, OWNER, "payments-catchup-1", "orders:0:10")
    return [("deployment", deployment["spec"]["template"]), ("catchup job", job["spec"]["template"])]


@pytest.mark.parametrize("which", ["deployment", "catchup job"])
def test_the_template_is_merged_onto_the_consumer_and_the_catchup_pods(which):
    pod = dict(pods(spec_dict(**HANDLER_EXTRAS)))[which]
    metadata, spec = pod["metadata"], pod["spec"]
    assert metadata["labels"]["team"] == "payments"
    assert metadata["labels"]["app.kubernetes.io/instance"] == "payments"  # the operator's labels stay
    assert metadata["annotations"]["vault.hashicorp.com/agent-inject"] == "true"
    template = TEMPLATE["spec"]
    for field in ("imagePullSecrets", "nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
        assert spec[field] == template[field], field
    assert spec["priorityClassName"] == "payments-high"
    assert spec["serviceAccountName"] == "payments-irsa"
    volumes = [volume["name"] for volume in spec["volumes"]]
    assert "fx-rates" in volumes and "tmp" in volumes and "kafka-properties" in volumes
    container = spec["containers"][0]
    assert {"name": "fx-rates", "mountPath": "/etc/payments/fx", "readOnly": True} in container["volumeMounts"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert container["envFrom"] == [{"configMapRef": {"name": "payments-settings"}}]
    env = {item["name"]: item for item in container["env"]}
    assert env["DB_PASSWORD"] == {
        "name": "DB_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "payments-db", "key": "password"}},
    }
    assert env["PLAIN"] == {"name": "PLAIN", "value": "1"}
    assert env["KEYORDER_GROUP_ID"]["value"] == "payments"
    # the hardening is the operator's, whatever the template says
    assert spec["securityContext"] == POD_SECURITY
    assert container["securityContext"] == CONTAINER_SECURITY


def test_without_a_template_the_pods_are_what_they_were():
    deployment, job = (pod for _, pod in pods(spec_dict(template={})))
    assert deployment["spec"]["serviceAccountName"] == "payments"
    assert job["spec"]["serviceAccountName"] == "payments"
    for pod in (deployment, job):
        assert not {"imagePullSecrets", "tolerations", "affinity", "nodeSelector", "priorityClassName"} & set(
            pod["spec"]
        )
        assert "envFrom" not in pod["spec"]["containers"][0]


def test_a_spark_driver_account_wins_over_the_templates_on_a_k8s_master():
    catchup = {"master": "k8s://https://k", "serviceAccountName": "spark", "image": CATCHUP_IMAGE}
    spec = parse_spec({**spec_dict(), "catchup": catchup})
    job = build_catchup_job(spec, OWNER, "payments-catchup-1", "orders:0:10")
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "spark"


@pytest.mark.parametrize(
    ("template", "handler", "field"),
    [
        ({"metadata": {"labels": {"app.kubernetes.io/instance": "other"}}}, {}, "labels.app.kubernetes.io/instance"),
        ({"metadata": {"annotations": {"prometheus.io/port": "1"}}}, {}, "annotations.prometheus.io/port"),
        ({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}, {}, "spec.template.spec.volumes[0].name"),
        ({"spec": {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}, {}, "volumes[0].hostPath"),
        (
            {"spec": {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]}},
            {},
            "volumes[1].name",
        ),
        ({}, {"volumeMounts": [{"name": "nope", "mountPath": "/data"}]}, "spec.handler.volumeMounts[0].name"),
        (
            {"spec": {"volumes": [{"name": "a", "emptyDir": {}}]}},
            {"volumeMounts": [{"name": "a", "mountPath": "/tmp"}]},
            "spec.handler.volumeMounts[0].mountPath",
        ),
        (
            {"spec": {"volumes": [{"name": "a", "emptyDir": {}}]}},
            {"volumeMounts": [{"name": "a", "mountPath": "/etc/keyorder/admin/x"}]},
            "volumeMounts[0].mountPath",
        ),
        ({}, {"env": [{"name": "KEYORDER_GROUP_ID", "value": "other"}]}, "spec.handler.env[0].name"),
        ({}, {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]}, "spec.handler.env[0]"),
    ],
)
def test_a_template_may_not_replace_what_the_operator_generates(template, handler, field):
    with pytest.raises(InvalidSpec) as error:
        parse_spec(spec_dict(template=template, **handler))
    assert field in str(error.value)


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"spec": {"securityContext": {"runAsUser": 0}}}, "spec.template.spec.securityContext"),
        ({"spec": {"hostNetwork": True}}, "spec.template.spec.hostNetwork"),
        ({"spec": {"containers": [{"name": "x"}]}}, "spec.template.spec.containers"),
        ({"spec": {"automountServiceAccountToken": True}}, "spec.template.spec.automountServiceAccountToken"),
    ],
)
def test_an_attempt_to_weaken_the_hardening_is_named_as_such(template, field):
    with pytest.raises(InvalidSpec) as error:
        parse_spec(spec_dict(template=template))
    assert f"{field}: the operator owns the pods' hardening" in str(error.value)


def test_the_reserved_names_are_what_the_builders_generate():
    """The lists the checks use cannot drift from what the pods really carry."""
    value = spec_dict()
    value["handler"]["executor"] = "process"  # the operator sets KEYORDER_EXECUTOR only when not auto
    spec = parse_spec({**value, "catchup": {"master": "k8s://https://k", "image": CATCHUP_IMAGE}})
    generated_env, generated_volumes, generated_mounts = set(), set(), set()
    generated_labels, generated_annotations = set(), set()
    k8s_job = build_catchup_job(spec, OWNER, "j", "t:0:1")["spec"]["template"]
    for _, pod in [*pods(spec.model_dump(by_alias=True, exclude_none=True)), ("k8s job", k8s_job)]:
        container = pod["spec"]["containers"][0]
        generated_env |= {item["name"] for item in container["env"]} - {"PLAIN", "DB_PASSWORD"}
        generated_volumes |= {volume["name"] for volume in pod["spec"]["volumes"]} - {"fx-rates"}
        generated_mounts |= {mount["mountPath"] for mount in container["volumeMounts"]} - {"/etc/payments/fx"}
        generated_labels |= set(pod["metadata"]["labels"]) - {"team"}
        generated_annotations |= set(pod["metadata"].get("annotations", {})) - {"vault.hashicorp.com/agent-inject"}
    assert generated_env <= OPERATOR_ENV
    assert {item["name"] for item in consumer_env(spec)} <= OPERATOR_ENV
    # a batch handler's variables too (the spec above has catch-up on, which refuses a batch handler)
    value["handler"]["batch"] = {"maxMessages": 100, "maxWaitMs": 5}
    batch_env = {item["name"] for item in consumer_env(parse_spec(value))}
    assert {"KEYORDER_BATCH_MAX_MESSAGES", "KEYORDER_BATCH_MAX_WAIT_MS"} <= batch_env <= OPERATOR_ENV
    assert generated_volumes <= OPERATOR_VOLUMES
    assert generated_mounts <= OPERATOR_MOUNT_PATHS
    assert generated_labels <= OPERATOR_LABELS
    assert generated_annotations <= OPERATOR_ANNOTATIONS


@pytest.mark.parametrize(
    ("name", "accepted"),
    [
        ("payments", True),
        ("a", True),
        ("a" * MAX_NAME_LENGTH, True),
        ("a" * (MAX_NAME_LENGTH + 1), False),
        ("payments.eu", False),
        ("Payments", False),
        ("9payments", False),
        ("payments-", False),
        ("", False),
    ],
)
def test_resource_names_must_fit_the_objects_named_after_them(name, accepted):
    problem = name_problem(name)
    assert (problem is None) is accepted, problem
    if problem is not None:
        assert "-metrics" in problem and str(MAX_NAME_LENGTH) in problem


# Where each list of the spec ends up in the Deployment's pod template (None: nowhere as a list).
LIST_DESTINATIONS = {
    "spec.kafka.topics": None,  # one comma-separated variable
    "spec.handler.env": "spec.template.spec.containers[].env",
    "spec.handler.envFrom": "spec.template.spec.containers[].envFrom",
    "spec.handler.volumeMounts": "spec.template.spec.containers[].volumeMounts",
    "spec.template.spec.imagePullSecrets": "spec.template.spec.imagePullSecrets",
    "spec.template.spec.tolerations": "spec.template.spec.tolerations",
    "spec.template.spec.topologySpreadConstraints": "spec.template.spec.topologySpreadConstraints",
    "spec.template.spec.volumes": "spec.template.spec.volumes",
    "spec.scaling.scaleUpPolicies": None,
    "spec.scaling.scaleDownPolicies": None,
}


def _spec_lists(model: type[BaseModel], path: str = "spec") -> list[str]:
    """The list fields of the spec models (the lists inside the embedded Kubernetes types are the pods' own)."""
    found = []
    for name, field in model.model_fields.items():
        field_path = f"{path}.{field.alias or name}"
        annotation = field.annotation
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)] if union else [annotation]
        for option in options:
            if typing.get_origin(option) is list:
                found.append(field_path)
            elif isinstance(option, type) and issubclass(option, BaseModel):
                found += _spec_lists(option, field_path)
    return found


def test_every_list_that_lands_in_a_keyed_list_of_the_pods_is_keyed_alike_in_the_crd():
    """Server-side apply refuses a Deployment whose keyed list (a container's env by name...) repeats a key,
    so a spec list that lands in one must refuse duplicates itself: the same keys, in the CRD."""
    from keyorder_operator.crd import crd_manifest
    from tests.operator.server_side_apply import Schema

    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    lists = _spec_lists(OrderedConsumerSpec)
    assert set(lists) == set(LIST_DESTINATIONS), "a new list in the spec: say where it lands in LIST_DESTINATIONS"
    for path in lists:
        node = schema
        for part in path.split("."):
            node = node["properties"][part]
        destination = LIST_DESTINATIONS[path]
        keys = None
        if destination is not None:
            position = Schema.of({"apiVersion": "apps/v1", "kind": "Deployment"})
            for part in destination.split("."):
                position = position.field(part.removesuffix("[]"))
                if part.endswith("[]"):
                    position = position.items()
            keys = position.list_keys()
        if keys is None:
            assert node.get("x-kubernetes-list-type") in (None, "atomic"), path
            continue
        assert node.get("x-kubernetes-list-type") == "map", f"{path} lands in a list keyed by {keys}"
        assert tuple(node["x-kubernetes-list-map-keys"]) in (keys, tuple(sorted(keys))), path
        items = node["items"]
        for key in keys:  # the API server refuses a CRD whose map key is neither required nor defaulted
            assert key in items.get("required", []) or "default" in items["properties"][key], (path, key)


@pytest.mark.parametrize(
    ("template", "handler", "field", "repeated"),
    [
        (
            {},
            {"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
            "spec.handler.env[1].name",
            "name 'A'",
        ),
        (
            {"spec": {"volumes": [{"name": "fx", "emptyDir": {}}]}},
            {
                "volumeMounts": [
                    {"name": "fx", "mountPath": "/fx"},
                    {"name": "fx", "mountPath": "/fx", "readOnly": True},
                ]
            },
            "spec.handler.volumeMounts[1].mountPath",
            "mountPath '/fx'",
        ),
        (
            {"spec": {"imagePullSecrets": [{"name": "registry"}, {"name": "registry"}]}},
            {},
            "spec.template.spec.imagePullSecrets[1].name",
            "name 'registry'",
        ),
        (
            {
                "spec": {
                    "topologySpreadConstraints": [
                        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
                        {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
                    ]
                }
            },
            {},
            "spec.template.spec.topologySpreadConstraints[1]",
            "topologyKey 'zone', whenUnsatisfiable 'DoNotSchedule'",
        ),
        (
            {"spec": {"volumes": [{"name": "a", "emptyDir": {}}, {"name": "a", "secret": {"secretName": "s"}}]}},
            {},
            "spec.template.spec.volumes[1].name",
            "name 'a'",
        ),
    ],
)
def test_a_keyed_list_refuses_a_repeated_key_naming_the_field_and_the_first_item(template, handler, field, repeated):
    with pytest.raises(InvalidSpec) as error:
        parse_spec(spec_dict(template=template, **handler))
    [(path, message)] = error.value.problems
    assert path == field
    assert message.startswith(f"duplicate entry: {repeated} is already {field.split('[')[0]}[0]"), message


def test_an_image_pull_secret_without_a_name_is_refused():
    """The list is keyed by name (a real API server's apply refuses an item that omits every key)."""
    with pytest.raises(InvalidSpec) as error:
        parse_spec(spec_dict(template={"spec": {"imagePullSecrets": [{}]}}))
    assert error.value.problems == [
        ("spec.template.spec.imagePullSecrets[0].name", "required: the list is keyed by name")
    ]


def test_the_same_key_in_two_different_lists_is_no_duplicate():
    spec = parse_spec(
        spec_dict(
            template={"spec": {"volumes": [{"name": "fx", "emptyDir": {}}], "imagePullSecrets": [{"name": "fx"}]}},
            env=[{"name": "fx", "value": "1"}, {"name": "FX", "value": "2"}],
            volumeMounts=[{"name": "fx", "mountPath": "/fx"}, {"name": "fx", "mountPath": "/fx2"}],
        )
    )
    assert [item.name for item in spec.handler.env] == ["fx", "FX"]
