"""The OrderedConsumer CRD as the API server would use it: valid CRD, structural, and in agreement
with the operator's own models on every example and every broken resource.

Each resource goes through ``apiserver.admit`` (unknown fields rejected, nulls pruned, defaults,
OpenAPI schema, CEL rules) and through the operator's ``parse_spec``: both must accept the
examples and both must refuse the broken ones.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from openapi_schema_validator import OAS30Validator

from keyorder_operator import crd, spec
from keyorder_operator.spec import InvalidSpec, parse_spec
from tests.packaging.apiserver import (
    CelError,
    CelSyntaxError,
    admit,
    apply_defaults,
    cel_violations,
    check_cel_syntax,
    evaluate_cel,
)
from tests.packaging.conftest import CHART, KUBERNETES_VERSIONS, ROOT

CRD_FILE = ROOT / "crds" / "orderedconsumers.keyorder.dev.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("orderedconsumer-*.yaml"))


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text())


@pytest.fixture(scope="module")
def schema(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def operator_accepts(resource: dict[str, Any]) -> tuple[bool, str]:
    try:
        parse_spec(resource.get("spec") or {})
    except InvalidSpec as error:
        return False, str(error)
    return True, ""


# ---------------------------------------------------------------- the manifest itself


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_crd_validates_as_a_crd(manifest, version):
    kubernetes_validate.validate(manifest, version, strict=True)


def test_chart_ships_the_same_crd_file():
    assert (CHART / "crds" / CRD_FILE.name).read_bytes() == CRD_FILE.read_bytes(), (
        "charts/keyorder-operator/crds/ differs from crds/: `make crds`"
    )


def test_subresources_and_columns(manifest):
    version = manifest["spec"]["versions"][0]
    assert version["subresources"] == {
        "status": {},
        "scale": {"specReplicasPath": ".spec.replicas.min", "statusReplicasPath": ".status.observedReplicas"},
    }
    columns = {column["name"]: column["jsonPath"] for column in version["additionalPrinterColumns"]}
    assert columns["Replicas"] == ".status.replicas" and columns["Lag"] == ".status.lag"
    assert manifest["spec"]["names"]["shortNames"] == ["okc"]


def test_scale_paths_exist_after_defaulting(schema):
    """GET /scale fails when specReplicasPath is absent: the defaults must always provide it."""
    stored, problems = admit(minimal(), schema)
    assert not problems
    assert stored["spec"]["replicas"]["min"] == 1


# ---------------------------------------------------------------- structural schema


def without_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: without_descriptions(value) for key, value in node.items() if key != "description"}
    if isinstance(node, list):
        return [without_descriptions(item) for item in node]
    return node


EMBEDDED = [without_descriptions(schema) for schema in crd.kubernetes_types().values()]


def embedded(node: dict[str, Any]) -> bool:
    """Whether ``node`` is one of the embedded Kubernetes types (checked by Kubernetes' rules, not ours)."""
    return without_descriptions(node) in EMBEDDED


def walk(node: dict[str, Any], path: str = "spec"):
    yield path, node
    if embedded(node):
        return
    for name, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def walk_all(node: dict[str, Any], path: str):
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk_all(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from walk_all(node[key], f"{path}[]")


def test_schema_is_structural(schema):
    assert schema["type"] == "object" and set(schema["properties"]) == {
        "apiVersion",
        "kind",
        "metadata",
        "spec",
        "status",
    }
    metadata = schema["properties"]["metadata"]
    assert set(metadata["properties"]) == {"name"}, "a CRD may constrain metadata.name/generateName only"
    for path, node in walk(schema["properties"]["spec"]):
        if embedded(node):
            for inner_path, inner in walk_all(node, path):
                assert "type" in inner or inner.get("x-kubernetes-int-or-string") is True, inner_path
                assert not {"$ref", "anyOf", "oneOf", "allOf", "not", "nullable", "$defs"} & set(inner), inner_path
            continue
        assert "type" in node, f"{path}: every node needs a type"
        assert not {"$ref", "anyOf", "oneOf", "allOf", "not", "title", "definitions", "$defs"} & set(node), path
        assert "nullable" not in node, f"{path}: Optional fields are plain optional (nulls are pruned)"
        assert not ("properties" in node and "additionalProperties" in node), f"{path}: properties or a map, not both"
        assert node.get("description") or path.endswith("{}"), f"{path}: every field needs a description"
        if "enum" in node:
            assert all(isinstance(value, str) for value in node["enum"]) and node["type"] == "string", path
        if "default" in node:
            assert not list(OAS30Validator(node).iter_errors(node["default"])), f"{path}: invalid default"
            # as written, nested defaults NOT filled in: the API server checks it so at CRD creation
            # (apiextensions-apiserver pkg/apiserver/schema/defaulting/validation.go; tests/operator/crd_creation.py)
            assert not cel_violations(node["default"], node), f"{path}: default breaks a rule"
        for rule in node.get("x-kubernetes-validations", []):
            assert node["type"] == "object" and rule.get("message"), path
            check_cel_syntax(rule["rule"])
        if node.get("type") == "integer" or node.get("type") == "number":
            assert "minimum" in node or "enum" in node, f"{path}: numbers need a lower bound"


def test_every_fallback_description_is_used():
    used: set[str] = set()
    crd.spec_schema(used)
    assert used == set(crd.FALLBACK_DESCRIPTIONS), (
        f"unused entries in crd.FALLBACK_DESCRIPTIONS (the model has a description now): "
        f"{set(crd.FALLBACK_DESCRIPTIONS) - used}"
    )


def test_every_cross_field_validator_has_a_cel_rule():
    """A model_validator the CRD does not restate would let the API server store what the operator refuses."""
    models = [
        value
        for value in vars(spec).values()
        if isinstance(value, type) and issubclass(value, spec._Model) and value is not spec._Model
    ]
    for model in models:
        if model.__pydantic_decorators__.model_validators:
            assert model in crd.VALIDATIONS, (
                f"{model.__name__} has a model_validator: add its CEL rule to crd.VALIDATIONS"
            )


# ---------------------------------------------------------------- the CEL evaluation (cel-python) itself


@pytest.mark.parametrize(
    ("rule", "value", "expected"),
    [
        ("self.min <= self.max", {"min": 1, "max": 2}, True),
        ("self.min <= self.max", {"min": 3, "max": 2}, False),
        ("!has(self.max) || self.min <= self.max", {"min": 3}, True),
        ("!has(self.max) || self.min <= self.max", {"min": 3, "max": 2}, False),
        ("self.a == 0 && self.b", {"a": 0, "b": True}, True),
        ("(self.a != 0) || self.b", {"a": 0, "b": False}, False),
        ("self.x.y > 2 || true", {}, True),  # an error on one side of || is forgiven when the other is true
        ("size(self.name) <= 3 && self.name.matches('^[a-z]+$')", {"name": "abc"}, True),
        ("size(self.name) <= 3", {"name": "abcd"}, False),
        ("self.name.matches('^[a-z]+$')", {"name": "a.b"}, False),
        ("self.name.matches('b')", {"name": "abc"}, True),  # CEL's matches() is a search (RE2), not a full match
        ("self.items.all(i, i > 0)", {"items": [1, 2]}, True),  # full CEL: macros, arithmetic, string functions
        ("self.items.exists(i, i > 1) && size(self.items) + 1 == 3", {"items": [1, 2]}, True),
        ("self.name.startsWith('ab') && self.name.size() == 3", {"name": "abc"}, True),
    ],
)
def test_cel_evaluation(rule, value, expected):
    assert evaluate_cel(rule, value) is expected


def test_cel_errors_syntax_and_transition_rules():
    with pytest.raises(CelError):
        evaluate_cel("self.min <= self.max", {"min": 1})  # a missing field read without has()
    with pytest.raises(CelError):
        evaluate_cel("self.name", {"name": "x"})  # not a bool
    for rule in ["self.a +", "self.a === 1", "self.a ? 1", "size(self.a"]:
        with pytest.raises(CelSyntaxError):
            check_cel_syntax(rule)
    assert evaluate_cel("self >= oldSelf", 3, old=2) is True
    assert evaluate_cel("self >= oldSelf", 1, old=2) is False
    rule = {"rule": "self.size == oldSelf.size", "message": "size is immutable"}
    schema = {"type": "object", "properties": {"size": {"type": "integer"}}, "x-kubernetes-validations": [rule]}
    assert cel_violations({"size": 2}, schema) == []  # a transition rule is not evaluated on creation
    assert cel_violations({"size": 2}, schema, old={"size": 2}) == []
    assert cel_violations({"size": 3}, schema, old={"size": 2}) == ['<nil>: Invalid value: "object": size is immutable']


# ---------------------------------------------------------------- examples and broken resources


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_examples_are_accepted_by_the_crd_and_the_operator(path: Path, schema):
    resource = yaml.safe_load(path.read_text())
    assert resource["apiVersion"] == f"{spec.GROUP}/{spec.VERSION}" and resource["kind"] == spec.KIND
    stored, problems = admit(resource, schema)
    assert not problems, problems
    accepted, why = operator_accepts(resource)
    assert accepted, why
    # The CRD's defaults are the models' defaults: the stored object means the same spec.
    assert parse_spec(stored["spec"]) == parse_spec(resource["spec"])


def test_full_example_sets_every_field(schema):
    resource = yaml.safe_load((ROOT / "examples" / "orderedconsumer-full.yaml").read_text())

    def missing(node, value, path):
        if embedded(node):
            return
        for name, child in (node.get("properties") or {}).items():
            if name not in value:
                yield f"{path}.{name}"
            elif embedded(child) or (child.get("type") == "array" and embedded(child["items"])):
                assert value[name], f"{path}.{name} is empty in the full example"
            elif child.get("type") == "object" and "properties" in child:
                yield from missing(child, value[name], f"{path}.{name}")
            elif child.get("type") == "array" and "properties" in child["items"]:
                # every field set by some item (a list's items may exclude each other: value or valueFrom)
                gaps = [set(missing(child["items"], item, f"{path}.{name}[]")) for item in value[name]]
                yield from sorted(set.intersection(*gaps) if gaps else {f"{path}.{name}[]"})

    assert list(missing(schema["properties"]["spec"], resource["spec"], "spec")) == []


def minimal() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / "orderedconsumer-minimal.yaml").read_text())


