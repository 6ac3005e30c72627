"""load_run_config and the Kafka-properties helpers: precedence, parsing, clear errors, redaction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keyorder.config import (
    ConfigError,
    RunConfig,
    consumer_properties,
    env_name,
    flag_name,
    kafka_properties,
    load_run_config,
    producer_properties,
    read_admin_token,
    read_properties_file,
    redact,
)
from keyorder.core.retry import ExhaustedPolicy
from keyorder.core.routing import Ordering
from keyorder.engine.process_pool import TEARDOWN_TIMEOUT

REQUIRED_FLAGS = {"handler": "app.handlers:handle", "topics": "orders", "group_id": "g1"}


def load(flags: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> RunConfig:
    """Always an explicit environment: the tests never read the real process environment."""
    return load_run_config({**REQUIRED_FLAGS, **(flags or {})}, environ=env or {})


def config_with(**flags: Any) -> RunConfig:
    return load({"bootstrap_servers": None, **flags})


# --- precedence and names -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        ({"workers": "8"}, {"KEYORDER_WORKERS": "4"}, 8),  # flag beats env
        ({}, {"KEYORDER_WORKERS": "4"}, 4),  # env beats default
        ({"workers": None}, {"KEYORDER_WORKERS": "4"}, 4),  # None = flag not given
        ({}, {}, 16),  # default
        ({}, {"WORKERS": "5", "keyorder_workers": "6"}, 16),  # not KEYORDER_*: not ours, ignored
    ],
)
def test_flags_beat_env_beat_defaults(flags: dict[str, Any], env: dict[str, str], expected: int) -> None:
    assert load(flags, env).workers == expected


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        ("KEYORDER_WORKER", "KEYORDER_WORKERS"),
        ("KEYORDER_MAX_INFLIGT", "KEYORDER_MAX_INFLIGHT"),
        ("KEYORDER_SHUTDOWN_GRACE_SECONDS", "KEYORDER_SHUTDOWN_GRACE"),
        ("KEYORDER_DLQ", "KEYORDER_DLQ_TOPIC"),
        ("KEYORDER_LOGLEVEL", "KEYORDER_LOG_LEVEL"),
        ("KEYORDER_HTTP_PROT", "KEYORDER_HTTP_PORT"),
        ("KEYORDER_ZZZ", None),
    ],
)
def test_unknown_keyorder_variable_stops_the_pod(variable: str, suggestion: str | None) -> None:
    with pytest.raises(ConfigError) as caught:
        load(env={variable: "4", "KEYORDER_WORKERS": "8"})
    message = str(caught.value)
    assert message.startswith("unknown environment variable:")
    assert f"  {variable}: " in message
    if suggestion:
        assert f"did you mean {suggestion}?" in message
    else:
        assert "not a setting" in message


def test_a_kafka_property_variable_without_a_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="KEYORDER_RDKAFKA_: a Kafka property needs a name"):
        load(env={"KEYORDER_RDKAFKA_": "x"})


def test_every_unknown_variable_is_named_in_one_message() -> None:
    with pytest.raises(ConfigError) as caught:
        load(env={"KEYORDER_WORKER": "4", "KEYORDER_LOGLEVEL": "DEBUG"})
    message = str(caught.value)
    assert "KEYORDER_WORKER: did you mean KEYORDER_WORKERS?" in message
    assert "KEYORDER_LOGLEVEL: did you mean KEYORDER_LOG_LEVEL?" in message


def test_legitimate_keyorder_variables_are_accepted() -> None:
    from keyorder_operator.builders import consumer_env
    from keyorder_operator.spec import OrderedConsumerSpec

    spec = OrderedConsumerSpec.model_validate(
        {
            "kafka": {
                "bootstrapServers": "k:9092",
                "topics": ["orders"],
                "groupId": "g",
                "propertiesSecretRef": {"name": "s", "key": "client.properties"},
            },
            "handler": {"image": "i", "handler": "m:f"},
        }
    )
    env = {item["name"]: item["value"] for item in consumer_env(spec)}
    env.update(
        {
            "KEYORDER_RDKAFKA_SASL_MECHANISM": "PLAIN",  # a Kafka property
            "KEYORDER_EXAMPLE_LATENCY_MS": "5",  # read by the example handlers
            "KEYORDER_TEST_RECORD_FILE": "/tmp/x",  # read by the test handlers
            # Kubernetes service links of a Service named keyorder(-metrics) in the namespace
            "KEYORDER_SERVICE_HOST": "10.0.0.1",
            "KEYORDER_SERVICE_PORT": "8080",
            "KEYORDER_SERVICE_PORT_HTTP": "8080",
            "KEYORDER_PORT": "tcp://10.0.0.1:8080",
            "KEYORDER_PORT_8080_TCP": "tcp://10.0.0.1:8080",
            "KEYORDER_PORT_8080_TCP_PROTO": "tcp",
            "KEYORDER_PORT_8080_TCP_PORT": "8080",
            "KEYORDER_PORT_8080_TCP_ADDR": "10.0.0.1",
            "KEYORDER_METRICS_PORT": "tcp://10.0.0.2:8080",
        }
    )
    config = load_run_config({}, environ=env)
    assert config.handler == "m:f" and config.admin_token_file is not None


def test_required_fields_can_all_come_from_the_environment() -> None:
    env = {"KEYORDER_HANDLER": "m:f", "KEYORDER_TOPICS": "a,b", "KEYORDER_GROUP_ID": "grp"}
    config = load_run_config({}, environ=env)
    assert (config.handler, config.topics, config.group_id) == ("m:f", ["a", "b"], "grp")


def test_empty_list_flag_counts_as_not_given() -> None:
    config = load({"kafka_property": []}, {"KEYORDER_KAFKA_PROPERTY": "client.id=from-env"})
    assert config.kafka_property == ["client.id=from-env"]


@pytest.mark.parametrize(
    ("field", "env_value", "expected"),
    [
        ("workers", "3", 3),
        ("max_workers", "64", 64),
        ("max_inflight", "20000", 20_000),
        ("max_inflight_per_partition", "100", 100),
        ("resume_ratio", "0.25", 0.25),
        ("pause_after", "0", 0.0),
        ("pause_after", "2.5", 2.5),
        ("poll_batch", "1000", 1000),
        ("commit_interval", "2.5", 2.5),
        ("max_attempts", "9", 9),
        ("retry_initial_backoff", "0.05", 0.05),
        ("retry_max_backoff", "60", 60.0),
        ("ordering", "partition", Ordering.PARTITION),
        ("ordering", "unordered", Ordering.UNORDERED),
        ("on_exhausted", "block", ExhaustedPolicy.BLOCK),
        ("dlq_topic", "dead.{topic}", "dead.{topic}"),
        ("revoke_drain_timeout", "0", 0.0),
        ("shutdown_grace", "5", 5.0),
        ("http_host", "127.0.0.1", "127.0.0.1"),
        ("http_port", "0", 0),
        ("admin_token_file", "/run/secrets/token", Path("/run/secrets/token")),
        ("kafka_properties_file", "/etc/kafka.properties", Path("/etc/kafka.properties")),
        ("bootstrap_servers", "b1:9092,b2:9092", "b1:9092,b2:9092"),  # not split: one string
        ("log_format", "json", "json"),
        ("log_level", "DEBUG", "DEBUG"),
    ],
)
def test_every_field_reads_keyorder_field_from_the_environment(field: str, env_value: str, expected: Any) -> None:
    name = env_name(field)
    assert name == "KEYORDER_" + field.upper()
    assert getattr(load(env={name: env_value}), field) == expected


@pytest.mark.parametrize(
    ("field", "flag", "env"),
    [
        ("workers", "--workers", "KEYORDER_WORKERS"),
        ("max_inflight_per_partition", "--max-inflight-per-partition", "KEYORDER_MAX_INFLIGHT_PER_PARTITION"),
        ("group_id", "--group-id", "KEYORDER_GROUP_ID"),
    ],
)
def test_flag_and_env_names(field: str, flag: str, env: str) -> None:
    assert (flag_name(field), env_name(field)) == (flag, env)


def test_every_field_has_a_description() -> None:
    undocumented = [name for name, field in RunConfig.model_fields.items() if not field.description]
    assert undocumented == []


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("orders", ["orders"]),
        ("orders,payments", ["orders", "payments"]),
        (" orders , payments ,, ", ["orders", "payments"]),
        (["a", "b"], ["a", "b"]),  # already a list: kept as is
    ],
)
def test_topics_are_comma_separated(given: str | list[str], expected: list[str]) -> None:
    assert load({"topics": given}).topics == expected
    if isinstance(given, str):
        assert load_run_config({"handler": "m:f", "group_id": "g"}, {"KEYORDER_TOPICS": given}).topics == expected


def test_defaults() -> None:
    config = load()
    assert config.ordering is Ordering.KEY
    assert (config.workers, config.max_workers, config.max_inflight, config.max_inflight_per_partition) == (
        16,
        4096,
        10_000,
        5_000,
    )
    assert config.on_exhausted is ExhaustedPolicy.DLQ
    assert config.dlq_topic == "{topic}.dlq"
    assert config.kafka_property == []
    assert config.admin_token_file is None


# --- invalid values name the flag and the variable ------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workers", "abc"),
        ("workers", "0"),
        ("max_workers", "-1"),
        ("max_inflight", "0"),
        ("resume_ratio", "1.5"),
        ("resume_ratio", "0"),
        ("pause_after", "-1"),
        ("pause_after", "61"),
        ("pause_after", "nan"),
        ("poll_batch", "100001"),
        ("commit_interval", "0"),
        ("ordering", "random"),
        ("on_exhausted", "drop"),
        ("http_port", "70000"),
        ("handler", "no-colon-here"),
        ("handler", "module:"),
        ("topics", " , "),
        ("group_id", ""),
        ("log_level", "TRACE"),
        ("log_format", "xml"),
        ("kafka_property", "no-equals-sign"),
        ("kafka_property", "=value-without-name"),
        ("batch_max_messages", "0"),
        ("batch_max_messages", "1001"),
        ("batch_max_messages", "many"),
        ("batch_max_wait_ms", "-1"),
        ("batch_max_wait_ms", "10001"),
        ("batch_max_wait_ms", "2.5"),
    ],
)
@pytest.mark.parametrize("source", ["flag", "env"])
def test_invalid_value_names_flag_and_env_var(field: str, value: str, source: str) -> None:
    flags = {field: value} if source == "flag" else {}
    env = {env_name(field): value} if source == "env" else {}
    base = {name: v for name, v in REQUIRED_FLAGS.items() if name != field}
    with pytest.raises(ConfigError) as caught:
        load_run_config({**base, **flags}, environ=env)
    message = str(caught.value)
    assert f"{flag_name(field)} / {env_name(field)}" in message
    assert message.startswith("invalid configuration:")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("retry_max_backoff", "inf"),
        ("retry_max_backoff", "1e10"),
        ("retry_max_backoff", "nan"),
        ("retry_max_backoff", "86401"),
        ("retry_initial_backoff", "inf"),
        ("retry_initial_backoff", "nan"),
        ("shutdown_grace", "inf"),
        ("shutdown_grace", "1e10"),
        ("shutdown_grace", "nan"),
        ("shutdown_grace", "3601"),
        ("commit_interval", "inf"),
        ("revoke_drain_timeout", "inf"),
        ("revoke_drain_timeout", "nan"),
    ],
)
def test_unbounded_durations_are_refused(field: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(env={env_name(field): value})
    assert f"{flag_name(field)} / {env_name(field)}" in str(caught.value)


def test_largest_durations_are_accepted() -> None:
    config = load(
        env={
            "KEYORDER_RETRY_INITIAL_BACKOFF": "86400",
            "KEYORDER_RETRY_MAX_BACKOFF": "86400",
            "KEYORDER_SHUTDOWN_GRACE": "3600",
            "KEYORDER_REVOKE_DRAIN_TIMEOUT": "59.5",
        }
    )
    assert (config.retry_max_backoff, config.shutdown_grace, config.revoke_drain_timeout) == (86400, 3600, 59.5)


@pytest.mark.parametrize("value", ["60", "61", "600"])
def test_revoke_drain_timeout_must_stay_below_the_liveness_threshold(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load({"revoke_drain_timeout": value})
    message = str(caught.value)
    assert "--revoke-drain-timeout / KEYORDER_REVOKE_DRAIN_TIMEOUT" in message
    assert "below 60 s" in message and "/healthz" in message and "rebalance" in message


def test_liveness_threshold_matches_the_http_server() -> None:
    from keyorder.adapters.http_server import STALL_SECONDS
    from keyorder.config import HEALTHZ_STALL_SECONDS

    assert HEALTHZ_STALL_SECONDS == STALL_SECONDS


@pytest.mark.parametrize(
    ("topics", "template"),
    [
        ("orders", "orders"),  # a fixed DLQ name equal to the input
        ("orders", "{topic}"),
        ("orders,orders.dlq", "{topic}.dlq"),  # orders' dead letters land in a consumed topic
        ("a,b", "b"),
    ],
)
def test_dlq_topic_resolving_to_a_consumed_topic_is_refused(topics: str, template: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load({"topics": topics, "dlq_topic": template})
    message = str(caught.value)
    assert "--dlq-topic / KEYORDER_DLQ_TOPIC" in message and "one of the consumed topics" in message


def test_dlq_topic_is_free_when_nothing_is_dead_lettered() -> None:
    config = load({"topics": "orders", "dlq_topic": "{topic}", "on_exhausted": "block"})
    assert config.dlq_topic == "{topic}"


@pytest.mark.parametrize("missing", ["handler", "topics", "group_id"])
def test_missing_required_field_names_flag_and_env_var(missing: str) -> None:
    flags = {name: value for name, value in REQUIRED_FLAGS.items() if name != missing}
    with pytest.raises(ConfigError, match=f"{flag_name(missing)} / {env_name(missing)}"):
        load_run_config(flags, environ={})


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"workers": "32", "max_workers": "16"}, r"workers \(32\) must be <= max_workers \(16\)"),
        (
            {"max_inflight": "1000", "max_inflight_per_partition": "2000"},
            r"max_inflight_per_partition \(2000\) must be <= max_inflight \(1000\)",
        ),
        (
            {"retry_initial_backoff": "5", "retry_max_backoff": "1"},
            "retry_initial_backoff must be <= retry_max_backoff",
        ),
    ],
)
def test_cross_field_errors(flags: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(flags)


def test_cross_field_bounds_are_inclusive() -> None:
    config = load({"workers": "16", "max_workers": "16", "max_inflight": "50", "max_inflight_per_partition": "50"})
    assert config.workers == config.max_workers == 16


def test_config_error_is_a_value_error_without_pydantic_chained() -> None:
    with pytest.raises(ConfigError) as caught:
        load({"workers": "x"})
    assert isinstance(caught.value, ValueError)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# --- Kafka properties -----------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_kafka_properties_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    file = write(
        tmp_path / "kafka.properties",
        "bootstrap.servers=file:9092\nclient.id=from-file\nsasl.mechanism=PLAIN\nlinger.ms=1\n",
    )
    config = config_with(kafka_properties_file=str(file), kafka_property=["linger.ms=3", "acks = all"])
    env = {
        "KEYORDER_RDKAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KEYORDER_RDKAFKA_LINGER_MS": "2",
        "KEYORDER_WORKERS": "4",  # a run setting, not a Kafka property
        "KEYORDER_RDKAFKA_": "ignored: no name",
    }
    assert kafka_properties(config, env) == {
        "bootstrap.servers": "file:9092",
        "client.id": "from-file",
        "sasl.mechanism": "SCRAM-SHA-512",  # env beats file
        "linger.ms": "3",  # flag beats env and file
        "acks": "all",
    }


def test_bootstrap_servers_setting_beats_the_property(tmp_path: Path) -> None:
    config = config_with(bootstrap_servers="setting:9092", kafka_property=["bootstrap.servers=flag:9092"])
    assert kafka_properties(config, {})["bootstrap.servers"] == "setting:9092"


def test_flag_value_may_contain_equals_and_commas() -> None:
    config = config_with(
        kafka_property=["bootstrap.servers=a:9092,b:9092", "sasl.oauthbearer.config=scope=x principal=y"]
    )
    properties = kafka_properties(config, {})
    assert properties["bootstrap.servers"] == "a:9092,b:9092"
    assert properties["sasl.oauthbearer.config"] == "scope=x principal=y"


def test_env_kafka_property_value_may_contain_commas() -> None:
    config = load(env={"KEYORDER_KAFKA_PROPERTY": "bootstrap.servers=a:9092,b:9092"})
    assert kafka_properties(config, {}) == {"bootstrap.servers": "a:9092,b:9092"}


def test_env_kafka_property_list_is_comma_separated() -> None:
    config = load(env={"KEYORDER_KAFKA_PROPERTY": "bootstrap.servers=a:9092, client.id=c"})
    assert kafka_properties(config, {}) == {"bootstrap.servers": "a:9092", "client.id": "c"}


def test_properties_file_parsing(tmp_path: Path) -> None:
    file = write(
        tmp_path / "client.properties",
        "# a comment\n"
        "! also a comment\n"
        "\n"
        "bootstrap.servers=host:9092\n"  # ':' in the value: '=' comes first
        "security.protocol : SASL_SSL\n"  # ':' separator, spaces around
        "   ssl.ca.location = /etc/ca.pem   \n"
        "sasl.jaas.config=a=b\n"  # only the first separator splits
        "empty.value=\n",
    )
    assert read_properties_file(file) == {
        "bootstrap.servers": "host:9092",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": "/etc/ca.pem",
        "sasl.jaas.config": "a=b",
        "empty.value": "",
    }


def test_properties_file_accepts_java_syntax(tmp_path: Path) -> None:
    file = write(
        tmp_path / "java.properties",
        "security.protocol SASL_SSL\n"  # whitespace separator
        "sasl.mechanism:SCRAM-SHA-512\n"  # ':' without spaces
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="app" \\\n'  # continuation lines: leading whitespace dropped
        '    password="p";\n'
        "client.id=caf\\u00e9\n"  # \uXXXX escape
        "ssl.ca.location=C:\\\\certs\\\\ca.pem\n"  # escaped backslashes
        "  # an indented comment\n"
        "name\\ with\\ spaces=x\n",
    )
    assert read_properties_file(file) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="app" '
        'password="p";',
        "client.id": "café",
        "ssl.ca.location": "C:\\certs\\ca.pem",
        "name with spaces": "x",
    }


def test_properties_file_in_iso_8859_1_is_read_like_java(tmp_path: Path) -> None:
    file = tmp_path / "latin1.properties"
    file.write_bytes("sasl.password=m\u00f6tley\nclient.id=x\n".encode("iso-8859-1"))  # b"\xf6": not UTF-8
    assert read_properties_file(file) == {"sasl.password": "m\u00f6tley", "client.id": "x"}


def test_properties_file_in_utf_8_keeps_its_characters(tmp_path: Path) -> None:
    file = tmp_path / "utf8.properties"
    file.write_bytes("sasl.password=m\u00f6tley\n".encode())
    assert read_properties_file(file) == {"sasl.password": "m\u00f6tley"}


def test_properties_file_bad_escape_names_the_file_and_line(tmp_path: Path) -> None:
    file = write(tmp_path / "bad.properties", "# header\nclient.id=a\\\n  b\nsasl.password=\\u12G4\n")
    with pytest.raises(ConfigError) as caught:
        read_properties_file(file)
    message = str(caught.value)
    assert str(file) in message and "line 4" in message and "\\u escape" in message
    assert "12G4" not in message, "values are never shown"


@pytest.mark.parametrize(("bad_line", "number"), [("=value", 3), (":value", 3), ("  = value", 3)])
def test_properties_file_bad_line_names_the_line_number(tmp_path: Path, bad_line: str, number: int) -> None:
    file = write(tmp_path / "bad.properties", f"# header\nclient.id=x\n{bad_line}\nacks=all\n")
    with pytest.raises(ConfigError) as caught:
        read_properties_file(file)
    message = str(caught.value)
    assert f"line {number}" in message
    assert "--kafka-properties-file" in message and str(file) in message


def test_missing_properties_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.properties"
    with pytest.raises(ConfigError, match="cannot read"):
        kafka_properties(config_with(kafka_properties_file=str(missing)), {})


@pytest.mark.parametrize(
    ("source", "name", "reason"),
    [
        ("flag", "enable.auto.commit", "commits the lowest unfinished offset itself"),
        ("env", "enable.auto.offset.store", "stores offsets itself"),
        ("file", "group.id", "use --group-id"),
    ],
)
def test_managed_properties_are_rejected(tmp_path: Path, source: str, name: str, reason: str) -> None:
    flags: dict[str, Any] = {"bootstrap_servers": "b:9092"}
    env: dict[str, str] = {}
    if source == "flag":
        flags["kafka_property"] = [f"{name}=true"]
    elif source == "env":
        env["KEYORDER_RDKAFKA_" + name.upper().replace(".", "_")] = "true"
    else:
        flags["kafka_properties_file"] = str(write(tmp_path / "k.properties", f"{name}=x\n"))
    with pytest.raises(ConfigError) as caught:
        kafka_properties(load(flags), env)
    assert f"{name!r} cannot be set" in str(caught.value)
    assert reason in str(caught.value)
    origin = {"flag": "--kafka-property", "env": "KEYORDER_RDKAFKA_", "file": "k.properties"}[source]
    assert origin in str(caught.value), "the message says where the property was set"


@pytest.mark.parametrize("extra", [[], ["bootstrap.servers="], ["client.id=x"]])
def test_missing_bootstrap_servers_is_a_clear_error(extra: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        kafka_properties(config_with(kafka_property=extra), {})
    message = str(caught.value)
    assert "bootstrap servers" in message
    assert "--bootstrap-servers" in message and "KEYORDER_BOOTSTRAP_SERVERS" in message


def test_bootstrap_servers_from_rdkafka_env() -> None:
    properties = kafka_properties(config_with(), {"KEYORDER_RDKAFKA_BOOTSTRAP_SERVERS": "env:9092"})
    assert properties == {"bootstrap.servers": "env:9092"}


def test_consumer_properties_defaults_and_forced_group() -> None:
    config = load()
    assert consumer_properties(config, {"bootstrap.servers": "b"}) == {
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "statistics.interval.ms": "5000",
        "bootstrap.servers": "b",
        "group.id": "g1",
    }
    assert consumer_properties(config, {"auto.offset.reset": "latest"})["auto.offset.reset"] == "latest"
    eager = consumer_properties(config, {"partition.assignment.strategy": "range"})
    assert eager["partition.assignment.strategy"] == "range"
    # KIP-848: the broker assigns; librdkafka refuses a client-side strategy with this protocol
    assert "partition.assignment.strategy" not in consumer_properties(config, {"group.protocol": "consumer"})


# --- refused combinations of the consumer's properties -------------------------------------------


@pytest.mark.parametrize("protocol", ["consumer", "CONSUMER", " consumer "])
def test_a_static_member_on_the_consumer_protocol_is_refused(protocol: str) -> None:
    """librdkafka's leave of a static member under KIP-848 is temporary (member epoch -2): the broker keeps
    its partitions until the session times out, so the pod's leave on SIGTERM would free nothing."""
    properties = {"bootstrap.servers": "b", "group.instance.id": "pod-1", "group.protocol": protocol}
    with pytest.raises(ConfigError) as caught:
        consumer_properties(load(), properties)
    message = str(caught.value)
    assert "group.instance.id" in message and "group.protocol=consumer" in message
    assert "temporary" in message and "session.timeout.ms" in message
    assert "Remove group.instance.id" in message and "group.protocol=classic" in message


