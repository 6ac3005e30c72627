"""The operator's own Kafka client configuration, built from an OrderedConsumer's properties Secret.

The pods read that Secret as files (it is mounted at ``KAFKA_PROPERTIES_DIR``), so a properties file
naturally says ``ssl.ca.location=/etc/keyorder/kafka/ca.crt``. The operator runs elsewhere, where no
such file exists: it reads the Secret through the API instead, and turns every TLS file property
that points into the mounted Secret into librdkafka's inline PEM property with that key's content
(``ssl.ca.location`` -> ``ssl.ca.pem``, ``ssl.certificate.location`` -> ``ssl.certificate.pem``,
``ssl.key.location`` -> ``ssl.key.pem``).

The Secret is written by a tenant, and the operator's client runs with the operator's identity and network
position. So the operator uses an **allow-list** (``OPERATOR_PROPERTIES``): only properties that say how
to reach and authenticate to the tenant's brokers with what the Secret itself holds (SASL PLAIN/SCRAM,
inline PEM) and how long to wait. The pods' consumer and producer settings (librdkafka's consumer-only
and producer-only properties, ``POD_ONLY``) are left to the pods and not given to the operator's client.
Anything else is refused with a message naming the property: what would make the operator's client call
out on the tenant's behalf (OIDC token endpoints, cloud metadata, Kerberos' ``kinit`` command), read a
file of the operator's (``https.ca.location``) or load code (``ssl.providers``, ``ssl.engine.*``,
``plugin.library.paths``). The pods' own client is not restricted by this. Pure: the Secret's decoded
data in, a configuration out; no value ever appears in an error.
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
from keyorder_operator.observe import redact as redact  # where it used to live
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

LIBRDKAFKA_REFERENCE = "librdkafka CONFIGURATION.md (v2.16, commit 4c3b017)"
"""Where the property lists below were read: the property table of confluentinc/librdkafka, its
``C``/``P`` column (consumer-only, producer-only) for ``POD_ONLY``."""

OPERATOR_PROPERTIES: dict[str, str] = {
    "bootstrap.servers": "where the brokers are (always the spec's bootstrapServers)",
    "security.protocol": "plaintext, TLS, SASL or both: how the pods reach the same brokers",
    "sasl.mechanism": "SASL with credentials the Secret holds (values in SASL_MECHANISMS)",
    "sasl.mechanisms": "librdkafka's alias of sasl.mechanism",
    "sasl.username": "the SASL PLAIN/SCRAM user",
    "sasl.password": "the SASL PLAIN/SCRAM password",
    "sasl.oauthbearer.method": "only 'default' (no token endpoint is called)",
    "sasl.oauthbearer.config": "an unsecured JWT built locally (enable.sasl.oauthbearer.unsecure.jwt)",
    "enable.sasl.oauthbearer.unsecure.jwt": "the local unsecured JWT of development set-ups",
    "ssl.ca.pem": "the brokers' CA, inline (also from ssl.ca.location in the mounted Secret)",
    "ssl.certificate.pem": "the client certificate, inline",
    "ssl.key.pem": "the client key, inline",
    "ssl.key.password": "the client key's passphrase",
    "ssl.ca.location": "only 'probe' (the system's CA store) or a file of the mounted Secret, made inline",
    "ssl.endpoint.identification.algorithm": "whether the broker's host name is checked",
    "enable.ssl.certificate.verification": "whether the broker's certificate is checked",
    "ssl.cipher.suites": "TLS parameters a broker may require (strings for OpenSSL, no file, no code)",
    "ssl.curves.list": "TLS parameters a broker may require",
    "ssl.sigalgs.list": "TLS parameters a broker may require",
    "client.id": "names the operator's requests in the brokers' logs and quotas",
    "client.dns.lookup": "how the bootstrap names resolve (as for the pods)",
    "broker.address.family": "IPv4 or IPv6 only, as for the pods",
    "broker.address.ttl": "how long resolved addresses are cached",
    "socket.timeout.ms": "how long a request may wait",
    "socket.connection.setup.timeout.ms": "how long a connection may take",
    "socket.keepalive.enable": "TCP keep-alives through load balancers",
    "connections.max.idle.ms": "idle connections closed before a load balancer drops them",
    "reconnect.backoff.ms": "reconnection pacing",
    "reconnect.backoff.max.ms": "reconnection pacing",
    "retry.backoff.ms": "retry pacing",
    "retry.backoff.max.ms": "retry pacing",
    "metadata.max.age.ms": "metadata refresh",
    "topic.metadata.refresh.interval.ms": "metadata refresh",
    "api.version.request": "for brokers older than 0.10",
    "api.version.request.timeout.ms": "for brokers older than 0.10",
    "api.version.fallback.ms": "for brokers older than 0.10",
    "broker.version.fallback": "for brokers older than 0.10",
}
"""The properties the operator's own client takes from a tenant's Secret, each with why it needs it."""

SASL_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"})
"""Mechanisms whose credentials the Secret itself holds. GSSAPI is refused: librdkafka runs
``sasl.kerberos.kinit.cmd`` (a shell command, ``kinit`` by default) to get its ticket."""

RESTRICTED_VALUES = {
    "sasl.mechanism": SASL_MECHANISMS,
    "sasl.mechanisms": SASL_MECHANISMS,
    "sasl.oauthbearer.method": frozenset({"default"}),
    "ssl.ca.location": frozenset({"probe"}),
}
"""Allowed properties whose value is restricted too (compared case-insensitively)."""

READ_NOT_PASSED = frozenset({"auto.offset.reset", "max.poll.interval.ms"})
"""Pod properties the operator reads (the lag of a group that never committed; the pods' drain check) but
never gives to its client."""

POD_ONLY = frozenset(
    {
        # consumer-only (C)
        "auto.commit.enable", "auto.commit.interval.ms", "check.crcs", "consume.callback.max.messages",
        "coordinator.query.interval.ms", "enable.auto.commit", "enable.auto.offset.store", "enable.partition.eof",
        "fetch.error.backoff.ms", "fetch.max.bytes", "fetch.message.max.bytes", "fetch.min.bytes",
        "fetch.queue.backoff.ms", "fetch.wait.max.ms", "group.id", "group.protocol.type", "group.remote.assignor",
        "heartbeat.interval.ms", "isolation.level", "max.partition.fetch.bytes", "max.poll.records",
        "offset.store.method", "offset.store.sync.interval.ms", "queued.max.messages.kbytes",
        "queued.min.messages", "session.timeout.ms", "share.acknowledgement.mode", "client.rack",
        # producer-only (P): the pods' dead-letter producer
        "acks", "batch.num.messages", "batch.size", "compression.codec", "compression.level", "compression.type",
        "delivery.report.only.error", "delivery.timeout.ms", "enable.gapless.guarantee", "enable.idempotence",
        "linger.ms", "message.send.max.retries", "message.timeout.ms", "partitioner", "produce.offset.report",
        "queue.buffering.backpressure.threshold", "queue.buffering.max.kbytes", "queue.buffering.max.messages",
        "queue.buffering.max.ms", "queuing.strategy", "request.required.acks", "request.timeout.ms", "retries",
        "sticky.partitioning.linger.ms", "transaction.timeout.ms", "transactional.id",
        # generic, but only the pods' throughput, buffers and diagnostics
        "message.max.bytes", "message.copy.max.bytes", "receive.message.max.bytes",
        "max.in.flight.requests.per.connection", "max.in.flight", "socket.send.buffer.bytes",
        "socket.receive.buffer.bytes", "socket.nagle.disable", "statistics.interval.ms", "enable.metrics.push",
        "allow.auto.create.topics", "topic.metadata.refresh.fast.interval.ms", "topic.metadata.refresh.sparse",
        "topic.metadata.propagation.max.ms", "log.connection.close", "log_level", "debug",
    }
)  # fmt: skip
"""The pods' settings (librdkafka's consumer-only and producer-only properties, and generic ones that tune
only throughput or logging): the operator's client does without them, and the pods keep them."""


