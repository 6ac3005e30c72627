"""OrderedConsumer spec validation (table-driven) and the pure object builders."""

from __future__ import annotations

import pytest

from keyorder_operator.builders import (
    ASSIGNMENT_STRATEGY_VARIABLE as STRATEGY,
)
from keyorder_operator.builders import (
    GROUP_INSTANCE_ID_VARIABLE as INSTANCE_ID,
)
from keyorder_operator.builders import (
    GROUP_PROTOCOL_VARIABLE as GROUP_PROTOCOL,
)
from keyorder_operator.builders import (
    build_deployment,
    build_pdb,
    build_service,
    build_service_account,
    cut_over_done,
    cutting_over,
    update_strategy,
)
from keyorder_operator.spec import AssignmentStrategy, InvalidSpec, parse_spec

MINIMAL = {
    "kafka": {"bootstrapServers": "kafka:9092", "topics": ["payments"], "groupId": "ledger"},
    "handler": {"image": "registry.example/ledger:1.0", "handler": "ledger.handler:handle"},
}
OWNER = {"metadata": {"name": "ledger", "namespace": "pay", "uid": "uid-1"}}


def with_(path: str, value):
    spec = {key: dict(value) if isinstance(value, dict) else value for key, value in MINIMAL.items()}
    node = spec
    *parents, leaf = path.split(".")
    for part in parents:
        node[part] = dict(node.get(part, {}))
        node = node[part]
    node[leaf] = value
    return spec


def test_minimal_spec_gets_the_documented_defaults():
    spec = parse_spec(MINIMAL)
    assert (spec.workers.min, spec.workers.initial, spec.workers.max) == (1, 16, 256)
    assert spec.replicas.max is None and spec.scaling.enabled and spec.ordering.value == "key"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("kafka.topics", [], "spec.kafka.topics"),
        ("handler.handler", "not a path", "spec.handler.handler"),
        ("workers.max", 0, "spec.workers.max"),
        ("workers", {"min": 8, "initial": 4, "max": 16}, "spec.workers: Value error, need min <= initial <= max"),
        ("replicas", {"min": 5, "max": 2}, "spec.replicas: Value error, min (5) must be <= max (2)"),
        ("replicas", {"min": 0}, "replicas.min 0 needs scaling.scaleToZero"),
        ("ordering", "random", "spec.ordering"),
        ("scaling.targetDrainSeconds", "soon", "spec.scaling.targetDrainSeconds"),
        ("unknownField", 1, "spec.unknownField: Extra inputs are not permitted"),
    ],
)
def test_invalid_specs_name_the_field(path, value, expected):
    with pytest.raises(InvalidSpec) as error:
        parse_spec(with_(path, value))
    assert expected in str(error.value)


