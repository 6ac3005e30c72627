"""Creating CustomResourceDefinitions on the API emulator (a FAKE) as a real API server does.

Each test names the file of kubernetes/apiextensions-apiserver (commit 1aa2717a552e) whose behaviour it
checks. Before ``tests/operator/crd_creation.py`` the emulator stored any CRD and these failed: the
shipped CRD of the previous release (``workers`` rule without ``has()``) was accepted, and so were the
broken schemas below. Plain HTTP, no kopf.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from tests.operator.crd_creation import creation_errors
from tests.operator.emulator import CRD_FILE
from tests.operator.harness import ApiError, serve_emulator

pytestmark = pytest.mark.timeout(60)

CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
OLD_WORKERS_RULE = "self.min <= self.initial && self.initial <= self.max"


def shipped() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text())


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def previous_release() -> dict[str, Any]:
    """The CRD as the previous release shipped it: ``spec.workers`` had ``default: {}`` and an unguarded rule."""
    crd = shipped()
    workers = spec_schema(crd)["properties"]["workers"]
    assert workers["default"] == {}
    workers["x-kubernetes-validations"][0]["rule"] = OLD_WORKERS_RULE
    return crd


def widget_crd(spec: dict[str, Any]) -> dict[str, Any]:
    """A small CRD whose ``spec`` node is ``spec`` (served as widgets.example.dev/v1)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.dev"},
        "spec": {
            "group": "example.dev",
            "scope": "Namespaced",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec}}},
                }
            ],
        },
    }


@pytest.fixture
def api():
    with serve_emulator(rbac=False) as running:
        yield running


