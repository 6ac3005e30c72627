"""Which API answers to an apply are permanent refusals, and which spec field each points at (refusals.py)."""

from __future__ import annotations

import json

import pytest

from keyorder_operator.refusals import Refusal, refusal_of, spec_field

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