def test_a_static_member_set_by_environment_on_the_consumer_protocol_is_refused() -> None:
    """The operator's way in: the pod name as KEYORDER_RDKAFKA_GROUP_INSTANCE_ID, the protocol beside it."""
    env = {"KEYORDER_RDKAFKA_GROUP_INSTANCE_ID": "orders-7d9-x2", "KEYORDER_RDKAFKA_GROUP_PROTOCOL": "consumer"}
    config = load({"bootstrap_servers": "b:9092"}, env)
    with pytest.raises(ConfigError, match=r"group\.instance\.id"):
        consumer_properties(config, kafka_properties(config, env))


@pytest.mark.parametrize(
    "properties",
    [
        {"group.instance.id": "pod-1"},  # static on the classic protocol: its LeaveGroup removes it
        {"group.instance.id": "pod-1", "group.protocol": "classic"},
        {"group.protocol": "consumer"},  # dynamic on KIP-848: leaves with epoch -1
        {"group.instance.id": "", "group.protocol": "consumer"},  # empty: not a static member
    ],
)
def test_static_membership_or_the_consumer_protocol_alone_is_accepted(properties: dict[str, str]) -> None:
    assert consumer_properties(load(), properties)["group.id"] == "g1"


def test_kafka_source_refuses_a_static_member_on_the_consumer_protocol() -> None:
    """The adapter refuses it too, whoever builds it (before any client exists)."""
    from keyorder.adapters.kafka_source import KafkaSource
    from keyorder.contracts import SourceError

    config = {
        "bootstrap.servers": "localhost:1",
        "group.id": "g",
        "group.instance.id": "p",
        "group.protocol": "consumer",
    }
    with pytest.raises(SourceError, match=r"group\.instance\.id"):
        KafkaSource(config)