SET_BY_SPEC = {
    "partition.assignment.strategy": "spec.kafka.assignmentStrategy (the operator must know it to move the group "
    "between eager and cooperative rebalancing without mixing the two)",
    "group.protocol": "spec.kafka.groupProtocol (the operator must know it to roll a change out safely)",
    "group.instance.id": "spec.kafka.staticMembership (each pod needs an id of its own, its pod name; one id "
    "shared by every pod would fence all but one)",
}
"""Pod properties the operator sets from the spec; the Secret may not set them (the spec would win unseen)."""


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
        refused = refused_property(properties)
        if refused is not None:
            raise CredentialsError(f"{where}: {refused}")
    properties["bootstrap.servers"] = bootstrap_servers
    return {name: value for name, value in properties.items() if name in OPERATOR_PROPERTIES or name in READ_NOT_PASSED}


def refused_property(properties: Mapping[str, str]) -> str | None:
    """Why the operator will not build its client from ``properties`` (the first refused property, by name,
    never its value), or ``None``: each one must be on the allow-list (``OPERATOR_PROPERTIES``, with
    ``RESTRICTED_VALUES``), read but not passed (``READ_NOT_PASSED``) or the pods' alone (``POD_ONLY``)."""
    for name in sorted(properties):
        if name in READ_NOT_PASSED or name in POD_ONLY:
            continue
        if name not in OPERATOR_PROPERTIES:
            return (
                f"{name} is not a property the operator's Kafka client uses (it reads lag with an allow-list of "
                "connection and SASL/TLS properties, so a tenant's properties cannot make it call out, read its "
                "files or load code); the pods still get it, but the operator does not read this resource's lag "
                f'while the Secret sets it (docs/security.md, "The operator\'s Kafka reads")'
            )
        allowed = RESTRICTED_VALUES.get(name)
        if allowed is not None and properties[name].strip().upper() not in {value.upper() for value in allowed}:
            return f"{name} is allowed for the operator's Kafka client only as one of {', '.join(sorted(allowed))}"
    return None


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
