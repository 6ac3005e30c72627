"""The dashboard's on-call views: lag in seconds, scaling decisions as annotations, a per-pod view;
every expression (panels and annotations) parsed by a real PromQL parser and naming only series
that exist (test_monitoring.existing_metrics: the documented pod metrics and the operator's registry)."""

from __future__ import annotations

from typing import Any

import promql_parser

from tests.packaging.test_alerts import selectors
from tests.packaging.test_monitoring import DASHBOARD, existing_metrics


def panels(title_part: str) -> list[dict[str, Any]]:
    return [panel for panel in DASHBOARD["panels"] if title_part in panel["title"].lower()]


def every_expression() -> list[str]:
    return [target["expr"] for panel in DASHBOARD["panels"] for target in panel["targets"]] + [
        annotation["expr"] for annotation in DASHBOARD["annotations"]["list"]
    ]


def test_every_expression_parses_and_names_existing_series():
    known = existing_metrics()
    for expr in every_expression():
        # Grafana substitutes its variables before Prometheus sees the query
        parsed = promql_parser.parse(expr.replace("$__rate_interval", "1m"))
        names = {selector.name for selector in selectors(parsed)}
        assert names and names <= known, (expr, names - known)


def test_scaling_decisions_and_catchups_are_annotations():
    annotations = {annotation["name"]: annotation for annotation in DASHBOARD["annotations"]["list"]}
    decisions = annotations["Scaling decisions"]
    assert decisions["enable"] is True and decisions["datasource"]["uid"] == "${datasource}"
    assert "increase(keyorder_operator_decisions_total{" in decisions["expr"]
    assert "{{direction}}" in decisions["titleFormat"] and "direction" in decisions["tagKeys"].split(",")
    assert "keyorder_operator_catchups_total" in annotations["Catch-ups"]["expr"]
    for annotation in annotations.values():
        assert 'namespace=~"$namespace"' in annotation["expr"] and 'name=~"$name"' in annotation["expr"]


def test_lag_is_shown_in_seconds_against_its_target():
    (series,) = panels("lag in seconds")
    (stat,) = panels("seconds to drain")
    for panel in (series, stat):
        assert panel["fieldConfig"]["defaults"]["unit"] == "s"
        assert "keyorder_operator_lag_seconds{" in panel["targets"][0]["expr"]
    assert "keyorder_operator_target_drain_seconds{" in series["targets"][1]["expr"], "the ETA against its target"


def test_the_capacity_ceiling_rates_and_limits_are_shown():
    (capacity,) = panels("ceiling")
    exprs = [target["expr"] for target in capacity["targets"]]
    assert "keyorder_operator_workers_per_pod{" in exprs[0] and "keyorder_operator_replicas{" in exprs[0]
    assert "keyorder_operator_ceiling_workers{" in exprs[1]
    (rates,) = panels("arrival and drain")
    assert {"keyorder_operator_arrival_rate", "keyorder_operator_drain_rate"} == {
        selector.name for target in rates["targets"] for selector in selectors(promql_parser.parse(target["expr"]))
    }
    (limited,) = panels("scaling limited")
    assert "by (namespace, name, reason)" in limited["targets"][0]["expr"]
    annotations = {annotation["name"]: annotation for annotation in DASHBOARD["annotations"]["list"]}
    assert "{{reason}}" in annotations["Scaling limited"]["titleFormat"]


def test_the_per_pod_view_splits_by_pod():
    per_pod = panels("per pod:")
    assert len(per_pod) >= 4
    shown = set()
    for panel in per_pod:
        for target in panel["targets"]:
            assert "by (namespace, name, pod)" in target["expr"] and "{{pod}}" in target["legendFormat"]
            shown |= {
                selector.name
                for selector in selectors(promql_parser.parse(target["expr"].replace("$__rate_interval", "1m")))
            }
    assert {
        "keyorder_messages_processed_total",
        "keyorder_workers_busy",
        "keyorder_pod_inflight_messages",
        "keyorder_partitions_assigned",
        "keyorder_broker_reachable",
    } <= shown


def test_panels_do_not_overlap():
    cells: set[tuple[int, int]] = set()
    for panel in DASHBOARD["panels"]:
        position = panel["gridPos"]
        area = {
            (x, y)
            for x in range(position["x"], position["x"] + position["w"])
            for y in range(position["y"], position["y"] + position["h"])
        }
        assert not area & cells, panel["title"]
        cells |= area
