"""Configuration of ``keyorder run``: one pydantic model, filled from flags, then env, then defaults.

The model is the single source of truth: the CLI flags (``--max-inflight``), the environment
variables (``KEYORDER_MAX_INFLIGHT``) and the docs table are all derived from its fields, so they
cannot drift apart. Invalid input fails at start-up with a message naming the flag and variable.

Kafka client properties (any librdkafka property, SASL/TLS included) come from, in increasing
precedence: a Java-style properties file (``--kafka-properties-file``, e.g. a mounted Secret),
``KEYORDER_RDKAFKA_<NAME>`` variables (``KEYORDER_RDKAFKA_SASL_MECHANISM`` -> ``sasl.mechanism``),
and ``--kafka-property name=value`` flags. Their values are never logged unredacted.

Why one room of over 600 lines: ``RunConfig`` is the one model the flags, the ``KEYORDER_*`` variables and
the generated settings table (``tools/docs_tables``) are derived from, and its validators are the error
messages that name a flag and its variable; the settings groups and the Kafka-properties loading
(``kafka_properties_with_origins``, the properties file) are the parts it is built from. The loading of
Kafka properties is the seam for a later split; issue 40's work edits this module this session.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import random
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticUndefined

from keyorder.adapters.dead_letters import dead_letter_topic
from keyorder.batch import BATCH_MAX_MESSAGES_LIMIT, BATCH_MAX_WAIT_MS_LIMIT, BatchLimits
from keyorder.core.flow import CEILING
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.core.routing import Ordering
from keyorder.core.stop_overruns import ASYNC_LOOP_STOP_SECONDS, PROCESS_TEARDOWN_SECONDS

ENV_PREFIX = "KEYORDER_"
RDKAFKA_ENV_PREFIX = "KEYORDER_RDKAFKA_"
HANDLER_ENV_PREFIXES = ("KEYORDER_EXAMPLE_", "KEYORDER_TEST_", "KEYORDER_BENCH_")
"""``KEYORDER_*`` prefixes read by the example, test and bench handlers, not by ``keyorder run``."""
SERVICE_LINK = re.compile(r"_SERVICE_HOST$|_SERVICE_PORT(_[A-Z0-9_]+)?$|_PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?$")
"""Variables Kubernetes injects for a Service (one named ``keyorder...`` yields ``KEYORDER_..._SERVICE_HOST``)."""
SAFE_TO_SHOW = frozenset(
    {
        # where and who: addresses and identifiers, not credentials
        "bootstrap.servers",
        "metadata.broker.list",
        "client.id",
        "client.rack",
        "group.id",
        "group.instance.id",
        "group.protocol",
        "security.protocol",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.kerberos.service.name",
        "sasl.oauthbearer.method",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
        "ssl.ca.location",
        "client.dns.lookup",
        "broker.address.family",
        "api.version.request",
        "broker.version.fallback",
        # consumer behaviour
        "auto.offset.reset",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "auto.commit.interval.ms",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "partition.assignment.strategy",
        "isolation.level",
        "fetch.min.bytes",
        "fetch.max.bytes",
        "fetch.wait.max.ms",
        "fetch.error.backoff.ms",
        "max.partition.fetch.bytes",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "check.crcs",
        "enable.partition.eof",
        "allow.auto.create.topics",
        "coordinator.query.interval.ms",
        # producer behaviour
        "acks",
        "request.required.acks",
        "enable.idempotence",
        "linger.ms",
        "queue.buffering.max.ms",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "batch.size",
        "batch.num.messages",
        "compression.type",
        "compression.codec",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "request.timeout.ms",
        "partitioner",
        # connections and diagnostics
        "message.max.bytes",
        "receive.message.max.bytes",
        "socket.timeout.ms",
        "socket.keepalive.enable",
        "socket.connection.setup.timeout.ms",
        "connections.max.idle.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "retry.backoff.ms",
        "retry.backoff.max.ms",
        "retries",
        "topic.metadata.refresh.interval.ms",
        "metadata.max.age.ms",
        "statistics.interval.ms",
        "log_level",
        "debug",
    }
)
"""Kafka properties whose values may be shown; every other value is redacted wherever properties are shown.

