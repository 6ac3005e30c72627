"""What the API server does to a custom resource before storing it, imitated offline for tests.

No offline tool evaluates a CRD's CEL rules or applies its defaults, so this module does the
small part keyorder relies on, in the API server's order:

1. unknown fields are rejected (``kubectl``'s default strict field validation): every object
   schema gets ``additionalProperties: false`` in a copy, except ``metadata`` and ``status``;
2. ``null`` values of non-nullable fields are dropped (the API server prunes them);
3. defaults are applied, recursively (a defaulted ``{}`` then gets its own fields' defaults);
4. the OpenAPI v3 schema is checked (openapi-schema-validator's ``OAS30Validator``);
5. the ``x-kubernetes-validations`` rules are evaluated by ``evaluate_cel``, a checker for the
   few simple forms the CRD uses (field paths, ``has()``, ``size()`` of a string, a string's
   ``.matches('regex')``, comparisons, ``!``, ``&&``, ``||``, integer, boolean and single-quoted
   string literals). Anything else is a ``CelUnsupported`` error, which keeps the
   rules simple.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from openapi_schema_validator import OAS30Validator

# ---------------------------------------------------------------- CEL (the simple subset)


class CelError(Exception):
    """A rule failed to evaluate (e.g. a missing field without ``has()``): the API server rejects."""


class CelUnsupported(Exception):
    """The rule uses CEL beyond the simple subset this checker (and the project) allows."""


_TOKEN = re.compile(
    r"\s*(?:(\d+)|(true|false)\b|(has|size)\b|([A-Za-z_]\w*)|(<=|>=|==|!=|&&|\|\||[<>!().,])|'([^'\\]*)')"
)


def _tokens(rule: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(rule.rstrip()):
        match = _TOKEN.match(rule, position)
        if not match:
            raise CelUnsupported(f"cannot read {rule[position:]!r} in {rule!r}")
        index = next(i for i, group in enumerate(match.groups()) if group is not None)
        kind = ("int", "bool", "function", "ident", "op", "string")[index]
        tokens.append((kind, match.group(index + 1)))
        position = match.end()
    return tokens


class _Parser:
    """Recursive descent over the subset; returns closures ``f(self_value) -> value``."""

    def __init__(self, rule: str) -> None:
        self.rule = rule
        self.tokens = _tokens(rule)
        self.index = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str]:
        token = self.peek()
        if token is None or (value is not None and token[1] != value):
            raise CelUnsupported(f"expected {value or 'more'} at token {self.index} of {self.rule!r}")
        self.index += 1
        return token

    def parse(self):
        expression = self.disjunction()
        if self.peek() is not None:
            raise CelUnsupported(f"unexpected {self.peek()[1]!r} in {self.rule!r}")
        return expression

    def disjunction(self):
        parts = [self.conjunction()]
        while self.peek() == ("op", "||"):
            self.take()
            parts.append(self.conjunction())
        if len(parts) == 1:
            return parts[0]

        def either(value):  # CEL's || is commutative over errors: true wins
            results = [_attempt(part, value) for part in parts]
            if any(result is True for result in results):
                return True
            _raise_first(results)
            return False

        return either

    def conjunction(self):
        parts = [self.negation()]
        while self.peek() == ("op", "&&"):
            self.take()
            parts.append(self.negation())
        if len(parts) == 1:
            return parts[0]

        def both(value):  # false wins over errors
            results = [_attempt(part, value) for part in parts]
            if any(result is False for result in results):
                return False
            _raise_first(results)
            return True

        return both

    def negation(self):
        if self.peek() == ("op", "!"):
            self.take()
            inner = self.negation()
            return lambda value: not _boolean(inner(value))
        return self.comparison()

    def comparison(self):
        left = self.primary()
        token = self.peek()
        if token and token[1] in ("<=", ">=", "<", ">", "==", "!="):
            self.take()
            right = self.primary()
            operator = {
                "<=": lambda a, b: a <= b,
                ">=": lambda a, b: a >= b,
                "<": lambda a, b: a < b,
                ">": lambda a, b: a > b,
                "==": lambda a, b: a == b,
                "!=": lambda a, b: a != b,
            }[token[1]]

            def compare(value):
                a, b = left(value), right(value)
                if type(a) is not type(b):
                    raise CelError(f"no such overload: {type(a).__name__} {token[1]} {type(b).__name__}")
                return operator(a, b)

            return compare
        return left

    def primary(self):
        kind, text = self.take()
        if text == "(":
            inner = self.disjunction()
            self.take(")")
            return inner
        if kind == "int":
            return lambda value: int(text)
        if kind == "bool":
            return lambda value: text == "true"
        if kind == "string":
            return lambda value: text
        if kind == "function" and text == "size":
            self.take("(")
            path = self.path()
            self.take(")")

            def size(value):
                selected = _select(value, path)
                if not isinstance(selected, str | list | dict):
                    raise CelError(f"no such overload: size({type(selected).__name__})")
                return len(selected)

            return size
        if kind == "function":
            self.take("(")
            path = self.path()
            self.take(")")
            if len(path) < 2:
                raise CelUnsupported(f"has() needs a field selection in {self.rule!r}")

            def has(value):
                parent = _select(value, path[:-1])
                if not isinstance(parent, dict):
                    raise CelError(f"has() on a non-object at {'.'.join(path[:-1])}")
                return path[-1] in parent

            return has
        if kind == "ident":
            self.index -= 1
            path = self.path()
            if path[-1] == "matches":  # self.a.matches('regex'): RE2 full-string search, as CEL's
                self.take("(")
                kind, pattern = self.take()
                if kind != "string":
                    raise CelUnsupported(f"matches() needs a string literal in {self.rule!r}")
                self.take(")")

                def matches(value):
                    selected = _select(value, path[:-1])
                    if not isinstance(selected, str):
                        raise CelError(f"no such overload: {type(selected).__name__}.matches")
                    return re.search(pattern, selected) is not None

                return matches
            return lambda value: _select(value, path)
        raise CelUnsupported(f"unexpected {text!r} in {self.rule!r}")

    def path(self) -> list[str]:
        kind, name = self.take()
        if kind != "ident" or name != "self":
            raise CelUnsupported(f"paths must start at self in {self.rule!r}")
        names = [name]
        while self.peek() == ("op", "."):
            self.take()
            kind, field = self.take()
            if kind != "ident":
                raise CelUnsupported(f"bad field name {field!r} in {self.rule!r}")
            names.append(field)
        return names


def _attempt(part, value):
    try:
        return _boolean(part(value))
    except CelError as error:
        return error


def _raise_first(results: list) -> None:
    for result in results:
        if isinstance(result, CelError):
            raise result


def _boolean(result: Any) -> bool:
    if not isinstance(result, bool):
        raise CelError(f"expected a bool, got {result!r}")
    return result


def _select(value: Any, path: list[str]) -> Any:
    for name in path[1:]:
        if not isinstance(value, dict) or name not in value:
            raise CelError(f"no such key: {name}")
        value = value[name]
    return value


def evaluate_cel(rule: str, value: Any) -> bool:
    """``rule`` applied to ``self = value``; raises ``CelError`` when the API server's evaluation would fail."""
    return _boolean(_Parser(rule).parse()(value))


