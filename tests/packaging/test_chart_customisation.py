"""The chart's customisation values, rendered by the real Helm engine: topology spread, extra
volumes, env as a list with ``valueFrom``, common labels, the component label, log format, and the
ClusterRoles that give namespace users OrderedConsumer rights through admin/edit/view aggregation.

The ``customised`` values set in conftest is also linted and validated strictly by test_chart.py.
"""

from __future__ import annotations

import argparse
from typing import Any

import helm_python
import pytest

from keyorder_operator.main import add_operator_flags, check_operator_args
from tests.packaging.conftest import NAMESPACE, RELEASE, VALUES_SETS, documents, find

SELECTOR = {"app.kubernetes.io/name": "keyorder-operator", "app.kubernetes.io/instance": RELEASE}


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = find(docs, "Deployment")
    return deployment["spec"]["template"]["spec"]


def render(chart: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    return documents(chart.render(values, name=RELEASE, namespace=NAMESPACE))


def test_topology_spread_gets_the_operator_selector_unless_given(manifests):
    first, second = pod_spec(manifests["customised"])["topologySpreadConstraints"]
    assert first == {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": SELECTOR},
    }
    assert second["labelSelector"] == {"matchLabels": {"app.kubernetes.io/name": "keyorder-operator"}}
    (deployment,) = find(manifests["customised"], "Deployment")
    assert SELECTOR.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert "topologySpreadConstraints" not in pod_spec(manifests["defaults"])


def test_extra_volumes_are_mounted_beside_the_scratch_directory(manifests):
    spec = pod_spec(manifests["customised"])
    assert [volume["name"] for volume in spec["volumes"]] == ["tmp", "kafka-ca"]
    assert spec["volumes"][1] == {"name": "kafka-ca", "configMap": {"name": "kafka-ca"}}
    (container,) = spec["containers"]
    assert container["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "kafka-ca", "mountPath": "/etc/kafka-ca", "readOnly": True},
    ]
    assert [volume["name"] for volume in pod_spec(manifests["defaults"])["volumes"]] == ["tmp"]


def test_env_as_a_list_keeps_value_from(manifests):
    (container,) = pod_spec(manifests["customised"])["containers"]
    env = {variable["name"]: variable for variable in container["env"]}
    assert list(env) == ["POD_ID", "KEYORDER_NETWORK_POLICY", "HTTPS_PROXY", "NODE_NAME", "TZ"], (
        "kopf's POD_ID stays first"
    )
    assert env["HTTPS_PROXY"]["valueFrom"] == {"secretKeyRef": {"name": "proxy", "key": "url"}}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["TZ"] == {"name": "TZ", "value": "UTC"}


def test_an_env_entry_without_a_name_is_refused(chart):
    with pytest.raises(helm_python.HelmValuesError, match="name"):
        render(chart, {"operator": {"extraEnv": [{"value": "x"}]}})


def test_common_labels_and_the_component_label_are_on_every_object(manifests):
    for values_set, docs in manifests.items():
        for doc in docs:
            labels = doc["metadata"]["labels"]
            helm_test = doc["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
            # the helm test pod is not the operator: the consumer pods' NetworkPolicy admits the operator by it
            assert labels["app.kubernetes.io/component"] == ("test" if helm_test else "operator"), (
                values_set,
                doc["kind"],
            )
            if values_set == "customised":
                assert labels["team"] == "payments" and labels["cost-center"] == "42", doc["kind"]
    (deployment,) = find(manifests["customised"], "Deployment")
    assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "payments"
    assert deployment["spec"]["selector"]["matchLabels"] == SELECTOR, "selectors never change"


def test_common_labels_may_not_replace_the_charts_own(chart):
    with pytest.raises(helm_python.HelmError, match=r"commonLabels: app.kubernetes.io/name is set by the chart"):
        render(chart, {"commonLabels": {"app.kubernetes.io/name": "other"}})


def test_log_format_reaches_the_operator_and_is_checked(manifests, chart):
    (container,) = pod_spec(manifests["customised"])["containers"]
    assert "--log-format=json" in container["args"]
    with pytest.raises(helm_python.HelmValuesError, match="logFormat"):
        render(chart, {"operator": {"logFormat": "xml"}})


@pytest.mark.parametrize("values_set", sorted(VALUES_SETS))
def test_rendered_args_pass_the_operators_own_checks(manifests, values_set):
    (container,) = pod_spec(manifests[values_set])["containers"]
    parser = argparse.ArgumentParser()
    add_operator_flags(parser)
    check_operator_args(parser.parse_args(container["args"][1:]))


def aggregated_rules(docs: list[dict[str, Any]], role: str) -> set[tuple[str, str, str]]:
    """What the chart adds to Kubernetes' built-in ``role`` (admin, edit or view) by aggregation."""
    label = f"rbac.authorization.k8s.io/aggregate-to-{role}"
    return {
        (group, resource, verb)
        for cluster_role in find(docs, "ClusterRole")
        if cluster_role["metadata"]["labels"].get(label) == "true"
        for rule in cluster_role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_namespace_users_get_orderedconsumer_rights_by_aggregation(manifests):
    docs = manifests["defaults"]
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    reads = {"get", "list", "watch"}
    resources = {"orderedconsumers", "orderedconsumers/status", "orderedconsumers/scale"}
    for role in ("admin", "edit"):
        granted = aggregated_rules(docs, role)
        assert {("keyorder.dev", "orderedconsumers", verb) for verb in reads | writes} <= granted, role
        assert ("keyorder.dev", "orderedconsumers/status", "get") in granted
        # kubectl scale okc (docs/install.md): as Kubernetes' edit role writes deployments/scale
        # (kubernetes/kubernetes plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go)
        assert {("keyorder.dev", "orderedconsumers/scale", verb) for verb in ("get", "update", "patch")} <= granted
        assert {resource for _, resource, _ in granted} == resources
    view = aggregated_rules(docs, "view")
    assert {verb for _, _, verb in view} == reads, "view never writes"
    assert {resource for _, resource, _ in view} == resources, "view reads the scale, as deployments/scale"
    bindings = find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding")
    user_roles = {f"{RELEASE}-keyorder-operator-{role}" for role in ("admin", "edit", "view")}
    assert not [binding for binding in bindings if binding["roleRef"]["name"] in user_roles], "bound by the cluster"


def test_user_roles_are_optional(manifests, chart):
    docs = render(chart, {"rbac": {"aggregateToDefaultRoles": False}})
    assert not aggregated_rules(docs, "edit") and not aggregated_rules(docs, "view")
    assert not aggregated_rules(manifests["minimal"], "edit"), "rbac.create: false renders no RBAC at all"
    assert aggregated_rules(manifests["namespaced"], "edit"), "also with watchNamespaces"