An allow-list, not a deny-list: a secret-bearing property we did not think of (or one a future
librdkafka adds) is hidden by default.
"""
MANAGED_PROPERTIES = {
    "enable.auto.commit": "keyorder commits the lowest unfinished offset itself",
    "enable.auto.offset.store": "keyorder stores offsets itself",
    "group.id": "use --group-id",
}
CONSUMER_ONLY_PREFIXES = (
    "group.",
    "enable.auto.",
    "auto.offset.reset",
    "auto.commit.",
    "session.timeout",
    "heartbeat.",
    "max.poll.",
    "partition.assignment",
    "fetch.",
    "queued.",
    "isolation.level",
    "check.crcs",
    "enable.partition.eof",
    "allow.auto.create",
    "consume.callback",
)


MAX_BACKOFF_SECONDS = 24 * 3600.0
"""Upper bound of the retry backoffs (a day): larger values only break timers."""
MAX_GRACE_SECONDS = 3600.0
"""Upper bound of the shutdown grace and the commit interval (an hour)."""
MAX_POLL_INTERVAL_DEFAULT_MS = 300_000
"""librdkafka's default ``max.poll.interval.ms`` (src/rdkafka_conf.c)."""
UNPOLLED_MARGIN_SECONDS = 5.0
"""What a drain that runs without calling ``consume`` (the shutdown grace, the revoke drain timeout) must
leave of ``max.poll.interval.ms`` beyond ``--pause-after``: the poll loop's last call may be a poll timeout
earlier, the worker pools get at least 0.5 s to stop after the grace, the final commit is a synchronous round
trip to the group coordinator, and librdkafka checks the interval only twice a second
(``check_unpolled_drains``). An executor whose pool may take longer to stop adds its own
(``shutdown_overrun``)."""
HEALTHZ_STALL_SECONDS = 60.0
"""``/healthz`` fails after the poll loop stalled this long (``adapters.http_server.STALL_SECONDS``; a test
keeps them equal, the adapter imports this module so it cannot be imported here)."""

Settings = TypeVar("Settings", bound=BaseModel)


class ConfigError(ValueError):
    """Invalid configuration; the message names the offending flag, variable or file."""


def split_name_values(value: Any) -> Any:
    """``a=1,b=x,y`` -> ``a=1``, ``b=x,y``: split a variable's value only at commas that start a ``name=``."""
    if isinstance(value, str):
        return [part.strip() for part in re.split(r",\s*(?=[\w.-]+=)", value) if part.strip()]
    return value


def name_values(items: list[str]) -> list[str]:
    """Check that every item of a repeatable setting looks like ``name=value``."""
    for item in items:
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ValueError(f"{item!r} must look like name=value")
    return items


class KafkaConnectionSettings(BaseModel):
    """How to reach Kafka: shared by ``keyorder run`` and ``keyorder catchup``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topics: list[str] = Field(description="Topics to consume, comma-separated.", min_length=1)
    group_id: str = Field(description="Kafka consumer group id.", min_length=1)
    bootstrap_servers: str | None = Field(
        None, description="Kafka bootstrap servers (or set bootstrap.servers in the Kafka properties)."
    )
    kafka_properties_file: Path | None = Field(
        None, description="Java-style properties file of librdkafka settings (e.g. a mounted Secret with SASL/TLS)."
    )
    kafka_property: list[str] = Field(
        default_factory=list,
        description="librdkafka setting 'name=value' (repeatable; overrides the file and environment).",
        json_schema_extra={"repeatable": True},
    )

    @field_validator("topics", mode="before")
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("kafka_property", mode="before")
    @classmethod
    def _split_properties(cls, value: Any) -> Any:
        return split_name_values(value)

    @field_validator("kafka_property")
    @classmethod
    def _name_equals_value(cls, value: list[str]) -> list[str]:
        return name_values(value)


class HandlerSettings(BaseModel):
    """The handler and what happens when it fails: the same contract for pods and catch-up jobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    handler: str = Field(
        description="Handler to call per message, as 'package.module:function' (plain or async def).",
        pattern=r"^[\w.]+:[\w.]+$",
    )
    ordering: Ordering = Field(
        Ordering.KEY,
        description="key: same key in order (keyless messages per "
        "partition); partition: same partition in order; unordered: no order.",
    )
    max_attempts: int = Field(5, ge=1, description="Handler attempts per message, the first included.")
    retry_initial_backoff: float = Field(
        0.2,
        ge=0,
        le=MAX_BACKOFF_SECONDS,
        allow_inf_nan=False,
        description="Seconds before the second attempt; doubles per attempt. Only the failing key waits.",
    )
    retry_max_backoff: float = Field(
        30.0,
        gt=0,
        le=MAX_BACKOFF_SECONDS,
        allow_inf_nan=False,
        description="Longest wait between attempts (and the retry period of a blocked key); at most a day.",
    )
    on_exhausted: ExhaustedPolicy = Field(
        ExhaustedPolicy.DLQ,
        description="After max-attempts: dlq "
        "(publish to the dead-letter topic, go on) or block (park the "
        "key, keep retrying, hold the partition's commit).",
    )
    dlq_topic: str = Field(
        "{topic}.dlq", min_length=1, description="Dead-letter topic; {topic} is replaced by the source topic."
    )
    handler_setup: str | None = Field(
        None,
        description="Hook run once before the first message, as 'package.module:function' without arguments "
        "(plain or async def; an async one runs on the async workers' event loop); in each worker process "
        "with the process executor; in a catch-up, once per Spark task (with an async def handler, once per "
        "task thread, on its event loop). If it raises, the pod exits with status 1 (a catch-up's task fails).",
        pattern=r"^[\w.]+:[\w.]+$",
    )
    handler_teardown: str | None = Field(
        None,
        description="Hook run once after the last message (on shutdown), like --handler-setup; in each worker "
        "process with the process executor, and after each Spark task (or task thread) of a catch-up. An error "
        "is logged.",
        pattern=r"^[\w.]+:[\w.]+$",
    )
    log_format: Literal["text", "json"] = Field("text", description="Log format.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level.")

    @model_validator(mode="after")
    def _backoff_order(self) -> HandlerSettings:
        if self.retry_initial_backoff > self.retry_max_backoff:
            raise ValueError("retry_initial_backoff must be <= retry_max_backoff")
        return self

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.max_attempts,
            initial_backoff=self.retry_initial_backoff,
            max_backoff=self.retry_max_backoff,
            exhausted=self.on_exhausted,
            random=random.Random().random,  # jitter: keys that failed together do not retry in lock-step
        )


