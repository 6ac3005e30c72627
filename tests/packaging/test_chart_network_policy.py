"""The chart's NetworkPolicies, rendered by the real Helm engine (issue 37): on by default, each switch works.

The operator's own policy lets only the scrapers (``networkPolicy.metricsFrom``) and the ``helm test`` pod reach
its metrics port. The consumer pods' policy is made by the operator from ``KEYORDER_NETWORK_POLICY``, which
the chart renders: parsed here by the operator's own code, and the policy it builds must admit the operator's
pods as the chart labels them, in the release's namespace. Every values set is also linted and validated
strictly by test_chart.py (``networking.k8s.io/v1`` NetworkPolicy included).
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from keyorder_operator.builders import (
    NAMESPACE_NAME_LABEL,
    NETWORK_POLICY_VARIABLE,
    build_network_policy,
    network_policy_settings,
)
from keyorder_operator.spec import parse_spec
from tests.packaging.conftest import NAMESPACE, RELEASE, documents, find

MONITORING = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "monitoring"}}}
OWNER = {"metadata": {"name": "orders", "namespace": "team-a", "uid": "uid-1"}}
SPEC = {
    "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "orders"},
    "handler": {"image": "registry.example/orders:1", "handler": "orders.handler:handle"},
}


def render(chart: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    return documents(chart.render(values, name=RELEASE, namespace=NAMESPACE))


def operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deployment,) = find(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value") for item in container["env"]}


def operator_pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    (deployment,) = find(docs, "Deployment")
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_the_operators_pods_take_metrics_scrapes_only_from_the_monitoring_namespace_and_helm_test(chart):
    docs = render(chart, {})
    (policy,) = find(docs, "NetworkPolicy")
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert spec["podSelector"]["matchLabels"].items() <= operator_pod_labels(docs).items()
    assert spec["policyTypes"] == ["Ingress"], "egress is not restricted"
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}]
    (test_pod,) = find(docs, "Pod")
    helm_test, scrapers = rule["from"]
    assert helm_test["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()
    assert scrapers == MONITORING
    (deployment,) = find(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "metrics" in {port["name"] for port in container["ports"]}


def test_the_operator_is_told_how_to_fence_the_consumer_pods_and_its_own_pods_pass(chart):
    docs = render(chart, {})
    settings = network_policy_settings(operator_env(docs))
    assert settings is not None
    assert settings.operator_namespace == NAMESPACE
    assert settings.metrics_from == [MONITORING]
    policy = build_network_policy(parse_spec(SPEC), OWNER, settings)
    operator_peer = policy["spec"]["ingress"][0]["from"][0]
    assert operator_peer["namespaceSelector"]["matchLabels"] == {NAMESPACE_NAME_LABEL: NAMESPACE}
    assert operator_peer["podSelector"]["matchLabels"].items() <= operator_pod_labels(docs).items()
    (helm_test,) = [doc for doc in docs if doc["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    assert not operator_peer["podSelector"]["matchLabels"].items() <= helm_test["metadata"]["labels"].items(), (
        "the helm test pod shares the selector labels but must not reach the consumer pods' admin port"
    )


def test_metrics_from_reaches_both_policies(chart):
    prometheus = [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "observability"}}}]
    docs = render(chart, {"networkPolicy": {"metricsFrom": prometheus}})
    (policy,) = find(docs, "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"][1:] == prometheus
    settings = network_policy_settings(operator_env(docs))
    assert settings is not None and settings.metrics_from == prometheus


def test_no_scrapers_leaves_helm_test_alone(chart):
    docs = render(chart, {"networkPolicy": {"metricsFrom": []}})
    (policy,) = find(docs, "NetworkPolicy")
    assert [list(peer) for peer in policy["spec"]["ingress"][0]["from"]] == [["podSelector"]]


def test_the_switches_turn_each_policy_off(chart):
    docs = render(chart, {"networkPolicy": {"enabled": False}})
    assert find(docs, "NetworkPolicy") == []
    assert NETWORK_POLICY_VARIABLE in operator_env(docs), "the consumer pods' policy has its own switch"
    docs = render(chart, {"networkPolicy": {"consumerPods": False}})
    assert NETWORK_POLICY_VARIABLE not in operator_env(docs)
    assert network_policy_settings(operator_env(docs)) is None
    assert len(find(docs, "NetworkPolicy")) == 1


def test_the_operator_may_manage_the_consumer_pods_policies(chart):
    (role,) = find(render(chart, {}), "ClusterRole", f"{RELEASE}-keyorder-operator")
    (rule,) = [rule for rule in role["rules"] if "networkpolicies" in rule["resources"]]
    assert rule["apiGroups"] == ["networking.k8s.io"]
    assert set(rule["verbs"]) == {"get", "patch", "create", "list", "watch", "delete"}


@pytest.mark.parametrize(
    "metrics_from",
    [[{}], [{"namespace": "monitoring"}], "monitoring", [{"ipBlock": {"except": ["10.0.0.0/8"]}}]],
)
def test_a_peer_that_is_no_network_policy_peer_is_refused(chart, metrics_from):
    with pytest.raises(helm_python.HelmValuesError):
        render(chart, {"networkPolicy": {"metricsFrom": metrics_from}})
