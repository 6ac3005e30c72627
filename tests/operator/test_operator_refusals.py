"""The real kopf operator on the API emulator: a spec whose objects the API server refuses for what they are.

Two ways there: a keyed list with a repeated key stored under an older CRD (the model refuses it before any
apply), and a pod-template label the CRD and the model take but the API server's Deployment validation does
not (the apply is refused with 422). Either way the resource gets ``InvalidSpec`` naming the spec field and
one Event, the refused object is not sent again within ``refusals.REFUSED_RETRY_SECONDS``, and a fixed spec
gets its objects. A third way comes from outside the spec: a ValidatingAdmissionPolicy of the cluster
(``admission_policy``) refuses the Deployment for a while; the operator goes on scaling the one that exists,
tries the refused one again every period (one Event for all the tries) and clears ``InvalidSpec`` once the
policy is gone. No broker: the lag comes from ``NoKafka``.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from keyorder_operator.kube import ApplyRefused, Kube
from keyorder_operator.objects import AppliedObjects
from tests.operator.admission_policy import ValidatingAdmissionPolicy
from tests.operator.harness import CR, api_client, wait_for, wait_for_polls
from tests.operator.test_operator_deployable import condition, events, operator, resource

pytestmark = pytest.mark.timeout(120)

DEPLOYMENTS = "apps/v1/deployments"


def reconcile_errors(context: Any, name: str) -> float:
    labels = {"namespace": "default", "name": name}
    return context.metrics.registry.get_sample_value("keyorder_operator_reconcile_errors_total", labels) or 0.0


def invalid_spec(kube, name: str) -> dict[str, Any] | None:
    entry = condition(kube, name, "InvalidSpec")
    return entry if entry.get("status") == "True" else None


def test_a_label_the_api_server_refuses_is_invalid_spec_naming_the_field_once_and_not_retried_at_once(kube):
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


RETRY_SECONDS = 1.5
"""The refused objects' retry period in the test (``AppliedObjects.refused_retry_seconds``; 300 s by default)."""


def no_debug(obj: dict[str, Any], old: dict[str, Any] | None) -> str | None:
    """An admission policy's rule: no container of a Deployment sets ``DEBUG``."""
    containers = ((obj.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    if any(item.get("name") == "DEBUG" for container in containers for item in container.get("env") or []):
        return "DEBUG may not be set in this namespace"
    return None


def test_a_deployment_an_admission_policy_refuses_stops_no_scaling_and_clears_once_the_policy_is_gone(kube):
    """The refusal is the cluster's, not the spec's: while it lasts the operator scales the Deployment that
    exists (its replicas-only apply is admitted) and sends the refused object again every retry period, with
    one InvalidSpec Event for all the tries; once the policy is removed the next try lands and InvalidSpec
    clears within that period."""
    policy = ValidatingAdmissionPolicy("no-debug", "apps/v1/deployments", no_debug, binding="no-debug-here")
    assert kube.emulator is not None
    emulator = kube.emulator
    env = [{"name": "DEBUG", "value": "1"}]
    with operator(kube.url) as context:
        context.applied = AppliedObjects(refused_retry_seconds=RETRY_SECONDS)
        kube.create(CR, resource("held", scaling={"enabled": False, "pollIntervalSeconds": 1}))
        wait_for(lambda: (kube.get(DEPLOYMENTS, "held") or {}).get("spec", {}).get("replicas") == 1, 20, "Deployment")
        kube.call_in_loop(lambda: emulator.admission_policies.append(policy))

        kube.patch(CR, "held", {"spec": {"handler": {"env": env}}})
        entry = wait_for(lambda: invalid_spec(kube, "held"), 20, "InvalidSpec from the policy's refusal")
        assert entry["message"] == (
            "spec: the API server refused the Deployment built from it: ValidatingAdmissionPolicy 'no-debug' with "
            "binding 'no-debug-here' denied request: DEBUG may not be set in this namespace"
        ), entry["message"]

        kube.patch(CR, "held", {"spec": {"replicas": {"min": 2}}})  # scaling disabled: the poll holds replicas.min
        wait_for(lambda: kube.get(DEPLOYMENTS, "held")["spec"]["replicas"] == 2, 20, "the poll to scale to 2")
        denied = policy.denied
        wait_for(lambda: policy.denied >= denied + 2, 10 * RETRY_SECONDS, "two more tries of the refused Deployment")
        assert [text for text in events(kube, "InvalidSpec") if "no-debug" in text] == [entry["message"]]
        assert invalid_spec(kube, "held") is not None
        assert condition(kube, "held", "ReconcileFailed").get("status") != "True", "a refusal is not a failed poll"

        kube.call_in_loop(lambda: emulator.admission_policies.remove(policy))
        wait_for(
            lambda: condition(kube, "held", "InvalidSpec").get("status") == "False",
            RETRY_SECONDS + 5,
            "InvalidSpec to clear within the retry period",
        )
        deployment = kube.get(DEPLOYMENTS, "held")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["env"][-1] == env[0]
        assert deployment["spec"]["replicas"] == 2
        assert [text for text in events(kube, "InvalidSpec") if "no-debug" in text] == [entry["message"]]


def at_most_five_replicas(obj: dict[str, Any], old: dict[str, Any] | None) -> str | None:
    """An admission policy's rule capping a Deployment's replicas."""
    return "at most 5 replicas" if ((obj.get("spec") or {}).get("replicas") or 0) > 5 else None


def test_a_refused_replicas_write_is_the_api_servers_error_and_a_refused_object_is_apply_refused(kube):
    """``Kube.scale`` applies ``spec.replicas`` alone: its refusal says nothing about a field of the spec, so it
    comes as the API server's error (the poll fails and tries again), never as ``ApplyRefused``, which would
    make the spec invalid; an object's apply refused the same way is ``ApplyRefused``."""
    assert kube.emulator is not None
    emulator = kube.emulator
    policy = ValidatingAdmissionPolicy("capped", "apps/v1/deployments", at_most_five_replicas)
    kube.call_in_loop(lambda: emulator.admission_policies.append(policy))
    labels = {"app": "capped"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "capped", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}},
        },
    }
    with api_client(kube.url) as client:
        operations = Kube(client)
        operations.apply(deployment)
        with pytest.raises(ApiException) as refused:
            operations.scale("default", "capped", 6, expected=1)
        assert not isinstance(refused.value, ApplyRefused) and refused.value.status == 422
        assert operations.scale("default", "capped", 5, expected=1) is not None
        with pytest.raises(ApplyRefused, match="ValidatingAdmissionPolicy 'capped' denied request: at most 5"):
            operations.apply({**deployment, "spec": {**deployment["spec"], "replicas": 7}})
    assert policy.denied == 2
