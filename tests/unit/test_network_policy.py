"""The consumer pods' NetworkPolicy (issue 37): only the operator's pods and the metrics scrapers reach their port.

``build_network_policy`` is pure: these check its selectors against the pods the operator generates (it must
select exactly them) and the settings the chart hands the operator (``KEYORDER_NETWORK_POLICY``)."""

from __future__ import annotations

import json

import pytest

from keyorder_operator.builders import (
    NETWORK_POLICY_VARIABLE,
    NetworkPolicySettings,
    build_catchup_job,
    build_deployment,
    build_network_policy,
    network_policy_settings,
)
from keyorder_operator.spec import parse_spec
from tests.unit.test_pod_template import OWNER, spec_dict

OPERATOR_LABELS = {"app.kubernetes.io/name": "keyorder-operator", "app.kubernetes.io/instance": "keyorder"}
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
SETTINGS = NetworkPolicySettings("keyorder-system", OPERATOR_LABELS, [MONITORING])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_the_policy_selects_the_consumer_pods_and_not_the_catchup_job():
    spec = parse_spec({**spec_dict(), "httpPort": 9090})
    policy = build_network_policy(spec, OWNER, SETTINGS)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    pod_labels = build_deployment(spec, OWNER, 1)["spec"]["template"]["metadata"]["labels"]
    assert selects(selector, pod_labels)
    job_labels = build_catchup_job(spec, OWNER, "payments-catchup-1", "t:0:1")["spec"]["template"]["metadata"]
    assert not selects(selector, job_labels["labels"]), "Spark's executors must still reach their driver"
    assert policy["metadata"]["namespace"] == "pay"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_only_the_operators_pods_and_the_scrapers_reach_the_http_port_and_egress_stays_open():
    spec = parse_spec({**spec_dict(), "httpPort": 9090})
    policy = build_network_policy(spec, OWNER, SETTINGS)["spec"]
    assert policy["policyTypes"] == ["Ingress"], "egress is not restricted: Kafka can be anywhere"
    operator_rule, metrics_rule = policy["ingress"]
    assert operator_rule == {
        "from": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keyorder-system"}},
                "podSelector": {"matchLabels": OPERATOR_LABELS},
            }
        ],
        "ports": [{"protocol": "TCP", "port": 9090}],
    }
    assert metrics_rule == {"from": [MONITORING], "ports": [{"protocol": "TCP", "port": 9090}]}
    # the one port the pods listen on is the one the rules open
    (container,) = build_deployment(spec, OWNER, 1)["spec"]["template"]["spec"]["containers"]
    assert [port["containerPort"] for port in container["ports"]] == [9090]


def test_no_scrapers_leaves_the_operator_alone():
    spec = parse_spec(spec_dict())
    settings = NetworkPolicySettings("ops", OPERATOR_LABELS, [])
    (rule,) = build_network_policy(spec, OWNER, settings)["spec"]["ingress"]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ops"}


def test_the_settings_come_from_the_variable_the_chart_sets():
    value = {"operatorNamespace": "ops", "operatorPodLabels": OPERATOR_LABELS, "metricsFrom": [MONITORING]}
    assert network_policy_settings({NETWORK_POLICY_VARIABLE: json.dumps(value)}) == NetworkPolicySettings(
        "ops", OPERATOR_LABELS, [MONITORING]
    )
    assert network_policy_settings({}) is None
    assert network_policy_settings({NETWORK_POLICY_VARIABLE: " "}) is None


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        json.dumps({"operatorPodLabels": OPERATOR_LABELS}),
        json.dumps({"operatorNamespace": "", "operatorPodLabels": OPERATOR_LABELS}),
        json.dumps({"operatorNamespace": "ops", "operatorPodLabels": {}}),
        json.dumps({"operatorNamespace": "ops", "operatorPodLabels": OPERATOR_LABELS, "metricsFrom": ["x"]}),
    ],
)
def test_a_garbled_variable_is_refused_by_name(raw):
    with pytest.raises(ValueError, match=NETWORK_POLICY_VARIABLE):
        network_policy_settings({NETWORK_POLICY_VARIABLE: raw})
