"""The Kubernetes types the OrderedConsumer's pod template embeds, as structural CRD schemas.

The pod template (``spec.template``, ``spec.handler.env[].valueFrom``, ``envFrom``,
``volumeMounts``) carries real Kubernetes types: tolerations, affinity, volumes... Their CRD
schema must be the real one, not ``x-kubernetes-preserve-unknown-fields``, so the API server
checks them when a resource is applied. ``kubernetes-validate`` bundles the Kubernetes API's
JSON schemas; this module inlines the needed ones (``$ref`` resolved), in the structural form a
CRD requires (no ``null`` types, int-or-string instead of ``oneOf``, only schema keywords a CRD
accepts) and writes them to ``operator/keyorder_operator/kubernetes_types.json``, which
``keyorder crd`` reads (the operator's image does not need kubernetes-validate). The schemas are
those of the oldest Kubernetes the CRD supports, so every field in them exists on every
supported cluster. Regenerate after changing ``TYPES`` or ``KUBERNETES_VERSION``:

    .venv/bin/python -m tools.kubernetes_types

and a test fails when the committed file differs from what this module writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "operator" / "keyorder_operator" / "kubernetes_types.json"
KUBERNETES_VERSION = "1.29.0"
"""The oldest Kubernetes the CRD supports (docs/install.md): its schemas are valid on every newer one."""
TYPES = (
    "EnvVarSource",
    "EnvFromSource",
    "VolumeMount",
    "Volume",
    "Toleration",
    "Affinity",
    "TopologySpreadConstraint",
    "LocalObjectReference",
)
"""``io.k8s.api.core.v1`` types referenced by the spec models (``spec.kubernetes_type``)."""

KEEP = {
    "description",
    "type",
    "format",
    "enum",
    "items",
    "properties",
    "required",
    "additionalProperties",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
}


def _definitions() -> dict[str, Any]:
    import kubernetes_validate

    path = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{KUBERNETES_VERSION}-local"
        / "_definitions.json"
    )
    return json.loads(path.read_text())["$defs"]


def _int_or_string(node: dict[str, Any]) -> bool:
    kinds = set()
    for option in node.get("oneOf", []):
        kind = option.get("type")
        kinds |= set(kind) if isinstance(kind, list) else {kind}
    return kinds - {"null"} in ({"string", "integer"}, {"string", "number"})


def structural(node: Any, definitions: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """``node`` with every ``$ref`` inlined, in the structural form CRD schemas require."""
    if isinstance(node, list):
        return [structural(item, definitions, seen) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            raise ValueError(f"recursive type {name}: a CRD schema cannot express it")
        target = structural(definitions[name], definitions, (*seen, name))
        rest = structural({key: value for key, value in node.items() if key != "$ref"}, definitions, seen)
        return {**target, **rest}
    if _int_or_string(node):
        result = {"x-kubernetes-int-or-string": True}
        if "description" in node:
            result["description"] = node["description"]
        return result
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key not in KEEP:
            continue
        if key == "type":
            kinds = [kind for kind in (value if isinstance(value, list) else [value]) if kind != "null"]
            if len(kinds) != 1:
                raise ValueError(f"cannot express the union type {value} structurally")
            result["type"] = kinds[0]
        elif key == "enum":
            result["enum"] = [item for item in value if item is not None]
        elif key == "properties":
            result["properties"] = {name: structural(child, definitions, seen) for name, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            result[key] = structural(value, definitions, seen)
        else:
            result[key] = value
    if "properties" in result:
        result.setdefault("type", "object")
    return result


def generate() -> str:
    definitions = _definitions()
    types = {name: structural(definitions[f"io.k8s.api.core.v1.{name}"], definitions) for name in TYPES}
    document = {"kubernetesVersion": KUBERNETES_VERSION, "types": types}
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def main() -> int:
    OUTPUT.write_text(generate())
    print(f"updated {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
