"""What the Kubernetes API server does to a custom resource before it stores it, for the tests.

One implementation for both places that need it: the API emulator (``emulator.Emulator``, which refuses
and defaults OrderedConsumers as a real API server does) and the offline CRD checks
(``tests/packaging/apiserver.py``). In the API server's order
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/):

1. ``null`` values of fields that are not ``nullable`` are dropped ("Defaulting and Nullable");
2. unknown fields are pruned ("Field pruning"), or, with strict field validation (``kubectl``'s
   default, ``?fieldValidation=Strict``), refused;
3. ``default``s are applied, recursively: a defaulted ``{}`` gets its own fields' defaults ("Defaulting");
4. the object is checked against the version's ``openAPIV3Schema`` (openapi-schema-validator's
   ``OAS30Validator``; ``x-kubernetes-int-or-string`` as an integer or a string), and its lists against
   their ``x-kubernetes-list-type`` (``list_type_errors``: a ``set`` item or a ``map`` key given twice is a
   ``Duplicate value``; an update whose old object already broke it is not refused for it);
5. every ``x-kubernetes-validations`` rule is evaluated with **cel-python** (``celpy``, the maintained
   CEL implementation on PyPI), as Kubernetes does ("Validation rules"): ``self`` is the value at the
   rule's node, typed by the schema (``number`` fields as doubles, ``integer`` as ints, objects as maps,
   so ``has(self.x)`` tests presence); at the root, ``self.metadata`` exposes only ``name`` and
   ``generateName``; a rule that refers to ``oldSelf`` is a transition rule, evaluated only on an update
   and only where the old object has a value at the same place; an evaluation error refuses the object;
   ``message``, ``messageExpression``, ``fieldPath`` and ``reason`` shape the error.

Every CEL function the CRD's rules use (``size``, ``has``, ``matches``, comparisons, boolean logic) is
cel-python's own: no extension function was needed. What Kubernetes adds and this does not: its CEL
libraries beyond the standard ones (``isSorted``, ``indexOf``, ``url``, ``quantity``...), compile-time type
checking of the rules against the schema, the rules' cost budget, ``optionalOldSelf``, and ratcheting.

The refusal reads like the API server's: ``OrderedConsumer.keyorder.dev "name" is invalid:
spec.workers.max: Invalid value: 5000: spec.workers.max in body should be less than or equal to 4096``.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import celpy
from celpy import celtypes
from openapi_schema_validator import OAS30Validator

# ---------------------------------------------------------------- CEL (cel-python)


class CelError(Exception):
    """A rule failed to evaluate (e.g. a field read without ``has()``): the API server refuses the object."""


class CelSyntaxError(Exception):
    """A rule is not valid CEL: the API server refuses the CRD itself."""


_ENVIRONMENT = celpy.Environment()
_OLD_SELF = re.compile(r"\boldSelf\b")


@functools.cache
def _program(rule: str) -> celpy.Runner:
    try:
        return _ENVIRONMENT.program(_ENVIRONMENT.compile(rule))
    except celpy.CELParseError as error:
        raise CelSyntaxError(f"{rule!r}: {error}") from error


def check_cel_syntax(rule: str) -> None:
    """Raises ``CelSyntaxError`` unless ``rule`` compiles."""
    _program(rule)


def is_transition_rule(rule: str) -> bool:
    """A rule that refers to ``oldSelf`` (Kubernetes evaluates it only on updates, where an old value exists)."""
    return bool(_OLD_SELF.search(rule))


def to_cel(value: Any, schema: dict[str, Any] | None = None, root: bool = False) -> Any:
    """``value`` as the CEL value Kubernetes binds for a node of ``schema`` (``None`` schema: by JSON type)."""
    schema = schema or {}
    if value is None:
        return None
    if schema.get("x-kubernetes-int-or-string"):
        return celtypes.IntType(value) if isinstance(value, int) and not isinstance(value, bool) else to_cel(value)
    kind = schema.get("type")
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
        items = value.items()
        if root and isinstance(value.get("metadata"), dict):  # only metadata.name and generateName are visible
            visible = {k: v for k, v in value["metadata"].items() if k in ("name", "generateName")}
            items = {**value, "metadata": visible}.items()
        return celtypes.MapType(
            {
                celtypes.StringType(key): to_cel(item, properties.get(key, extra) if schema else None)
                for key, item in items
            }
        )
    if isinstance(value, list):
        items_schema = schema.get("items") if isinstance(schema.get("items"), dict) else None
        return celtypes.ListType([to_cel(item, items_schema) for item in value])
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if kind == "number" and isinstance(value, int | float):
        return celtypes.DoubleType(float(value))
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return celtypes.StringType(value)
    return celpy.json_to_cel(value)


def _run(rule: str, activation: dict[str, Any]) -> Any:
    try:
        result = _program(rule).evaluate(activation)
    except celpy.CELEvalError as error:
        raise CelError(f"{rule!r}: {error.args[0] if error.args else error}") from error
    if isinstance(result, celpy.CELEvalError):
        raise CelError(f"{rule!r}: {result.args[0] if result.args else result}")
    return result


def evaluate_cel(
    rule: str,
    value: Any,
    old: Any = None,
    schema: dict[str, Any] | None = None,
    root: bool = False,
) -> bool:
    """``rule`` with ``self = value`` (and ``oldSelf = old``); ``CelError`` where the API server's evaluation fails."""
    activation = {"self": to_cel(value, schema, root)}
    if old is not None:
        activation["oldSelf"] = to_cel(old, schema, root)
    result = _run(rule, activation)
    if not isinstance(result, celtypes.BoolType):
        raise CelError(f"{rule!r} evaluated to {result!r}, not a bool")
    return bool(result)


