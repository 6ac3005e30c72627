"""The real kopf operator on the API emulator creates each OrderedConsumer's NetworkPolicy, and deletes it when
the chart's switch (``networkPolicy.consumerPods``, the variable ``KEYORDER_NETWORK_POLICY``) is turned off.

The emulator serves ``networking.k8s.io/v1`` NetworkPolicies from kmock's bundled discovery data (the API
server's own list of resources: kind NetworkPolicy, namespaced, with create, delete, get, list, patch and
watch); the operator's requests are authorised by the chart's RBAC (``tests/operator/conftest.py``), so a
missing grant for networkpolicies fails the test. The emulator enforces no policy (nothing here does): what
is checked is the object the operator writes, its selectors, owner and port.
"""

from __future__ import annotations

import json

import pytest

from keyorder_operator.builders import NAMESPACE_NAME_LABEL, NETWORK_POLICY_VARIABLE, selector_labels
from tests.operator.harness import CR, wait_for, wait_for_polls
from tests.operator.test_operator_deployable import operator, resource

pytestmark = pytest.mark.timeout(120)

POLICIES = "networking.k8s.io/v1/networkpolicies"
OPERATOR_LABELS = {"app.kubernetes.io/name": "keyorder-operator", "app.kubernetes.io/instance": "keyorder"}
MONITORING = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "monitoring"}}}


def test_the_operator_fences_the_pods_port_and_lifts_the_fence_when_switched_off(kube, monkeypatch):
    settings = {
        "operatorNamespace": "keyorder-system",
        "operatorPodLabels": OPERATOR_LABELS,
        "metricsFrom": [MONITORING],
    }
    monkeypatch.setenv(NETWORK_POLICY_VARIABLE, json.dumps(settings))
    with operator(kube.url):
        created = kube.create(CR, resource("fenced", httpPort=9090))
        policy = wait_for(lambda: kube.get(POLICIES, "fenced"), 20, "the pods' NetworkPolicy")
        spec = policy["spec"]
        assert spec["podSelector"] == {"matchLabels": selector_labels("fenced")}
        assert spec["policyTypes"] == ["Ingress"]
        operator_rule, metrics_rule = spec["ingress"]
        assert operator_rule["from"] == [
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: "keyorder-system"}},
                "podSelector": {"matchLabels": OPERATOR_LABELS},
            }
        ]
        assert metrics_rule["from"] == [MONITORING]
        assert operator_rule["ports"] == metrics_rule["ports"] == [{"protocol": "TCP", "port": 9090}]
        (owner,) = policy["metadata"]["ownerReferences"]
        assert owner["uid"] == created["metadata"]["uid"] and owner["controller"] is True
        # the pods it selects are the Deployment's
        deployment = kube.get("apps/v1/deployments", "fenced")
        assert (
            spec["podSelector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        )

        # a policy of the same kind somebody else made is never the operator's to delete
        kube.create(
            POLICIES,
            {
                "apiVersion": "networking.k8s.io/v1",
                "kind": "NetworkPolicy",
                "metadata": {"name": "team-own"},
                "spec": {"podSelector": {}},
            },
        )
        monkeypatch.delenv(NETWORK_POLICY_VARIABLE)
        wait_for(lambda: kube.get(POLICIES, "fenced") is None, 20, "the pods' NetworkPolicy deleted")
        wait_for_polls(kube, "fenced", 2)
        assert kube.get(POLICIES, "fenced") is None, "an operator with the switch off recreated it"
        assert kube.get(POLICIES, "team-own") is not None
        assert kube.get("apps/v1/deployments", "fenced") is not None
