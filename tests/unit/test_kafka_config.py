"""The operator's Kafka configuration from a resource's properties Secret (table-driven, no broker)."""

from __future__ import annotations

import pytest

from keyorder_operator.context import OperatorContext, kafka_properties
from keyorder_operator.kafka_config import (
    MAX_POLL_INTERVAL_VARIABLE,
    CredentialsError,
    operator_kafka_config,
    pods_drain_problem,
    redact,
)
from keyorder_operator.observe import LagUnavailable
from keyorder_operator.spec import OrderedConsumerSpec, parse_spec

CA = "-----BEGIN CERTIFICATE-----\nMIIBCA\n-----END CERTIFICATE-----\n"
CERT = "-----BEGIN CERTIFICATE-----\nMIIBCERT\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIKEY\n-----END PRIVATE KEY-----\n"


def config(properties: str, **files: str) -> dict[str, str]:
    return operator_kafka_config("kafka:9093", {"client.properties": properties, **files}, secret_name="pay/kafka")


def test_without_a_secret_only_the_bootstrap_servers():
    assert operator_kafka_config("kafka:9092") == {"bootstrap.servers": "kafka:9092"}


def test_sasl_scram_properties_are_used_as_they_are_and_pod_only_ones_dropped():
    result = config(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=u\nsasl.password=p\n"
        "group.remote.assignor=uniform\nenable.auto.commit=false\nbootstrap.servers=ignored:1\n"
    )
    assert result == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
        "bootstrap.servers": "kafka:9093",  # the spec's, as the pods use
    }


def test_mtls_files_in_the_mounted_secret_become_inline_pem():
    result = config(
        "security.protocol=SSL\n"
        "ssl.ca.location=/etc/keyorder/kafka/ca.crt\n"
        "ssl.certificate.location=/etc/keyorder/kafka/tls.crt\n"
        "ssl.key.location=/etc/keyorder/kafka/tls.key\n"
        "ssl.key.password=secret\n",
        **{"ca.crt": CA, "tls.crt": CERT, "tls.key": KEY},
    )
    assert result == {
        "security.protocol": "SSL",
        "ssl.ca.pem": CA,
        "ssl.certificate.pem": CERT,
        "ssl.key.pem": KEY,
        "ssl.key.password": "secret",
        "bootstrap.servers": "kafka:9093",
    }
    assert not any(name.endswith(".location") for name in result)


def test_inline_pem_and_the_system_ca_store_are_kept():
    result = config("ssl.ca.location=probe\nssl.certificate.pem=" + CERT.replace("\n", "\\n"))
    assert result["ssl.ca.location"] == "probe"
    assert result["ssl.certificate.pem"] == CERT.rstrip()  # the properties reader drops trailing whitespace


@pytest.mark.parametrize(
    ("properties", "files", "expected"),
    [
        (
            "ssl.ca.location=/etc/ssl/certs/corp.pem",
            {},
            "ssl.ca.location=/etc/ssl/certs/corp.pem is a file the operator",
        ),
        ("ssl.ca.location=/etc/keyorder/kafka/ca.crt", {}, "or give the certificate inline as ssl.ca.pem"),
        ("ssl.keystore.location=/etc/keyorder/kafka/k.p12", {"k.p12": "x"}, "ssl.keystore.location names a file"),
        ("sasl.kerberos.keytab=/etc/krb5.keytab", {}, "sasl.kerberos.keytab names a file"),
        ("= no name", {}, "line 1: expected name=value"),
        (
            "partition.assignment.strategy=range",
            {},
            "partition.assignment.strategy is set by spec.kafka.assignmentStrategy",
        ),
        ("group.protocol=consumer", {}, "group.protocol is set by spec.kafka.groupProtocol"),
        ("group.instance.id=ledger-1", {}, "group.instance.id is set by spec.kafka.staticMembership"),
    ],
)
def test_what_cannot_work_in_the_operator_is_refused_with_what_to_do(properties, files, expected):
    with pytest.raises(CredentialsError if "name=value" not in expected else ValueError) as error:
        config(properties, **files)
    assert expected in str(error.value)
    assert "Secret pay/kafka key client.properties" in str(error.value)


def test_a_missing_key_names_the_secret_and_the_field():
    with pytest.raises(CredentialsError, match=r"Secret pay/kafka has no key 'client.properties'.*propertiesSecretRef"):
        operator_kafka_config("kafka:9092", {"other": "x"}, secret_name="pay/kafka")


def test_errors_never_show_a_value():
    properties = {"bootstrap.servers": "kafka:9092", "sasl.password": "hunter22", "sasl.username": "bob"}
    text = 'Invalid value "hunter22" for configuration property "sasl.password" (servers kafka:9092)'
    assert (
        redact(text, properties)
        == 'Invalid value "<redacted>" for configuration property "sasl.password" (servers kafka:9092)'
    )


# --- the pods' drains against max.poll.interval.ms ------------------------------------------------


