"""The operator's own Kafka client configuration, built from an OrderedConsumer's properties Secret.

The pods read that Secret as files (it is mounted at ``KAFKA_PROPERTIES_DIR``), so a properties file
naturally says ``ssl.ca.location=/etc/keyorder/kafka/ca.crt``. The operator runs elsewhere, where no
such file exists: it reads the Secret through the API instead, and turns every TLS file property
that points into the mounted Secret into librdkafka's inline PEM property with that key's content
(``ssl.ca.location`` -> ``ssl.ca.pem``, ``ssl.certificate.location`` -> ``ssl.certificate.pem``,
``ssl.key.location`` -> ``ssl.key.pem``). Inline PEM properties and SASL properties (SCRAM, PLAIN,
OAUTHBEARER) are used as they are. Any other file path cannot exist in the operator: it is refused
with a message naming the property and what to do instead. Pure: the Secret's decoded data in, a
configuration out; no value ever appears in an error.
"""

from __future__ import annotations

from collections.abc import Mapping

from keyorder.config import (
    ConfigError,
    RunConfig,
    UnpolledDrain,
    env_name,
    max_poll_interval_ms,
    parse_properties,
    shutdown_overrun,
    unpolled_drain_problems,
)
from keyorder_operator.spec import OrderedConsumerSpec

MOUNT_DIR = "/etc/keyorder/kafka"
"""Where the pods see the properties Secret (``builders.KAFKA_PROPERTIES_DIR`` mounts it there)."""

PEM_FOR_LOCATION = {
    "ssl.ca.location": "ssl.ca.pem",
    "ssl.certificate.location": "ssl.certificate.pem",
    "ssl.key.location": "ssl.key.pem",
}
"""File properties the operator can replace by librdkafka's inline PEM equivalent."""

FILE_PROPERTIES = frozenset(
    {
        *PEM_FOR_LOCATION,
        "ssl.keystore.location",
        "ssl.crl.location",
        "ssl.engine.location",
        "sasl.kerberos.keytab",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.file",
        "sasl.oauthbearer.assertion.jwt.template.file",
        "plugin.library.paths",
    }
)
"""librdkafka properties that name a file (or a library) on the client's filesystem."""

SET_BY_SPEC = {
    "partition.assignment.strategy": "spec.kafka.assignmentStrategy (the operator must know it to move the group "
    "between eager and cooperative rebalancing without mixing the two)",
    "group.protocol": "spec.kafka.groupProtocol (the operator must know it to roll a change out safely)",
    "group.instance.id": "spec.kafka.staticMembership (each pod needs an id of its own, its pod name; one id "
    "shared by every pod would fence all but one)",
}
"""Pod properties the operator sets from the spec; the Secret may not set them (the spec would win unseen)."""

POD_ONLY_PREFIXES = ("group.", "enable.auto")
"""Consumer-group settings of the pods: meaningless to (and refused by) an admin client."""


class CredentialsError(ConfigError):
    """The Secret cannot give the operator a working Kafka configuration; the message says why and what to do."""


def operator_kafka_config(
    bootstrap_servers: str,
    secret: Mapping[str, str] | None = None,
    key: str = "client.properties",
    secret_name: str = "",
) -> dict[str, str]:
    """The operator's admin-client configuration for a resource.

    ``secret`` is the properties Secret's decoded data (``None`` without ``propertiesSecretRef``),
    ``key`` the key holding the properties file, ``secret_name`` names it in messages.
    """
    properties: dict[str, str] = {}
    if secret is not None:
        where = f"Secret {secret_name} key {key}"
        if key not in secret:
            raise CredentialsError(f"Secret {secret_name} has no key {key!r} (spec.kafka.propertiesSecretRef.key)")
        properties = parse_properties(secret[key], where)
        for name, instead in SET_BY_SPEC.items():
            if name in properties:
                raise CredentialsError(f"{where}: {name} is set by {instead}; remove it from the Secret")
        for name in [name for name in properties if name in FILE_PROPERTIES]:
            path = properties.pop(name)
            pem = PEM_FOR_LOCATION.get(name)
            if name == "ssl.ca.location" and path == "probe":  # librdkafka's "the system's CA store"
                properties[name] = path
                continue
            inside = path.startswith(MOUNT_DIR + "/") and path[len(MOUNT_DIR) + 1 :] in secret
            if pem is None:
                raise CredentialsError(
                    f"{where}: {name} names a file, which the operator cannot read "
                    "(it reads lag with the Secret's values, not the pods' files); "
                    "use PEM certificates (ssl.ca.pem, ssl.certificate.pem, ssl.key.pem) or SASL instead"
                )
            if not inside:
                raise CredentialsError(
                    f"{where}: {name}={path} is a file the operator cannot read (it exists only in the pods); "
                    f"put the file into Secret {secret_name} and point {name} at {MOUNT_DIR}/<its key>, "
                    f"or give the certificate inline as {pem}"
                )
            properties[pem] = secret[path[len(MOUNT_DIR) + 1 :]]
    properties["bootstrap.servers"] = bootstrap_servers
    return {name: value for name, value in properties.items() if not name.startswith(POD_ONLY_PREFIXES)}