@pytest.mark.parametrize(
    ("flags", "properties", "named", "value"),
    [
        # librdkafka's default max.poll.interval.ms (300 s) minus --pause-after (0.5 s) minus 5 s: 294.5 s
        ({"shutdown_grace": "294.6"}, {}, "--shutdown-grace / KEYORDER_SHUTDOWN_GRACE", "294.6 s"),
        ({"shutdown_grace": "3600"}, {}, "--shutdown-grace / KEYORDER_SHUTDOWN_GRACE", "3600 s"),
        ({"shutdown_grace": "25"}, {"max.poll.interval.ms": "30000"}, "--shutdown-grace", "25 s"),
        ({"shutdown_grace": "20", "pause_after": "10"}, {"max.poll.interval.ms": "30000"}, "--shutdown-grace", "20 s"),
        (
            {"revoke_drain_timeout": "30", "shutdown_grace": "10"},
            {"max.poll.interval.ms": "30000"},
            "--revoke-drain-timeout / KEYORDER_REVOKE_DRAIN_TIMEOUT",
            "30 s",
        ),
    ],
)
def test_a_drain_that_could_outlast_max_poll_interval_is_refused(
    flags: dict[str, str], properties: dict[str, str], named: str, value: str
) -> None:
    """Nothing calls consume while the pod drains; past max.poll.interval.ms librdkafka leaves the group, the
    final commit fails, and another pod runs the same keys while this one still does."""
    with pytest.raises(ConfigError) as caught:
        consumer_properties(load(flags), properties)
    message = str(caught.value)
    assert f"{named}" in message and f"({value})" in message
    maximum = properties.get("max.poll.interval.ms", "300000")
    assert f"max.poll.interval.ms ({maximum} ms)" in message and "--pause-after" in message
    assert "leaves the group" in message and "raise max.poll.interval.ms to at least" in message


