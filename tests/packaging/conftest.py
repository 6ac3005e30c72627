"""Shared, offline fixtures: the chart loaded once and rendered once per values set (real Helm engine)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import latest_version, major_minor

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "keyorder-operator"
RELEASE, NAMESPACE = "keyorder", "keyorder-system"
KUBERNETES_VERSIONS = ["1.29", major_minor(latest_version())]
"""The oldest Kubernetes the chart supports (Chart.yaml kubeVersion; CEL rules with fieldPath) and
the newest kubernetes-validate knows."""

VALUES_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"operator": {"watchNamespaces": ["team-a", "team-b"]}},
    "namespaced-strict": {"operator": {"watchNamespaces": ["team-a"]}, "rbac": {"discovery": False}},
    "monitoring": {
        "monitoring": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True, "additionalAlertLabels": {"team": "payments"}},
            "dashboard": {"enabled": True, "namespace": "grafana"},
        }
    },
    "monitoring-namespaced": {
        "operator": {"watchNamespaces": ["team-a"]},
        "monitoring": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    },
    "peering": {"replicaCount": 2, "peering": {"enabled": True}},
    "peering-namespaced": {
        "replicaCount": 2,
        "peering": {"enabled": True},
        "operator": {"watchNamespaces": ["team-a", "team-b"]},
    },
    "custom-image": {
        "fullnameOverride": "ko",
        "image": {"repository": "registry.example/keyorder", "digest": "sha256:" + "ab" * 32, "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccount": {"name": "ops-operator", "annotations": {"example.com/role": "keyorder"}},
        "operator": {"env": {"TZ": "UTC"}, "extraArgs": ["--tick=2"], "metricsPort": 9100, "healthPort": 9101},
        "service": {"port": 9100},
        "podAnnotations": {"example.com/team": "payments"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
    },
    "customised": {
        "commonLabels": {"team": "payments", "cost-center": "42"},
        "replicaCount": 2,
        "peering": {"enabled": True},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"},
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "keyorder-operator"}},
            },
        ],
        "extraVolumes": [{"name": "kafka-ca", "configMap": {"name": "kafka-ca"}}],
        "extraVolumeMounts": [{"name": "kafka-ca", "mountPath": "/etc/kafka-ca", "readOnly": True}],
        "operator": {
            "logFormat": "json",
            "extraEnv": [
                {"name": "HTTPS_PROXY", "valueFrom": {"secretKeyRef": {"name": "proxy", "key": "url"}}},
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "TZ", "value": "UTC"},
            ],
        },
    },
    "minimal": {
        "rbac": {"create": False},
        "serviceAccount": {"create": False, "name": "existing"},
        "tests": {"enabled": False},
    },
}
"""Values sets rendered, linted and validated by the tests (each one a realistic install)."""


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every manifest of a render (NOTES.txt excluded), in template order."""
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


@pytest.fixture(scope="session")
def chart() -> Iterator[Any]:
    import helm_python

    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def renders(chart: Any) -> dict[str, dict[str, str]]:
    """Values-set name -> rendered templates (path -> text)."""
    return {name: chart.render(values, name=RELEASE, namespace=NAMESPACE) for name, values in VALUES_SETS.items()}


@pytest.fixture(scope="session")
def manifests(renders: dict[str, dict[str, str]]) -> dict[str, list[dict[str, Any]]]:
    return {name: documents(rendered) for name, rendered in renders.items()}


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)]