def spec_with(termination_grace: int = 30, env: list | None = None, **handler: object) -> OrderedConsumerSpec:
    return parse_spec(
        {
            "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "orders"},
            "handler": {
                "image": "registry.example/orders:1.0",
                "handler": "orders.handler:handle",
                "terminationGracePeriodSeconds": termination_grace,
                "env": env or [],
                **handler,
            },
        }
    )


def test_the_default_spec_keeps_the_pods_drains_below_the_default_max_poll_interval():
    """30 s termination grace: a 25 s shutdown grace, 10 s revoke drain, against librdkafka's 300 s."""
    assert pods_drain_problem(spec_with(), operator_kafka_config("kafka:9092")) is None


@pytest.mark.parametrize(
    ("termination_grace", "properties", "env", "expected"),
    [
        # 295 s of shutdown grace + 0.5 s --pause-after + 5 s margin + 10 s (auto may be async) > 300 s
        (300, {}, [], "at least 310500"),
        (3600, {}, [], "terminationGracePeriodSeconds 3600 less 5 s) (3595 s)"),
        (30, {"max.poll.interval.ms": "20000"}, [], "max.poll.interval.ms (20000 ms)"),
        # the pods read spec.handler.env over the Secret
        (
            600,
            {"max.poll.interval.ms": "900000"},
            [{"name": "KEYORDER_RDKAFKA_MAX_POLL_INTERVAL_MS", "value": "60000"}],
            "(60000 ms)",
        ),
        (250, {}, [{"name": "KEYORDER_PAUSE_AFTER", "value": "60"}], "minus KEYORDER_PAUSE_AFTER (60 s)"),
        (
            30,
            {"max.poll.interval.ms": "30000"},
            [{"name": "KEYORDER_REVOKE_DRAIN_TIMEOUT", "value": "29"}],
            "KEYORDER_REVOKE_DRAIN_TIMEOUT (spec.handler.env) (29 s)",
        ),
    ],
)
def test_a_spec_whose_pods_would_outlast_max_poll_interval_is_reported(termination_grace, properties, env, expected):
    problem = pods_drain_problem(spec_with(termination_grace, env), {"bootstrap.servers": "kafka:9092", **properties})
    assert problem is not None and expected in problem, problem
    assert "leaves the group" in problem and "the pods refuse to start" in problem
    assert "spec.kafka.propertiesSecretRef" in problem  # where to raise it


@pytest.mark.parametrize(
    ("termination_grace", "properties", "env"),
    [
        (289, {}, []),  # 284 s of shutdown grace: the largest with the default interval (auto: maybe async)
        (600, {"max.poll.interval.ms": "700000"}, []),
        (600, {}, [{"name": MAX_POLL_INTERVAL_VARIABLE, "value": "700000"}]),
    ],
)
def test_a_max_poll_interval_that_leaves_room_is_accepted(termination_grace, properties, env):
    assert pods_drain_problem(spec_with(termination_grace, env), properties) is None


@pytest.mark.parametrize(
    ("executor", "largest_termination_grace", "why"),
    [
        ("thread", 299, None),  # 294 s of grace <= 300 - 0.5 - 5
        ("async", 289, "the async executor waits up to 10 s more"),  # 284 <= 284.5
        ("auto", 289, "with spec.handler.executor auto the handler may be async def"),
        ("process", 288, "worker processes get up to 11 s for their tear-down hooks"),  # 283 <= 283.5
    ],
)
def test_the_pods_shutdown_grace_leaves_room_for_their_executors_stop(executor, largest_termination_grace, why):
    """As the pods' own rule (keyorder.config.shutdown_overrun): after the grace the pool's stop may run on
    before the final commit, without a call to consume, for as long as the spec's executor allows."""
    assert pods_drain_problem(spec_with(largest_termination_grace, executor=executor), {}) is None
    problem = pods_drain_problem(spec_with(largest_termination_grace + 1, executor=executor), {})
    assert problem is not None and "the pods refuse to start" in problem
    if why is None:
        assert "minus 5 s: at most 294.5 s" in problem, problem
    else:
        assert why in problem, problem


@pytest.mark.parametrize(
    "handler",
    [
        {"envFrom": [{"configMapRef": {"name": "orders-settings"}}]},
        {
            "env": [
                {
                    "name": "KEYORDER_RDKAFKA_MAX_POLL_INTERVAL_MS",
                    "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}},
                }
            ]
        },
    ],
)
def test_what_the_operator_cannot_see_is_not_guessed(handler):
    """From envFrom or valueFrom the pods may get any interval: the pods themselves still refuse a bad one."""
    assert pods_drain_problem(spec_with(3600, **handler), {}) is None


def test_the_operator_reports_it_where_it_reads_the_kafka_properties():
    """context.kafka_properties: LagUnknown (condition and Event) names it, as for the Secret's other refusals."""
    context = OperatorContext(kube=None, clock=lambda: 0.0, monotonic=lambda: 0.0)  # type: ignore[arg-type]
    with pytest.raises(LagUnavailable, match="terminationGracePeriodSeconds 600"):
        kafka_properties(context, spec_with(600), "default")
    assert kafka_properties(context, spec_with(), "default") == {"bootstrap.servers": "kafka:9092"}