def changed(path: str, value: Any, **more: Any) -> dict[str, Any]:
    """The minimal example with ``spec.<path>`` set to ``value`` (``...`` deletes it), and more such pairs."""
    resource = copy.deepcopy(minimal())
    for dotted, new in {path: value, **more}.items():
        *parents, leaf = dotted.split(".")
        node = resource["spec"]
        for name in parents:
            node = node.setdefault(name, {})
        if new is ...:
            del node[leaf]
        else:
            node[leaf] = new
    return resource


BROKEN = {
    "missing kafka": changed("kafka", ...),
    "missing handler image": changed("handler.image", ...),
    "topics not a list": changed("kafka.topics", "payments"),
    "empty topics": changed("kafka.topics", []),
    "empty bootstrap servers": changed("kafka.bootstrapServers", ""),
    "workers.max a string": changed("workers.max", "many"),
    "workers above 4096": changed("workers.max", 5000),
    "zero workers": changed("workers.min", 0),
    "negative replicas": changed("replicas.min", -1),
    "port below 1024": changed("httpPort", 80),
    "grace period too short": changed("handler.terminationGracePeriodSeconds", 1),
    "float attempts": changed("retry.maxAttempts", 2.5),
    "zero max backoff": changed("retry.maxBackoffSeconds", 0),
    "unknown ordering": changed("ordering", "random"),
    "unknown onExhausted": changed("retry.onExhausted", "drop"),
    "handler without a function": changed("handler.handler", "ledger.handler"),
    "bad env name": changed("handler.env", [{"name": "1BAD", "value": "x"}]),
    "unknown top-level field": changed("replicaCount", 3),
    "unknown nested field": changed("scaling.targetLag", 10),
    "unknown field in a list item": changed("handler.env", [{"name": "A", "value": "1", "from": "x"}]),
    "catch-up trigger below a minute": changed("catchup.triggerDrainSeconds", 30),
    "too many catch-up executors": changed("catchup.executors", 1001),
    "resources not strings": changed("handler.resources", {"requests": {"cpu": {"milli": 500}}}),
    "env with value and valueFrom": changed(
        "handler.env", [{"name": "A", "value": "1", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    ),
    "a template's securityContext": changed("template", {"spec": {"securityContext": {"runAsUser": 0}}}),
    "a template's container list": changed("template", {"spec": {"containers": [{"name": "x", "image": "y"}]}}),
    "tolerations not a list": changed("template", {"spec": {"tolerations": {"key": "a"}}}),
}
"""Resources both the API server (schema only) and the operator must refuse."""

BROKEN_BY_RULES = {
    "workers min above initial": changed("workers", {"min": 32, "initial": 16, "max": 64}),
    "workers initial above max": changed("workers", {"initial": 128, "max": 64}),
    "default initial above max": changed("workers", {"max": 8}),
    "replicas min above max": changed("replicas", {"min": 5, "max": 2}),
    "zero replicas without scaleToZero": changed("replicas", {"min": 0}),
    "zero replicas, scaleToZero false": changed("scaling", {"scaleToZero": False}, replicas={"min": 0}),
    "zero fallback replicas without scaleToZero": changed(
        "scaling", {"fallback": {"failureThreshold": 3, "replicas": 0}}
    ),
    "catch-up enabled without its image": changed("catchup", {"enabled": True}),
    # keyorder catchup refuses them after the pods were stopped (issue 38, defect 3): refused at admission
    "catch-up with a fixed Spark setting": changed(
        "catchup", {"enabled": True, "image": "reg/spark:1", "sparkConf": {"spark.task.maxFailures": "4"}}
    ),
    "catch-up with a fixed Spark setting, padded": changed(
        "catchup", {"enabled": True, "image": "reg/spark:1", "sparkConf": {" spark.speculation ": " true"}}
    ),
    # review of issue 38, finding 3: keyorder catchup refused these at start, after the pods were stopped
    "catch-up on local[n,f] with f above 1": changed(
        "catchup", {"enabled": True, "image": "reg/spark:1", "master": "local[4,3]"}
    ),
    "catch-up on a spark:// master without its secret": changed(
        "catchup", {"enabled": True, "image": "reg/spark:1", "master": "spark://m:7077"}
    ),
    "catch-up on a spark:// master with authentication on and no secret": changed(
        "catchup",
        {
            "enabled": True,
            "image": "reg/spark:1",
            "master": "spark://m:7077",
            "sparkConf": {"spark.authenticate": "TRUE"},
        },
    ),
    # librdkafka's leave of a static member under KIP-848 is temporary (member epoch -2)
    "static membership on the consumer protocol": changed(
        "kafka.groupProtocol", "consumer", **{"kafka.staticMembership": True}
    ),
}
"""Resources that pass the OpenAPI schema and only the CEL rules (and the models' validators) refuse."""

ACCEPTED_BY_RULES = {
    "zero replicas with scaleToZero": changed("scaling", {"scaleToZero": True}, replicas={"min": 0}),
    "zero fallback replicas with scaleToZero": changed(
        "scaling", {"scaleToZero": True, "fallback": {"failureThreshold": 3, "replicas": 0}}
    ),
    "recommend-only mode": changed("scaling", {"mode": "recommend", "tolerance": 0.2, "targetUtilizationPercent": 70}),
    "replicas max equal to min": changed("replicas", {"min": 3, "max": 3}),
    "explicit null max is unset": changed("replicas", {"min": 3, "max": None}),
    "workers all equal": changed("workers", {"min": 8, "initial": 8, "max": 8}),
    "catch-up enabled with its image": changed("catchup", {"enabled": True, "image": "reg/spark:1"}),
    "catch-up disabled without an image": changed("catchup", {"enabled": False}),
    "catch-up with Spark settings it does not fix": changed(
        "catchup", {"enabled": True, "image": "reg/spark:1", "sparkConf": {"spark.executor.memory": "4g"}}
    ),
    # review of issue 38, finding 4: the required value is what the job runs with; CRs that passed before pass
    "catch-up giving a fixed Spark setting its required value": changed(
        "catchup",
        {
            "enabled": True,
            "image": "reg/spark:1",
            "sparkConf": {"spark.task.maxFailures": " 1 ", "spark.speculation": "False"},
        },
    ),
    "catch-up on local[n,1]": changed("catchup", {"enabled": True, "image": "reg/spark:1", "master": "local[4,1]"}),
    "catch-up on a spark:// master with its secret": changed(
        "catchup",
        {
            "enabled": True,
            "image": "reg/spark:1",
            "master": "spark://m:7077",
            "sparkConf": {"spark.authenticate.secret": "s3cret"},
        },
    ),
    "catch-up on a spark:// master without authentication": changed(
        "catchup",
        {
            "enabled": True,
            "image": "reg/spark:1",
            "master": "spark://m:7077",
            "sparkConf": {"spark.authenticate": "false"},
        },
    ),
    "catch-up off on a spark:// master without its secret": changed(
        "catchup", {"enabled": False, "master": "spark://m:7077"}
    ),
    "static membership on the classic protocol": changed("kafka.staticMembership", True),
    "static membership off on the consumer protocol": changed(
        "kafka.groupProtocol", "consumer", **{"kafka.staticMembership": False}
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_resources_are_refused_by_the_schema_and_the_operator(case, schema):
    stored, problems = admit(BROKEN[case], schema)
    assert stored is None and problems, f"the API server would store {case}"
    accepted, _ = operator_accepts(BROKEN[case])
    assert not accepted, f"the operator would run {case}"


@pytest.mark.parametrize("case", sorted(BROKEN_BY_RULES))
def test_cross_field_rules_refuse_what_the_models_refuse(case, schema):
    resource = BROKEN_BY_RULES[case]
    defaulted = apply_defaults(resource, schema)
    assert not list(OAS30Validator(schema).iter_errors(defaulted)), "should pass the plain schema"
    stored, problems = admit(resource, schema)
    assert stored is None and problems, f"the CEL rules let {case} through"
    accepted, why = operator_accepts(resource)
    assert not accepted
    # the rule's message says the same thing as the model's
    assert any(
        word in why
        for word in ("min", "max", "initial", "scaleToZero", "catchup.image", "staticMembership", "catchup.sparkConf")
    ), why


@pytest.mark.parametrize("case", sorted(ACCEPTED_BY_RULES))
def test_cross_field_rules_accept_what_the_models_accept(case, schema):
    stored, problems = admit(ACCEPTED_BY_RULES[case], schema)
    assert not problems, problems
    assert operator_accepts(ACCEPTED_BY_RULES[case])[0]
    assert parse_spec(stored["spec"]) == parse_spec(ACCEPTED_BY_RULES[case]["spec"])


MALFORMED_KUBERNETES_TYPES = {
    "toleration seconds a word": {"spec": {"tolerations": [{"key": "a", "tolerationSeconds": "soon"}]}},
    "unknown volume field": {"spec": {"volumes": [{"name": "a", "emptyDir": {}, "hostpth": {"path": "/"}}]}},
    "volume without a name": {"spec": {"volumes": [{"emptyDir": {}}]}},
    "affinity of the wrong shape": {"spec": {"affinity": {"nodeAffinity": "anywhere"}}},
    "pull secret without a name field": {"spec": {"imagePullSecrets": [{"secret": "x"}]}},
}
"""Malformed Kubernetes types: the API server refuses them by the embedded real schemas (the operator does
not restate Kubernetes' own schemas; it would get them refused when it applies the Deployment)."""


@pytest.mark.parametrize("case", sorted(MALFORMED_KUBERNETES_TYPES))
def test_the_embedded_kubernetes_schemas_refuse_malformed_types(case, schema):
    stored, problems = admit(changed("template", MALFORMED_KUBERNETES_TYPES[case]), schema)
    assert stored is None and problems, f"the API server would store {case}"


def test_the_full_template_is_valid_kubernetes():
    """The example's template, as a pod, passes Kubernetes' own (strict) pod schema."""
    resource = yaml.safe_load((ROOT / "examples" / "orderedconsumer-full.yaml").read_text())
    template = resource["spec"]["template"]
    handler = resource["spec"]["handler"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", **template["metadata"]},
        "spec": {
            **template["spec"],
            "containers": [
                {
                    "name": "consumer",
                    "image": handler["image"],
                    "env": handler["env"],
                    "envFrom": handler["envFrom"],
                    "volumeMounts": handler["volumeMounts"],
                }
            ],
        },
    }
    kubernetes_validate.validate(pod, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize(
    ("name", "accepted"),
    [("payments", True), ("a" * 55, True), ("a" * 56, False), ("payments.eu", False), ("Payments", False)],
)
def test_the_crd_refuses_a_name_the_operator_cannot_use(name, accepted, schema):
    resource = minimal()
    resource["metadata"]["name"] = name
    stored, problems = admit(resource, schema)
    assert (stored is not None) is accepted, problems
    rule_messages = cel_violations(resource, schema)
    if accepted:
        assert rule_messages == []
    else:  # the CEL rule says why, in words (the schema's maxLength and pattern refuse it too)
        assert any("metadata.name must be at most 55 characters" in message for message in rule_messages)
    assert (spec.name_problem(name) is None) is accepted
