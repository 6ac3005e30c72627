"""What the API server does to a custom resource before storing it, imitated offline for the CRD checks.

The work is done by ``tests/operator/crd_validation.py``, the one implementation the API emulator uses
too: nulls pruned, unknown fields refused (``kubectl``'s default strict field validation; ``metadata``
and ``status`` excepted), defaults applied, the OpenAPI v3 schema checked, and every
``x-kubernetes-validations`` rule evaluated with cel-python (a maintained CEL implementation, not a
subset). This module keeps the shape the packaging tests use: problems as lines of text.
"""

from __future__ import annotations

from typing import Any

from tests.operator import crd_validation
from tests.operator.crd_validation import (
    CelError,
    CelSyntaxError,
    apply_defaults,
    check_cel_syntax,
    drop_nulls,
    strict_copy,
)


def evaluate_cel(rule: str, value: Any, old: Any = None) -> bool:
    """``rule`` applied to ``self = value`` (``oldSelf = old``); raises ``CelError`` where the API server's fails."""
    return crd_validation.evaluate_cel(rule, value, old)


def cel_violations(value: Any, schema: dict[str, Any], path: str = "", old: Any = None) -> list[str]:
    """The ``x-kubernetes-validations`` rules ``value`` fails (errors count as failures), as lines of text."""
    return [str(error) for error in crd_validation.cel_violations(value, schema, old, path, root=not path)]


def admit(resource: dict[str, Any], schema: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """The stored object (or None) and the reasons it was refused, as the API server would decide."""
    try:
        return crd_validation.admit(resource, schema, strict=True), []
    except crd_validation.UnknownFields as unknown:
        return None, [f"{path}: field not declared in schema" for path in unknown.paths]
    except crd_validation.Invalid as invalid:
        return None, [str(error) for error in invalid.errors]


__all__ = [
    "CelError",
    "CelSyntaxError",
    "admit",
    "apply_defaults",
    "cel_violations",
    "check_cel_syntax",
    "drop_nulls",
    "evaluate_cel",
    "strict_copy",
]
