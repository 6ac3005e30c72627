"""The OrderedConsumer CustomResourceDefinition, generated from the pydantic spec models.

One schema source: the models validate resources in the operator, and this module turns their
JSON Schema into the CRD's structural ``openAPIV3Schema`` ($refs inlined, titles dropped,
exclusive bounds in OpenAPI v3 form) and adds what JSON Schema cannot say:

* ``Optional`` fields are simply optional, never ``nullable``: the API server prunes a ``null``
  of a non-nullable field before defaulting, so ``max: null`` means "unset", as ``None`` does in
  the models, and CEL rules only ever see absent or typed values.
* Nested objects whose model field has a ``default_factory`` get ``default: {}``, so the API
  server fills in their own defaults too (and the scale subresource always finds
  ``spec.replicas.min``).
* The models' cross-field ``model_validator`` rules are restated as ``x-kubernetes-validations``
  (``VALIDATIONS``, kept to simple comparisons; tests evaluate them against the models' verdicts).
* The ``status`` and ``scale`` subresources and the printer columns.

``keyorder crd`` prints it; a test fails when ``crds/`` (or the chart's copy) drifts from the models.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

from keyorder_operator.spec import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAME,
    VERSION,
    OrderedConsumerSpec,
    ReplicasSpec,
    WorkersSpec,
)

KEEP = {
    "type",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "items",
    "properties",
    "required",
    "additionalProperties",
}

VALIDATIONS: dict[type[BaseModel], list[dict[str, str]]] = {
    WorkersSpec: [
        {"rule": "self.min <= self.initial && self.initial <= self.max", "message": "need min <= initial <= max"}
    ],
    ReplicasSpec: [{"rule": "!has(self.max) || self.min <= self.max", "message": "min must be <= max"}],
    OrderedConsumerSpec: [
        {
            "rule": "!(has(self.replicas) && has(self.replicas.min) && self.replicas.min == 0) || "
            "(has(self.scaling) && has(self.scaling.scaleToZero) && self.scaling.scaleToZero)",
            "message": "replicas.min 0 needs scaling.scaleToZero: true",
            "fieldPath": ".replicas.min",
        }
    ],
}
"""CEL restatements of the models' ``model_validator`` rules (a test checks every validator has one)."""

FALLBACK_DESCRIPTIONS = {
    "spec.kafka": "Where to consume from: brokers, topics and the consumer group.",
    "spec.handler": "The consumer pods: image, handler function, environment and resources.",
    "spec.workers": "Key workers per pod; the operator grows them live once pods reach the partition count.",
    "spec.replicas": "Pods of the consumer group; `kubectl scale` sets replicas.min.",
    "spec.scaling": "The lag-driven autoscaler.",
    "spec.retry": "Handler retries and what happens after the last attempt.",
    "spec.catchup": "Spark catch-up of a backlog too large for the pods to drain in time.",
    "spec.handler.env[]": "An environment variable.",
    "spec.kafka.topics[]": "A topic name.",
    "spec.scaling.scaleUpPolicies[]": "At most `value` pods (or percent of the pods) added per `periodSeconds`.",
    "spec.scaling.scaleDownPolicies[]": "At most `value` pods (or percent of the pods) removed per `periodSeconds`.",
}
"""Descriptions for fields whose model gives none (a test fails on an unused entry or a field without one)."""

SCALE = {"specReplicasPath": ".spec.replicas.min", "statusReplicasPath": ".status.replicas"}
"""``kubectl scale okc NAME --replicas=N`` sets the autoscaler's floor (the exact size with
scaling disabled); the operator reports its decided size. No ``labelSelectorPath``: an HPA on
top of the operator's own autoscaler would fight it."""


def _structural(node: Any, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = definitions[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**target, **node}
    if "anyOf" in node:
        options = [option for option in node.pop("anyOf") if option.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {len(options)} types structurally")
        node = {**_structural(options[0], definitions), **node}
    if "exclusiveMinimum" in node:
        node["minimum"] = node.pop("exclusiveMinimum")
        node["exclusiveMinimum"] = True
    if "default" in node and node["default"] is None:
        del node["default"]  # absent means unset
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]  # structural schemas prune unknown fields instead
    result = {
        key: _structural(value, definitions) for key, value in node.items() if key in KEEP or key == "exclusiveMinimum"
    }
    if "properties" in result:
        result["properties"] = {name: _structural(value, definitions) for name, value in node["properties"].items()}
        result.setdefault("type", "object")
    if result.get("type") == "object" and "additionalProperties" in result:
        result["additionalProperties"] = _structural(node["additionalProperties"], definitions)
    return result


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model class inside ``annotation`` (``X``, ``X | None``, ``list[X]``), and whether it is a list."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return _model_of(options[0]) if len(options) == 1 else (None, False)
    if origin is list:
        model, _ = _model_of(typing.get_args(annotation)[0])
        return model, True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _annotate(model: type[BaseModel], node: dict[str, Any], path: str, used: set[str]) -> None:
    """Add what the JSON Schema lacks, walking the models and the schema together."""
    if model in VALIDATIONS:
        node["x-kubernetes-validations"] = [dict(rule) for rule in VALIDATIONS[model]]
    for name, field in model.model_fields.items():
        alias = field.alias or name
        child = node["properties"][alias]
        child_path = f"{path}.{alias}"
        if "description" not in child and child_path in FALLBACK_DESCRIPTIONS:
            child["description"] = FALLBACK_DESCRIPTIONS[child_path]
            used.add(child_path)
        sub_model, is_list = _model_of(field.annotation)
        if is_list:
            item_path = f"{child_path}[]"
            if "description" not in child["items"] and item_path in FALLBACK_DESCRIPTIONS:
                child["items"]["description"] = FALLBACK_DESCRIPTIONS[item_path]
                used.add(item_path)
        if sub_model is None:
            continue
        if field.default_factory is not None and not is_list:
            child["default"] = {}
        _annotate(
            sub_model, child["items"] if is_list else child, child_path if not is_list else f"{child_path}[]", used
        )


def spec_schema(used_fallbacks: set[str] | None = None) -> dict[str, Any]:
    schema = OrderedConsumerSpec.model_json_schema(by_alias=True, mode="validation")
    definitions = schema.pop("$defs", {})
    result = _structural(schema, definitions)
    _annotate(OrderedConsumerSpec, result, "spec", used_fallbacks if used_fallbacks is not None else set())
    return result


PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Lag", "type": "integer", "jsonPath": ".status.lag"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Workers", "type": "integer", "jsonPath": ".status.workersPerPod"},
    {
        "name": "Drain ETA",
        "type": "integer",
        "jsonPath": ".status.drainEtaSeconds",
        "description": "Projected seconds to drain the backlog at the current pace",
    },
    {
        "name": "Catch-up",
        "type": "string",
        "jsonPath": ".status.catchup.phase",
        "priority": 1,
        "description": "Phase of a Spark catch-up hand-over in progress (StoppingPods, Running)",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": [SHORT_NAME],
                "categories": ["keyorder"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": dict(SCALE)},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "Key-ordered Kafka consumers that autoscale past the partition count.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema(),
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    import yaml

    header = "# Generated from keyorder_operator.spec by `keyorder crd`; do not edit (a test checks for drift).\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=120)