def check_cel_syntax(rule: str) -> None:
    """Raises ``CelUnsupported`` unless ``rule`` is in the simple subset."""
    _Parser(rule).parse()


# ---------------------------------------------------------------- schema operations


def strict_copy(schema: dict[str, Any], skip: tuple[str, ...] = ("metadata", "status")) -> dict[str, Any]:
    """A copy where every object without ``additionalProperties`` rejects unknown fields."""
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


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Fill absent fields that have a ``default``, then recurse (into defaulted objects too)."""
    if isinstance(value, dict):
        result = dict(value)
        for key, child in (schema.get("properties") or {}).items():
            if key not in result and "default" in child:
                result[key] = copy.deepcopy(child["default"])
            if key in result:
                result[key] = apply_defaults(result[key], child)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(item, schema["items"]) for item in value]
    return value


def cel_violations(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Messages of the ``x-kubernetes-validations`` rules ``value`` fails (errors count as failures)."""
    failures = []
    for rule in schema.get("x-kubernetes-validations") or []:
        try:
            ok = evaluate_cel(rule["rule"], value)
        except CelError as error:
            ok, rule = False, {**rule, "message": f"{rule.get('message')} (evaluation error: {error})"}
        if not ok:
            failures.append(f"{path or '.'}{rule.get('fieldPath', '')}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key in value:
                failures += cel_violations(value[key], child, f"{path}.{key}")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            failures += cel_violations(item, schema["items"], f"{path}[{index}]")
    return failures


def admit(resource: dict[str, Any], schema: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """The stored object (or None) and the reasons it was refused, as the API server would decide."""
    resource = apply_defaults(drop_nulls(resource, schema), schema)
    problems = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '.'}: {error.message}"
        for error in OAS30Validator(strict_copy(schema)).iter_errors(resource)
    ]
    if not problems:
        problems = cel_violations(resource, schema)
    return (None if problems else resource), problems
