"""Alerts and the Grafana dashboard only name metrics that exist, and show what an SRE needs.

Metric names come from the code: the pods' from the table in docs/metrics.md (which
tests/unit/test_docs.py checks against the collector), the operator's from ``OperatorMetrics``'
registry.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from keyorder_operator.operator_metrics import OperatorMetrics
from tests.packaging.conftest import CHART, ROOT, find

NAME = re.compile(r"\bkeyorder_[a-z_]+\b")
DASHBOARD = json.loads((CHART / "dashboards" / "keyorder.json").read_text())


def existing_metrics() -> set[str]:
    """Every series name Prometheus will see: documented pod metrics, operator metrics, histogram series."""
    table = re.findall(r"^\| `(keyorder_[a-z_]+)` \| (\w+) \|", (ROOT / "docs" / "metrics.md").read_text(), re.M)
    names = set()
    for name, kind in table:
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    for family in OperatorMetrics().registry.collect():
        names |= {f"{family.name}_total" if family.type == "counter" else family.name}
    return names


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]]


def test_metric_sources_are_read():
    names = existing_metrics()
    assert {
        "keyorder_partition_lag_messages",
        "keyorder_processing_latency_seconds_bucket",
        "keyorder_operator_decisions_total",
        "keyorder_operator_replicas",
    } <= names


def test_alerts_name_only_existing_metrics(manifests):
    (rule,) = find(manifests["monitoring"], "PrometheusRule")
    text = json.dumps(rule["spec"])
    used = set(NAME.findall(text))
    assert used, "no metric found in the alerts"
    assert used - existing_metrics() == set()


def test_dashboard_names_only_existing_metrics():
    used = set(NAME.findall("\n".join(dashboard_exprs())))
    assert used - existing_metrics() == set()
    # and it uses both sides: the operator's view and the pods'
    assert any(name.startswith("keyorder_operator_") for name in used)
    assert any(not name.startswith("keyorder_operator_") for name in used)


@pytest.mark.parametrize(
    ("topic", "metric"),
    [
        ("lag", "keyorder_operator_observed_lag_messages"),
        ("throughput", "keyorder_messages_processed_total"),
        ("replicas", "keyorder_operator_replicas"),
        ("workers", "keyorder_operator_workers_per_pod"),
        ("min-offset age", "keyorder_partition_oldest_inflight_age_seconds"),
        ("decisions", "keyorder_operator_decisions_total"),
    ],
)
def test_dashboard_shows(topic, metric):
    panels = [panel for panel in DASHBOARD["panels"] if topic in panel["title"].lower()]
    assert panels, f"no panel titled with {topic!r}"
    assert any(metric in target["expr"] for panel in panels for target in panel["targets"])


def test_dashboard_is_well_formed():
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    variables = {variable["name"] for variable in DASHBOARD["templating"]["list"]}
    assert variables == {"datasource", "namespace", "name"}
    for panel in DASHBOARD["panels"]:
        position = panel["gridPos"]
        assert position["x"] >= 0 and position["x"] + position["w"] <= 24
        assert panel["datasource"]["uid"] == "${datasource}" and panel["description"]
        for target in panel["targets"]:
            expr: str = target["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
            assert 'namespace=~"$namespace"' in expr and 'name=~"$name"' in expr, expr
            for variable in re.findall(r"\$(\w+)", expr):
                assert variable in variables | {"__rate_interval"}, variable


def test_dashboard_label_is_configurable(chart):
    from tests.packaging.conftest import NAMESPACE, RELEASE, documents

    values: dict[str, Any] = {
        "monitoring": {
            "dashboard": {
                "enabled": True,
                "labels": {"grafana_dashboard": "keyorder"},
                "annotations": {"grafana_folder": "Streaming"},
            }
        }
    }
    (config_map,) = find(
        documents(chart.render(values, name=RELEASE, namespace=NAMESPACE)),
        "ConfigMap",
        f"{RELEASE}-keyorder-operator-dashboard",
    )
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "keyorder"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Streaming"}
    assert config_map["metadata"]["namespace"] == NAMESPACE
