"""A ValidatingAdmissionPolicy for the emulator: a refusal that comes from the cluster, not from what is sent.

A cluster's admission policies refuse writes the kind's own validation takes (a required label, an image
registry, a frozen field), and they come and go with the cluster's administrators, not with the
OrderedConsumer's spec. The operator must tell such a refusal from a temporary failure and recover once the
policy is gone, so the emulator can hold one (``Emulator.admission_policies``). Its rule is a Python function
of the object and the old object, as the policy's CEL ``validations`` see them (``object``, ``oldObject``);
what a denial looks like follows kubernetes/apiserver:

* ``pkg/admission/plugin/policy/validating/dispatcher.go`` (``Dispatch``): the first denying decision's message,
  ``ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>``, wrapped by
  ``admission.NewForbidden`` (``pkg/admission/errors.go`` -> k8s.io/apimachinery ``pkg/api/errors/errors.go``
  ``NewForbidden``: ``<resource>.<group> "<name>" is forbidden: <that>``, details with the group, the
  resource as ``kind`` and the name), then the reason set to the validation's (``Invalid`` when it gives none),
  the code from it (``policy_decision.go`` ``reasonToCode``: 422 for ``Invalid``, 403 for ``Forbidden``), and
  one cause carrying the message with no field;
* ``pkg/registry/generic/registry/store.go`` (``Create``, ``Update``): validating admission runs after the
  kind's own validation (``rest.BeforeCreate``/``BeforeUpdate``), on the object as it would be stored, so it
  sees an apply or a patch merged with the live object.

A policy's ``resource`` matches the object's own writes (create, update, patch, apply), not a subresource's
(a rule for ``deployments`` does not match ``deployments/scale``, as in ``matchConstraints.resourceRules``).
Not imitated: CEL, parameters, match conditions, ``validationActions`` other than ``Deny``, audit annotations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import kmock

REASON_CODES = {"Invalid": 422, "Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413}
"""``reasonToCode``: the HTTP code of a denial by its reason (anything else: 422)."""


@dataclasses.dataclass
class ValidatingAdmissionPolicy:
    """One policy and its binding, denying writes of ``resource`` (``group/version/plural``, ``v1/pods`` for the
    core group) for which ``rule(object, old_object)`` returns a message (``None``: admitted)."""

    name: str
    resource: str
    rule: Callable[[dict[str, Any], dict[str, Any] | None], str | None]
    binding: str | None = None
    reason: str = "Invalid"
    """The validation's ``reason`` (the API server's default: ``Invalid``)."""
    denied: int = 0
    """Writes it denied so far."""

    def matches(self, resource: Any, subresource: str | None) -> bool:
        plural = f"{resource.group}/{resource.version}/{resource.plural}" if resource.group else None
        core = f"{resource.version}/{resource.plural}"
        return subresource is None and self.resource in (plural, core)

    def admit(self, resource: Any, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        """Raise the API server's denial when the rule refuses ``obj``."""
        message = self.rule(obj, old)
        if message is None:
            return
        self.denied += 1
        by = f" with binding '{self.binding}'" if self.binding else ""
        denied = f"ValidatingAdmissionPolicy '{self.name}'{by} denied request: {message}"
        qualified = f"{resource.plural}.{resource.group}" if resource.group else str(resource.plural)
        name = str((obj.get("metadata") or {}).get("name") or "")
        raise kmock.KubernetesError(
            REASON_CODES.get(self.reason, 422),
            self.reason,
            f'{qualified} "{name}" is forbidden: {denied}' if name else f"{qualified} is forbidden: {denied}",
            {"name": name, "group": resource.group, "kind": resource.plural, "causes": [{"message": denied}]},
        )
