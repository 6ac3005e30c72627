"""What the Kubernetes API server checks when a CustomResourceDefinition is created or updated, for the tests.

``crd_validation`` imitates what the server does to a custom *resource*; this module imitates what it does
to the *definition*, so that a CRD the real server refuses is refused here too (the emulator runs it on
every write of a ``customresourcedefinitions`` object, and the install walkthrough creates the shipped
CRDs through it). Each check follows a file of kubernetes/apiextensions-apiserver (read at commit
1aa2717a552ee6ca1e2a18f1f8ffccde981db923):

* ``pkg/apis/apiextensions/v1/conversion.go``: when every version has the same schema, the v1 object is
  converted with the schema hoisted to ``spec.validation``, which is why the server's paths read
  ``spec.validation.openAPIV3Schema...`` for a one-version CRD (``spec.versions[i].schema...`` otherwise).
* ``pkg/apiserver/schema/validation.go`` (``ValidateStructural``): every node has a ``type`` (unless
  ``x-kubernetes-int-or-string`` or ``x-kubernetes-preserve-unknown-fields``), arrays have ``items``, no
  ``additionalProperties`` at the root, root ``metadata`` restricts only ``name`` and ``generateName``,
  nested value validations (``anyOf``, ``allOf``, ``oneOf``, ``not``) carry no ``type``, ``default``,
  ``description``, ``nullable`` or ``x-kubernetes-*`` extension.
* ``pkg/apis/apiextensions/validation/validation.go``: ``properties`` and ``additionalProperties`` are
  mutually exclusive; ``x-kubernetes-list-type`` is atomic, set or map; a map list has keys, an object
  items schema, scalar key properties, and every key required or defaulted and not nullable; every
  ``x-kubernetes-validations`` entry has a rule, a one-line message (required for a rule on several
  lines), a supported reason and a ``fieldPath`` naming a field of its node
  (``pkg/apiserver/schema/cel/validation.go`` ``ValidFieldPath``), and its rule compiles.
* ``pkg/apiserver/schema/defaulting/validation.go`` (``ValidateDefaults``): every ``default`` is checked
  **as written**, its nested defaults NOT filled in: it must survive pruning unchanged ("must not have
  unknown fields"), pass the node's OpenAPI schema, and pass the CEL rules of the node and of everything
  inside it (``celValidator.Validate(ctx, pth.Child("default"), s, s.Default.Object, s.Default.Object,
  ...)``, then once more with no old object, as ratcheting does). A rule that reads a field the raw
  default lacks fails to evaluate ("no such key"), and that refuses the CRD.

Not imitated: the CEL cost budget and compile-time type checking, ``x-kubernetes-embedded-resource``
metadata coercion, conversion webhooks, and the checks on names, scope and printer columns.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from tests.operator.crd_validation import (
    CelError,
    CelSyntaxError,
    FieldError,
    Invalid,
    cel_violations,
    check_cel_syntax,
    prune,
    schema_errors,
)

_NESTED_FORBIDDEN = {
    "type": ("Forbidden", "must be empty to be structural"),
    "default": ("Forbidden", "must be undefined to be structural"),
    "title": ("Forbidden", "must be empty to be structural"),
    "description": ("Forbidden", "must be empty to be structural"),
    "nullable": ("Forbidden", "must be false to be structural"),
    "additionalProperties": ("Forbidden", "must be undefined to be structural"),
    "x-kubernetes-preserve-unknown-fields": ("Forbidden", "must be false to be structural"),
    "x-kubernetes-embedded-resource": ("Forbidden", "must be false to be structural"),
    "x-kubernetes-int-or-string": ("Forbidden", "must be false to be structural"),
    "x-kubernetes-list-map-keys": ("Forbidden", "must be empty to be structural"),
    "x-kubernetes-list-type": ("Forbidden", "must be undefined to be structural"),
    "x-kubernetes-map-type": ("Forbidden", "must be undefined to be structural"),
    "x-kubernetes-validations": ("Forbidden", "must be empty to be structural"),
}
"""validateNestedValueValidation: what a node under anyOf/allOf/oneOf/not may not say."""

_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def _child(path: str, *parts: str) -> str:
    return ".".join((path, *parts))


def _key(path: str, name: str) -> str:
    return f"{path}.properties[{name}]"


def _structural_errors(node: dict[str, Any], path: str, level: str) -> list[FieldError]:
    """validateStructuralInvariants and the schema checks of ValidateCustomResourceDefinitionOpenAPISchema."""
    errors: list[FieldError] = []
    kind = node.get("type")
    properties = node.get("properties") or {}
    extra = node.get("additionalProperties")
    if kind == "array" and "items" not in node:
        errors.append(FieldError(_child(path, "items"), "Required value", "must be specified"))
    if not kind and not node.get("x-kubernetes-int-or-string") and not node.get("x-kubernetes-preserve-unknown-fields"):
        where = {"root": "at the root", "item": "for specified array items", "field": "for specified object fields"}
        errors.append(FieldError(_child(path, "type"), "Required value", f"must not be empty {where[level]}"))
    if level == "root" and kind and kind != "object":
        errors.append(FieldError(_child(path, "type"), "Invalid value", "must be object at the root", kind, True))
    if extra is not None:
        if level == "root":
            errors.append(FieldError(_child(path, "additionalProperties"), "Forbidden", "must not be used at the root"))
        if properties and (extra is False or isinstance(extra, dict)):
            errors.append(
                FieldError(
                    _child(path, "additionalProperties"),
                    "Forbidden",
                    "additionalProperties and properties are mutual exclusive",
                )
            )
    if node.get("x-kubernetes-int-or-string") and node.get("x-kubernetes-preserve-unknown-fields"):
        errors.append(
            FieldError(
                _child(path, "x-kubernetes-preserve-unknown-fields"),
                "Invalid value",
                "must be false if x-kubernetes-int-or-string is true",
                True,
                True,
            )
        )
    if isinstance(node.get("pattern"), str):
        try:
            re.compile(node["pattern"])
        except re.error as error:
            errors.append(
                FieldError(
                    _child(path, "pattern"),
                    "Invalid value",
                    f"must be a valid regular expression, but isn't: {error}",
                    node["pattern"],
                    True,
                )
            )
    for junctor in ("anyOf", "allOf", "oneOf"):
        for index, nested in enumerate(node.get(junctor) or []):
            if junctor == "anyOf" and node.get("anyOf") == _INT_OR_STRING:
                continue  # the IntOrString exception
            if junctor == "allOf" and index == 0 and (nested.get("anyOf") == _INT_OR_STRING):
                continue
            errors += _nested_errors(nested, f"{path}.{junctor}[{index}]")
    if isinstance(node.get("not"), dict):
        errors += _nested_errors(node["not"], _child(path, "not"))
    if level == "root" and isinstance(properties.get("metadata"), dict):
        metadata = properties["metadata"]
        allowed = {"name", "generateName"}
        rest = {k: v for k, v in metadata.items() if k not in ("type", "properties")}
        if set(metadata.get("properties") or {}) - allowed or rest:
            errors.append(
                FieldError(
                    _key(path, "metadata"),
                    "Forbidden",
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                )
            )
    errors += _list_type_errors(node, path)
    for index, rule in enumerate(node.get("x-kubernetes-validations") or []):
        errors += _rule_errors(rule, node, f"{path}.x-kubernetes-validations[{index}]")
    if isinstance(node.get("items"), dict):
        errors += _structural_errors(node["items"], _child(path, "items"), "item")
    for name, child in properties.items():
        if level == "root" and name == "metadata":
            continue
        errors += _structural_errors(child, _key(path, name), "field")
    if isinstance(extra, dict):
        errors += _structural_errors(extra, _child(path, "additionalProperties"), "field")
    return errors


_REASONS = ("FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired")


def _rule_errors(rule: dict[str, Any], node: dict[str, Any], path: str) -> list[FieldError]:
    """What validation.go checks of one ``x-kubernetes-validations`` entry before compiling it: a rule, a
    one-line message (required when the rule spans lines), a supported reason, a ``fieldPath`` that names a
    field of the node (``cel.ValidFieldPath``); then the rule must compile."""
    text, message = str(rule.get("rule") or "").strip(), rule.get("message")
    errors: list[FieldError] = []
    if not text:
        errors.append(FieldError(_child(path, "rule"), "Required value", "rule is not specified"))
    elif message is not None and not str(message).strip():
        errors.append(
            FieldError(_child(path, "message"), "Invalid value", "must be non-empty if specified", message, True)
        )
    elif message is not None and "\n" in str(message).strip():
        errors.append(
            FieldError(_child(path, "message"), "Invalid value", "must not contain line breaks", message, True)
        )
    elif "\n" in text and not str(message or "").strip():
        errors.append(
            FieldError(
                _child(path, "message"), "Required value", "message must be specified if rule contains line breaks"
            )
        )
    if "reason" in rule and rule["reason"] not in _REASONS:
        supported = ", ".join(f'"{reason}"' for reason in _REASONS)
        errors.append(
            FieldError(
                _child(path, "reason"), "Unsupported value", f"supported values: {supported}", rule["reason"], True
            )
        )
    field_path = rule.get("fieldPath")
    if field_path is not None:
        if not str(field_path).strip():
            errors.append(
                FieldError(
                    _child(path, "fieldPath"), "Invalid value", "must be non-empty if specified", field_path, True
                )
            )
        elif "\n" in str(field_path):
            errors.append(
                FieldError(_child(path, "fieldPath"), "Invalid value", "must not contain line breaks", field_path, True)
            )
        elif not _field_path_valid(node, str(field_path)):
            errors.append(
                FieldError(_child(path, "fieldPath"), "Invalid value", "must be a valid path", field_path, True)
            )
    if text:
        try:
            check_cel_syntax(text)
        except CelSyntaxError as error:
            errors.append(FieldError(_child(path, "rule"), "Invalid value", f"compilation failed: {error}"))
    return errors


_PATH_TOKEN = re.compile(r"\.([^.\[\]]+)|\['((?:[^'\\]|\\.)*)'\]")


def _field_path_valid(node: dict[str, Any], path: str) -> bool:
    """``cel.ValidFieldPath``: ``.name`` and ``['key']`` steps, each through the node's ``properties`` (a map's
    ``additionalProperties`` takes any key); no list indices."""
    position, schema = 0, node
    while position < len(path):
        match = _PATH_TOKEN.match(path, position)
        if match is None:
            return False
        name = match.group(1) if match.group(1) is not None else match.group(2)
        properties = schema.get("properties") or {}
        if match.group(1) is None and not properties and isinstance(schema.get("additionalProperties"), dict):
            schema = schema["additionalProperties"]
        elif name in properties:
            schema = properties[name]
        else:
            return False
        position = match.end()
    return position > 0


def _nested_errors(node: dict[str, Any], path: str) -> list[FieldError]:
    errors = []
    for name, (kind, detail) in _NESTED_FORBIDDEN.items():
        if node.get(name):
            errors.append(FieldError(_child(path, name), kind, detail))
    if "metadata" in (node.get("properties") or {}):
        errors.append(FieldError(_key(path, "metadata"), "Forbidden", "must not be specified in a nested context"))
    for name, child in (node.get("properties") or {}).items():
        errors += _nested_errors(child, _key(path, name))
    if isinstance(node.get("items"), dict):
        errors += _nested_errors(node["items"], _child(path, "items"))
    return errors


def _list_type_errors(node: dict[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    list_type = node.get("x-kubernetes-list-type")
    keys = node.get("x-kubernetes-list-map-keys") or []
    if list_type is not None and list_type not in ("atomic", "set", "map"):
        errors.append(
            FieldError(
                _child(path, "x-kubernetes-list-type"),
                "Unsupported value",
                'supported values: "atomic", "set", "map"',
                list_type,
                True,
            )
        )
    if keys and list_type != "map":
        errors.append(
            FieldError(
                _child(path, "x-kubernetes-list-type"),
                "Required value" if list_type is None else "Invalid value",
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )
        )
    if list_type != "map":
        return errors
    if not keys:
        errors.append(
            FieldError(
                _child(path, "x-kubernetes-list-map-keys"),
                "Required value",
                "must not be empty if x-kubernetes-list-type is map",
            )
        )
    items = node.get("items")
    if not isinstance(items, dict):
        errors.append(
            FieldError(_child(path, "items"), "Required value", "must have a schema if x-kubernetes-list-type is map")
        )
        return errors
    if items.get("type") != "object":
        errors.append(
            FieldError(
                _child(path, "items", "type"),
                "Invalid value",
                "must be object if parent array's x-kubernetes-list-type is map",
                items.get("type"),
                True,
            )
        )
        return errors
    item_properties = items.get("properties") or {}
    required = set(items.get("required") or [])
    if len(set(keys)) != len(keys):
        errors.append(
            FieldError(
                _child(path, "x-kubernetes-list-map-keys"), "Invalid value", "must not contain duplicate entries"
            )
        )
    for key in keys:
        if key not in item_properties:
            errors.append(
                FieldError(
                    _child(path, "x-kubernetes-list-map-keys"),
                    "Invalid value",
                    "entries must all be names of item properties",
                )
            )
            continue
        key_schema = item_properties[key]
        key_path = _key(_child(path, "items"), key)
        if key_schema.get("type") in ("array", "object"):
            errors.append(
                FieldError(
                    _child(key_path, "type"),
                    "Invalid value",
                    "must be a scalar type if parent array's x-kubernetes-list-type is map",
                )
            )
        if key not in required and "default" not in key_schema:
            errors.append(
                FieldError(
                    _child(key_path, "default"),
                    "Required value",
                    "this property is in x-kubernetes-list-map-keys, so it must have a default or be a "
                    "required property",
                )
            )
        if key_schema.get("nullable"):
            errors.append(
                FieldError(
                    _child(key_path, "nullable"),
                    "Forbidden",
                    "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
                )
            )
    return errors


def _default_errors(node: dict[str, Any], path: str, root: bool = True) -> list[FieldError]:
    """ValidateDefaults: each default as written (nested defaults not filled in), then the nodes below."""
    errors: list[FieldError] = []
    if "default" in node:
        where = _child(path, "default")
        value = node["default"]
        unknown: list[str] = []
        if prune(copy.deepcopy(value), node, "", unknown) != value or unknown:
            errors.append(FieldError(where, "Invalid value", "must not have unknown fields", value, True))
        found = schema_errors(value, node, where)
        if found:
            errors += found
        else:
            try:
                # with the default as its own old value (transition rules run), then with none (as ratcheting adds)
                errors += cel_violations(value, node, value, where, root=False)
                errors += [e for e in cel_violations(value, node, None, where, root=False) if e not in errors]
            except CelError as error:  # pragma: no cover - cel_violations reports evaluation errors as violations
                errors.append(FieldError(where, "Invalid value", str(error), value, True))
    if isinstance(node.get("items"), dict):
        errors += _default_errors(node["items"], _child(path, "items"), False)
    for name, child in (node.get("properties") or {}).items():
        if root and name == "metadata":
            continue  # the server's own: ObjectMeta defaults go through its coercion, not imitated here
        errors += _default_errors(child, _key(path, name), False)
    # additionalProperties is not followed: defaults are forbidden there
    return errors


def _schema_paths(crd: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(path prefix, schema) per distinct schema, as the server names them after conversion.go's hoisting."""
    versions = crd.get("spec", {}).get("versions") or []
    schemas = [((v.get("schema") or {}).get("openAPIV3Schema")) for v in versions]
    if schemas and all(schema == schemas[0] for schema in schemas) and schemas[0] is not None:
        return [("spec.validation.openAPIV3Schema", schemas[0])]
    return [
        (f"spec.versions[{index}].schema.openAPIV3Schema", schema)
        for index, schema in enumerate(schemas)
        if schema is not None
    ]


def creation_errors(crd: dict[str, Any]) -> list[FieldError]:
    """Every reason the API server refuses ``crd`` at creation (or update), worded as the server words it."""
    errors: list[FieldError] = []
    versions = crd.get("spec", {}).get("versions") or []
    for index, version in enumerate(versions):
        if version.get("served", True) and not (version.get("schema") or {}).get("openAPIV3Schema"):
            errors.append(
                FieldError(
                    f"spec.versions[{index}].schema.openAPIV3Schema",
                    "Required value",
                    "because otherwise all fields are pruned",
                )
            )
    for path, schema in _schema_paths(crd):
        structural = _structural_errors(schema, path, "root")
        errors += structural
        if not structural:  # validation.go: the defaults are checked only on a structural schema
            errors += _default_errors(schema, path)
    return errors


def check_crd(crd: dict[str, Any]) -> None:
    """Raises ``Invalid`` (worded as the API server's 422) unless the server would create ``crd``."""
    errors = creation_errors(crd)
    if errors:
        name = (crd.get("metadata") or {}).get("name")
        raise Invalid(errors, f'CustomResourceDefinition.apiextensions.k8s.io "{name}"')


__all__ = ["check_crd", "creation_errors"]
