"""Which API answers to an apply are permanent refusals, and which spec field each points at (refusals.py)."""

from __future__ import annotations

import json

import pytest

from keyorder_operator.kube import ApplyRefused
from keyorder_operator.objects import AppliedObjects, apply_owned_objects
from keyorder_operator.refusals import Refusal, refusal_of, spec_field
from keyorder_operator.spec import parse_spec
from tests.fakes import FakeClock

DUPLICATE_ENV = (
    "failed to create typed patch object (payments/ledger; apps/v1, Kind=Deployment): "
    '.spec.template.spec.containers[name="consumer"].env: duplicate entries for key [name="A"]'
)
TWO_ERRORS = (
    "failed to create typed patch object (payments/ledger; apps/v1, Kind=Deployment): errors:\n"
    '  .spec.template.spec.containers[name="consumer"].env: duplicate entries for key [name="A"]\n'
    '  .spec.template.spec.imagePullSecrets: duplicate entries for key [name="registry"]'
)
LABEL_MESSAGE = 'Invalid value: "data platform": a valid label must be an empty string or ...'


def status(code: int, message: str, reason: str = "", causes: list[dict[str, str]] | None = None) -> str:
    body: dict = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}
    if reason:
        body["reason"] = reason
    if causes is not None:
        body["details"] = {"name": "ledger", "group": "apps", "kind": "deployments", "causes": causes}
    return json.dumps(body)


@pytest.mark.parametrize(
    ("code", "body", "causes"),
    [
        (
            500,
            status(500, DUPLICATE_ENV),
            [('spec.template.spec.containers[name="consumer"].env', 'duplicate entries for key [name="A"]')],
        ),
        (
            500,
            status(500, TWO_ERRORS),
            [
                ('spec.template.spec.containers[name="consumer"].env', 'duplicate entries for key [name="A"]'),
                ("spec.template.spec.imagePullSecrets", 'duplicate entries for key [name="registry"]'),
            ],
        ),
        (
            422,
            status(
                422,
                f'Deployment.apps "ledger" is invalid: spec.template.labels: {LABEL_MESSAGE}',
                "Invalid",
                [{"reason": "FieldValueInvalid", "field": "spec.template.labels", "message": LABEL_MESSAGE}],
            ),
            [("spec.template.labels", 'Invalid value: "data platform"')],
        ),
        (  # a server that repeats the field in the cause's message (the API emulator does)
            422,
            status(
                422,
                "...",
                "Invalid",
                [{"field": "spec.template.labels", "message": f"spec.template.labels: {LABEL_MESSAGE}"}],
            ),
            [("spec.template.labels", 'Invalid value: "data platform"')],
        ),
    ],
)
def test_a_permanent_refusal_is_recognised_with_each_field_it_names(code, body, causes):
    refusal = refusal_of("Deployment", code, body)
    assert refusal is not None
    assert refusal.status == code and refusal.kind == "Deployment"
    assert len(refusal.causes) == len(causes)
    for (field, message), (wanted_field, start) in zip(refusal.causes, causes, strict=True):
        assert field == wanted_field
        assert message.startswith(start), message


@pytest.mark.parametrize(
    ("code", "body"),
    [
        (409, status(409, "Apply failed with 1 conflict", "Conflict")),
        (500, status(500, "etcdserver: request timed out")),
        (500, status(500, "Internal error occurred: failed calling webhook", "InternalError")),
        (403, status(403, 'admission webhook "policy.example" denied the request', "Forbidden")),
        (429, status(429, "too many requests", "TooManyRequests")),
        (503, "upstream connect error"),
        (422, status(422, "unprocessable", "SomethingElse")),
        (0, None),
    ],
)
def test_everything_else_stays_temporary(code, body):
    assert refusal_of("Deployment", code, body) is None


@pytest.mark.parametrize(
    ("field", "spec"),
    [
        ('spec.template.spec.containers[name="consumer"].env', "spec.handler.env"),
        ("spec.template.spec.containers[0].env[3].name", "spec.handler.env"),
        ("spec.template.spec.containers[0].envFrom[0]", "spec.handler.envFrom"),
        ('spec.template.spec.containers[name="consumer"].volumeMounts', "spec.handler.volumeMounts"),
        ("spec.template.spec.containers[0].resources.limits[memory]", "spec.handler.resources"),
        ("spec.template.spec.containers[0].image", "spec.handler.image"),
        ("spec.template.spec.containers[0].ports[0].containerPort", "spec.httpPort"),
        ("spec.template.labels", "spec.template.metadata.labels"),
        ("spec.template.metadata.annotations", "spec.template.metadata.annotations"),
        ("spec.template.spec.imagePullSecrets", "spec.template.spec.imagePullSecrets"),
        ("spec.template.spec.topologySpreadConstraints[1].maxSkew", "spec.template.spec.topologySpreadConstraints"),
        ("spec.template.spec.volumes[2].secret", "spec.template.spec.volumes"),
        ("spec.template.spec.securityContext", "spec"),  # the operator's own
        ("spec.selector", "spec"),
        ("", "spec"),
    ],
)
def test_a_deployment_field_is_traced_to_the_spec_field_it_is_built_from(field, spec):
    assert spec_field("Deployment", field) == spec


def test_the_problems_name_the_spec_field_and_quote_the_server():
    refusal = Refusal("Deployment", 500, (('spec.template.spec.containers[name="consumer"].env', "duplicate x"),))
    assert refusal.problems() == [
        (
            "spec.handler.env",
            'the API server refused the Deployment built from it: spec.template.spec.containers[name="consumer"].env: '
            "duplicate x",
        )
    ]
    assert spec_field("Service", "spec.ports[0].port") == "spec"