MAX_POLL_INTERVAL_VARIABLE = "KEYORDER_RDKAFKA_MAX_POLL_INTERVAL_MS"
"""The pods' variable for ``max.poll.interval.ms``: set in ``spec.handler.env`` it overrides the Secret's."""


def pods_drain_problem(spec: OrderedConsumerSpec, properties: Mapping[str, str]) -> str | None:
    """Why the pods of ``spec`` would refuse to start because a drain could outlast ``max.poll.interval.ms``
    (``keyorder.config.unpolled_drain_problems``, the pods' own rule), or ``None``.

    ``properties`` are the resource's Kafka properties (``operator_kafka_config``: the Secret's
    ``max.poll.interval.ms`` stays in them). The pods read a variable of ``spec.handler.env`` over the
    Secret (``KEYORDER_RDKAFKA_MAX_POLL_INTERVAL_MS``, ``KEYORDER_PAUSE_AFTER``,
    ``KEYORDER_REVOKE_DRAIN_TIMEOUT``); with ``envFrom``, or a value from ``valueFrom``, the operator cannot
    know what they get, and says nothing (the pods still refuse, naming the settings). The shutdown grace is
    the operator's: ``spec.handler.terminationGracePeriodSeconds`` less 5 s, followed by what the pods'
    executor (``spec.handler.executor``) may take to stop after it (``keyorder.config.shutdown_overrun``).
    """
    handler = spec.handler
    if handler.env_from:
        return None
    literal: dict[str, str] = {}
    for variable in handler.env:
        if variable.value_from is not None:
            if variable.name in (MAX_POLL_INTERVAL_VARIABLE, env_name("pause_after"), env_name("revoke_drain_timeout")):
                return None
            continue
        literal[variable.name] = variable.value or ""
    defaults = RunConfig.model_fields
    try:
        pause_after = float(literal.get(env_name("pause_after"), defaults["pause_after"].default))
        revoke_drain = float(literal.get(env_name("revoke_drain_timeout"), defaults["revoke_drain_timeout"].default))
    except ValueError:
        return None  # the pods refuse the value, naming the variable
    interval = dict(properties)
    if MAX_POLL_INTERVAL_VARIABLE in literal:
        interval["max.poll.interval.ms"] = literal[MAX_POLL_INTERVAL_VARIABLE]
    overrun, overrun_why = shutdown_overrun(handler.executor.value, "spec.handler.executor")
    drains = [
        UnpolledDrain(
            f"the pods' shutdown grace (spec.handler.terminationGracePeriodSeconds "
            f"{handler.termination_grace_period_seconds} less 5 s)",
            float(handler.shutdown_grace_seconds),
            overrun,
            overrun_why,
        ),
        UnpolledDrain(f"{env_name('revoke_drain_timeout')} (spec.handler.env)", revoke_drain),
    ]
    problems = unpolled_drain_problems(drains, pause_after, max_poll_interval_ms(interval), env_name("pause_after"))
    if not problems:
        return None
    where = (
        "the properties Secret (spec.kafka.propertiesSecretRef)"
        + f" or {MAX_POLL_INTERVAL_VARIABLE} in spec.handler.env"
    )
    return "; ".join(problems) + f" (max.poll.interval.ms is set in {where}); the pods refuse to start"


def redact(message: str, properties: Mapping[str, str]) -> str:
    """``message`` with every property value (but the bootstrap servers) replaced: Kafka's errors may quote one."""
    for name, value in properties.items():
        if name != "bootstrap.servers" and len(value) >= 4:
            message = message.replace(value, "<redacted>")
    return message
