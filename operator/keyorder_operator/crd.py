"""The OrderedConsumer CustomResourceDefinition, generated from the pydantic spec models.

One schema source: the models validate resources in the operator, and this module turns their
JSON Schema into the CRD's structural ``openAPIV3Schema`` ($refs inlined, ``Optional`` as
``nullable``, titles dropped, exclusive bounds in OpenAPI v3 form). ``keyorder crd`` prints it;
a test fails when ``crds/`` drifts from the models.
"""

from __future__ import annotations

from typing import Any

from keyorder_operator.spec import GROUP, KIND, PLURAL, SHORT_NAME, VERSION, OrderedConsumerSpec

KEEP = {"type", "description", "default", "enum", "minimum", "maximum", "minLength", "maxLength", "pattern",
        "minItems", "maxItems", "items", "properties", "required", "additionalProperties", "nullable"}


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
        node = {**_structural(options[0], definitions), **node, "nullable": True}
    if "exclusiveMinimum" in node:
        node["minimum"] = node.pop("exclusiveMinimum")
        node["exclusiveMinimum"] = True
    if "default" in node and node["default"] is None:
        del node["default"]  # absent means unset; a null default would need its own validation rules
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]  # structural schemas prune unknown fields instead
    result = {key: _structural(value, definitions) for key, value in node.items()
              if key in KEEP or key == "exclusiveMinimum"}
    if "properties" in result:
        result["properties"] = {name: _structural(value, definitions) for name, value in node["properties"].items()}
        result.setdefault("type", "object")
    if result.get("type") == "object" and "additionalProperties" in result:
        result["additionalProperties"] = _structural(node["additionalProperties"], definitions)
    return result


def spec_schema() -> dict[str, Any]:
    schema = OrderedConsumerSpec.model_json_schema(by_alias=True, mode="validation")
    definitions = schema.pop("$defs", {})
    return _structural(schema, definitions)


PRINTER_COLUMNS = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Lag", "type": "integer", "jsonPath": ".status.lag"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Workers", "type": "integer", "jsonPath": ".status.workersPerPod"},
    {"name": "Drain ETA", "type": "integer", "jsonPath": ".status.drainEtaSeconds",
     "description": "Projected seconds to drain the backlog at the current pace"},
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
            "names": {"kind": KIND, "plural": PLURAL, "singular": KIND.lower(), "shortNames": [SHORT_NAME],
                      "categories": ["keyorder"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
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
                }},
            }],
        },
    }


def crd_yaml() -> str:
    import yaml

    header = "# Generated from keyorder_operator.spec by `keyorder crd`; do not edit (a test checks for drift).\n"
    return header + yaml.safe_dump(crd_manifest(), sort_keys=False, width=120)
