"""The chart's RBAC grants exactly what the operator needs, in every install mode.

Needs come from ``keyorder_operator.rbac.required_rules`` (``kube.API_CALLS`` plus kopf's table);
``kube.API_CALLS`` itself is checked against the Kubernetes client calls found in the operator's
source. Grants come from the rendered (Cluster)Roles. Both directions are asserted: every call is
allowed, and nothing else is (no wildcard, no extra verb, no cluster-wide grant in namespaced mode).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from keyorder_operator import kube
from keyorder_operator.rbac import KOPF_NEEDS, required_rules
from tests.packaging.conftest import NAMESPACE, VALUES_SETS, find

OPERATOR_SOURCE = Path(kube.__file__).parent
CLUSTER_SCOPED = {
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("", "namespaces"),
    ("kopf.dev", "clusterkopfpeerings"),
}
API_GROUPS = {
    "CoreV1Api": "",
    "AppsV1Api": "apps",
    "PolicyV1Api": "policy",
    "BatchV1Api": "batch",
    "AutoscalingV2Api": "autoscaling",
    "NetworkingV1Api": "networking.k8s.io",
}
VERBS = {"read": "get", "create": "create", "patch": "patch", "list": "list", "delete": "delete", "replace": "update"}
RESOURCES = {
    "deployment": "deployments",
    "service": "services",
    "pod_disruption_budget": "poddisruptionbudgets",
    "service_account": "serviceaccounts",
    "secret": "secrets",
    "pod": "pods",
    "job": "jobs",
    "config_map": "configmaps",
    "event": "events",
    "horizontal_pod_autoscaler": "horizontalpodautoscalers",
    "network_policy": "networkpolicies",
}


def calls_in_source() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every ``<api>.<verb>_namespaced_<resource>`` in the operator's modules."""
    found = set()
    for path in OPERATOR_SOURCE.glob("*.py"):
        text = path.read_text()
        apis = dict(re.findall(r"self\.(\w+) = kubernetes\.client\.(\w+)\(", text))
        for api, verb, resource in re.findall(
            r"\.(\w+)\.(read|create|patch|list|delete|replace)_namespaced_(\w+?)\b", text
        ):
            if api in apis:
                found.add((API_GROUPS[apis[api]], RESOURCES[resource], VERBS[verb]))
    return found


def test_api_calls_table_covers_every_client_call_in_the_code():
    calls = calls_in_source()
    assert ("apps", "deployments", "patch") in calls and ("", "pods", "list") in calls  # the scan finds them
    table = {(group, resource, verb) for (group, resource), verbs in kube.API_CALLS.items() for verb in verbs}
    assert calls - table == set(), "kube.API_CALLS misses calls the code makes"


def is_users_role(role: dict[str, Any]) -> bool:
    """A ClusterRole the chart aggregates into Kubernetes' admin/edit/view roles (not the operator's)."""
    return any(label.startswith("rbac.authorization.k8s.io/aggregate-to-") for label in role["metadata"]["labels"])


def granted(docs: list[dict[str, Any]], service_account: str) -> tuple[dict[str, set], set]:
    """Per namespace ("*" = cluster-wide), the (group, resource, verb) bound to the operator's account."""
    bound_roles = {
        (binding["metadata"].get("namespace", "*"), binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for binding in find(docs, "RoleBinding") + find(docs, "ClusterRoleBinding")
        if {"kind": "ServiceAccount", "name": service_account, "namespace": NAMESPACE} in binding["subjects"]
    }
    grants: dict[str, set] = {}
    for role in find(docs, "Role") + find(docs, "ClusterRole"):
        if is_users_role(role):
            continue  # rights of the cluster's users, aggregated into admin/edit/view: test_user_roles.py
        where = role["metadata"].get("namespace", "*")
        assert (where, role["kind"], role["metadata"]["name"]) in bound_roles, f"unbound {role['kind']}"
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no resourceNames, no nonResourceURLs
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                        grants.setdefault(where, set()).add((group, resource, verb))
    return grants, bound_roles


MODES = {
    "defaults": {"clusterwide": True, "peering": False, "discovery": True},
    "namespaced": {"clusterwide": False, "peering": False, "discovery": True},
    "namespaced-strict": {"clusterwide": False, "peering": False, "discovery": False},
    "peering": {"clusterwide": True, "peering": True, "discovery": True},
    "peering-namespaced": {"clusterwide": False, "peering": True, "discovery": True},
}


@pytest.mark.parametrize("values_set", sorted(MODES))
def test_rules_grant_exactly_what_is_needed(manifests, values_set):
    mode = MODES[values_set]
    needed = required_rules(**mode)
    grants, _ = granted(manifests[values_set], "keyorder-keyorder-operator")
    namespaced_needs = {(g, r, v) for scope, g, r, v in needed if scope == "namespaced"}
    cluster_needs = {(g, r, v) for scope, g, r, v in needed if scope == "cluster"}
    if mode["clusterwide"]:
        assert set(grants) == {"*"}
        assert grants["*"] == namespaced_needs | cluster_needs
    else:
        watched = VALUES_SETS[values_set]["operator"]["watchNamespaces"]
        assert set(grants) == set(watched) | ({"*"} if cluster_needs else set())
        for namespace in watched:
            assert grants[namespace] == namespaced_needs, namespace
        assert grants.get("*", set()) == cluster_needs
        assert all((g, r) in CLUSTER_SCOPED for g, r, _ in cluster_needs)


def test_every_rule_says_why(renders):
    for values_set in MODES:
        text = renders[values_set]["keyorder-operator/templates/rbac.yaml"]
        lines = text.splitlines()
        for index, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                assert lines[index - 1].strip().startswith("#"), f"{values_set}: rule without a comment: {line}"


def test_no_rbac_when_disabled(manifests):
    assert not [doc for doc in manifests["minimal"] if "Role" in doc["kind"]]


def test_kopf_needs_are_documented():
    for need in KOPF_NEEDS:
        assert need.why and need.verbs <= {"get", "list", "watch", "patch", "create"}
    # kopf lists namespaces only when it is not cluster-wide (kopf/_core/reactor/observation.py)
    assert not any(
        resource == "namespaces" for _, _, resource, _ in required_rules(clusterwide=True, peering=True, discovery=True)
    )
    assert ("cluster", "", "namespaces", "watch") in required_rules(clusterwide=False, peering=False, discovery=True)
