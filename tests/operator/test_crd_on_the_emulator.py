"""The CRD as the strict emulator applies it (schema, CEL rules, defaults): specs users write are stored."""

from __future__ import annotations

from tests.operator.harness import CR
from tests.operator.test_operator_deployable import resource


def test_a_resource_on_the_new_group_protocol_is_accepted_and_gets_no_assignment_strategy(kube):
    """groupProtocol consumer refuses assignmentStrategy (the broker assigns): the CRD must not default
    the field, or no such resource could ever be stored (the API server applies defaults before the rules)."""
    body = resource("kip848")
    body["spec"]["kafka"]["groupProtocol"] = "consumer"
    stored = kube.create(CR, body)
    assert stored["spec"]["kafka"]["groupProtocol"] == "consumer"
    assert "assignmentStrategy" not in stored["spec"]["kafka"]
    classic = kube.create(CR, resource("classic"))
    assert "assignmentStrategy" not in classic["spec"]["kafka"]  # the operator's model supplies cooperative-sticky