class RunConfig(HandlerSettings, KafkaConnectionSettings):
    """Everything ``keyorder run`` needs. Field docs become the ``--help`` text and the docs table."""

    executor: Literal["auto", "thread", "async", "process"] = Field(
        "auto",
        description="How the handler runs: thread (a plain handler on worker threads), async (an async def handler "
        "as asyncio tasks), process (worker processes, one per worker: for CPU-bound handlers, plain or async); "
        "auto: thread or async, by the handler.",
    )
    handler_timeout: float = Field(
        0,
        ge=0,
        le=MAX_GRACE_SECONDS,
        allow_inf_nan=False,
        description="Process executor only: a message running longer has its worker process killed and replaced, "
        "and is retried under the retry policy; with a batch handler it bounds the whole call (a call of several "
        "messages that overruns charges none of them: each is retried in a call of its own); 0: no timeout.",
    )
    batch_max_messages: int = Field(
        1,
        ge=1,
        le=BATCH_MAX_MESSAGES_LIMIT,
        description="Above 1: the handler is a batch handler, called as handler(messages) with a list of up to "
        "this many messages, the heads of distinct ready keys (never two of one key); it returns None (all "
        "succeeded), raises (all failed) or returns one outcome per message, None or an exception "
        "(docs/handler-tutorial.md, Batch handlers). 1: one call per message.",
    )
    batch_max_wait_ms: int = Field(
        0,
        ge=0,
        le=BATCH_MAX_WAIT_MS_LIMIT,
        description="Batch handlers only: milliseconds a worker holding fewer than --batch-max-messages ready "
        "messages waits for more keys to become ready before it calls the handler; 0: it calls with what is "
        "ready now.",
    )
    workers: int = Field(16, ge=1, description="Key workers per pod at start (live-resizable).")
    max_workers: int = Field(4096, ge=1, description="Upper bound for a live resize of the key workers.")
    max_inflight: int = Field(
        10_000,
        ge=1,
        description="Unfinished messages per pod: a read takes the pod at most to it (bounds payload memory). "
        "Partitions that cannot drain (a blocked key, a hung handler) may hold more than their share and do not "
        f"stop the others, so the pod may hold more, never more than {CEILING}x this: there every partition is "
        "paused until it is one partition's share below (docs/configuration.md, Memory).",
    )
    max_inflight_per_partition: int = Field(
        5_000,
        ge=1,
        description="Unfinished messages per partition (at most its fair share of --max-inflight) before the pod "
        "stops reading it: held, then paused after --pause-after. The read that fills it may take it past; "
        f"the pod stays within {CEILING}x --max-inflight.",
    )
    max_uncommitted: int = Field(
        50_000,
        ge=1,
        description="Messages at or above the committed offsets per pod, finished or not, before partitions are "
        f"paused: what a crash re-delivers. At most {CEILING}x this, when partitions that cannot commit (a "
        "blocked key) hold more than their share (docs/configuration.md, Memory).",
    )
    resume_ratio: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Held or paused partitions are read again when their counts fall to this fraction of the bounds.",
    )
    pause_after: float = Field(
        0.5,
        ge=0,
        le=60,
        allow_inf_nan=False,
        description="Seconds a partition at its in-flight bound only stops the reading, keeping the client's "
        "prefetched messages, before it is paused so that the others are read past it (0: pause at once); "
        f"the pod then holds up to {CEILING}x --max-inflight. Per fill; and while another partition could be "
        "read (neither full nor paused) the seconds add up over fills that follow each other, until a fill ends "
        "while the partition is paused (which drops its prefetch): a partition that refills after each hold keeps "
        "the others unread at most this long in all. Holds that keep no other partition from being read (one "
        "partition, or the others full or paused) do not add up.",
    )
    poll_batch: int = Field(500, ge=1, le=100_000, description="Most messages taken per poll.")
    gc_threshold: int = Field(
        0,
        ge=0,
        le=10_000_000,
        description="Container objects Python allocates between two young-generation garbage collections, in the "
        "pod's process and each worker process; 0 keeps Python's 700. A pod allocates several per message, so at "
        "700 it collects hundreds of times a second holding the GIL: 10,000 made key-ordered fast handlers 8-34% "
        "faster in keyorder bench but partition-ordered ones slower (docs/performance.md, Batch handlers). "
        "Reference cycles a handler makes wait that long too.",
    )
    commit_interval: float = Field(
        1.0, gt=0, le=MAX_GRACE_SECONDS, allow_inf_nan=False, description="Seconds between periodic commits."
    )
    revoke_drain_timeout: float = Field(
        10.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds the handlers still running on revoked partitions may take to finish (their queued "
        "and retry-waiting messages are handed back at once). Below 60: the poll loop waits meanwhile, and "
        "/healthz fails after 60 s without a poll; and at most max.poll.interval.ms minus --pause-after minus "
        "5 s (the group's rebalance timeout).",
    )
    shutdown_grace: float = Field(
        25.0,
        ge=0,
        le=MAX_GRACE_SECONDS,
        allow_inf_nan=False,
        description="Seconds in-flight messages may take to finish "
        "on SIGTERM (keep below the pod's terminationGracePeriodSeconds); at most an hour, and at most "
        "max.poll.interval.ms (librdkafka's default 300000) minus --pause-after minus 5 s, minus what the "
        "executor's workers may take to stop after it (process, async and auto: docs/configuration.md): nothing "
        "calls the Kafka client meanwhile, and past that interval the pod would leave the group while it still "
        "drains.",
    )
    http_host: str = Field("0.0.0.0", description="Address of the metrics/health/admin HTTP server.")
    http_port: int = Field(8080, ge=0, le=65535, description="Port of the HTTP server (0: any free port).")
    admin_token_file: Path | None = Field(
        None,
        description="File holding the bearer token required by "
        "PUT /admin/workers and GET /admin/scaling; re-read at every admin request, so a rotated Secret "
        "takes effect once the kubelet updates the mount. Without it those endpoints are disabled.",
    )

    def batch_limits(self) -> BatchLimits:
        """How the pool fills a batch handler's calls (per message when ``batch_max_messages`` is 1)."""
        return BatchLimits(self.batch_max_messages, self.batch_max_wait_ms / 1000)

    @field_validator("revoke_drain_timeout")
    @classmethod
    def _below_the_liveness_threshold(cls, value: float) -> float:
        if value >= HEALTHZ_STALL_SECONDS:
            raise ValueError(
                f"must be below {HEALTHZ_STALL_SECONDS:g} s: the poll loop waits for the drain during a "
                f"rebalance, and /healthz fails after {HEALTHZ_STALL_SECONDS:g} s without a poll, so the "
                "liveness probe would restart the pod mid-rebalance"
            )
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> RunConfig:
        if self.handler_timeout and self.executor != "process":
            raise ValueError(
                f"handler_timeout ({flag_name('handler_timeout')}) needs {flag_name('executor')} process: a thread "
                "or an asyncio task cannot be killed, only a worker process"
            )
        if self.batch_max_wait_ms and self.batch_max_messages == 1:
            raise ValueError(
                f"batch_max_wait_ms ({flag_name('batch_max_wait_ms')} / {env_name('batch_max_wait_ms')}) "
                f"needs {flag_name('batch_max_messages')} above 1: a per-message handler has no batch to fill"
            )
        if self.workers > self.max_workers:
            raise ValueError(f"workers ({self.workers}) must be <= max_workers ({self.max_workers})")
        if self.max_uncommitted < self.max_inflight:
            raise ValueError(f"max_uncommitted ({self.max_uncommitted}) must be >= max_inflight ({self.max_inflight})")
        if self.max_inflight_per_partition > self.max_inflight:
            raise ValueError(
                f"max_inflight_per_partition ({self.max_inflight_per_partition}) must be <= "
                f"max_inflight ({self.max_inflight})"
            )
        for topic in self.topics:
            target = dead_letter_topic(self.dlq_topic, topic)
            if self.on_exhausted is ExhaustedPolicy.DLQ and target in self.topics:
                raise ValueError(
                    f"dlq_topic ({flag_name('dlq_topic')} / {env_name('dlq_topic')}) {self.dlq_topic!r} sends "
                    f"the dead letters of {topic!r} to {target!r}, one of the consumed topics "
                    f"({flag_name('topics')}): they would be consumed and fail again"
                )
        return self


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def add_settings_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per field of a settings model, its help text naming the default and the variable."""
    for name, field in model.model_fields.items():
        default = field.default if field.default is not PydanticUndefined else None
        if field.default_factory is not None:
            default = None
        shown = (
            f" [default: {default.value if hasattr(default, 'value') else default}]"
            if default is not None
            else " [required]"
            if field.is_required()
            else ""
        )
        help_text = f"{field.description}{shown} (env {env_name(name)})".replace("%", "%%")
        extra = field.json_schema_extra or {}
        if callable(extra):
            raise TypeError(f"{model.__name__}.{name}: json_schema_extra must be a dict, not a callable")
        if extra.get("repeatable"):
            parser.add_argument(flag_name(name), dest=name, action="append", metavar="NAME=VALUE", help=help_text)
        else:
            parser.add_argument(flag_name(name), dest=name, metavar=name.upper(), help=help_text)


def load_run_config(flags: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> RunConfig:
    """Build the config of ``keyorder run`` from parsed flags (``None`` = not given), then the environment.

    A ``KEYORDER_*`` variable that ``keyorder run`` does not know (a typo such as ``KEYORDER_WORKER``)
    is an error rather than silently ignored.
    """
    environ = os.environ if environ is None else environ
    check_unknown_variables(RunConfig, environ)
    return load_config(RunConfig, flags, environ)


def is_service_link(name: str, value: str) -> bool:
    """A variable Kubernetes injects for a Service in the namespace (``enableServiceLinks``)."""
    if SERVICE_LINK.search(name):
        return True
    return name.endswith("_PORT") and re.match(r"(tcp|udp|sctp)://", value) is not None


def check_unknown_variables(
    model: type[BaseModel], environ: Mapping[str, str], also_known: Collection[str] = ()
) -> None:
    """Refuse ``KEYORDER_*`` variables that are neither a setting of ``model`` (or one of ``also_known``'s names)
    nor a Kafka property."""
    known = [env_name(field) for field in model.model_fields] + [name for name in also_known if name]
    unknown = sorted(
        name
        for name, value in environ.items()
        if name.startswith(ENV_PREFIX)
        and name not in known
        and not (name.startswith(RDKAFKA_ENV_PREFIX) and len(name) > len(RDKAFKA_ENV_PREFIX))
        and not name.startswith(HANDLER_ENV_PREFIXES)
        and not is_service_link(name, value)
    )
    if not unknown:
        return
    lines = ["unknown environment variables:" if len(unknown) > 1 else "unknown environment variable:"]
    suffixes = {name[len(ENV_PREFIX) :]: name for name in known}  # the shared prefix would make all names close
    for name in unknown:
        close = difflib.get_close_matches(name[len(ENV_PREFIX) :], list(suffixes), n=1, cutoff=0.5)
        if name == RDKAFKA_ENV_PREFIX:
            hint = f"a Kafka property needs a name: {RDKAFKA_ENV_PREFIX}<NAME>"
        elif close:
            hint = f"did you mean {suffixes[close[0]]}?"
        else:
            hint = "not a setting"
        lines.append(f"  {name}: {hint}")
    lines.append(
        f"  (settings are {ENV_PREFIX}<FLAG>, see --help; Kafka properties are {RDKAFKA_ENV_PREFIX}<NAME>; "
        "give a handler's own variables another prefix)"
    )
    raise ConfigError("\n".join(lines))


def load_config(model: type[Settings], flags: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Settings:
    """Build any settings model from parsed flags (``None`` = not given), then ``KEYORDER_*`` variables."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for field in model.model_fields:
        flag_value = flags.get(field)
        if flag_value is not None and flag_value != []:
            values[field] = flag_value
        elif env_name(field) in environ:
            values[field] = environ[env_name(field)]
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error)) from None