def test_a_refusal_naming_no_field_quotes_the_server_alone():
    """A ValidatingAdmissionPolicy's denial is a 422 Invalid whose one cause has a message and no field."""
    denied = "ValidatingAdmissionPolicy 'no-debug' denied request: DEBUG may not be set"
    body = status(422, f'deployments.apps "ledger" is forbidden: {denied}', "Invalid", [{"message": denied}])
    refusal = refusal_of("Deployment", 422, body)
    assert refusal is not None
    assert refusal.problems() == [("spec", f"the API server refused the Deployment built from it: {denied}")]


REFUSED = ApplyRefused(Refusal("Deployment", 422, (("", "denied"),)), "the API server refused Deployment ns/a: denied")


def test_a_refused_object_is_held_back_for_the_retry_period_and_a_changed_one_is_not():
    clock = FakeClock()
    applied = AppliedObjects(refused_retry_seconds=300, monotonic=clock)
    key = ("ns", "a", "Deployment")
    applied.record_refusal(key, "v1", REFUSED)
    assert applied.held_back(key, "v1") and not applied.held_back(key, "v2")  # a new spec is sent at once
    assert [refused.message for refused in applied.refusals("ns", "a")] == [str(REFUSED)]
    assert applied.refusals("ns", "b") == []
    clock.sleep(299)
    assert applied.held_back(key, "v1")
    clock.sleep(1)
    assert not applied.held_back(key, "v1")  # the period is over: sent again
    applied.record(key, "v1", "7")
    assert applied.refusals("ns", "a") == [] and not applied.held_back(key, "v1")


def test_the_refused_objects_are_retried_once_per_period_whatever_the_outcome():
    """After a restart nothing is remembered: due at once. A retry counts whether it was refused again or failed
    otherwise, so a resource is retried at most once per period."""
    clock = FakeClock()
    applied = AppliedObjects(refused_retry_seconds=300, monotonic=clock)
    assert applied.retry_due("ns", "a")  # nothing remembered (a restart): at once
    assert not applied.retry_due("ns", "a")  # that retry failed otherwise (a timeout): not again at once
    clock.sleep(300)
    assert applied.retry_due("ns", "a")
    applied.record_refusal(("ns", "a", "Deployment"), "v1", REFUSED)  # refused again
    clock.sleep(299)
    assert not applied.retry_due("ns", "a") and applied.retry_due("ns", "b")
    clock.sleep(1)
    assert applied.retry_due("ns", "a")
    applied.forget("ns", "a")
    assert applied.refusals("ns", "a") == [] and applied.retry_due("ns", "a")


class RefusingKube:
    """FAKE ``kube.Kube`` for ``apply_owned_objects``: every object exists, at version "1" until an apply of it
    lands ("2"); it refuses the applies of the kinds in ``refusing`` (``ApplyRefused``) and records the rest."""

    def __init__(self, refusing: set[str]) -> None:
        self.refusing = refusing
        self.applied: list[str] = []
        self.sent: list[str] = []

    def ensure_secret(self, desired: dict, key: str) -> str:
        return "token"

    def deployment(self, namespace: str, name: str) -> dict | None:
        return {"metadata": {"name": name, "resourceVersion": "1"}, "spec": {"replicas": 2}}

    def resource_version(self, kind: str, namespace: str, name: str) -> str | None:
        return "2" if kind in self.applied else "1"

    def network_policy_present(self, namespace: str, name: str) -> bool:
        return False  # the chart's switch is off in these tests: nothing of the operator's to delete

    def apply(self, desired: dict) -> str:
        self.sent.append(desired["kind"])
        if desired["kind"] in self.refusing:
            raise ApplyRefused(Refusal(desired["kind"], 422, (("", "denied"),)), f"refused {desired['kind']}")
        self.applied.append(desired["kind"])
        return "2"


def test_a_refused_object_leaves_the_others_applied_and_the_repair_skips_it_until_its_retry():
    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "k:9092", "topics": ["orders"], "groupId": "orders"},
            "handler": {"image": "registry.example/orders:1.0", "handler": "orders.handler:handle"},
        }
    )
    meta = {"namespace": "ns", "name": "orders", "uid": "u-1"}
    clock = FakeClock()
    applied = AppliedObjects(refused_retry_seconds=300, monotonic=clock)
    kube = RefusingKube({"Deployment"})
    with pytest.raises(ApplyRefused, match="refused Deployment"):
        apply_owned_objects(kube, spec, meta, {}, applied, always=True)  # type: ignore[arg-type]
    assert kube.applied == ["ServiceAccount", "Service", "PodDisruptionBudget"]  # after the refused one too
    assert [refused.refusal.kind for refused in applied.refusals("ns", "orders")] == ["Deployment"]

    kube.sent.clear()
    assert apply_owned_objects(kube, spec, meta, {}, applied, always=False) == []  # type: ignore[arg-type]
    assert kube.sent == []  # the repair: the others unchanged, the refused one held back (not raised again)
    clock.sleep(300)
    with pytest.raises(ApplyRefused):
        apply_owned_objects(kube, spec, meta, {}, applied, always=False)  # type: ignore[arg-type]
    assert kube.sent == ["Deployment"]  # its period over: sent again, refused again
    kube.refusing.clear()  # what refused it is gone (an admission policy removed)
    clock.sleep(299)
    kube.sent.clear()
    apply_owned_objects(kube, spec, meta, {}, applied, always=False)  # type: ignore[arg-type]
    assert kube.sent == []  # the repair waits for the period
    apply_owned_objects(kube, spec, meta, {}, applied, always=True)  # type: ignore[arg-type]
    assert "Deployment" in kube.applied and applied.refusals("ns", "orders") == []  # a retry (or a new spec): sent
