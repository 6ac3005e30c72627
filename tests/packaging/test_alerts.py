"""keyorder's alerts, rendered by the real Helm engine and read by a real PromQL parser.

What an on-call engineer relies on: every expression is valid PromQL (promql-parser, the Rust
parser used by GreptimeDB), every alert links to its own section of docs/troubleshooting.md, and
the thresholds are shaped so that they do not page on a healthy backlog or a new group: growth
only above a minimum lag, a stuck key measured against the pod's own queue, an unknown lag only
for groups whose lag was measured before. (No Prometheus engine runs here, so the firing itself is
not simulated; the structure that makes these properties hold is asserted instead.)
"""

from __future__ import annotations

import re
from typing import Any

import promql_parser
import pytest

from tests.packaging.conftest import NAMESPACE, RELEASE, ROOT, documents, find

TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
EXTERNAL_METRICS = {
    "up": "Prometheus itself, for every scrape target",
    "kube_deployment_status_replicas_unavailable": "kube-state-metrics",
}
"""Series the alerts use that keyorder does not export, and who does."""


def rules(chart: Any, prometheus_rule: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    values = {
        "replicaCount": 2,
        "peering": {"enabled": True},  # so that every alert renders (KeyorderPeeringObjectMissing needs peering)
        "monitoring": {"prometheusRule": {"enabled": True, **(prometheus_rule or {})}},
    }
    (rule,) = find(documents(chart.render(values, name=RELEASE, namespace=NAMESPACE)), "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def selectors(node: Any) -> list[Any]:
    """Every VectorSelector in a parsed expression."""
    if isinstance(node, promql_parser.VectorSelector):
        return [node]
    found = []
    for attribute in ("lhs", "rhs", "expr", "vector_selector", "param"):
        child = getattr(node, attribute, None)
        if child is not None:
            found += selectors(child)
    for child in getattr(node, "args", None) or []:
        found += selectors(child)
    return found


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings (lower case, punctuation dropped, spaces to '-')."""
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M)
    }


def test_every_expression_is_valid_promql_on_known_series(chart):
    for name, alert in rules(chart).items():
        parsed = promql_parser.parse(alert["expr"])
        used = {selector.name for selector in selectors(parsed)}
        assert used, name
        assert all(metric.startswith("keyorder_") or metric in EXTERNAL_METRICS for metric in used), (name, used)


def test_a_broken_expression_is_caught_by_the_parser():
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (namespace (keyorder_workers)")


def test_every_alert_links_to_its_section_of_troubleshooting(chart):
    anchors = github_anchors(TROUBLESHOOTING.read_text())
    for name, alert in rules(chart).items():
        url = alert["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == "docs/troubleshooting.md" and anchor == name.lower(), url
        assert anchor in anchors, f"docs/troubleshooting.md has no section {name}"


def test_the_runbook_base_is_where_the_team_hosts_the_docs(chart):
    base = "https://docs.example.com/keyorder/troubleshooting"
    for name, alert in rules(chart, {"runbookBaseUrl": base}).items():
        assert alert["annotations"]["runbook_url"] == f"{base}#{name.lower()}"


def test_lag_growth_pages_only_above_a_minimum_lag(chart):
    expr = rules(chart, {"lagGrowing": {"minLagMessages": 5000}})["KeyorderLagGrowing"]["expr"]
    parsed = promql_parser.parse(expr)
    assert str(parsed.op) == "and", "growth alone is not enough: a new group's first messages grow the lag too"
    assert "deriv(keyorder_operator_observed_lag_messages" in str(parsed.lhs)
    assert str(parsed.rhs) == "keyorder_operator_observed_lag_messages{} > 5000"


def test_a_stuck_key_is_measured_against_the_pods_own_queue(chart):
    expr = rules(chart, {"stuckKey": {"minSeconds": 120, "queueFactor": 3, "maxSeconds": 7200}})["KeyorderKeyStuck"][
        "expr"
    ]
    parsed = promql_parser.parse(expr)
    assert str(parsed.op) == "or"
    against_queue = str(parsed.lhs)
    assert "clamp_max(120 + 3 * max by (namespace, name, pod)(keyorder_pod_queued_messages{})" in against_queue
    assert "rate(keyorder_partition_completed_messages_total{}[10m])" in against_queue and "7200)" in against_queue
    blocked = str(parsed.rhs)
    assert "> 120" in blocked and "keyorder_partition_min_offset_blocked{}) == 1" in blocked


def test_an_unknown_lag_pages_only_for_groups_measured_before(chart):
    expr = rules(chart, {"lagUnknown": {"measuredWithin": "3d"}})["KeyorderLagUnknown"]["expr"]
    parsed = promql_parser.parse(expr)
    assert str(parsed.op) == "and"
    assert "max_over_time(keyorder_operator_observed_lag_messages{}[3d])" in str(parsed.rhs)


def test_operator_down_watches_the_job_the_service_monitor_scrapes(chart, manifests):
    (service,) = find(manifests["monitoring"], "Service")
    expr = rules(chart)["KeyorderOperatorDown"]["expr"]
    assert expr == f'absent(up{{job="{service["metadata"]["name"]}", namespace="{NAMESPACE}"}} == 1)'
    assert (
        'job="prometheus-operator-keyorder"'
        in rules(chart, {"operatorDown": {"job": "prometheus-operator-keyorder"}})["KeyorderOperatorDown"]["expr"]
    )


def test_pods_not_ready_covers_broker_loss_and_unavailable_replicas_of_keyorder_groups_only(chart):
    parsed = promql_parser.parse(rules(chart)["KeyorderPodsNotReady"]["expr"])
    assert str(parsed.op) == "or"
    assert "keyorder_broker_reachable{} == 0" in str(parsed.lhs)
    replicas = str(parsed.rhs)
    assert "kube_deployment_status_replicas_unavailable" in replicas
    assert "and on (namespace, name) max by (namespace, name)(keyorder_operator_replicas{})" in replicas, (
        "only keyorder's"
    )


def test_new_alerts_can_be_disabled(chart):
    alerts = rules(chart, {"operatorDown": {"enabled": False}, "notReady": {"enabled": False}})
    assert "KeyorderOperatorDown" not in alerts and "KeyorderPodsNotReady" not in alerts


def test_scaling_limited_pages_only_when_behind_the_target(chart):
    parsed = promql_parser.parse(rules(chart)["KeyorderScalingLimited"]["expr"])
    assert str(parsed.op) == "and"
    assert "keyorder_operator_scaling_limited{}) == 1" in str(parsed.lhs)
    behind = str(parsed.rhs)
    assert (
        "keyorder_operator_lag_seconds{}) > max by (namespace, name)(keyorder_operator_target_drain_seconds{})"
        in behind
    )