# ---------------------------------------------------------------- field errors, as the API server words them


@dataclass(frozen=True)
class FieldError:
    """One ``field.Error`` of the API server: ``<path>: <type>[: <value>]: <detail>``."""

    path: str
    kind: str  # "Invalid value", "Required value", "Unsupported value", "Forbidden", "Duplicate value"
    detail: str
    value: Any = field(default=None, compare=False)
    shows_value: bool = False
    type_error: bool = False
    """A value of the wrong type: the API server then skips the CEL rules (they would see the wrong type)."""

    def __str__(self) -> str:
        shown = f": {_render_value(self.value)}" if self.shows_value else ""
        return f"{self.path}: {self.kind}{shown}" + (f": {self.detail}" if self.detail else "")


def _render_value(value: Any) -> str:
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _path_of(parts: Iterator[Any] | list[Any], prefix: str = "") -> str:
    path = prefix
    for part in parts:
        path = _join(path, part)
    return path


_REASONS = {
    "FieldValueInvalid": "Invalid value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
}


# ---------------------------------------------------------------- the schema operations, in the server's order


def strict_copy(schema: dict[str, Any], skip: tuple[str, ...] = ("metadata", "status")) -> dict[str, Any]:
    """A copy where every object without ``additionalProperties`` rejects unknown fields (strict validation)."""
    result = copy.deepcopy(schema)

    def visit(node: dict[str, Any], name: str | None) -> None:
        if name in skip:
            return
        if (
            node.get("type") == "object"
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for child_name, child in (node.get("properties") or {}).items():
            visit(child, child_name)
        if isinstance(node.get("items"), dict):
            visit(node["items"], None)
        if isinstance(node.get("additionalProperties"), dict):
            visit(node["additionalProperties"], None)

    visit(result, None)
    return result


def _validation_copy(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as OAS30Validator should see it: ``x-kubernetes-int-or-string`` is an integer or a string."""

    def visit(node: Any) -> Any:
        if isinstance(node, dict):
            result = {key: visit(value) for key, value in node.items()}
            if node.get("x-kubernetes-int-or-string"):
                result["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            return result
        if isinstance(node, list):
            return [visit(item) for item in node]
        return node

    return visit(schema)


def drop_nulls(value: Any, schema: dict[str, Any]) -> Any:
    """The API server prunes ``null`` of every field that is not ``nullable``."""
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else {}
        result = {}
        for key, item in value.items():
            child = properties.get(key, extra)
            if item is None and not child.get("nullable"):
                continue
            result[key] = drop_nulls(item, child)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [drop_nulls(item, schema["items"]) for item in value]
    return value


def prune(value: Any, schema: dict[str, Any], path: str = "", pruned: list[str] | None = None) -> Any:
    """``value`` without the fields ``schema`` does not declare (structural pruning); their paths go to ``pruned``.

    The root's ``metadata`` (ObjectMeta, the server's own business), nodes with
    ``x-kubernetes-preserve-unknown-fields`` and maps (``additionalProperties``) keep what they hold."""
    if pruned is None:
        pruned = []
    if isinstance(value, dict):
        if path == "metadata":
            return value
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep_unknown = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or extra is True
        result = {}
        for key, item in value.items():
            if key in properties:
                result[key] = prune(item, properties[key], _join(path, key), pruned)
            elif isinstance(extra, dict):
                result[key] = prune(item, extra, _join(path, key), pruned)
            elif keep_unknown or (not path and key in ("apiVersion", "kind", "metadata")):
                result[key] = item
            else:
                pruned.append(_join(path, key))
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(item, schema["items"], _join(path, index), pruned) for index, item in enumerate(value)]
    return value


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Fill absent fields that have a ``default``, then recurse (into defaulted objects too)."""
    if isinstance(value, dict):
        result = dict(value)
        for key, child in (schema.get("properties") or {}).items():
            if key not in result and "default" in child:
                result[key] = copy.deepcopy(child["default"])
            if key in result:
                result[key] = apply_defaults(result[key], child)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in result:
                if key not in (schema.get("properties") or {}):
                    result[key] = apply_defaults(result[key], extra)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


_VALIDATORS: dict[int, tuple[dict[str, Any], OAS30Validator]] = {}


def _validator(schema: dict[str, Any]) -> OAS30Validator:
    """One validator per schema object (kept alive here, so its id is not reused)."""
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = _VALIDATORS[id(schema)] = (schema, OAS30Validator(_validation_copy(schema)))
    return cached[1]


def schema_errors(value: Any, schema: dict[str, Any], prefix: str = "") -> list[FieldError]:
    """What the OpenAPI v3 schema refuses, worded as the API server words it (paths under ``prefix``)."""
    errors = []
    validator = _validator(schema)
    for error in sorted(validator.iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path]):
        path = _path_of(list(error.absolute_path), prefix)
        where = path or "<nil>"
        keyword, limit, instance = error.validator, error.validator_value, error.instance
        if keyword == "required":
            missing = re.match(r"'([^']+)' is a required property", error.message)
            name = missing.group(1) if missing else str(limit)
            errors.append(FieldError(_join(path, name), "Required value", ""))
        elif keyword == "enum":
            supported = ", ".join(json.dumps(item) for item in limit)
            errors.append(FieldError(where, "Unsupported value", f"supported values: {supported}", instance, True))
        elif keyword == "additionalProperties" and limit is False:
            for extra in re.findall(r"'([^']+)'", error.message.split("(")[-1]):
                errors.append(FieldError(_join(path, extra), "Invalid value", "field not declared in schema"))
        else:
            detail = {
                "type": f"{where} in body must be of type {limit}: {_render_value(instance)}",
                "maximum": f"{where} in body should be less than or equal to {limit}",
                "minimum": f"{where} in body should be greater than or equal to {limit}",
                "minLength": f"{where} in body should be at least {limit} chars long",
                "maxLength": f"{where} in body may not be longer than {limit}",
                "pattern": f"{where} in body should match '{limit}'",
                "minItems": f"{where} in body should have at least {limit} items",
                "maxItems": f"{where} in body should have at most {limit} items",
                "anyOf": f"{where} in body must be of type int-or-string: {_render_value(instance)}",
            }.get(keyword, error.message)
            errors.append(FieldError(where, "Invalid value", detail, instance, True, keyword in ("type", "anyOf")))
    return errors


