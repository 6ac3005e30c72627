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
so the ``InvalidSpec`` condition points the user at what to change.

A refusal is permanent for the object as sent, not for ever: a 422 may come from outside the spec (a
ValidatingAdmissionPolicy's denial is 422 ``Invalid`` by default: kubernetes/apiserver
``pkg/admission/plugin/policy/validating/dispatcher.go``; an immutable field an upgrade changed), and the
cluster may change under it (the policy removed). So the same object is sent again, but only every
``REFUSED_RETRY_SECONDS`` (``RefusedApply.holds``), not on every poll. Pure: no I/O, no kopf.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

TYPED_PATCH_REFUSAL = "failed to create typed patch object"
"""How the API server's field manager words an applied configuration that fails its typed validation."""

REFUSED_RETRY_SECONDS = 300.0
"""An owned object the API server refused is applied again, unchanged, after this many seconds: often enough
that an outside fix (an admission policy removed or changed) clears ``InvalidSpec`` within minutes, seldom
enough that a refusal that stays (the spec's own fault) costs one apply per resource per period. A changed
object (a new spec) is applied at once."""

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
        built = f"the API server refused the {self.kind} built from it"
        return [
            (spec_field(self.kind, field), f"{built}: {field}: {message}" if field else f"{built}: {message}")
            for field, message in self.causes
        ]


@dataclass(frozen=True)
class RefusedApply:
    """An owned object the API server refused: the fingerprint of the object as sent, the refusal, the error's
    message (``kube.ApplyRefused``), and when (a monotonic clock's seconds)."""

    fingerprint: str
    refusal: Refusal
    message: str
    at: float

    def holds(self, fingerprint: str, now: float, retry_seconds: float = REFUSED_RETRY_SECONDS) -> bool:
        """Whether an apply of the object with ``fingerprint`` at ``now`` should be skipped: it is the object
        refused, and the refusal is younger than ``retry_seconds``."""
        return fingerprint == self.fingerprint and now - self.at < retry_seconds


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
