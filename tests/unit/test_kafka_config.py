"""The operator's Kafka configuration from a resource's properties Secret (table-driven, no broker)."""

from __future__ import annotations

import pytest

from keyorder_operator.kafka_config import CredentialsError, operator_kafka_config, redact

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