def test_the_error_says_how_far_to_raise_max_poll_interval() -> None:
    with pytest.raises(ConfigError) as caught:
        consumer_properties(load({"shutdown_grace": "600", "pause_after": "2", "executor": "thread"}), {})
    assert "at least 607000" in str(caught.value)  # 600 + 2 + 5 s
    accepted = consumer_properties(
        load({"shutdown_grace": "600", "pause_after": "2", "executor": "thread"}), {"max.poll.interval.ms": "607000"}
    )
    assert accepted["max.poll.interval.ms"] == "607000"


@pytest.mark.parametrize(
    ("flags", "properties"),
    [
        ({}, {}),  # the defaults: 25 s grace, 10 s revoke drain, 0.5 s pause-after, 300 s interval, auto
        ({"shutdown_grace": "294.5", "executor": "thread"}, {}),  # exactly the margin
        ({"shutdown_grace": "3600", "executor": "thread"}, {"max.poll.interval.ms": "3605500"}),
        (
            {"revoke_drain_timeout": "24.5", "shutdown_grace": "24.5", "executor": "thread"},
            {"max.poll.interval.ms": "30000"},
        ),
    ],
)
def test_drains_comfortably_below_max_poll_interval_are_accepted(
    flags: dict[str, str], properties: dict[str, str]
) -> None:
    assert consumer_properties(load(flags), properties)["group.id"] == "g1"


