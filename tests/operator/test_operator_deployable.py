"""The real kopf operator on the API emulator: what a real install needs beyond scaling.

Pod templates reach the pods, spec changes converge by server-side apply (a removed env var or a changed
port does not linger), a fixed spec clears InvalidSpec, bad names are refused, and every way the
operator's Kafka client can fail to be built ends in LagUnknown with the reason and an Event.

No broker runs here, except where a test says so: the lag comes from ``NoKafka``, a stand-in that
always answers "unavailable", so the operator's timer never waits on a network timeout.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Sequence
from typing import Any

import pytest

from keyorder_operator.builders import ASSIGNMENT_STRATEGY_VARIABLE
from keyorder_operator.kube import Kube
from keyorder_operator.observe import KafkaLagSource, LagSample, LagUnavailable
from keyorder_operator.reconcile import OperatorContext, register
from tests.operator.harness import CR, api_client, polls_of, run_kopf, wait_for, wait_for_polls
from tests.operator.kubelet import LocalKubelet

pytestmark = pytest.mark.timeout(120)


class NoKafka:
    """A stand-in lag source: no broker in these tests (the real one is tested against Tansu elsewhere)."""

    def __init__(self, properties: dict[str, str]) -> None:
        self.properties = properties

    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample:
        raise LagUnavailable("no broker in this test")

    def close(self) -> None:
        pass


@contextlib.contextmanager
def operator(url: str, lag_source_for: Any = NoKafka):
    with api_client(url) as client:
        context = OperatorContext(kube=Kube(client), tick_seconds=0.3, lag_source_for=lag_source_for)
        with run_kopf(url, lambda registry: register(registry, context)), polls_of(context):
            yield context


def resource(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kafka": {"bootstrapServers": "127.0.0.1:9", "topics": ["orders"], "groupId": "orders"},
        "handler": {"image": "registry.example/orders:1.0", "handler": "orders.handler:handle"},
        "scaling": {"pollIntervalSeconds": 1},
    }
    body.update(spec)
    return {"apiVersion": "keyorder.dev/v1alpha1", "kind": "OrderedConsumer", "metadata": {"name": name}, "spec": body}


def condition(kube, name: str, kind: str) -> dict[str, Any]:
    resource = kube.get(CR, name) or {}
    return next((c for c in (resource.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def events(kube, reason: str) -> list[str]:
    return [event.get("message", "") for event in kube.list("v1/events", "default") if event.get("reason") == reason]


def consumer(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_spec_changes_converge_by_server_side_apply_and_the_template_reaches_the_pods(kube):
    with operator(kube.url):
        kube.create(
            CR,
            resource(
                "orders",
                handler={
                    "image": "registry.example/orders:1.0",
                    "handler": "orders.handler:handle",
                    "env": [{"name": "KEEP", "value": "1"}, {"name": "DROP", "value": "2"}],
                },
            ),
        )
        first = wait_for(lambda: kube.get("apps/v1/deployments", "orders"), 20, "the Deployment")
        assert {"KEEP", "DROP"} <= {item["name"] for item in consumer(first)["env"]}
        kube.patch("apps/v1/deployments", "orders", {"metadata": {"annotations": {"team.example/owner": "orders"}}})
        kube.patch(
            CR,
            "orders",
            {
                "spec": {
                    "httpPort": 9090,
                    "handler": {
                        "env": [
                            {"name": "KEEP", "value": "1"},
                            {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                        ],
                        "volumeMounts": [{"name": "fx", "mountPath": "/etc/fx"}],
                    },
                    "template": {
                        "metadata": {"annotations": {"sidecar.istio.io/inject": "false"}},
                        "spec": {
                            "imagePullSecrets": [{"name": "registry-credentials"}],
                            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
                            "volumes": [{"name": "fx", "configMap": {"name": "fx-rates"}}],
                        },
                    },
                }
            },
        )

        def converged() -> dict[str, Any] | None:
            deployment = kube.get("apps/v1/deployments", "orders")
            return deployment if deployment and consumer(deployment)["ports"][0]["containerPort"] == 9090 else None

        deployment = wait_for(converged, 20, "the Deployment to follow the spec")
        container = consumer(deployment)
        assert container["ports"] == [{"name": "http", "containerPort": 9090}], "the old port lingers"
        names = [item["name"] for item in container["env"]]
        assert "DROP" not in names, "a removed env var lingers"
        assert {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}} in container[
            "env"
        ]
        pod = deployment["spec"]["template"]
        assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert pod["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
        assert {"name": "fx", "mountPath": "/etc/fx"} in container["volumeMounts"]
        assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9090"
        assert deployment["metadata"]["annotations"] == {"team.example/owner": "orders"}, "another tool's field went"
        service = wait_for(
            lambda: (
                (kube.get("v1/services", "orders-metrics") or {}).get("spec", {}).get("ports", [{}])[0].get("port")
                == 9090
                and kube.get("v1/services", "orders-metrics")
            ),
            20,
            "the Service to follow the port",
        )
        assert [port["port"] for port in service["spec"]["ports"]] == [9090], "the old Service port lingers"


def test_a_fixed_spec_clears_invalid_spec_and_gets_its_objects(kube_older_crd):
    """The CRD refuses such a spec (CEL); an older CRD lets it through to the operator."""
    kube = kube_older_crd
    with operator(kube.url):
        kube.create(CR, resource("fixme", workers={"min": 8, "initial": 4, "max": 2}))
        wait_for(lambda: condition(kube, "fixme", "InvalidSpec").get("status") == "True", 20, "InvalidSpec")
        kube.patch(CR, "fixme", {"spec": {"workers": {"min": 1, "initial": 4, "max": 8}}})
        wait_for(lambda: kube.get("apps/v1/deployments", "fixme"), 20, "the Deployment of the fixed spec")
        cleared = wait_for(
            lambda: (
                condition(kube, "fixme", "InvalidSpec").get("status") == "False"
                and condition(kube, "fixme", "InvalidSpec")
            ),
            20,
            "InvalidSpec to clear",
        )
        assert cleared["reason"] == "Valid"
        # the poll (every tick, from its own copy of the resource) keeps its conditions and never
        # writes the stale InvalidSpec back
        wait_for(lambda: condition(kube, "fixme", "LagUnknown").get("status") == "True", 20, "the poll's LagUnknown")
        for _ in range(4):
            wait_for_polls(kube, "fixme", 1)
            assert condition(kube, "fixme", "InvalidSpec").get("status") == "False", "a stale InvalidSpec came back"


def test_a_template_that_would_weaken_the_hardening_is_refused_by_field(kube):
    with operator(kube.url):
        hostile = {"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}
        kube.create(CR, resource("hostile", template=hostile))
        message = wait_for(
            lambda: condition(kube, "hostile", "InvalidSpec").get("message"), 20, "InvalidSpec on the hostPath"
        )
        assert "spec.template.spec.volumes[0].hostPath" in message
        assert kube.get("apps/v1/deployments", "hostile") is None


def test_a_name_the_objects_cannot_carry_is_invalid(kube_older_crd):
    """The CRD refuses such a name (CEL and the name's pattern); an older CRD lets it through to the operator."""
    kube = kube_older_crd
    with operator(kube.url):
        kube.create(CR, resource("orders.eu"))
        message = wait_for(
            lambda: condition(kube, "orders.eu", "InvalidSpec").get("message"), 20, "InvalidSpec on the name"
        )
        assert message.startswith("metadata.name: 'orders.eu' must be at most 55 characters")
        assert any("metadata.name" in text for text in events(kube, "InvalidSpec"))
        assert kube.get("apps/v1/deployments", "orders.eu") is None


def secret(name: str, **data: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in data.items()},
    }


