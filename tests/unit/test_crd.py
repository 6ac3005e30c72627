"""The CRD is generated from the spec models: no drift, structural basics, names from the brief."""

from __future__ import annotations

from pathlib import Path

import yaml

from keyorder_operator.crd import crd_manifest, crd_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_matches_the_models():
    committed = (ROOT / "crds" / "orderedconsumers.keyorder.dev.yaml").read_text()
    assert committed == crd_yaml(), "crds/ is stale: run `make crds`"


def test_names_and_printer_columns():
    spec = crd_manifest()["spec"]
    assert (spec["group"], spec["names"]["kind"], spec["names"]["plural"]) == (
        "keyorder.dev",
        "OrderedConsumer",
        "orderedconsumers",
    )
    assert spec["names"]["shortNames"] == ["okc"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"]["status"] == {}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Ready",
        "Lag",
        "Replicas",
        "Workers",
        "Drain ETA",
        "Catch-up",
        "Age",
    ]


def walk(node, path="spec"):
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")


def test_schema_is_structural():
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in walk(schema):
        assert "type" in node or node.get("x-kubernetes-int-or-string") is True, f"{path} has no type"
        assert not {"$ref", "anyOf", "oneOf", "allOf", "title"} & set(node), f"{path} is not structural"
        assert node.get("additionalProperties") is not False, path
    assert yaml.safe_load(crd_yaml())["kind"] == "CustomResourceDefinition"


def test_committed_kubernetes_types_match_kubernetes_validates_schemas():
    from tools import kubernetes_types

    assert kubernetes_types.OUTPUT.read_text() == kubernetes_types.generate(), (
        "operator/keyorder_operator/kubernetes_types.json is stale: run `make kubernetes-types`"
    )