def refusal(api, crd: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as raised:
        api.create(CRDS, crd, namespace=None)
    assert raised.value.status == 422, raised.value.body
    return raised.value.body["message"]


def test_the_previous_release_crd_is_refused_as_the_api_server_refuses_it(api):
    """defaulting/validation.go ValidateDefaults: ``default: {}`` is checked as written, nested defaults not
    filled in, against the node's CEL rules; reading ``self.min`` of ``{}`` is an evaluation error."""
    message = refusal(api, previous_release())
    assert message.startswith(
        'CustomResourceDefinition.apiextensions.k8s.io "orderedconsumers.keyorder.dev" is invalid'
    )
    # v1/conversion.go hoists one shared schema to spec.validation
    assert "spec.validation.openAPIV3Schema.properties[spec].properties[workers].default: Invalid value" in message


def test_the_shipped_crds_are_created_and_then_served(api, tmp_path):
    """The CRD in crds/ and the chart's copy pass every creation check, and a created CRD is served."""
    chart_copy = CRD_FILE.parents[1] / "charts" / "keyorder-operator" / "crds" / CRD_FILE.name
    assert yaml.safe_load(chart_copy.read_text()) == shipped()
    created = api.create(CRDS, shipped(), namespace=None)
    assert created["metadata"]["name"] == "orderedconsumers.keyorder.dev"
    widget = widget_crd({"type": "object", "properties": {"size": {"type": "integer", "default": 3}}})
    api.create(CRDS, widget, namespace=None)
    stored = api.create("example.dev/v1/widgets", {"metadata": {"name": "w"}, "spec": {}})
    assert stored["spec"] == {"size": 3}, "served with its schema: defaults applied"


def test_a_default_that_fails_its_own_schema_is_refused(api):
    """defaulting/validation.go: ValidateCustomResource(default) against the node's schema, unfilled."""
    spec = {"type": "object", "default": {}, "required": ["size"], "properties": {"size": {"type": "integer"}}}
    assert "spec.validation.openAPIV3Schema.properties[spec].default.size: Required value" in refusal(
        api, widget_crd(spec)
    )


def test_a_default_with_fields_the_schema_would_prune_is_refused(api):
    """defaulting/validation.go (requirePrunedDefaults): a default must survive pruning unchanged."""
    spec = {"type": "object", "default": {"colour": "red"}, "properties": {"size": {"type": "integer"}}}
    assert "properties[spec].default: Invalid value" in refusal(api, widget_crd(spec))
    assert "must not have unknown fields" in refusal(api, widget_crd(spec))


def test_a_guarded_rule_on_a_defaulted_node_is_accepted_and_still_applies(api):
    """The fix's shape: has() guards let the raw default pass; objects are defaulted first, so the rule
    still sees every field and still refuses a bad object."""
    spec = {
        "type": "object",
        "default": {},
        "properties": {"low": {"type": "integer", "default": 1}, "high": {"type": "integer", "default": 5}},
        "x-kubernetes-validations": [{"rule": "!has(self.low) || !has(self.high) || self.low <= self.high"}],
    }
    crd = widget_crd(spec)
    crd["metadata"]["name"] = "gadgets.example.dev"
    crd["spec"]["names"] = {"kind": "Gadget", "plural": "gadgets", "singular": "gadget"}
    api.create(CRDS, crd, namespace=None)
    assert api.create("example.dev/v1/gadgets", {"metadata": {"name": "g"}})["spec"] == {"low": 1, "high": 5}
    with pytest.raises(ApiError) as raised:
        api.create("example.dev/v1/gadgets", {"metadata": {"name": "h"}, "spec": {"low": 9}})
    assert raised.value.status == 422


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # schema/validation.go validateStructuralInvariants
        (
            {"type": "object", "properties": {"size": {}}},
            "properties[size].type: Required value: must not be empty for specified object fields",
        ),
        ({"type": "array"}, "properties[spec].items: Required value: must be specified"),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "anyOf": [{"type": "object"}]},
            "properties[spec].anyOf[0].type: Forbidden: must be empty to be structural",
        ),
        # apiextensions/validation/validation.go ValidateCustomResourceDefinitionOpenAPISchema (and, for
        # fieldPath, pkg/apiserver/schema/cel/validation.go ValidFieldPath)
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}},
            "additionalProperties: Forbidden: additionalProperties and properties are mutual exclusive",
        ),
        (
            {
                "type": "array",
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
            "items.properties[name].default: Required value: this property is in x-kubernetes-list-map-keys, "
            "so it must have a default or be a required property",
        ),
        (
            {
                "type": "array",
                "x-kubernetes-list-map-keys": ["name"],
                "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
            },
            "x-kubernetes-list-type: Required value: must be map if x-kubernetes-list-map-keys is non-empty",
        ),
        (
            {
                "type": "object",
                "x-kubernetes-validations": [{"rule": "self.a >"}],
                "properties": {"a": {"type": "integer"}},
            },
            "x-kubernetes-validations[0].rule: Invalid value",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "x-kubernetes-validations": [{"rule": "self.a > 0", "fieldPath": ".b"}],
            },
            'x-kubernetes-validations[0].fieldPath: Invalid value: ".b": must be a valid path',
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "x-kubernetes-validations": [{"rule": "self.a > 0", "reason": "TooBig"}],
            },
            "x-kubernetes-validations[0].reason: Unsupported value",
        ),
    ],
    ids=[
        "no type",
        "array without items",
        "type under anyOf",
        "properties and a map",
        "map key not required",
        "map keys without map",
        "rule that does not compile",
        "fieldPath naming no field",
        "unsupported reason",
    ],
)
def test_schemas_the_api_server_refuses(api, spec, expected):
    assert expected in refusal(api, widget_crd(spec))


def test_the_creation_check_finds_nothing_else_in_the_shipped_crd():
    """Every creation error, not just the first: the shipped CRD has none, the previous release exactly one."""
    assert creation_errors(shipped()) == []
    errors = creation_errors(previous_release())
    assert [error.path for error in errors] == [
        "spec.validation.openAPIV3Schema.properties[spec].properties[workers].default"
    ]


def test_an_update_of_a_crd_is_checked_too(api):
    """validation.go ValidateCustomResourceDefinitionUpdate runs the same schema checks on an update."""
    crd = widget_crd({"type": "object", "properties": {"n": {"type": "integer"}}})
    crd["metadata"]["name"] = "gizmos.example.dev"
    crd["spec"]["names"] = {"kind": "Gizmo", "plural": "gizmos", "singular": "gizmo"}
    api.create(CRDS, crd, namespace=None)
    broken = copy.deepcopy(crd)
    broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["n"] = {}
    with pytest.raises(ApiError) as raised:
        api.patch(CRDS, "gizmos.example.dev", {"spec": broken["spec"]}, namespace=None)
    assert raised.value.status == 422
