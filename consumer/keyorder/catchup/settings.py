"""Settings of ``keyorder catchup``: the pod's Kafka and handler settings plus the job's own.

Sharing ``KafkaConnectionSettings`` and ``HandlerSettings`` with ``keyorder run`` means the same
``KEYORDER_*`` variables (and the same Secret of Kafka properties) configure a pod and the
catch-up Job that replaces it, and the handler meets the same retry/DLQ policy in both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from keyorder.catchup.layout import BALANCE_TOLERANCE, Layout
from keyorder.catchup.plan import CommitMode
from keyorder.catchup.positions import Position, PositionError, parse_position
from keyorder.catchup.sizing import parse_master
from keyorder.config import (
    ConfigError,
    HandlerSettings,
    KafkaConnectionSettings,
    RunConfig,
    check_unknown_variables,
    env_name,
    name_values,
    split_name_values,
)

TASK_LOOKAHEAD_MB = 64
"""``--task-lookahead-mb``'s default; the operator sizes executors' memory overhead by it (``memory``)."""

ENFORCED_SPARK_SETTINGS = {
    "spark.speculation": "false",  # a speculative copy of a task would handle the same keys at the same time
    "spark.task.maxFailures": "1",  # a retried task re-handles its keys; rerun the wave instead
    "spark.stage.maxConsecutiveAttempts": "1",  # a fetch failure would re-run the handler stage
}
"""Spark settings the job always uses; ``--spark-conf`` cannot give them other values
(``fixed_setting_overrides``), and a session that
was started without them (``getOrCreate`` on an existing one) is refused (``job.check_session``)."""

SPARK_SECURITY_DEFAULTS = {
    # every RPC, block transfer and file fetch between driver and executors authenticated with a shared
    # secret: Spark makes one per application on local, YARN and k8s:// masters (SecurityManager.initializeAuth);
    # a spark:// master needs the cluster's (spark.authenticate.secret, ``job.security_settings``)
    "spark.authenticate": "true",
    "spark.network.crypto.enabled": "true",  # ... and encrypted (AES): the tasks' data carry the messages
    "spark.io.encryption.enabled": "true",  # shuffle and spill files on the executors' disks encrypted
    "spark.ui.enabled": "false",  # the UI has no authentication here and can kill jobs: --spark-ui turns it on
}
"""Spark settings the job starts its session with unless ``--spark-conf`` or spark-submit set them otherwise
(docs/security.md, "Catch-up's Spark traffic")."""


def fixed_setting_overrides(conf: Mapping[str, str]) -> list[str]:
    """``name=value`` for each enforced setting ``conf`` gives a value other than the one the job requires
    (pure): names and values stripped, values compared case-insensitively, as ``job.session_problems``
    compares them. Giving the required value is allowed."""
    return [
        f"{name.strip()}={value.strip()}"
        for name, value in conf.items()
        if name.strip() in ENFORCED_SPARK_SETTINGS
        and str(value).strip().lower() != ENFORCED_SPARK_SETTINGS[name.strip()]
    ]


def master_attempts_problem(master: str) -> str | None:
    """Why ``master`` would run a handler task more than once whatever ``spark.task.maxFailures`` says
    (pure; ``None``: it would not): ``local[n,f]`` with f above 1 (``sizing.parse_master``)."""
    parsed = parse_master(master)
    if parsed.task_attempts is None or parsed.task_attempts == 1:
        return None
    return (
        f"master {parsed.url} ({parsed.task_attempts} attempts per task whatever spark.task.maxFailures says; "
        "needs local[n] or local[n,1])"
    )


SPARK_MAKES_SECRET = re.compile(r"^(yarn|local(\[.*\])?|k8s://.*)$")
"""Masters for which Spark generates a per-application secret when ``spark.authenticate`` is on
(``SecurityManager.initializeAuth`` in apache/spark core): the others need spark.authenticate.secret."""


def cluster_secret_missing(master: str, conf: Mapping[str, str]) -> bool:
    """Spark authentication is on (``SPARK_SECURITY_DEFAULTS`` unless ``conf`` turns it off) on a master
    whose cluster shares one secret (``spark://``, ``local-cluster``: not ``SPARK_MAKES_SECRET``) and
    ``conf`` gives none (pure): the session would refuse to start (``job.security_settings``)."""
    names = {name.strip(): str(value) for name, value in conf.items()}
    authenticate = names.get("spark.authenticate", SPARK_SECURITY_DEFAULTS["spark.authenticate"])
    return (
        authenticate.strip().lower() == "true"
        and not SPARK_MAKES_SECRET.match(master.strip())
        and "spark.authenticate.secret" not in names
    )


class CatchupConfig(HandlerSettings, KafkaConnectionSettings):
    """Everything ``keyorder catchup`` needs; field docs become ``--help`` and the docs table."""

    start: str = Field(
        "committed",
        description="Where each partition's range starts: committed (the group's "
        "offsets, else where its auto.offset.reset says, as for its pods), earliest, ms:<epoch ms>, an ISO "
        "8601 time with zone, or topic:partition=offset,...",
    )
    until: str = Field(
        "end",
        description="The fence (excluded): end (the end offsets at planning), "
        "ms:<epoch ms>, an ISO 8601 time with zone, or topic:partition=offset,...",
    )
    commit: CommitMode = Field(
        CommitMode.AUTO,
        description="Commit the fence for the group after success: "
        "auto (only when --start is committed), always, or never.",
    )
    allow_unknown_members: bool = Field(
        False,
        description="Run a committing job even when the broker cannot tell whether the group has live members "
        "(describe-groups failed: a timeout or a coordinator move, which passes, exit 3; an ACL or an old broker, "
        "which does not, exit 2). Without it such a job refuses: live consumers would handle the same keys at "
        "the same time. Set it only once you stopped them yourself.",
    )
    master: str = Field(
        "",
        description="Spark master; empty: the one spark-submit gives, else local[*]. local[*] runs one task per "
        "core of the container's CPU limit (cgroup), not of the node.",
    )
    key_partitions: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Spark partitions the keys are hashed into "
        "(tasks of the handler stage); 0: one per core the job asks Spark for, waiting up to --executor-wait "
        "for them to register (a task spreads its keys over its threads).",
    )
    executor_wait: float = Field(
        120.0,
        ge=0,
        le=3600,
        description="Seconds to wait, before the first wave, for the executors' cores to register when "
        "--key-partitions is 0 (one partition per core asked for: spark.executor.instances x "
        "spark.executor.cores, spark.cores.max or local[n]).",
    )
    layout: Layout = Field(
        Layout.AUTO,
        description="How a wave's messages reach its handler tasks. by-partition: each task reads whole Kafka "
        "partitions and handles their messages as it reads them (no shuffle, reading overlaps handling); "
        "shuffle: every partition is read first, then each key moves to its key partition (any number of "
        "tasks, balanced by key, but no handler starts before the last read); auto: by-partition when at "
        "least as many partitions have messages as there are key partitions and whole partitions leave no "
        f"task more than {BALANCE_TOLERANCE:.0%} above an even share, else shuffle.",
    )
    task_workers: int = Field(
        16,
        ge=1,
        le=1024,
        description="Handler threads per Spark task: different keys "
        "run in parallel, each key's messages one after another (like a pod's key "
        "workers); raise it for I/O-bound handlers.",
    )
    task_lookahead: int = Field(
        100_000,
        ge=1,
        le=10_000_000,
        description="Messages a Spark task reads ahead of its slowest key (queued, retrying or running): "
        "room for other keys to pass a hot one. --task-lookahead-mb bounds the same messages by memory.",
    )
    task_lookahead_mb: int = Field(
        TASK_LOOKAHEAD_MB,
        ge=1,
        le=65_536,
        description="Estimated memory (MiB) of the messages a Spark task holds at most: keys, values and "
        "headers plus about 600 bytes each. A task's Python workers hold this much on top of their own "
        "(2 x 192 MiB), the reader's 64 MiB and one 8 MiB Arrow batch; the operator sizes executors' memory "
        "overhead by it; see docs/catchup.md, Memory.",
    )
    wave_offsets: int = Field(
        1_000_000,
        ge=0,
        description="Most offsets per partition in one wave: the job handles, audits and commits the "
        "range wave after wave, so a failure re-runs only its wave; 0: one wave.",
    )
    wave_retries: int = Field(
        2,
        ge=0,
        le=100,
        description="Times a failed wave is run again (a lost executor, a broker outage past the reader's timeout, "
        "a failed dead-letter write) before the job fails; never after a blocked key, an order violation or an "
        "audit problem. A retry handles the wave again from its start: messages the failed attempt handled are "
        "handled twice, as after a pod restart.",
    )
    wave_retry_pause: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="Seconds before a failed wave's first retry, counted once the failed attempt's tasks have ended "
        "(the job waits for them first, at most 36 s, also with 0); doubles for each further retry (at most 10 "
        "minutes).",
    )
    split_offsets: int = Field(
        100_000,
        ge=1,
        description="Most offsets per input split: larger partition ranges are read as several splits in parallel.",
    )
    read_timeout: float = Field(
        120.0,
        gt=0,
        description="Seconds a split may go without records (quiet, or retrying transient broker errors "
        "with a growing pause) before its read fails.",
    )
    spark_conf: list[str] = Field(
        default_factory=list,
        description="Spark setting 'name=value' (repeatable). Overrides the job's security defaults "
        "(spark.authenticate, spark.network.crypto.enabled, spark.io.encryption.enabled on; see docs/security.md); "
        "a spark:// master needs its cluster's spark.authenticate.secret.",
        json_schema_extra={"repeatable": True},
    )
    spark_ui: bool = Field(
        False,
        description="Serve the Spark UI (off by default: it has no authentication here, shows the job's "
        "configuration and can kill its jobs). Same as --spark-conf spark.ui.enabled=true.",
    )
    report: Path | None = Field(None, description="Write the JSON report to this file.")

    @field_validator("start", "until")
    @classmethod
    def _position(cls, value: str, info: Any) -> str:
        try:
            parse_position(value, f"--{info.field_name}")
        except PositionError as error:
            raise ValueError(str(error)) from None
        return value

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _split_conf(cls, value: Any) -> Any:
        return split_name_values(value)

    @field_validator("spark_conf")
    @classmethod
    def _conf_pairs(cls, value: list[str]) -> list[str]:
        overrides = fixed_setting_overrides(dict(item.split("=", 1) for item in name_values(value)))
        if overrides:
            raise ValueError(
                f"{', '.join(overrides)}: fixed by keyorder catchup to "
                + ", ".join(f"{name}={required}" for name, required in ENFORCED_SPARK_SETTINGS.items())
                + " (speculative or retried tasks would handle keys twice or concurrently)"
            )
        return value

    def start_position(self) -> Position:
        return parse_position(self.start, "--start")

    def until_position(self) -> Position:
        return parse_position(self.until, "--until")

    def spark_settings(self) -> dict[str, str]:
        """The user's ``--spark-conf`` plus the enforced settings."""
        given = {name.strip(): value.strip() for name, value in (item.split("=", 1) for item in self.spark_conf)}
        return {**given, **ENFORCED_SPARK_SETTINGS}


BATCH_VARIABLE = env_name("batch_max_messages")
"""The pods' batch size: catch-up calls its handler per message, so it must be unset or 1 for a catch-up."""


def environment_problem(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """Why ``keyorder catchup`` refuses this environment, as ``(the variable, the reason)``; ``None`` when it
    may run. Pure: it reads ``environ`` only.

    * A ``KEYORDER_*`` variable that is neither a catch-up setting nor a pod's (``keyorder run``'s: a Job
      shares its environment with the pods it replaces, ``spec.handler.env``): a typo such as
      ``KEYORDER_TASK_WORKER`` would otherwise be ignored and the job run with the default.
    * ``KEYORDER_BATCH_MAX_MESSAGES`` above 1: the pods' handler takes a list, and catch-up calls its handler
      with one ``Message``. Run so, a batch handler fails every message, and under ``--on-exhausted dlq``
      the whole backlog goes to the dead-letter topic and the fence is committed.
    """
    try:
        check_unknown_variables(CatchupConfig, environ, also_known=[env_name(name) for name in RunConfig.model_fields])
    except ConfigError as error:
        return "", str(error)
    batch = environ.get(BATCH_VARIABLE, "").strip()
    if batch not in ("", "1"):
        return BATCH_VARIABLE, (
            f"{BATCH_VARIABLE}={batch}: the pods run a batch handler (a list of messages a call), and keyorder "
            "catchup calls its handler once per message (handler(message)): the batch handler would fail every "
            "message. Give the job a per-message handler (--handler; examples/keyorder_example/bulk_sqlite.py's "
            f"handle calls its handle_batch with [message]) and leave {BATCH_VARIABLE} unset or 1 for it"
        )
    return None
