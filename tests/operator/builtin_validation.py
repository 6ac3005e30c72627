"""The API server's own validation of a built-in kind, for the emulator: the part the operator can trip.

The API server validates every write of a Deployment with Go code (kubernetes/kubernetes
``pkg/apis/apps/validation/validation.go``, ``ValidateDeployment`` and ``ValidateDeploymentUpdate``), far
more than any schema says: a CRD cannot restate it, so a pod template the OrderedConsumer's CRD and model
accept can still be refused (422 Invalid) when the operator applies its Deployment. This module imitates
one such check, the one a user most easily trips through ``spec.template.metadata.labels``: the pod
template's labels (``ValidatePodTemplateSpecForReplicaSet`` -> core ``ValidatePodTemplateSpec``:
``unversionedvalidation.ValidateLabels(spec.Labels, fldPath.Child("labels"))``, so the field is
``spec.template.labels``), keys and values as k8s.io/apimachinery ``pkg/util/validation/validation.go``
(``IsQualifiedName``, ``IsValidLabelValue``; the words of Kubernetes 1.29, the oldest the CRD supports)
checks them. The rest of Deployment validation (selectors, resources, probes, volumes...) is not imitated.
"""

from __future__ import annotations

import re
from typing import Any

from tests.operator.crd_validation import FieldError

_QUALIFIED_NAME = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME_MESSAGE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)
_LABEL_VALUE = f"({_QUALIFIED_NAME})?"
_LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start "
    "and end with an alphanumeric character"
)
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_DNS1123_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start "
    "and end with an alphanumeric character"
)


def _regex_error(message: str, pattern: str, *examples: str) -> str:
    """apimachinery ``RegexError``."""
    if not examples:
        return f"{message} (regex used for validation is '{pattern}')"
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{pattern}')"


def _max_length_error(length: int) -> str:
    return f"must be no more than {length} characters"


def _matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern, value) is not None


def dns1123_subdomain_problems(value: str) -> list[str]:
    """apimachinery ``IsDNS1123Subdomain``."""
    problems = []
    if len(value) > 253:
        problems.append(_max_length_error(253))
    if not _matches(_DNS1123_SUBDOMAIN, value):
        problems.append(_regex_error(_DNS1123_SUBDOMAIN_MESSAGE, _DNS1123_SUBDOMAIN, "example.com"))
    return problems


def qualified_name_problems(value: str) -> list[str]:
    """apimachinery ``IsQualifiedName`` (a label key: an optional DNS subdomain prefix and ``/``, then a name)."""
    problems: list[str] = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            problems += [f"prefix part {problem}" for problem in dns1123_subdomain_problems(prefix)]
    else:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_NAME_MESSAGE, _QUALIFIED_NAME, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append(f"name part {_max_length_error(63)}")
    if not _matches(_QUALIFIED_NAME, name):
        problems.append(
            "name part " + _regex_error(_QUALIFIED_NAME_MESSAGE, _QUALIFIED_NAME, "MyName", "my.name", "123-abc")
        )
    return problems


def label_value_problems(value: str) -> list[str]:
    """apimachinery ``IsValidLabelValue``."""
    problems = []
    if len(value) > 63:
        problems.append(_max_length_error(63))
    if not _matches(_LABEL_VALUE, value):
        problems.append(_regex_error(_LABEL_VALUE_MESSAGE, _LABEL_VALUE, "MyValue", "my_value", "12345"))
    return problems


def label_errors(labels: Any, path: str) -> list[FieldError]:
    """apimachinery ``pkg/apis/meta/v1/validation/validation.go`` ``ValidateLabels``: every error at the map's own
    path (not the key's), its value the bad key or value."""
    errors = []
    for key, value in (labels or {}).items() if isinstance(labels, dict) else ():
        errors += [FieldError(path, "Invalid value", problem, key, True) for problem in qualified_name_problems(key)]
        errors += [
            FieldError(path, "Invalid value", problem, value, True) for problem in label_value_problems(str(value))
        ]
    return errors


def deployment_errors(deployment: dict[str, Any]) -> list[FieldError]:
    """What the API server's validation of a Deployment refuses, of what this module imitates."""
    template = (deployment.get("spec") or {}).get("template") or {}
    return label_errors((template.get("metadata") or {}).get("labels"), "spec.template.labels")


VALIDATORS = {("apps", "v1", "deployments"): deployment_errors}
"""(group, version, plural) -> the validation of that built-in kind."""