@pytest.mark.parametrize(
    ("secret_data", "reason"),
    [
        (None, "Secret default/kafka-client (spec.kafka.propertiesSecretRef) does not exist"),
        ({"other": "x"}, "Secret default/kafka-client has no key 'client.properties'"),
        (
            {"client.properties": "security.protocol=SSL\nssl.ca.location=/etc/ssl/corp-ca.pem\n"},
            "ssl.ca.location=/etc/ssl/corp-ca.pem is a file the operator cannot read",
        ),
        (
            {"client.properties": "no.such.property=s3cr3t-value\n"},
            "no.such.property is not a property the operator's Kafka client uses",  # the allow-list (issue 37)
        ),
        (
            {"client.properties": "security.protocol=s3cr3t-value\n"},
            "the Kafka client could not be built: ",  # librdkafka's own refusal, without the value
        ),
    ],
    ids=["missing secret", "missing key", "pod-only file", "refused property", "bad value"],
)
def test_every_failure_to_build_the_kafka_client_is_lag_unknown_with_its_reason(kube, secret_data, reason):
    """The real KafkaLagSource: building its client fails before any broker is contacted."""
    if secret_data is not None:
        kube.create("v1/secrets", secret("kafka-client", **secret_data))
    with operator(kube.url, lag_source_for=KafkaLagSource):
        kafka = {
            "bootstrapServers": "127.0.0.1:9",
            "topics": ["orders"],
            "groupId": "orders",
            "propertiesSecretRef": {"name": "kafka-client"},
        }
        kube.create(CR, resource("creds", kafka=kafka))
        unknown = wait_for(
            lambda: (
                condition(kube, "creds", "LagUnknown").get("status") == "True"
                and condition(kube, "creds", "LagUnknown")
            ),
            20,
            "LagUnknown",
        )
        assert reason in unknown["message"]
        assert any(reason in text for text in events(kube, "LagUnknown")), events(kube, "LagUnknown")
        assert condition(kube, "creds", "Ready").get("status") == "False"
        assert "s3cr3t-value" not in str(kube.get(CR, "creds")) and not any(
            "s3cr3t" in e for e in events(kube, "LagUnknown")
        )