def _correlated(old: Any, key: str | int, item: Any, schema: dict[str, Any]) -> Any:
    """The old value at the same place (Kubernetes correlates object fields, map keys and map-list items)."""
    if isinstance(old, dict) and isinstance(key, str):
        return old.get(key)
    if isinstance(old, list) and schema.get("x-kubernetes-list-type") == "map" and isinstance(item, dict):
        keys = schema.get("x-kubernetes-list-map-keys") or []
        for candidate in old:
            if isinstance(candidate, dict) and all(candidate.get(k) == item.get(k) for k in keys):
                return candidate
    return None


def cel_violations(
    value: Any, schema: dict[str, Any], old: Any = None, path: str = "", root: bool = True
) -> list[FieldError]:
    """The ``x-kubernetes-validations`` rules ``value`` fails (evaluation errors count as failures), everywhere."""
    failures = []
    for rule in schema.get("x-kubernetes-validations") or []:
        text = rule["rule"]
        if is_transition_rule(text) and old is None:
            continue  # a transition rule: only evaluated where an old value exists
        where = path + rule.get("fieldPath", "") if path else rule.get("fieldPath", "").lstrip(".") or "<nil>"
        try:
            ok = evaluate_cel(text, value, old if is_transition_rule(text) else None, schema, root)
        except CelError as error:
            failures.append(FieldError(where, "Invalid value", str(error), value, True))
            continue
        if ok:
            continue
        message = rule.get("message") or f"failed rule: {text}"
        if rule.get("messageExpression"):
            try:
                activation = {"self": to_cel(value, schema, root)}
                rendered = _run(rule["messageExpression"], activation)
                if isinstance(rendered, celtypes.StringType) and str(rendered).strip():
                    message = str(rendered)
            except CelError:
                pass  # the API server falls back to message, too
        kind = _REASONS.get(rule.get("reason", "FieldValueInvalid"), "Invalid value")
        failures.append(FieldError(where, kind, message, value, kind == "Invalid value"))
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
        for key, item in value.items():
            child = properties.get(key, extra)
            if child is not None:
                failures += cel_violations(item, child, _correlated(old, key, item, schema), _join(path, key), False)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            old_item = _correlated(old, index, item, schema)
            failures += cel_violations(item, schema["items"], old_item, _join(path, index), False)
    return failures