@pytest.mark.parametrize(
    ("executor", "overrun", "why"),
    [
        ("thread", 0.0, None),
        ("async", 10.0, "the async executor waits up to 10 s more for its event loop"),
        ("auto", 10.0, "with --executor auto the handler may be async def"),
        ("process", TEARDOWN_TIMEOUT + 1, "worker processes get up to 11 s for their tear-down hooks"),
    ],
)
def test_the_shutdown_grace_leaves_room_for_the_executors_stop_after_it(
    executor: str, overrun: float, why: str | None
) -> None:
    """After the grace the pool's stop may run on (ProcessWorkerPool.stop joins each worker for its
    tear-down up to TEARDOWN_TIMEOUT + 1 s, AsyncWorkerPool.stop waits 5 s more for its loop and 5 s
    for its thread) before the final commit, still without a call to consume."""
    longest = 300 - 0.5 - 5 - overrun  # librdkafka's default interval, the default --pause-after
    assert consumer_properties(load({"executor": executor, "shutdown_grace": f"{longest:g}"}), {})["group.id"]
    with pytest.raises(ConfigError) as caught:
        consumer_properties(load({"executor": executor, "shutdown_grace": f"{longest + 0.1:g}"}), {})
    message = str(caught.value)
    assert f"at most {longest:g} s" in message and "at least 300100" in message, message
    if why is None:
        assert "minus 5 s: at most" in message, "no overrun named for the thread executor"
    else:
        assert f"minus 5 s minus {overrun:g} s (" in message and why in message, message