def describe_validation_error(error: ValidationError) -> str:
    lines = ["invalid configuration:"]
    for problem in error.errors():
        field = str(problem["loc"][0]) if problem["loc"] else ""
        where = f"{flag_name(field)} / {env_name(field)}" if field else "config"
        lines.append(f"  {where}: {problem['msg']}")
    return "\n".join(lines)


def read_properties_file(path: Path) -> dict[str, str]:
    """Parse a Java properties file (see ``parse_properties``), read as bytes and decoded by ``decode_properties``."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"--kafka-properties-file {path}: cannot read: {error.strerror}") from None
    return parse_properties(decode_properties(data), f"--kafka-properties-file {path}")


def decode_properties(data: bytes) -> str:
    """UTF-8 when the bytes are valid UTF-8 (what a Secret written today holds), else ISO-8859-1.

    ISO-8859-1 is Java's own encoding of properties files (``Properties.load(InputStream)``) and
    decodes any byte, so no file fails here; ASCII files (with ``\\uXXXX`` escapes) read the same
    either way.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("iso-8859-1")


def parse_properties(text: str, source: str) -> dict[str, str]:
    """Parse Java properties syntax with ``javaproperties``: ``name=value``, ``name: value`` and
    ``name value`` lines, ``#`` and ``!`` comments, ``\\`` line continuations and escapes.

    Trailing whitespace of a value is dropped (Java keeps it; in a host name or path it is a typo).
    ``source`` names where the text came from in error messages, with the line (values are never shown).
    """
    import javaproperties

    properties: dict[str, str] = {}
    line = 1
    elements = javaproperties.parse(text)
    while True:
        try:
            element = next(elements)
        except StopIteration:
            return properties
        except javaproperties.InvalidUEscapeError:
            raise ConfigError(f"{source}, line {line}: invalid \\u escape (expected \\u and 4 hex digits)") from None
        if isinstance(element, javaproperties.KeyValue):
            if not element.key.strip():
                raise ConfigError(f"{source}, line {line}: expected name=value (the name is empty)")
            properties[element.key] = element.value.rstrip()  # unlike Java: a stray trailing space breaks a host
        line += len(element.source.splitlines()) or 1