def test_deployment_is_owned_locked_down_and_configured_by_env():
    spec = parse_spec(with_("kafka.propertiesSecretRef", {"name": "kafka-client"}))
    deployment = build_deployment(spec, OWNER, replicas=3)
    assert deployment["metadata"]["ownerReferences"][0] == {
        "apiVersion": "keyorder.dev/v1alpha1",
        "kind": "OrderedConsumer",
        "name": "ledger",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    security = container["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]} and not security["allowPrivilegeEscalation"]
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["KEYORDER_TOPICS"] == "payments" and env["KEYORDER_GROUP_ID"] == "ledger"
    assert env["KEYORDER_KAFKA_PROPERTIES_FILE"] == "/etc/keyorder/kafka/client.properties"
    assert env["KEYORDER_ADMIN_TOKEN_FILE"] == "/etc/keyorder/admin/token"
    assert env["KEYORDER_SHUTDOWN_GRACE"] == "25"
    assert deployment["spec"]["replicas"] == 3
    assert "sasl" not in str(deployment).lower(), "credentials stay in the Secret, never in the Deployment"


def test_scaling_does_not_change_the_pod_template_but_a_spec_change_does():
    spec = parse_spec(MINIMAL)
    template = build_deployment(spec, OWNER, 1)["spec"]["template"]
    assert template == build_deployment(spec, OWNER, 4)["spec"]["template"]
    changed = parse_spec(with_("handler.image", "registry.example/ledger:1.1"))
    assert build_deployment(changed, OWNER, 1)["spec"]["template"] != template


def test_service_pdb_and_service_account():
    spec = parse_spec(MINIMAL)
    service = build_service(spec, OWNER)
    assert service["metadata"]["name"] == "ledger-metrics" and service["spec"]["ports"][0]["port"] == 8080
    assert build_pdb(OWNER)["spec"]["maxUnavailable"] == 1
    assert build_service_account(OWNER)["automountServiceAccountToken"] is False


@pytest.mark.parametrize(("executor", "variable"), [(None, None), ("auto", None), ("process", "process")])
def test_the_executor_reaches_the_pods_as_keyorder_executor(executor, variable):
    from keyorder.config import load_run_config

    spec = parse_spec(with_("handler.executor", executor) if executor else MINIMAL)
    container = build_deployment(spec, OWNER, replicas=1)["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env.get("KEYORDER_EXECUTOR") == variable
    assert load_run_config({}, env).executor == (variable or "auto"), "the pod must accept what the builder sets"


@pytest.mark.parametrize(
    ("batch", "variables"),
    [
        (None, {"KEYORDER_BATCH_MAX_MESSAGES": "1"}),  # set even so: no envFrom variable turns batching on
        ({"maxMessages": 200}, {"KEYORDER_BATCH_MAX_MESSAGES": "200"}),
        (
            {"maxMessages": 200, "maxWaitMs": 5},
            {"KEYORDER_BATCH_MAX_MESSAGES": "200", "KEYORDER_BATCH_MAX_WAIT_MS": "5"},
        ),
    ],
)
def test_a_batch_handler_reaches_the_pods_as_its_two_variables(batch, variables):
    from keyorder.config import load_run_config

    spec = parse_spec(with_("handler.batch", batch) if batch else MINIMAL)
    container = build_deployment(spec, OWNER, replicas=1)["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert {name: value for name, value in env.items() if name.startswith("KEYORDER_BATCH_")} == variables
    limits = load_run_config({}, env).batch_limits()
    assert limits.max_messages == (batch or {}).get("maxMessages", 1), "the pod must accept what the builder sets"


@pytest.mark.parametrize("name", ["KEYORDER_BATCH_MAX_MESSAGES", "KEYORDER_BATCH_MAX_WAIT_MS"])
def test_a_batch_variable_in_the_handlers_env_is_refused_as_the_operators(name):
    """Set from spec.handler.batch: in spec.handler.env it would override the spec (Kubernetes takes the later
    entry), pass the refusal of a batch handler with catch-up, or make the pods refuse to start (a review found
    it accepted)."""
    spec = with_("handler.env", [{"name": name, "value": "50"}])
    with pytest.raises(InvalidSpec, match=f"{name} is set by the operator from the spec"):
        parse_spec(spec)


@pytest.mark.parametrize(
    ("batch", "catchup", "expected"),
    [
        ({"maxMessages": 0}, None, "spec.handler.batch.maxMessages"),
        ({"maxMessages": 1001}, None, "spec.handler.batch.maxMessages"),
        ({"maxWaitMs": -1, "maxMessages": 2}, None, "spec.handler.batch.maxWaitMs"),
        ({"maxWaitMs": 5}, None, "spec.handler.batch: Value error, maxWaitMs needs maxMessages above 1"),
        ({"maxMessages": 50}, {"enabled": True, "image": "c:1"}, "handler.batch.maxMessages above 1 with catchup"),
    ],
)
def test_bad_batch_settings_are_refused_naming_the_field(batch, catchup, expected):
    spec = with_("handler.batch", batch)
    if catchup:
        spec["catchup"] = catchup
    with pytest.raises(InvalidSpec) as error:
        parse_spec(spec)
    assert expected in str(error.value)


def test_an_unknown_executor_is_refused_naming_the_field():
    with pytest.raises(InvalidSpec, match=r"spec\.handler\.executor"):
        parse_spec(with_("handler.executor", "gpu"))


# --- the assignment strategy and the cut-over between eager and cooperative ----------------------


def live(strategy: str | None, update: str = "RollingUpdate", generation: int = 2, status: dict | None = None) -> dict:
    """A live Deployment as the API server returns it (its first container's env, strategy and status)."""
    built = build_deployment(parse_spec(MINIMAL), OWNER, 3)
    env = [item for item in built["spec"]["template"]["spec"]["containers"][0]["env"] if item["name"] != STRATEGY]
    if strategy is not None:
        env.append({"name": STRATEGY, "value": strategy})
    built["spec"]["template"]["spec"]["containers"][0]["env"] = env
    built["spec"]["strategy"] = {"type": update}
    built["metadata"]["generation"] = generation
    built["status"] = status if status is not None else {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3}
    return built


def test_pods_get_cooperative_sticky_by_default_and_the_spec_can_choose_an_eager_strategy():
    env = {
        item["name"]: item["value"]
        for item in build_deployment(parse_spec(MINIMAL), OWNER, 1)["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env[STRATEGY] == "cooperative-sticky"
    eager = parse_spec(with_("kafka.assignmentStrategy", "range"))
    assert eager.kafka.assignment_strategy is AssignmentStrategy.RANGE
    with pytest.raises(InvalidSpec, match=r"spec\.kafka\.assignmentStrategy"):
        parse_spec(with_("kafka.assignmentStrategy", "range,cooperative-sticky"))


@pytest.mark.parametrize(
    ("desired", "live_deployment", "expected"),
    [
        ("cooperative-sticky", None, "RollingUpdate"),  # a new Deployment: no old pods to mix with
        ("cooperative-sticky", live("cooperative-sticky"), "RollingUpdate"),
        ("range", live("roundrobin"), "RollingUpdate"),  # eager to eager: they share a group
        ("range", live("cooperative-sticky"), "Recreate"),
        ("cooperative-sticky", live("range"), "Recreate"),
        ("cooperative-sticky", live(None), "Recreate"),  # pods of an older operator: librdkafka's eager default
        # the cut-over keeps Recreate until no pod of the old template is left ...
        (
            "cooperative-sticky",
            live(
                "cooperative-sticky", "Recreate", status={"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1}
            ),
            "Recreate",
        ),
        (
            "cooperative-sticky",
            live(
                "cooperative-sticky", "Recreate", status={"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3}
            ),
            "Recreate",
        ),
        # ... and then goes back to rolling updates (the pods were listed: none of the old kind is left)
        ("cooperative-sticky", live("cooperative-sticky", "Recreate"), "RollingUpdate"),
    ],
)
def test_a_move_between_eager_and_cooperative_is_a_cut_over(desired, live_deployment, expected):
    spec = parse_spec(with_("kafka.assignmentStrategy", desired))
    strategy = update_strategy(spec, live_deployment, pods=[])
    assert strategy["type"] == expected
    assert ("rollingUpdate" in strategy) == (expected == "RollingUpdate"), "Recreate refuses rollingUpdate"
    assert build_deployment(spec, OWNER, 3, strategy)["spec"]["strategy"] == strategy


def pod(strategy: str | None, *, terminating: bool = False, phase: str = "Running") -> dict:
    """A pod of the group as the API server lists it: made from a template whose consumer runs ``strategy``."""
    metadata: dict = {"name": f"ledger-{strategy}", "labels": {"app.kubernetes.io/instance": "ledger"}}
    if terminating:
        metadata.update(deletionTimestamp="2026-01-01T00:00:30Z", deletionGracePeriodSeconds=30)
    template = live(strategy)["spec"]["template"]
    return {"metadata": metadata, "spec": {**template["spec"], "nodeName": "n1"}, "status": {"phase": phase}}


COOPERATIVE, EAGER = "cooperative-sticky", "range"
OBSERVED_ALL = {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3}


@pytest.mark.parametrize(
    ("status", "pods", "expected"),
    [
        # the old pods terminate: a ReplicaSet counts no terminating pod, so the Deployment shows 0 and 0
        ({"observedGeneration": 2}, [pod(EAGER, terminating=True)] * 3, "Recreate"),
        # every replica updated, yet an old pod is still leaving the group
        (OBSERVED_ALL, [pod(COOPERATIVE)] * 3 + [pod(EAGER, terminating=True)], "Recreate"),
        # the pods were not read: no telling whether an old one is left
        (OBSERVED_ALL, None, "Recreate"),
        # the cluster counts terminating pods itself (Kubernetes 1.33+): not done while it counts any
        ({**OBSERVED_ALL, "terminatingReplicas": 1}, [pod(COOPERATIVE)] * 3, "Recreate"),
        # the controller has not observed the current spec: its counts are of an older one
        ({"replicas": 3, "updatedReplicas": 3}, [pod(COOPERATIVE)] * 3, "Recreate"),
        ({**OBSERVED_ALL, "observedGeneration": 1}, [pod(COOPERATIVE)] * 3, "Recreate"),
        # the new pods are still being made
        ({**OBSERVED_ALL, "updatedReplicas": 1, "replicas": 1}, [pod(COOPERATIVE)], "Recreate"),
        # done: a terminating pod of the new kind mixes with nothing, a finished old one is no member
        (OBSERVED_ALL, [pod(COOPERATIVE)] * 3 + [pod(COOPERATIVE, terminating=True)], "RollingUpdate"),
        (OBSERVED_ALL, [pod(COOPERATIVE)] * 3 + [pod(EAGER, phase="Failed")], "RollingUpdate"),
        (OBSERVED_ALL, [pod(COOPERATIVE)] * 3, "RollingUpdate"),
    ],
)
def test_a_cut_over_ends_only_when_the_new_spec_is_observed_and_no_old_pod_is_left(status, pods, expected):
    spec = parse_spec(with_("kafka.assignmentStrategy", COOPERATIVE))
    strategy = update_strategy(spec, live(COOPERATIVE, "Recreate", status=status), pods)
    assert strategy["type"] == expected


def test_a_cut_over_at_zero_replicas_ends_when_no_old_pod_is_left():
    spec = parse_spec(with_("kafka.assignmentStrategy", COOPERATIVE))
    idle = live(COOPERATIVE, "Recreate", status={"observedGeneration": 2})  # zero counts are left out
    idle["spec"]["replicas"] = 0
    assert update_strategy(spec, idle, [pod(EAGER, terminating=True)])["type"] == "Recreate"
    assert update_strategy(spec, idle, [])["type"] == "RollingUpdate"
    assert cut_over_done(idle, [], "cooperative")
    assert not cut_over_done(idle, [pod(COOPERATIVE), pod(EAGER, terminating=True)], "cooperative")
    assert cutting_over(idle) and not cutting_over(live(COOPERATIVE)) and not cutting_over(None)


def kip848(spec_dict: dict) -> dict:
    kafka = {**spec_dict["kafka"], "groupProtocol": "consumer"}
    return {**spec_dict, "kafka": kafka}


def test_kip848_pods_get_the_consumer_protocol_and_no_client_side_strategy():
    spec = parse_spec(kip848(MINIMAL))
    container = build_deployment(spec, OWNER, 1)["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env[GROUP_PROTOCOL] == "consumer" and STRATEGY not in env, "librdkafka refuses a strategy with it"
    with pytest.raises(InvalidSpec, match=r"assignmentStrategy applies to groupProtocol classic only"):
        parse_spec(kip848(with_("kafka.assignmentStrategy", "cooperative-sticky")))


def test_a_move_to_or_from_kip848_is_a_cut_over_too():
    consumer = parse_spec(kip848(MINIMAL))
    assert update_strategy(consumer, live("cooperative-sticky"))["type"] == "Recreate"
    consumer_pods = build_deployment(consumer, OWNER, 3)
    consumer_pods["status"] = {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3}
    assert update_strategy(consumer, consumer_pods)["type"] == "RollingUpdate"
    assert update_strategy(parse_spec(MINIMAL), consumer_pods)["type"] == "Recreate"


def test_static_membership_gives_each_pod_its_own_name_as_group_instance_id():
    container = build_deployment(parse_spec(MINIMAL), OWNER, 1)["spec"]["template"]["spec"]["containers"][0]
    assert INSTANCE_ID not in {item["name"] for item in container["env"]}, "off by default"
    static = parse_spec(with_("kafka.staticMembership", True))
    container = build_deployment(static, OWNER, 1)["spec"]["template"]["spec"]["containers"][0]
    instance = [item for item in container["env"] if item["name"] == INSTANCE_ID]
    assert instance == [{"name": INSTANCE_ID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    with pytest.raises(InvalidSpec, match=INSTANCE_ID):
        parse_spec(with_("handler.env", [{"name": INSTANCE_ID, "value": "shared"}]))