def test_the_revoke_drain_leaves_no_room_for_a_pools_stop() -> None:
    """No pool stops after a revoke's drain: the process executor's tear-down allowance is not taken from it."""
    flags = {"executor": "process", "revoke_drain_timeout": "24.5", "shutdown_grace": "13.5"}
    assert consumer_properties(load(flags), {"max.poll.interval.ms": "30000"})["group.id"] == "g1"


def test_max_poll_interval_that_is_not_a_number_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"max\.poll\.interval\.ms='5m': must be a whole number of milliseconds"):
        consumer_properties(load(), {"max.poll.interval.ms": "5m"})


def test_a_catchup_job_has_no_drain_to_check() -> None:
    """consumer_properties serves the catch-up job too (a KafkaConnectionSettings, no poll loop)."""
    from keyorder.config import KafkaConnectionSettings

    settings = KafkaConnectionSettings(topics=["t"], group_id="g")
    assert consumer_properties(settings, {"max.poll.interval.ms": "1000"})["group.id"] == "g"


def test_producer_properties_drop_consumer_only_keys() -> None:
    kept = {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
        "ssl.ca.location": "/ca.pem",
        "client.id": "c",
        "enable.idempotence": "true",  # "enable." but not "enable.auto."
        "queue.buffering.max.ms": "5",  # "queue." is a producer setting, "queued." is not
        "statistics.interval.ms": "0",
    }
    dropped = {
        "group.instance.id": "i",
        "enable.auto.offset.store": "false",
        "auto.offset.reset": "earliest",
        "auto.commit.interval.ms": "5000",
        "session.timeout.ms": "6000",
        "heartbeat.interval.ms": "500",
        "max.poll.interval.ms": "300000",
        "partition.assignment.strategy": "cooperative-sticky",
        "fetch.min.bytes": "1",
        "queued.max.messages.kbytes": "1024",
        "isolation.level": "read_committed",
        "check.crcs": "true",
        "enable.partition.eof": "false",
        "allow.auto.create.topics": "false",
        "consume.callback.max.messages": "10",
    }
    assert producer_properties({**kept, **dropped}) == kept


