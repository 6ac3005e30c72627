"""Pod start-up: a Kafka property librdkafka refuses is reported with its name and where it was set."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyorder.config import ConfigError, blame_kafka_property, load_run_config
from keyorder.contracts import DeadLetterError
from keyorder.pod import Pod

REQUIRED = {"handler": "m:f", "topics": "orders", "group_id": "g", "bootstrap_servers": "127.0.0.1:1"}


def start(flags: dict[str, object], environ: dict[str, str]) -> Pod:
    config = load_run_config({**REQUIRED, **flags}, environ=environ)
    return Pod(config, handler=lambda message: None, environ=environ, serve_http=False)


def test_unknown_property_from_a_flag_names_the_flag_not_the_dead_letter_producer() -> None:
    with pytest.raises(ConfigError) as caught:
        start({"kafka_property": ["foo.bar=1"]}, {})
    message = str(caught.value)
    assert "'foo.bar'" in message and "--kafka-property / KEYORDER_KAFKA_PROPERTY" in message
    assert "No such configuration property" in message
    assert "dead-letter" not in message


def test_unknown_property_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        start({}, {"KEYORDER_RDKAFKA_SASL_MECHANISMZ": "PLAIN"})
    message = str(caught.value)
    assert "'sasl.mechanismz'" in message and "KEYORDER_RDKAFKA_SASL_MECHANISMZ" in message
    assert "dead-letter" not in message


def test_unknown_property_from_the_file_names_the_file(tmp_path: Path) -> None:
    file = tmp_path / "client.properties"
    file.write_text("security.protocol=PLAINTEXT\nssl.endpoint.identification=https\n")
    with pytest.raises(ConfigError) as caught:
        start({"kafka_properties_file": str(file)}, {})
    message = str(caught.value)
    assert "'ssl.endpoint.identification'" in message and str(file) in message and "dead-letter" not in message


def test_without_a_dead_letter_producer_the_consumer_error_is_blamed_the_same_way() -> None:
    with pytest.raises(ConfigError) as caught:
        start({"kafka_property": ["foo.bar=1"], "on_exhausted": "block"}, {})
    message = str(caught.value)
    assert "'foo.bar'" in message and "--kafka-property" in message


def test_invalid_value_names_the_property_its_origin_and_the_client() -> None:
    with pytest.raises(ConfigError) as caught:
        start({}, {"KEYORDER_RDKAFKA_LINGER_MS": "sometimes"})
    message = str(caught.value)
    assert "'linger.ms'" in message and "KEYORDER_RDKAFKA_LINGER_MS" in message and "dead-letter producer" in message
    assert "Invalid value" in message


def test_an_error_naming_no_supplied_property_is_left_alone() -> None:
    error = DeadLetterError('invalid Kafka client configuration (dead-letter producer): bad "linger.ms"')
    assert blame_kafka_property(error, {"client.id": "--kafka-property"}, "dead-letter producer") is error


def test_an_alias_is_blamed_under_the_name_the_user_gave() -> None:
    with pytest.raises(ConfigError) as caught:
        start({"kafka_property": ["acks=sometimes"]}, {})
    message = str(caught.value)
    assert "'acks'" in message and "--kafka-property" in message and "request.required.acks" in message
