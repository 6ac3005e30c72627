"""The real kopf operator on the API emulator: a spec whose objects the API server refuses for what they are.

Two ways there: a keyed list with a repeated key stored under an older CRD (the model refuses it before any
apply), and a pod-template label the CRD and the model take but the API server's Deployment validation does
not (the apply is refused with 422). Either way the resource gets ``InvalidSpec`` naming the spec field and
one Event, nothing is retried until the spec changes, and a fixed spec gets its objects. No broker: the lag
comes from ``NoKafka``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.harness import CR, wait_for, wait_for_polls
from tests.operator.test_operator_deployable import condition, events, operator, resource

pytestmark = pytest.mark.timeout(120)

DEPLOYMENTS = "apps/v1/deployments"


def reconcile_errors(context: Any, name: str) -> float:
    labels = {"namespace": "default", "name": name}
    return context.metrics.registry.get_sample_value("keyorder_operator_reconcile_errors_total", labels) or 0.0


def invalid_spec(kube, name: str) -> dict[str, Any] | None:
    entry = condition(kube, name, "InvalidSpec")
    return entry if entry.get("status") == "True" else None


def test_a_label_the_api_server_refuses_is_invalid_spec_naming_the_field_once_and_not_retried(kube):
    with operator(kube.url) as context:
        kube.create(CR, resource("sibling"))
        kube.create(CR, resource("labelled", template={"metadata": {"labels": {"team": "data platform"}}}))
        entry = wait_for(lambda: invalid_spec(kube, "labelled"), 20, "InvalidSpec from the refused apply")
        assert entry["message"].startswith(
            "spec.template.metadata.labels: the API server refused the Deployment built from it: "
            'spec.template.labels: Invalid value: "data platform": a valid label must be'
        ), entry["message"]
        refused = reconcile_errors(context, "labelled")
        assert refused == 1
        wait_for_polls(kube, "sibling", 3)  # the operator goes on meanwhile: time enough for a retry or a poll
        assert reconcile_errors(context, "labelled") == refused, "the refused apply was sent again"
        assert [text for text in events(kube, "InvalidSpec") if "data platform" in text] == [entry["message"]]
        assert kube.get(DEPLOYMENTS, "labelled") is None
        assert condition(kube, "labelled", "ReconcileFailed") == {}, "a refusal is not a failed poll"

        kube.patch(CR, "labelled", {"spec": {"template": {"metadata": {"labels": {"team": "data-platform"}}}}})
        deployment = wait_for(lambda: kube.get(DEPLOYMENTS, "labelled"), 20, "the Deployment of the fixed spec")
        assert deployment["spec"]["template"]["metadata"]["labels"]["team"] == "data-platform"
        wait_for(
            lambda: condition(kube, "labelled", "InvalidSpec").get("status") == "False", 20, "InvalidSpec to clear"
        )


def test_a_repeated_env_name_stored_under_an_older_crd_is_invalid_spec_naming_both_items(kube_older_crd):
    """The CRD refuses the duplicate (list-map keys); an older CRD took it, and every apply of the Deployment
    built from it would be refused (server-side apply's "duplicate entries for key")."""
    kube = kube_older_crd
    with operator(kube.url):
        env = [{"name": "REGION", "value": "eu"}, {"name": "REGION", "value": "us"}]
        kube.create(CR, resource("twice", handler={"image": "registry.example/x:1", "handler": "x.h:h", "env": env}))
        entry = wait_for(lambda: invalid_spec(kube, "twice"), 20, "InvalidSpec on the repeated name")
        assert entry["message"].startswith(
            "spec.handler.env[1].name: duplicate entry: name 'REGION' is already spec.handler.env[0]"
        ), entry["message"]
        assert any("spec.handler.env[1].name" in text for text in events(kube, "InvalidSpec"))
        assert kube.get(DEPLOYMENTS, "twice") is None