@pytest.mark.parametrize(
    "secret",
    [
        "sasl.password",
        "SASL.PASSWORD",
        "sasl.username",
        "ssl.key.pem",
        "ssl.key.password",
        "ssl.keystore.password",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "sasl.jaas.config",
        "sasl.oauthbearer.assertion.private.key.passphrase",  # slipped through the old deny-list
        "sasl.oauthbearer.assertion.private.key.file",
        "ssl.key.location",
        "some.future.librdkafka.credential.blob",  # unknown names are hidden by default
        "made.up.property",
    ],
)
def test_redact_hides_sensitive_values(secret: str) -> None:
    properties = {"bootstrap.servers": "b:9092", secret: "hunter2"}
    shown = redact(properties)
    assert shown == {"bootstrap.servers": "b:9092", secret: "<redacted>"}
    assert properties[secret] == "hunter2", "redact must return a copy"


def test_redact_keeps_ordinary_settings() -> None:
    ordinary = {
        "bootstrap.servers": "b:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "client.id": "c",
        "linger.ms": 5,
        "session.timeout.ms": "6000",
        "group.id": "g",
        "auto.offset.reset": "earliest",
        "SASL.MECHANISMS": "PLAIN",
    }
    assert redact(ordinary) == ordinary


# --- admin token ----------------------------------------------------------------------------------