def kafka_properties(config: KafkaConnectionSettings, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The librdkafka properties the user supplied, merged by precedence (file < env < flags)."""
    return kafka_properties_with_origins(config, environ)[0]


def kafka_properties_with_origins(
    config: KafkaConnectionSettings, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """``kafka_properties`` and, per property, where its value came from (for error messages)."""
    environ = os.environ if environ is None else environ
    properties: dict[str, str] = {}
    origins: dict[str, str] = {}
    if config.kafka_properties_file is not None:
        for name, value in read_properties_file(config.kafka_properties_file).items():
            properties[name] = value
            origins[name] = f"the properties file {config.kafka_properties_file} (--kafka-properties-file)"
    for variable, value in environ.items():
        if variable.startswith(RDKAFKA_ENV_PREFIX) and len(variable) > len(RDKAFKA_ENV_PREFIX):
            name = variable[len(RDKAFKA_ENV_PREFIX) :].lower().replace("_", ".")
            properties[name] = value
            origins[name] = f"the environment variable {variable}"
    for item in config.kafka_property:
        name, value = item.split("=", 1)
        properties[name.strip()] = value.strip()
        origins[name.strip()] = f"{flag_name('kafka_property')} / {env_name('kafka_property')}"
    if config.bootstrap_servers:
        properties["bootstrap.servers"] = config.bootstrap_servers
        origins["bootstrap.servers"] = f"{flag_name('bootstrap_servers')} / {env_name('bootstrap_servers')}"
    for name, reason in MANAGED_PROPERTIES.items():
        if name in properties:
            raise ConfigError(f"Kafka property {name!r} cannot be set (set by {origins[name]}): {reason}")
    if not properties.get("bootstrap.servers"):
        raise ConfigError(
            "no Kafka bootstrap servers: set --bootstrap-servers / KEYORDER_BOOTSTRAP_SERVERS "
            "or bootstrap.servers in the Kafka properties"
        )
    return properties, origins


PROPERTY_ALIASES = {
    "linger.ms": "queue.buffering.max.ms",
    "acks": "request.required.acks",
    "compression.type": "compression.codec",
    "sasl.mechanism": "sasl.mechanisms",
    "retries": "message.send.max.retries",
    "delivery.timeout.ms": "message.timeout.ms",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "metadata.broker.list": "bootstrap.servers",
}
"""librdkafka aliases -> the name librdkafka uses in its errors."""


def blame_kafka_property(error: Exception, origins: Mapping[str, str], client: str) -> Exception:
    """Turn a Kafka client's configuration error into a ``ConfigError`` naming the property and its origin.

    librdkafka quotes the property it rejects (``No such configuration property: "x"``, ``Invalid
    value for configuration property "x"``); a property not supplied by the user (or an error that
    names none) leaves ``error`` as it is. ``client`` names the client that refused it.
    """
    text = str(error)
    detail = text.split("): ", 1)[1] if "): " in text else text.split(": ", 1)[-1]
    for quoted in re.findall(r'"([^"]+)"', text):
        for name in (quoted, *(alias for alias, canonical in PROPERTY_ALIASES.items() if canonical == quoted)):
            if name in origins:
                refused = detail.startswith("No such configuration property")
                where = "" if refused else f" (refused by the {client})"
                return ConfigError(f"Kafka property {name!r}, set by {origins[name]}: {detail}{where}")
    return error


CONSUMER_DEFAULTS = {
    # a new group starts at the oldest message rather than skipping the backlog
    "auto.offset.reset": "earliest",
    # incremental rebalancing (KIP-429): a member joining or leaving moves only the partitions that
    # change owner; the others keep running (librdkafka's default, range,roundrobin, stops every member)
    "partition.assignment.strategy": "cooperative-sticky",
    # the client's statistics every 5 s: each partition's fetch queue (keyorder_partition_fetch_queue_messages)
    "statistics.interval.ms": "5000",
}
"""keyorder's consumer defaults; any of them is overridden by the user's Kafka properties."""


def consumer_properties(config: KafkaConnectionSettings, properties: Mapping[str, str]) -> dict[str, str]:
    """Consumer settings: keyorder's defaults, overridden by the user's properties.

    With ``group.protocol=consumer`` (KIP-848) the broker assigns the partitions and librdkafka
    refuses a client-side ``partition.assignment.strategy``, so that default is left out. A static
    member (``group.instance.id``) on that protocol is refused: its leave is only temporary
    (``kafka_source.static_member_cannot_leave``). For a pod (a ``RunConfig``), its drains must fit
    within ``max.poll.interval.ms`` (``check_unpolled_drains``).
    """
    from keyorder.adapters.kafka_source import (  # here: only a consumer needs the Kafka client
        STATIC_MEMBER_ON_CONSUMER_PROTOCOL,
        broker_assigns,
        static_member_cannot_leave,
    )

    if static_member_cannot_leave(properties):
        raise ConfigError(STATIC_MEMBER_ON_CONSUMER_PROTOCOL)
    if isinstance(config, RunConfig):  # a catch-up job has no poll loop to drain
        check_unpolled_drains(config, properties)
    defaults = dict(CONSUMER_DEFAULTS)
    if broker_assigns(properties):
        del defaults["partition.assignment.strategy"]
    return {**defaults, **properties, "group.id": config.group_id}


def max_poll_interval_ms(properties: Mapping[str, str]) -> int:
    """The consumer's ``max.poll.interval.ms``: the property's, or librdkafka's default."""
    value = properties.get("max.poll.interval.ms")
    if value is None:
        return MAX_POLL_INTERVAL_DEFAULT_MS
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(
            f"Kafka property max.poll.interval.ms={value!r}: must be a whole number of milliseconds"
        ) from None


@dataclass(frozen=True)
class UnpolledDrain:
    """A wait of the pod during which nothing calls the Kafka client's ``consume``."""

    name: str
    """The setting that sets it, as the error names it (a flag, a variable, a spec field)."""
    seconds: float
    overrun: float = 0.0
    """Seconds that may follow it, still without a call: the worker pool's stop past the shutdown grace
    (``shutdown_overrun``)."""
    overrun_why: str = ""


def shutdown_overrun(executor: str, executor_name: str | None = None) -> tuple[float, str]:
    """How long the pool of ``executor`` (``--executor``, which ``executor_name`` names in the reason) may take
    to stop past the shutdown grace, before the pod's final commit and still without a call to ``consume``,
    beyond what ``UNPOLLED_MARGIN_SECONDS`` covers; and why, for the error. ``auto`` may turn out async (an
    ``async def`` handler)."""
    if executor == "process":
        join = PROCESS_TEARDOWN_SECONDS + 1  # ProcessWorkerPool.stop's join of each worker after the grace
        return join, (
            f"after the grace the process executor's worker processes get up to {join:g} s for their tear-down "
            "hooks, or to exit once killed"
        )
    if executor in ("async", "auto"):
        overrun = 2 * ASYNC_LOOP_STOP_SECONDS  # AsyncWorkerPool.stop: the loop's shutdown, then its thread
        why = (
            f"after the grace the async executor waits up to {overrun:g} s more for its event "
            "loop: the handlers' cancellation, the tear-down hook, the loop's thread"
        )
        if executor == "auto":
            named = executor_name or flag_name("executor")
            why += f"; with {named} auto the handler may be async def: say thread if it is not"
        return overrun, why
    return 0.0, ""


def longest_unpolled_drain(max_poll_interval: int, pause_after: float, overrun: float = 0.0) -> float:
    """The longest drain, in seconds, that runs without calling ``consume`` and still stays comfortably
    below ``max.poll.interval.ms`` (``max_poll_interval``, in ms): the loop may already have gone
    ``pause_after`` without a call when the drain starts, ``overrun`` may follow it (``UnpolledDrain``),
    and ``UNPOLLED_MARGIN_SECONDS`` covers the rest."""
    return max_poll_interval / 1000 - pause_after - UNPOLLED_MARGIN_SECONDS - overrun


def unpolled_drain_problems(
    drains: Iterable[UnpolledDrain], pause_after: float, max_poll_interval: int, pause_after_name: str
) -> list[str]:
    """Why each of ``drains`` would outlast ``max.poll.interval.ms``, with what may follow it.

    Nothing calls the Kafka client's ``consume`` while the pod drains on SIGTERM (the shutdown grace), nor
    during a revoke's drain when the loop served the revoke from a non-blocking call (every partition
    paused): librdkafka suspends the poll timer only inside a *blocking* call (``rd_kafka_app_poll_start``
    sets ``rk_ts_last_poll`` to INT64_MAX only when the timeout is not 0, src/rdkafka_int.h; the rebalance
    callback is served inside ``rd_kafka_q_serve_rkmessages``, src/rdkafka_queue.c). Past the interval its
    timer (``rd_kafka_cgrp_max_poll_interval_check_tmr_cb``, src/rdkafka_cgrp.c, every 500 ms) leaves the
    group: the final commit fails, and another member handles the same keys while this pod still does.
    A revoke served inside a blocking call is bounded as well: the group's rebalance timeout is
    ``max.poll.interval.ms`` (JoinGroup's RebalanceTimeoutMs in ``rd_kafka_JoinGroupRequest``,
    src/rdkafka_request.c; KIP-848's heartbeat in ``rd_kafka_cgrp_consumer_group_heartbeat``), and a member
    that has not finished revoking by then is removed. ``pause_after_name`` names ``--pause-after``.
    """
    problems = []
    for drain in drains:
        name, seconds = drain.name, drain.seconds
        longest = longest_unpolled_drain(max_poll_interval, pause_after, drain.overrun)
        if seconds <= longest:
            continue
        needed = math.ceil((seconds + pause_after + UNPOLLED_MARGIN_SECONDS + drain.overrun) * 1000)
        overrun = f" minus {drain.overrun:g} s ({drain.overrun_why})" if drain.overrun else ""
        problems.append(
            f"{name} ({seconds:g} s) must stay below max.poll.interval.ms ({max_poll_interval} ms) minus "
            f"{pause_after_name} ({pause_after:g} s) minus {UNPOLLED_MARGIN_SECONDS:g} s{overrun}: at most "
            f"{longest:g} s. Nothing calls the Kafka client's consume while the pod drains, and the poll loop may "
            f"already have gone {pause_after_name} without a call; past max.poll.interval.ms librdkafka leaves the "
            "group, the final commit fails and another pod handles the same keys while this one still does. Lower "
            f"{name}, or raise max.poll.interval.ms to at least {needed}"
        )
    return problems


def check_unpolled_drains(config: RunConfig, properties: Mapping[str, str]) -> None:
    """Refuse a shutdown grace or revoke drain timeout that could outlast ``max.poll.interval.ms``
    (``unpolled_drain_problems``): the grace with what the executor's pool may take to stop past it
    (``shutdown_overrun``), the revoke drain alone (no pool stops)."""
    drains = [
        UnpolledDrain(
            f"{flag_name('shutdown_grace')} / {env_name('shutdown_grace')}",
            config.shutdown_grace,
            *shutdown_overrun(config.executor),
        ),
        UnpolledDrain(
            f"{flag_name('revoke_drain_timeout')} / {env_name('revoke_drain_timeout')}", config.revoke_drain_timeout
        ),
    ]
    problems = unpolled_drain_problems(
        drains, config.pause_after, max_poll_interval_ms(properties), flag_name("pause_after")
    )
    if problems:
        raise ConfigError("\n".join(problems))


def producer_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """Connection and security settings reused by the dead-letter producer (consumer-only ones dropped)."""
    return {name: value for name, value in properties.items() if not name.startswith(CONSUMER_ONLY_PREFIXES)}


def redact(properties: Mapping[str, Any]) -> dict[str, Any]:
    """A copy safe to log: every value is ``<redacted>`` unless its name is in ``SAFE_TO_SHOW``."""
    return {name: value if name.strip().lower() in SAFE_TO_SHOW else "<redacted>" for name, value in properties.items()}


def read_admin_token(config: RunConfig) -> str | None:
    if config.admin_token_file is None:
        return None
    try:
        token = config.admin_token_file.read_text().strip()
    except OSError as error:
        raise ConfigError(f"--admin-token-file {config.admin_token_file}: cannot read: {error.strerror}") from None
    if len(token) < 16:
        raise ConfigError(f"--admin-token-file {config.admin_token_file}: token must be at least 16 characters")
    return token


def reference_markdown(model: type[BaseModel] = RunConfig) -> str:
    """A settings table for the docs (flag, variable, default, meaning), generated from ``model``."""
    rows = ["| flag | environment variable | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if field.is_required():
            default = "**required**"
        elif field.default_factory is not None:
            default = "(none)"
        else:
            value = field.default
            shown = getattr(value, "value", value)
            default = "(none)" if value is None else '`""`' if shown == "" else f"`{shown}`"
        description = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{flag_name(name)}` | `{env_name(name)}` | {default} | {description} |")
    return "\n".join(rows) + "\n"