# ---------------------------------------------------------------- list-type uniqueness (x-kubernetes-list-type)


def _go_value(value: Any) -> str:
    """``value`` as Go's ``%#v`` prints a decoded JSON value held in an ``interface{}``."""
    if value is None:
        return "interface {}(nil)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    if isinstance(value, dict):
        fields = ", ".join(f"{json.dumps(key)}:{_go_value(value[key])}" for key in sorted(value))
        return "map[string]interface {}{" + fields + "}"
    if isinstance(value, list):
        return "[]interface {}{" + ", ".join(_go_value(item) for item in value) + "}"
    return str(value)


def _bad_value(value: Any) -> str:
    """A field error's value as ``field.Error.ErrorBody`` prints it up to Kubernetes 1.33 (k8s.io/apimachinery
    ``pkg/util/validation/field/errors.go``: numbers and bools with ``%v``, strings with ``%q``, the rest with
    ``%#v``); from 1.34 the rest is printed as JSON (``{"name":"A"}``)."""
    if isinstance(value, bool | int | float):
        return _go_value(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return _go_value(value)


def _non_unique(items: list[Any]) -> list[int]:
    """The index of each value's second appearance (apiextensions-apiserver ``validateListSet``: compound values
    compared as their JSON, scalars by type and value)."""
    seen: dict[Any, int] = {}
    repeated = []
    for index, item in enumerate(items):
        if isinstance(item, dict | list):
            key: Any = ("compound", json.dumps(item, sort_keys=True, separators=(",", ":")))
        else:
            key = (type(item).__name__, item)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 2:
            repeated.append(index)
    return repeated


_UNSPECIFIED = ("unspecified",)
"""A list-map item without the key (or a null item): equal to every other such item."""


def _list_map_errors(items: list[Any], schema: dict[str, Any], path: str) -> list[FieldError]:
    for index, item in enumerate(items):
        if item is not None and not isinstance(item, dict):
            return [
                FieldError(
                    _join(path, index), "Invalid value", "must be an object for an array of list-type map", item, True
                )
            ]
    if len(items) <= 1:
        return []
    keys = list(schema.get("x-kubernetes-list-map-keys") or [])
    if len(keys) == 1:
        values = [item[keys[0]] if isinstance(item, dict) and keys[0] in item else _UNSPECIFIED for item in items]
        shown = [{} if value == _UNSPECIFIED else {keys[0]: value} for value in values]
    else:
        shown = [{key: item[key] for key in keys if key in item} if isinstance(item, dict) else {} for item in items]
        values = shown
    return [
        FieldError(_join(path, index), "Duplicate value", _bad_value(shown[index])) for index in _non_unique(values)
    ]


def list_type_errors(value: Any, schema: dict[str, Any], path: str = "") -> list[FieldError]:
    """Where ``value`` breaks its lists' ``x-kubernetes-list-type``: an item of a ``set`` or a key of a ``map``
    list given twice (kubernetes/apiextensions-apiserver ``pkg/apiserver/schema/listtype/validation.go``,
    ``ValidateListSetsAndMaps``), worded as the API server words it: ``spec.handler.env[1]: Duplicate value:
    map[string]interface {}{"name":"A"}``. Paths as ``field.Path`` renders them (a map's key as ``[key]``)."""
    errors: list[FieldError] = []
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
        for key, item in value.items():
            if extra is not None:
                errors += list_type_errors(item, extra, f"{path}[{key}]")
            if key in properties:
                errors += list_type_errors(item, properties[key], _join(path, key))
    elif isinstance(value, list):
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set":
            errors += [
                FieldError(_join(path, index), "Duplicate value", _bad_value(value[index]))
                for index in _non_unique(value)
            ]
        elif list_type == "map":
            errors += _list_map_errors(value, schema, path)
        if isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                errors += list_type_errors(item, schema["items"], _join(path, index))
    return errors


# ---------------------------------------------------------------- admission of a whole object


class Invalid(Exception):
    """The object is refused (the API server's 422 Invalid); ``errors`` are its field errors."""

    def __init__(self, errors: list[FieldError], subject: str = "") -> None:
        self.errors = errors
        listed = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
        super().__init__(f"{subject} is invalid: {listed}" if subject else listed)


class UnknownFields(Exception):
    """Strict field validation met fields the schema does not declare (the API server's 400 BadRequest)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        super().__init__("strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in paths))


def admit(
    resource: Any,
    schema: dict[str, Any],
    old: Any = None,
    strict: bool = True,
    pruned: list[str] | None = None,
    path: str = "",
) -> Any:
    """The object the API server would store: nulls dropped, unknown fields pruned (``strict``: refused with
    ``UnknownFields``), defaults applied; refused with ``Invalid`` when the schema or a rule says no.
    ``path``: where ``resource`` sits when it is a part of the object (e.g. ``status``)."""
    resource = drop_nulls(resource, schema)
    unknown: list[str] = []
    resource = prune(resource, schema, path, unknown)
    if unknown and strict:
        raise UnknownFields(unknown)
    if pruned is not None:
        pruned += unknown
    resource = apply_defaults(resource, schema)
    errors = schema_errors(resource, schema, path)
    # an update is refused for its lists only if the old object had none (the API server's ratcheting)
    if old is None or not list_type_errors(old, schema, path):
        errors += list_type_errors(resource, schema, path)
    if not any(error.type_error for error in errors):  # the API server's order: CEL unless a type is wrong
        errors += cel_violations(resource, schema, old, path, root=not path)
    if errors:
        raise Invalid(errors)
    return resource


def _same_but(a: dict[str, Any], b: dict[str, Any], ignored: tuple[str, ...]) -> bool:
    keys = (set(a) | set(b)) - set(ignored)
    return all(a.get(key) == b.get(key) for key in keys)


@dataclass
class CustomResourceSchema:
    """One served version of a CRD, as the emulator uses it."""

    group: str
    version: str
    plural: str
    kind: str
    schema: dict[str, Any]
    subresources: dict[str, Any]

    @classmethod
    def of(cls, manifest: dict[str, Any], version: str | None = None) -> CustomResourceSchema:
        spec = manifest["spec"]
        served = [v for v in spec["versions"] if v.get("served", True)]
        chosen = next(v for v in served if version in (None, v["name"]))
        return cls(
            group=spec["group"],
            version=chosen["name"],
            plural=spec["names"]["plural"],
            kind=spec["names"]["kind"],
            schema=chosen["schema"]["openAPIV3Schema"],
            subresources=chosen.get("subresources") or {},
        )

    def subject(self, name: str | None) -> str:
        return f'{self.kind}.{self.group} "{name}"'

    def admit(
        self,
        resource: dict[str, Any],
        old: dict[str, Any] | None = None,
        strict: bool = False,
        pruned: list[str] | None = None,
    ) -> dict[str, Any]:
        """The object to store (see ``admit``). On an update that changes nothing but ``status`` and
        ``metadata`` only the status is checked: Kubernetes' validation ratcheting (on by default since 1.30)
        does not refuse an update for fields it leaves as they were, and the rest was checked when written."""
        name = (resource.get("metadata") or {}).get("name")
        status_schema = (self.schema.get("properties") or {}).get("status")
        try:
            if old is not None and status_schema is not None and _same_but(resource, old, ("status", "metadata")):
                result = dict(resource)
                if "status" in resource:
                    result["status"] = admit(
                        resource["status"], status_schema, old.get("status"), strict, pruned, path="status"
                    )
                return result
            return admit(resource, self.schema, old, strict=strict, pruned=pruned)
        except Invalid as invalid:
            raise Invalid(invalid.errors, self.subject(name)) from None


__all__ = [
    "CelError",
    "CelSyntaxError",
    "CustomResourceSchema",
    "FieldError",
    "Invalid",
    "UnknownFields",
    "admit",
    "apply_defaults",
    "cel_violations",
    "check_cel_syntax",
    "drop_nulls",
    "evaluate_cel",
    "is_transition_rule",
    "list_type_errors",
    "prune",
    "schema_errors",
    "strict_copy",
    "to_cel",
]