def test_no_admin_token_file_means_no_token() -> None:
    assert read_admin_token(load()) is None


@pytest.mark.parametrize(("content", "token"), [("s" * 16, "s" * 16), ("  " + "t" * 40 + "\n", "t" * 40)])
def test_admin_token_is_read_and_stripped(tmp_path: Path, content: str, token: str) -> None:
    file = write(tmp_path / "token", content)
    assert read_admin_token(load({"admin_token_file": str(file)})) == token


@pytest.mark.parametrize("content", ["", "Qx7Kp", "Qx7Kp" * 3, "   " + "Qx7Kp" * 3 + "   \n"])
def test_short_admin_token_is_rejected(tmp_path: Path, content: str) -> None:
    file = write(tmp_path / "token", content)
    with pytest.raises(ConfigError) as caught:
        read_admin_token(load({"admin_token_file": str(file)}))
    assert "--admin-token-file" in str(caught.value)
    assert "at least 16 characters" in str(caught.value)
    assert content.strip() == "" or content.strip() not in str(caught.value), "the token must not be echoed"


def test_unreadable_admin_token_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        read_admin_token(load({"admin_token_file": str(tmp_path / "missing")}))


def test_json_logs_are_one_object_per_line():
    import json as json_module
    import logging

    from keyorder.logs import JsonFormatter

    record = logging.LogRecord("keyorder.x", logging.WARNING, __file__, 1, "failed on %s[%d]", ("t", 3), None)
    entry = json_module.loads(JsonFormatter().format(record))
    assert entry["level"] == "WARNING" and entry["message"] == "failed on t[3]" and entry["logger"] == "keyorder.x"
    assert "\n" not in JsonFormatter().format(record)


def test_a_batch_handler_is_configured_by_its_most_messages_and_fill_wait() -> None:
    config = load(env={"KEYORDER_BATCH_MAX_MESSAGES": "200", "KEYORDER_BATCH_MAX_WAIT_MS": "5"})
    limits = config.batch_limits()
    assert (limits.enabled, limits.max_messages, limits.max_wait) == (True, 200, 0.005)
    assert not load().batch_limits().enabled, "a per-message handler by default"


def test_a_fill_wait_without_batches_is_refused_naming_both_flags() -> None:
    with pytest.raises(ConfigError) as caught:
        load(env={"KEYORDER_BATCH_MAX_WAIT_MS": "5"})
    message = str(caught.value)
    assert "--batch-max-wait-ms / KEYORDER_BATCH_MAX_WAIT_MS" in message and "--batch-max-messages" in message
