"""The API server's permanent refusals of an object the operator applies, and the spec fields they point at.

An apply the API server refuses for what the object *is* (not for the moment it was sent) fails the same
way on every retry: retrying it as a temporary error would go on forever and tell the user nothing. Two
answers are such refusals:

* **422 Invalid**: the object fails the kind's validation (kubernetes/kubernetes ``pkg/apis/apps/validation``
  for a Deployment: a pod-template label the CRD cannot check, say); the Status names each field in
  ``details.causes``;
* **500 "failed to create typed patch object"**: the applied configuration does not fit the kind's schema as
  server-side apply types it, e.g. a keyed list that repeats a key (structured-merge-diff's "duplicate entries
  for key [name=\"A\"]"); the field manager returns a plain error (k8s.io/apimachinery
  ``pkg/util/managedfields/internal/structuredmerge.go``), which the API server answers as a 500 without a
  reason, so the message is the only sign.

Every other failure (conflicts, throttling, timeouts, webhooks, a 500 of another kind) stays temporary.
``spec_field`` names the resource's field the refused object field was built from (builders.py's layout),
so the ``InvalidSpec`` condition points the user at what to change. Pure: no I/O, no kopf.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

TYPED_PATCH_REFUSAL = "failed to create typed patch object"
"""How the API server's field manager words an applied configuration that fails its typed validation."""

_SMD_ERROR = re.compile(r"^\s*(\.[^\s:]*): (.+)$")
"""One error of structured-merge-diff's ``ValidationErrors``: ``<.path>: <message>``."""

_INDEX = re.compile(r"\[[^\]]*\]")

POD_TEMPLATE_FIELDS = (
    "imagePullSecrets",
    "serviceAccountName",
    "nodeSelector",
    "tolerations",
    "affinity",
    "topologySpreadConstraints",
    "priorityClassName",
    "volumes",
)
"""Pod fields that come from ``spec.template.spec`` of the same name (``spec.PodOptions``)."""

DEPLOYMENT_FIELDS = {
    "spec.template.spec.containers[].env": "spec.handler.env",
    "spec.template.spec.containers[].envFrom": "spec.handler.envFrom",
    "spec.template.spec.containers[].volumeMounts": "spec.handler.volumeMounts",
    "spec.template.spec.containers[].resources": "spec.handler.resources",
    "spec.template.spec.containers[].image": "spec.handler.image",
    "spec.template.spec.containers[].ports": "spec.httpPort",
    "spec.template.spec.terminationGracePeriodSeconds": "spec.handler.terminationGracePeriodSeconds",
    "spec.template.labels": "spec.template.metadata.labels",
    "spec.template.annotations": "spec.template.metadata.annotations",
    "spec.template.metadata.labels": "spec.template.metadata.labels",
    "spec.template.metadata.annotations": "spec.template.metadata.annotations",
    **{f"spec.template.spec.{name}": f"spec.template.spec.{name}" for name in POD_TEMPLATE_FIELDS},
}
"""A Deployment's fields (list positions as ``[]``) -> the OrderedConsumer field they are built from
(builders.py: ``build_deployment``, ``_with_template``). Validation errors name a field either way:
``spec.template.labels`` (core validation's path) or ``spec.template.metadata.labels``."""


@dataclass(frozen=True)
class Refusal:
    """A permanent refusal of an applied ``kind``: each cause as (the object's field, the server's message)."""

    kind: str
    status: int
    causes: tuple[tuple[str, str], ...]

    def problems(self) -> list[tuple[str, str]]:
        """(the spec field it points at, why), as ``spec.InvalidSpec`` takes them."""
        return [
            (spec_field(self.kind, field), f"the API server refused the {self.kind} built from it: {field}: {message}")
            for field, message in self.causes
        ]


def refusal_of(kind: str, status: int, body: str | bytes | None) -> Refusal | None:
    """The refusal an API answer (``status``, its Status ``body``) is, for an apply of ``kind``; ``None`` for
    anything worth retrying."""
    try:
        answer = json.loads(body or "{}")
    except ValueError:
        return None
    if not isinstance(answer, dict):
        return None
    message = str(answer.get("message") or "")
    if status == 422 and answer.get("reason") == "Invalid":
        causes = []
        for cause in (answer.get("details") or {}).get("causes") or ():
            field, text = str(cause.get("field") or ""), str(cause.get("message") or "")
            causes.append((field, text.removeprefix(f"{field}: ")))  # some servers repeat the field
        return Refusal(kind, status, tuple(causes) or (("", message),))
    if status == 500 and message.startswith(TYPED_PATCH_REFUSAL):
        _, _, errors = message.partition("): ")
        causes = []
        for line in errors.splitlines():
            found = _SMD_ERROR.match(line)
            if found:
                causes.append((found.group(1).removeprefix("."), found.group(2)))
        return Refusal(kind, status, tuple(causes) or (("", errors or message),))
    return None


def spec_field(kind: str, field: str) -> str:
    """The OrderedConsumer field that ``field`` of the ``kind`` the operator built comes from (``spec``: no
    single one, or a field of the operator's own)."""
    if kind != "Deployment":
        return "spec"
    shape = _INDEX.sub("[]", field.removeprefix("."))
    for prefix in sorted(DEPLOYMENT_FIELDS, key=len, reverse=True):
        if shape == prefix or shape.startswith((f"{prefix}.", f"{prefix}[")):
            return DEPLOYMENT_FIELDS[prefix]
    return "spec"