def test_a_cut_over_keeps_recreate_while_old_pods_terminate_and_rolls_again_once_they_are_gone(kube):
    """A move from cooperative to eager is rolled out with ``Recreate`` (one group cannot mix them). While the old
    pods terminate, the Deployment shows 0 replicas and 0 updated (a ReplicaSet counts no terminating pod), which
    is not the end of the cut-over: the strategy stays ``Recreate`` over several polls and no eager pod starts;
    once the old pods are gone and the new ones run, the operator goes back to ``RollingUpdate``. The stand-in
    controllers (``LocalKubelet``, FAKE, object-only pods) hold the deleted pods terminating, as a slow node does,
    and report no ``terminatingReplicas`` (a cluster before Kubernetes 1.35, or with the feature off)."""

    def deployment() -> dict[str, Any]:
        return kube.get("apps/v1/deployments", "switch") or {}

    def strategy_variable(pod_spec: dict[str, Any]) -> str | None:
        env = pod_spec["containers"][0].get("env") or []
        return next((item.get("value") for item in env if item["name"] == ASSIGNMENT_STRATEGY_VARIABLE), None)

    def pods() -> list[dict[str, Any]]:
        return [pod for pod in kube.list("v1/pods", "default") if pod["metadata"]["name"].startswith("switch-")]

    def terminating(listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [pod for pod in listed if pod["metadata"].get("deletionTimestamp")]

    with operator(kube.url), LocalKubelet(kube, "switch", processes=False, period=0.1) as kubelet:
        kube.create(CR, resource("switch", replicas={"min": 2, "max": 4}))
        wait_for(lambda: (deployment().get("status") or {}).get("readyReplicas") == 2, 30, "2 ready pods")
        assert deployment()["spec"]["strategy"]["type"] == "RollingUpdate"
        assert {strategy_variable(pod["spec"]) for pod in pods()} == {"cooperative-sticky"}

        kubelet.hold_terminating.set()
        kube.patch(CR, "switch", {"spec": {"kafka": {"assignmentStrategy": "range"}}})
        wait_for(
            lambda: strategy_variable(deployment()["spec"]["template"]["spec"]) == "range", 20, "the eager template"
        )
        assert deployment()["spec"]["strategy"] == {"type": "Recreate"}
        wait_for(lambda: len(terminating(pods())) == 2, 20, "the old pods to terminate")
        status = wait_for(
            lambda: (
                (s := deployment().get("status") or {}).get("observedGeneration")
                == deployment()["metadata"]["generation"]
                and s
            ),
            20,
            "the controller to observe the cut-over",
        )
        assert not status.get("replicas") and not status.get("updatedReplicas"), "0 and 0 while the old pods go"
        wait_for_polls(kube, "switch", 3)
        assert deployment()["spec"]["strategy"] == {"type": "Recreate"}, "went back to rolling while old pods ran"
        assert {strategy_variable(pod["spec"]) for pod in pods()} == {"cooperative-sticky"}, "eager and cooperative mix"

        kubelet.hold_terminating.clear()
        wait_for(lambda: deployment()["spec"]["strategy"]["type"] == "RollingUpdate", 30, "rolling updates again")
        listed = pods()
        assert not terminating(listed), "went back to rolling while an old pod was still there"
        assert {strategy_variable(pod["spec"]) for pod in listed} == {"range"}
        assert (deployment().get("status") or {}).get("updatedReplicas") == 2
