"""Minimal schemas of our own for the Prometheus Operator kinds the chart renders.

kubernetes-validate knows only Kubernetes' built-in kinds, and the monitoring.coreos.com CRDs
are not installable here. These schemas are NOT the Prometheus Operator's: they cover only the
fields the chart uses, with their types, and refuse any other field, so a typo or a misplaced
key still fails a test. Names say so: ``MINIMAL_MONITORING_SCHEMAS``.
"""

from __future__ import annotations

from typing import Any

DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["matchLabels"],
    "properties": {"matchLabels": STRING_MAP},
}
NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
    "properties": {
        "any": {"type": "boolean"},
        "matchNames": {"type": "array", "minItems": 1, "items": {"type": "string"}},
    },
}
RELABELING = {
    "type": "object",
    "additionalProperties": False,
    "required": ["targetLabel"],
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
        "targetLabel": {"type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
    },
}
ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "path": {"type": "string", "pattern": "^/"},
        "interval": DURATION,
        "scrapeTimeout": DURATION,
        "honorLabels": {"type": "boolean"},
        "relabelings": {"type": "array", "items": RELABELING},
    },
}
METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {
        "name": {"type": "string", "maxLength": 63},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}


def _kind(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
    }


RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["alert", "expr"],
    "properties": {
        "alert": {"type": "string", "pattern": "^[A-Z][A-Za-z0-9]*$"},
        "expr": {"type": "string", "minLength": 1},
        "for": DURATION,
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}

MINIMAL_MONITORING_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _kind(
        "ServiceMonitor",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": LABEL_SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "endpoints": {"type": "array", "minItems": 1, "items": ENDPOINT},
            },
        },
    ),
    "PodMonitor": _kind(
        "PodMonitor",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "podMetricsEndpoints"],
            "properties": {
                "selector": LABEL_SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": ENDPOINT},
            },
        },
    ),
    "PrometheusRule": _kind(
        "PrometheusRule",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string"},
                            "rules": {"type": "array", "minItems": 1, "items": RULE},
                        },
                    },
                }
            },
        },
    ),
}
