"""The catch-up driver: plan on Kafka, run the ordered pipeline on Spark wave by wave, audit, commit.

The range of every partition is cut into *waves* (``plan.cut_waves``). Each wave is one Spark
job, ``read splits -> repartition(n, lane) -> sortWithinPartitions(progress, source, offset) ->
mapInArrow(handler)``, audited on its own and, when the plan commits, committed at once: a
failure re-runs only the current wave (the committed waves are done), progress is real (one line
per committed wave) and a rerun handles again at most one wave. The unit of order is a key within
its partition (``layout.ORDER_GUARANTEE``), and waves run one after another, so its messages keep
their order across waves; within a wave, the sort restores each partition's offset order after the
shuffle, and the tasks run the lanes (``apply``). The fence is the last wave's end.

Spark must never run a handler task twice: ``check_session`` refuses any session, created here or
found running, without ``ENFORCED_SPARK_SETTINGS`` (or on a master that fixes more attempts itself,
``local[n,f]``: ``sizing.parse_master``). An executor lost to decommission or preemption still has
its task re-run (Spark does not count that as a task failure): the report counts such re-runs per
wave, and docs/catchup.md says what they can repeat. No two attempts of a wave overlap: a task copy
asks the driver over the live channel whether its attempt is still the current one before every
handler call (``live``), and after each attempt's Spark job the job waits for its copies to end
before it commits, retries or starts the next wave (``CatchupJob._settle``). Whether a failed wave
is retried is decided on what the failed task said of itself (``apply.TaskFailed``), not on the
error's text.

Why one room of over 600 lines: ``CatchupJob`` (about 520 lines) is one run of the driver, and its steps
(the session check, the plan, each wave's Spark job, its audit and commit, the fence) share the run's
session, plan and live channel; what the run reports (``Plan``, ``WaveOutcome``, ``Outcome``) is the
seam for a later split, apart from the run. That split waits for the fence work of issue 38, being done
here this session.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.accumulators import AccumulatorParam

from keyorder.catchup.apply import SUMMARY_SCHEMA, ApplyHandler, TaskFailure, read_task_failure
from keyorder.catchup.datasource import (
    OPTION_ORDERING,
    OPTION_PROPERTIES_FILE,
    OPTION_SPLITS,
    OPTION_TIMEOUT,
    SOURCE_NAME,
    KafkaRangeDataSource,
)
from keyorder.catchup.layout import ORDER_GUARANTEE, Layout, WaveLayout, choose_layout
from keyorder.catchup.live import FENCE_LEASE, QUIET, ProgressListener, WaveAttempt
from keyorder.catchup.memory import ARROW_BATCH_BYTES, ARROW_BATCH_CONF
from keyorder.catchup.offsets import CatchupKafkaError, KafkaOffsets
from keyorder.catchup.plan import (
    COUNTS,
    Audit,
    KeyStatistics,
    OffsetRange,
    PartitionCounts,
    PlanError,
    TaskSummary,
    TopicPartition,
    audit,
    commits_fence,
    cut_waves,
    fence_metadata,
    key_statistics,
    offsets_a_commit_would_skip,
    partitions_added_note,
    partitions_added_since_commits,
    refuse_live_group,
    resolve_ranges,
    skip_runs,
    split_ranges,
)
from keyorder.catchup.positions import PositionKind
from keyorder.catchup.settings import (
    ENFORCED_SPARK_SETTINGS,
    SPARK_SECURITY_DEFAULTS,
    CatchupConfig,
    cluster_secret_missing,
    master_attempts_problem,
)
from keyorder.catchup.shipped import PRODUCER, READER, ShippedProperties
from keyorder.catchup.sizing import RegistrationWait, expected_cores, is_local_master, local_master, parse_master
from keyorder.config import consumer_properties, env_name, kafka_properties, producer_properties, redact
from keyorder.progress import Progress

log = logging.getLogger(__name__)
TASKS_PER_CORE = 1
SPARK_DEFAULTS = {
    "spark.speculation": "false",
    "spark.task.maxFailures": "4",
    "spark.stage.maxConsecutiveAttempts": "4",
}
"""Spark's own defaults of the enforced settings: what a session that does not set them runs with."""
_EVERY_INTERFACE = frozenset({"0.0.0.0", "::", "[::]"})


class SparkStartError(RuntimeError):
    """The Spark session could not start; the message says what to check."""


class SparkSettingsError(RuntimeError):
    """The Spark session runs without a setting the job needs (it would run handler tasks twice), or its
    security settings cannot work on its master."""


def security_settings(master: str, given: Mapping[str, str], ui: bool) -> dict[str, str]:
    """What the session on ``master`` adds to the settings ``given`` by spark-submit, spark-defaults and
    ``--spark-conf`` (pure): ``SPARK_SECURITY_DEFAULTS`` where none is given, the UI when ``ui`` (``--spark-ui``),
    and the driver's listening address narrowed from every interface to its ``spark.driver.host`` when that
    is an IP address. Raises ``SparkSettingsError`` when authentication is on but cannot work: a master
    whose cluster shares one secret (``spark://``) and no secret given."""
    added = {name: value for name, value in SPARK_SECURITY_DEFAULTS.items() if name not in given}
    if ui:
        added["spark.ui.enabled"] = "true"
    host = given.get("spark.driver.host", "")
    if given.get("spark.driver.bindAddress", "").strip() in _EVERY_INTERFACE and _is_ip_address(host):
        added["spark.driver.bindAddress"] = host  # a pod's own IP: reachable by the executors, nothing else
    authenticated = {**given, **added}["spark.authenticate"].strip().lower() == "true"
    if not authenticated:
        added.pop("spark.network.crypto.enabled", None)  # its keys come from the authentication handshake
    if cluster_secret_missing(master, given):
        raise SparkSettingsError(
            f"Spark authentication is on (the default) and a {master or 'spark-submit'} master needs the secret "
            "its master and workers share (Spark makes one per run only on local, YARN and k8s:// masters): give "
            f"it as --spark-conf spark.authenticate.secret=... ({env_name('spark_conf')}, or spark-submit "
            "--properties-file), or run without authentication and encryption with --spark-conf "
            'spark.authenticate=false (docs/security.md, "Catch-up\'s Spark traffic")'
        )
    return added


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return False
    return True


def session_problems(conf: Mapping[str, str], master: str) -> list[str]:
    """The enforced settings a session with this configuration does not have (pure). A master that fixes
    the attempts per task itself (``local[n,f]``: f, whatever spark.task.maxFailures says;
    ``sizing.parse_master``) is held to the same rule: at most one attempt."""
    problems = []
    parsed = parse_master(master)
    for name, required in ENFORCED_SPARK_SETTINGS.items():
        value = conf.get(name, SPARK_DEFAULTS[name]).strip().lower()
        if name == "spark.task.maxFailures" and parsed.task_attempts is not None:
            if problem := master_attempts_problem(master):
                problems.append(problem)
            continue  # local and local[n] allow one attempt per task whatever the setting says
        if value != required:
            problems.append(f"{name}={value} (needs {required})")
    return problems


def check_session(session: Any) -> None:
    """Refuse a session that could run a handler task twice; Spark reads these settings only when its
    context starts, so they cannot be set on a running session."""
    context = session.sparkContext
    conf = dict(context.getConf().getAll())
    problems = session_problems(conf, context.master)
    if problems:
        raise SparkSettingsError(
            f"the Spark session runs with {', '.join(problems)}: a handler task could run twice. "
            "These settings are read when the session starts and cannot be changed on a running one: "
            "stop the existing session (or start it with them: "
            + " ".join(f"--conf {name}={value}" for name, value in ENFORCED_SPARK_SETTINGS.items())
            + ")"
        )


@dataclass
class Plan:
    ranges: list[OffsetRange]
    splits: list[OffsetRange]
    notes: list[str]
    committed: dict[TopicPartition, int | None]
    """The group's offsets at planning: each wave's commit refuses to run if they moved."""
    commit: bool
    waves: list[list[OffsetRange]] = field(default_factory=list)
    """The ranges of each wave, in order (``plan.cut_waves``)."""
    done: dict[TopicPartition, frozenset[int]] = field(default_factory=dict)
    """Offsets from the range's start on the group's consumers already finished (their commit metadata):
    skipped in range, and kept as metadata above each commit (``plan.fence_metadata``)."""
    partitions_added: dict[str, list[int]] = field(default_factory=dict)
    """Per topic, the partitions probably added since the group's commits (``plan.partitions_added_since_commits``):
    a key may sit in two partitions, each handled in its own offset order."""

    @property
    def offsets(self) -> int:
        return sum(r.offsets for r in self.ranges)

    @property
    def sources(self) -> list[TopicPartition]:
        """The partitions in plan order: rows carry an index into this list."""
        return [(r.topic, r.partition) for r in self.ranges]

    def source_index(self) -> dict[TopicPartition, int]:
        """Each partition's index in ``sources`` (the ``source`` its rows carry)."""
        return {tp: number for number, tp in enumerate(self.sources)}

    def fence(self) -> dict[str, int]:
        return {f"{r.topic}:{r.partition}": r.end for r in self.ranges}


@dataclass
class WaveOutcome:
    """One wave: what it covered, what its audit found, whether it was committed."""

    index: int
    ranges: list[OffsetRange]
    seconds: float
    audit: Audit | None = None
    committed: bool = False
    error: str | None = None
    task_reruns: int = 0
    """Handler tasks Spark ran again after an executor was lost (their keys may have been handled twice)."""
    task_threads: list[int] = field(default_factory=list)
    """Handler threads each task ran at once when it ended: fewer than --task-workers when the handler
    kept its Python worker busy with fewer (``keyorder.core.concurrency``)."""
    layout: WaveLayout | None = None
    """How the wave's messages reached its handler tasks, and why (``layout.choose_layout``)."""
    dead_letters: list[tuple[str, int, int]] = field(default_factory=list)
    """(topic, partition, offset) of the dead-lettered messages (at most 1,000 per task and partition)."""
    attempts: int = 1
    """Times the wave ran: more than 1 when failed attempts were retried (``--wave-retries``)."""
    failed_attempts: list[dict[str, Any]] = field(default_factory=list)
    """The attempts before the last one: ``{"attempt", "error", "seconds"}`` each (their handled messages
    were handled again by the next attempt)."""
    failure: TaskFailure | None = None
    """Why the failed task failed, as it said itself (``apply.TaskFailed``); None when no task said (a
    crashed Python worker, a lost executor, a reader's error) or the wave did not fail."""
    still_running: list[str] = field(default_factory=list)
    """What of the attempt still ran when the job stopped waiting for it (``CatchupJob._settle``): task copies
    that may still call the handler beside what comes next. Empty when all were known ended."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.audit is not None and self.audit.ok

    @property
    def retryable(self) -> bool:
        """A failed wave that running it again may fix (``retryable_wave_error``)."""
        return not self.ok and retryable_wave_error(self.error, self.failure)

    def report(self, run_id: str) -> dict[str, Any]:
        return {
            "wave": self.index,
            "run_id": run_id,
            "ok": self.ok,
            "committed": self.committed,
            "error": self.error,
            "seconds": round(self.seconds, 3),
            "ranges": {f"{r.topic}:{r.partition}": [r.start, r.end] for r in self.ranges},
            "planned_offsets": sum(r.offsets for r in self.ranges),
            **{
                name: self.audit.total(name) if self.audit else 0
                for name in ("read", "skipped", "processed", "dead_lettered")
            },
            "task_reruns": self.task_reruns,
            "layout": self.layout.report() if self.layout else None,
            "task_threads": {"min": min(self.task_threads), "max": max(self.task_threads)}
            if self.task_threads
            else None,
            "attempts": self.attempts,
            "failed_attempts": self.failed_attempts,
            "still_running": self.still_running,
            "dead_letters": [{"topic": t, "partition": p, "offset": o} for t, p, o in self.dead_letters],
            "problems": self.audit.problems if self.audit else [],
        }


@dataclass
class Outcome:
    plan: Plan
    audit: Audit | None
    seconds: float
    committed: bool = False
    error: str | None = None
    spark_ui: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    waves: list[WaveOutcome] = field(default_factory=list)
    run_id: str = ""
    stopped: str | None = None
    """Why the run was stopped before its end (``stopped by SIGTERM``: ``CatchupJob.cancel``), else None."""

    @property
    def ok(self) -> bool:
        return self.error is None and self.audit is not None and self.audit.ok

    def report(self) -> dict[str, Any]:
        handled = self.audit.handled if self.audit else 0
        return {
            "ok": self.ok,
            "error": self.error,
            "stopped": self.stopped,
            "committed": self.committed,
            "run_id": self.run_id,
            "fence": self.plan.fence(),
            "seconds": round(self.seconds, 3),
            "messages_per_second": round(handled / self.seconds, 1) if self.seconds > 0 else None,
            "planned_offsets": self.plan.offsets,
            "read": self.audit.total("read") if self.audit else 0,
            "skipped": self.audit.total("skipped") if self.audit else 0,
            "processed": self.audit.total("processed") if self.audit else 0,
            "dead_lettered": self.audit.total("dead_lettered") if self.audit else 0,
            "violations": self.audit.total("violations") if self.audit else 0,
            "problems": self.audit.problems if self.audit else [],
            "notes": self.plan.notes,
            "order": ORDER_GUARANTEE,
            "partitions_added": self.plan.partitions_added,
            "spark_ui": self.spark_ui,
            "waves_planned": len(self.plan.waves),
            "waves_committed": sum(wave.committed for wave in self.waves),
            "task_reruns": sum(wave.task_reruns for wave in self.waves),
            "wave_retries": sum(wave.attempts - 1 for wave in self.waves),
            "waves": [wave.report(self.run_id) for wave in self.waves],
            "partitions": [
                {
                    "topic": p.planned.topic,
                    "partition": p.planned.partition,
                    "start": p.planned.start,
                    "fence": p.planned.end,
                    "planned_offsets": p.planned.offsets,
                    "splits": p.expected_splits,
                    **{
                        name: getattr(p.counts, name)
                        for name in ("read", "skipped", "processed", "dead_lettered", "violations")
                    },
                }
                for p in (self.audit.partitions if self.audit else [])
            ],
            **self.extra,
        }


UNRETRYABLE_FAILURES = frozenset({TaskFailure.KEY_BLOCKED, TaskFailure.ORDER_VIOLATION, TaskFailure.HANDLER_NOT_LOADED})
"""Causes a wave's retry would only meet again: a key failing every attempt under ``block`` (the pods
take it over), rows out of order (a bug, or a source that changed under the job), a handler the executors
cannot load (the image, ``spark.executorEnv.*`` or the shipped code to fix)."""
WAVE_RETRY_PAUSE_MAX = 600.0
"""The longest pause before a wave's retry, however many retries came before."""
SETTLE_WAIT = FENCE_LEASE + 2 * QUIET
"""Seconds the job waits at most, after a wave attempt's Spark job ended, for its task copies to end
(``CatchupJob._settle``): a copy the driver cannot answer stops by itself after ``live.FENCE_LEASE``."""


def retryable_wave_error(error: str | None, failure: TaskFailure | None) -> bool:
    """Whether running a failed wave again may fix its failure (pure). ``failure`` is what the failed task
    said of itself (``apply.read_task_failure``), never read from the error's text: a handler's message
    may hold any line. ``error`` None means the wave ran to its end and its audit found problems: running
    it again would read and handle the same records, so it is not retried either."""
    if error is None:
        return False
    return failure not in UNRETRYABLE_FAILURES


def wave_failure(error: BaseException, token: str) -> tuple[str, TaskFailure | None]:
    """A failed wave job's error for the report and its typed cause (pure): the ``TaskFailed`` marker of the
    wave attempt's ``token`` when a task raised one, else the best line of the text (``_first_line``)."""
    said = read_task_failure(str(error), token)
    if said is not None:
        return said[1], said[0]
    return _first_line(error), None


def wave_retry_pause(retry: int, first: float) -> float:
    """Seconds before the ``retry``-th retry of a wave (1-based): ``first``, doubling, capped (pure)."""
    return min(first * 2 ** max(retry - 1, 0), WAVE_RETRY_PAUSE_MAX)


def stopped_error(reason: str, waves: list[WaveOutcome], planned: int) -> str:
    """The error of a run stopped by ``cancel`` (pure): where it stopped and which waves stay committed."""
    if waves and not waves[-1].ok:
        where = f"during wave {waves[-1].index + 1} of {planned} (cancelled, not committed)"
    elif waves:
        where = f"after wave {waves[-1].index + 1} of {planned}"
    else:
        where = f"before the first of {planned} waves"
    committed = [str(wave.index + 1) for wave in waves if wave.committed]
    kept = f"committed waves: {', '.join(committed)}" if committed else "no wave committed"
    return f"{reason} {where}; {kept}; a rerun starts at the first uncommitted wave"


def memory_settings(given: Mapping[str, str]) -> dict[str, str]:
    """What the session adds to the settings ``given`` so a task's memory stays within its budget (pure):
    Spark's Arrow batches to ``mapInArrow`` cut at ``memory.ARROW_BATCH_BYTES`` (Spark's default cuts only at
    10,000 rows: 1 GB of 100 KB messages), unless given."""
    return {} if ARROW_BATCH_CONF in given else {ARROW_BATCH_CONF: str(ARROW_BATCH_BYTES)}


def spark_session(config: CatchupConfig):
    """A Spark session for the job: spark-submit's master if launched by it, else ``config.master`` or
    local[*]; refused (``SparkSettingsError``) if an existing session lacks the enforced settings."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run the driver's interpreter locally
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per closed gateway connection otherwise
    builder = SparkSession.builder.appName(f"keyorder-catchup-{config.group_id}")
    launched_by_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    given = {**_launch_settings(), **config.spark_settings()}
    master = given.get("spark.master", "")
    if config.master or not launched_by_submit:
        master = session_master(config.master)
        builder = builder.master(master)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    added = {**security_settings(master, given, config.spark_ui), **memory_settings(given)}
    for name, value in {**config.spark_settings(), **added}.items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    if config.log_level != "DEBUG":
        session.sparkContext.setLogLevel("ERROR")  # task failures are reported once, by the job
    return session


def _launch_settings() -> dict[str, str]:
    """The Spark settings the JVM was launched with (spark-submit's ``--conf`` and ``--properties-file``,
    spark-defaults.conf): the security defaults must not override what the user chose there."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # starts the JVM (or joins spark-submit's), as getOrCreate would
    return dict(SparkConf().getAll())


def session_master(master: str) -> str:
    """``master`` (empty: ``local[*]``) with ``local[*]`` as ``local[n]``, n the container's CPU limit."""
    from keyorder.adapters.cpu import available_cpus, cpu_quota

    resolved = local_master(master or "local[*]", cpu_quota(), available_cpus())
    if resolved != (master or "local[*]"):
        log.info("Spark master %s: %s is the CPU this container may use", resolved, master or "local[*]")
    return resolved


def stop_spark(session: Any) -> None:
    """Stop the session and its JVM now (not in a garbage collector's ``__del__`` at exit): the JVM
    exits when the gateway's stdin closes."""
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    gateway.shutdown()
    process = getattr(gateway, "proc", None)
    SparkContext._gateway = SparkContext._jvm = None
    if process is not None:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=30)
        except Exception:  # subprocess.TimeoutExpired: do not leave it behind
            process.kill()
            process.wait(timeout=10)


class _DictSum(AccumulatorParam):
    """Sums ``{(topic, partition): count}`` dictionaries: the handled counts behind the progress line."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, total: dict, more: dict) -> dict:
        for key, count in more.items():
            total[key] = total.get(key, 0) + count
        return total


class CatchupJob:
    """One catch-up run for one group; ``spark`` may be shared (tests, notebooks) and is then not stopped."""

    cancelled: str | None = None
    """Set by ``cancel`` from another thread, read by ``run`` on the main thread: start and commit no other wave."""
    _job_group: str | None = None
    """The running wave's Spark job group: set by ``_run_wave`` (main thread), read by ``cancel`` (any thread)."""

    def __init__(
        self,
        config: CatchupConfig,
        spark: Any = None,
        environ: Mapping[str, str] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.config = config
        self.properties = kafka_properties(config, environ)
        log.info("Kafka properties: %s", redact(self.properties))
        group_properties = consumer_properties(config, self.properties)
        self.offsets = KafkaOffsets(group_properties, config.group_id)
        # where the group's pods start a partition it never committed: ``--start committed`` does the same
        self.offset_reset = group_properties.get("auto.offset.reset", "earliest")
        self._spark = spark
        self._checked = False
        self._owns_spark = False
        self.progress = progress or Progress()
        self.sleep = time.sleep  # the pause before a wave's retry (a fake clock's in tests)
        # (attempt, most attempts) of the running wave: set on the main thread before the wave's progress
        # thread starts, read by it
        self._attempt = (1, 1 + config.wave_retries)
        self._key_partitions: int | None = None
        self.key_partitions_reason = ""
        self.live: ProgressListener | None = None
        self._told_no_reports = False
        """The warning that no task reported to ``live`` was logged (once per run)."""
        """Running tasks' handled counts (``live``), started with the first wave."""
        self._shipped: ShippedProperties | None = None
        """The Kafka properties the tasks read (``shipped``), registered with Spark before the first wave."""

    @property
    def spark(self):
        if self._spark is None:
            from pyspark.sql import SparkSession

            self._owns_spark = SparkSession.getActiveSession() is None  # never stop a notebook's session
            try:
                self._spark = spark_session(self.config)
            except Exception as error:  # PySparkRuntimeError JAVA_GATEWAY_EXITED, a bad master URL, ...
                raise SparkStartError(
                    f"could not start Spark (master {session_master(self.config.master)!r}): "
                    f"{_first_line(error)}. Is a Java 17+ runtime installed (java -version, "
                    "JAVA_HOME)?"
                ) from error
        if not self._checked:
            check_session(self._spark)  # created here or handed over: getOrCreate may return an old one
            self._checked = True
        return self._spark

    def cancel(self, reason: str) -> None:
        """Stop the run as soon as possible (``reason``: ``stopped by SIGTERM``): ``run`` starts no other wave
        and commits none, the interrupted one included, and the running wave's Spark jobs are cancelled
        (Spark kills their tasks, and PySpark a killed task's Python worker). Any thread, but not a signal
        handler: it calls py4j, and the main thread's py4j connection is busy in ``collect()``
        (``keyorder.catchup.signals`` calls it from a thread of its own). Calling it again cancels again:
        a wave may have submitted its job just after the previous call."""
        if self.cancelled is None:
            self.cancelled = reason
        group, spark = self._job_group, self._spark
        if group is not None and spark is not None:
            spark.sparkContext.cancelJobGroup(group)

    def close(self) -> None:
        self.offsets.close()
        if self.live is not None:
            self.live.close()
        if self._shipped is not None:
            self._shipped.close()
        if self._owns_spark and self._spark is not None:
            stop_spark(self._spark)

    def plan(self, preview: bool = False) -> Plan:
        """The ranges, waves and splits; ``preview`` (``--plan``) notes a live group instead of refusing."""
        start, until = self.config.start_position(), self.config.until_position()
        snapshots = self.offsets.snapshot(self.config.topics, start, until)
        ranges, notes = resolve_ranges(snapshots, start, until, self.offset_reset)
        commit = commits_fence(self.config.commit, start)
        skipped = offsets_a_commit_would_skip(ranges, snapshots, self.offset_reset) if commit else []
        if skipped:
            raise PlanError(
                "committing the fence would skip offsets that were never handled ("
                + "; ".join(skipped)
                + "): start at or before the group's offsets, or --commit never"
            )
        refusal = refuse_live_group(
            self.offsets.members() if commit else None,
            commit,
            self.config.group_id,
            preview,
            allow_unknown=self.config.allow_unknown_members,
        )
        if refusal:
            notes.append(refusal)
        done = {}
        if start.kind is PositionKind.COMMITTED:  # a replay from elsewhere handles everything again
            for r in ranges:
                # past the fence too: the commits keep them as metadata for the pods (``fence_metadata``)
                finished = frozenset(o for o in snapshots[(r.topic, r.partition)].done if o >= r.start)
                if finished:
                    done[(r.topic, r.partition)] = finished
                in_range = sum(1 for o in finished if o < r.end)
                if in_range:
                    notes.append(
                        f"{r.name()}: {in_range:,} offsets in range were finished by the group's consumers "
                        "(commit metadata): read but not handled again"
                    )
        added = partitions_added_since_commits(snapshots)
        for note in partitions_added_note(added):
            log.warning("%s", note)
            notes.append(note)
        waves = cut_waves(ranges, self.config.wave_offsets)
        return Plan(
            ranges=ranges,
            splits=[split for wave in waves for split in split_ranges(wave, self.config.split_offsets)],
            notes=notes,
            committed={tp: snapshot.committed for tp, snapshot in snapshots.items()},
            commit=commit,
            waves=waves,
            done=done,
            partitions_added=added,
        )

    def _records(self, plan: Plan, wave: list[OffsetRange], layout: WaveLayout | None = None):
        """The wave's records, read by the tasks of a by-partition ``layout``, else one reader task per split."""
        self.spark.dataSource.register(KafkaRangeDataSource)
        index = plan.source_index()
        whole = {(r.topic, r.partition): r for r in wave}
        splits: dict[int, list[list[Any]]] = {}
        for s in split_ranges(wave, self.config.split_offsets):
            source = index[(s.topic, s.partition)]
            splits.setdefault(source, []).append(
                [
                    s.topic,
                    s.partition,
                    s.start,
                    s.end,
                    source,
                    whole[(s.topic, s.partition)].start,
                    whole[(s.topic, s.partition)].end,
                    skip_runs(s, plan.done.get((s.topic, s.partition), frozenset())),
                ]
            )
        if layout is not None and layout.layout is Layout.BY_PARTITION:
            tasks = [[split for source in task for split in splits[source]] for task in layout.tasks]
        else:
            tasks = [[split] for source in sorted(splits) for split in splits[source]]
        return (
            self.spark.read.format(SOURCE_NAME)
            .option(OPTION_SPLITS, json.dumps(tasks))
            .option(OPTION_PROPERTIES_FILE, self._properties_file())
            .option(OPTION_ORDERING, self.config.ordering.value)
            .option(OPTION_TIMEOUT, str(self.config.read_timeout))
            .load()
        )

    def _properties_file(self) -> str:
        """The name under which the tasks find the run's Kafka properties (``shipped``): never in a closure."""
        if self._shipped is None:
            reader = {
                name: value
                for name, value in self.properties.items()
                if not name.startswith(("group.", "enable.auto."))
            }
            self._shipped = ShippedProperties(
                self.spark.sparkContext, {READER: reader, PRODUCER: producer_properties(self.properties)}
            )
        return self._shipped.name

    def _live_address(self, attempt: WaveAttempt) -> tuple[str, int] | None:
        """Where this wave attempt's tasks send their handled counts and ask whether to go on, and the listener's
        port. The listener is bound to the driver's own address, not every interface: ``spark.driver.host``'s,
        and the tasks get the numeric address it is bound to (``ProgressListener.task_host``: a name with
        addresses of both families cannot send them to the other one); or ``spark.driver.bindAddress`` when
        that names one, and the tasks get ``spark.driver.host``, the address it is reached at, as Spark's own
        executors do. None when no listener could start (no live progress, no fence: docs/catchup.md)."""
        conf = self.spark.sparkContext.getConf()
        host = conf.get("spark.driver.host") or "127.0.0.1"
        bind = (conf.get("spark.driver.bindAddress") or "").strip()
        advertised = bool(bind) and bind not in _EVERY_INTERFACE  # bound here, reached at host (NAT, bridges)
        if self.live is None:
            try:
                self.live = ProgressListener(bind if advertised else host)
            except OSError as error:
                log.warning("no live progress from the tasks (handled counts at each task's end): %s", error)
                return None
        self.live.expect(attempt)
        return (host if advertised else self.live.task_host), self.live.port

    def _settle(self, group: str) -> list[str]:
        """After a wave attempt's Spark job ended: close the attempt (its task copies are told to stop at their
        next handler call) and wait, at most ``SETTLE_WAIT`` seconds, until Spark runs none of its tasks and
        no copy of it still reports (a copy on an executor Spark gave up on). The next attempt, the next wave
        and the commit come after it. What still ran at the bound, for the log and the report."""
        if self.live is not None:
            self.live.close_attempt()
            if not self.live.reported() and not self._told_no_reports:
                self._told_no_reports = True
                log.warning(
                    "no task of this wave attempt reported to the driver's live progress listener (UDP port %d): "
                    "if its tasks ran, the executors cannot send UDP to the driver; their counts show only at "
                    "each task's end, and a task that hears no answer stops after %.0f s (docs/catchup.md)",
                    self.live.port,
                    FENCE_LEASE,
                )
        deadline = time.monotonic() + SETTLE_WAIT
        while True:
            running = [f"{count} Spark tasks" for count in [self._spark_tasks_running(group)] if count]
            if self.live is not None:
                running += [f"task {task} copy {copy}" for task, copy in self.live.running()]
            if not running or time.monotonic() >= deadline or self.cancelled is not None:
                return running
            time.sleep(0.1)

    def _spark_tasks_running(self, group: str) -> int:
        """The tasks Spark still runs of the job group's jobs (killed ones end after
        spark.python.task.killTimeout)."""
        tracker = self.spark.sparkContext.statusTracker()
        running = 0
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else []:
                stage_info = tracker.getStageInfo(stage)
                running += stage_info.numActiveTasks if stage_info is not None else 0
        return running

    def wave_layout(self, plan: Plan, wave: list[OffsetRange]) -> WaveLayout:
        """How this wave's messages reach its key partitions (``--layout``; ``layout.choose_layout``)."""
        index = plan.source_index()
        sizes = {index[(r.topic, r.partition)]: r.offsets for r in wave}
        return choose_layout(self.config.layout, sizes, self.key_partitions())

    def key_partitions(self) -> int:
        """``--key-partitions``, else one per core the job asked Spark for, after waiting (at most
        ``--executor-wait`` seconds, once per run) for the executors to register (``sizing``)."""
        if self._key_partitions is None:
            self._key_partitions, self.key_partitions_reason = self._size_key_partitions()
            log.info("%s", self.key_partitions_reason)
        return self._key_partitions

    def _size_key_partitions(self) -> tuple[int, str]:
        if self.config.key_partitions:
            return self.config.key_partitions, f"{self.config.key_partitions} key partitions: --key-partitions"
        context = self.spark.sparkContext
        conf = dict(context.getConf().getAll())
        expected, source = expected_cores(context.master, conf)
        local = is_local_master(context.master)
        if expected is None and local:  # a handed-over local[*] session
            expected, source = context.defaultParallelism, context.master
        wait = RegistrationWait(
            expected, time.monotonic(), timeout=self.config.executor_wait, tasks_per_core=TASKS_PER_CORE
        )

        def registered() -> int:
            return (expected or context.defaultParallelism) if local else _registered_cores(context, conf)

        count, shown = registered(), False
        while not wait.done(count, time.monotonic()) and self.cancelled is None:  # a SIGTERM ends the wait
            shown = True
            self.progress.show(
                f"waiting for Spark executors: {count} of {expected if expected else '?'} cores registered "
                f"({source}), {time.monotonic() - wait.started:.0f} of {self.config.executor_wait:.0f} s"
            )
            time.sleep(0.5)
            count = registered()
        if shown:
            self.progress.done()
        return wait.key_partitions(count), wait.describe(count, time.monotonic()) + f" ({source})"

    def key_statistics(self, plan: Plan, top: int = 10) -> KeyStatistics:
        """Messages per route (a key within its partition: the unit of order) over the whole range (one read
        pass, no handler)."""
        from pyspark.sql import functions

        busy = [r for r in plan.ranges if r.offsets]
        if not busy:
            return key_statistics([])
        counts = (
            self._records(plan, busy)
            .where(functions.col("marker_read").isNull())
            .groupBy("lane")
            .agg(
                functions.count("*").alias("count"),
                functions.first("key").alias("key"),
                functions.first("source").alias("source"),
            )
        )
        sources = plan.sources

        def name(row: Any) -> str:  # a lane is a key within its partition (datasource.route_of)
            topic, partition = sources[row["source"]]
            if row["key"] is None or self.config.ordering.value == "partition":
                return f"{topic}[{partition}] (partition lane)"
            return f"{_key_name(row['key'])} in {topic}[{partition}]"

        rows = counts.collect() if plan.offsets <= 5_000_000 else None
        if rows is None:  # too many keys to ship to the driver: aggregate on Spark
            totals = counts.agg(functions.sum("count").alias("messages"), functions.count("*").alias("keys")).first()
            hottest = counts.orderBy(functions.desc("count")).limit(top).collect()
            return KeyStatistics(
                messages=totals["messages"] or 0,
                distinct_keys=totals["keys"],
                hottest=[(name(row), row["count"]) for row in hottest],
            )
        return key_statistics(((name(row), row["count"]) for row in rows), top=top)

    def run(self, plan: Plan) -> Outcome:
        """Handle every message of the plan in key order, wave by wave; each wave is committed (when
        the plan commits) only after its own clean audit. A failed wave is run again, after a growing
        pause, up to ``wave_retries`` times unless retrying cannot help (``retryable_wave_error``); a
        wave failed for good stops the run (the waves before it stay committed)."""
        started = time.monotonic()
        run_id = uuid.uuid4().hex[:12]
        outcome = Outcome(plan, None, 0.0, run_id=run_id)
        expected = dict(plan.committed)
        summaries: list[TaskSummary] = []
        done_splits: list[OffsetRange] = []
        handled_before = 0
        for index, wave in enumerate(plan.waves):
            if self.cancelled is not None:  # stopped between waves: start no other
                outcome.stopped = self.cancelled
                break
            result, wave_summaries = self._run_wave_with_retries(plan, index, wave, run_id, started, handled_before)
            if self.cancelled is not None:  # stopped during the wave: never commit it, even if it got to its end
                outcome.stopped, result.error = self.cancelled, f"{self.cancelled}: the wave was cancelled"
            outcome.waves.append(result)
            if result.ok:
                summaries += wave_summaries
                done_splits += split_ranges(wave, self.config.split_offsets)
                handled_before += result.audit.handled  # type: ignore[union-attr]
            if result.ok and plan.commit:
                try:
                    self.offsets.commit_fence(wave, expected, fence_metadata(wave, plan.done))
                except CatchupKafkaError as error:
                    result.error = str(error)
                else:
                    result.committed = True
                    expected.update({(r.topic, r.partition): r.end for r in wave})
            self._show_wave(plan, result, started)
            if not result.ok:
                outcome.error = result.error or "; ".join(result.audit.problems if result.audit else [])
                if result.attempts > 1:
                    outcome.error += f" (the wave's attempt {result.attempts}; it failed every time)"
                break
        self.progress.done()
        if outcome.stopped is not None:
            outcome.error = stopped_error(outcome.stopped, outcome.waves, len(plan.waves))
        outcome.audit = audit(plan.ranges, plan.splits if outcome.error is None else done_splits, summaries)
        outcome.seconds = time.monotonic() - started
        outcome.spark_ui = self.spark.sparkContext.uiWebUrl if plan.waves else None
        if self._key_partitions is not None:
            outcome.extra.update(key_partitions=self._key_partitions, key_partitions_reason=self.key_partitions_reason)
        outcome.committed = plan.commit and outcome.ok and all(wave.committed for wave in outcome.waves)
        if plan.commit and outcome.ok and not plan.waves:  # nothing to handle: commit the fence (= the start)
            try:
                self.offsets.commit_fence(plan.ranges, expected, fence_metadata(plan.ranges, plan.done))
            except CatchupKafkaError as error:
                outcome.error = str(error)
            else:
                outcome.committed = True
        return outcome

    def _run_wave_with_retries(
        self, plan: Plan, index: int, wave: list[OffsetRange], run_id: str, started: float, handled_before: int
    ) -> tuple[WaveOutcome, list[TaskSummary]]:
        """Run the wave, and again after a failure retrying may fix (the committed waves are done: only
        this one runs again, from its start); the last attempt's outcome, with the earlier ones in it."""
        most = 1 + self.config.wave_retries
        failed: list[dict[str, Any]] = []
        while True:
            self._attempt = (len(failed) + 1, most)
            result, summaries = self._run_wave(plan, index, wave, run_id, started, handled_before)
            result.attempts, result.failed_attempts = len(failed) + 1, list(failed)
            if result.ok or not result.retryable or len(failed) + 1 >= most or self.cancelled is not None:
                return result, summaries
            pause = wave_retry_pause(len(failed) + 1, self.config.wave_retry_pause)
            failed.append({"attempt": len(failed) + 1, "error": result.error, "seconds": round(result.seconds, 3)})
            self._show_wave(plan, result, started, retry_in=pause)
            while self.cancelled is None and pause > 0:  # in steps: a SIGTERM (``cancel``) ends the pause
                self.sleep(min(pause, 0.5))
                pause -= 0.5
            if self.cancelled is not None:
                return result, summaries

    def _run_wave(
        self, plan: Plan, index: int, wave: list[OffsetRange], run_id: str, started: float, handled_before: int
    ) -> tuple[WaveOutcome, list[TaskSummary]]:
        wave_started = time.monotonic()
        accumulator = self.spark.sparkContext.accumulator({}, _DictSum())
        failure_token = uuid.uuid4().hex  # in a failed task's TaskFailed marker: no handler text can forge it
        handler = ApplyHandler(
            handler=self.config.handler,
            policy=self.config.retry_policy(),
            dlq_topic=self.config.dlq_topic,
            sources=plan.sources,
            ordering=self.config.ordering.value,
            properties_file=self._properties_file(),
            progress=accumulator,
            task_workers=self.config.task_workers,
            lookahead=self.config.task_lookahead,
            lookahead_bytes=self.config.task_lookahead_mb << 20,
            run_id=run_id,
            wave=index,
            wave_attempt=self._attempt[0],
            live_address=self._live_address(WaveAttempt(run_id, index, self._attempt[0])),
            failure_token=failure_token,
            setup=self.config.handler_setup,
            teardown=self.config.handler_teardown,
        )
        layout = self.wave_layout(plan, wave)
        log.info("wave %d/%d: %s", index + 1, len(plan.waves), layout.reason)
        records = self._records(plan, wave, layout)
        if layout.layout is Layout.SHUFFLE:
            records = records.repartition(self.key_partitions(), "lane").sortWithinPartitions(
                "progress", "source", "offset"
            )
        group = self._job_group = f"keyorder-catchup-{run_id}-wave-{index}"  # what cancel() cancels
        self.spark.sparkContext.setJobGroup(group, f"keyorder catch-up wave {index + 1}/{len(plan.waves)}")
        stop = threading.Event()
        watcher = threading.Thread(
            target=self._show_progress,
            args=(plan, index, layout, accumulator, stop, started, handled_before),
            name="catchup-progress",
            daemon=True,
        )
        watcher.start()
        try:
            rows = records.mapInArrow(handler, SUMMARY_SCHEMA).collect()
        except Exception as error:  # a task failed: the handler, Kafka, or a blocked key
            message, failure = wave_failure(error, failure_token)
            failed = WaveOutcome(
                index, wave, time.monotonic() - wave_started, error=message, failure=failure, layout=layout
            )
            failed.still_running = self._settle(group)
            return failed, []
        finally:
            stop.set()
            watcher.join()
        still_running = self._settle(group)
        summaries = [
            TaskSummary(row["topic"], row["partition"], PartitionCounts(**{name: row[name] for name in COUNTS}))
            for row in rows
        ]
        return (
            WaveOutcome(
                index,
                wave,
                time.monotonic() - wave_started,
                audit=audit(wave, split_ranges(wave, self.config.split_offsets), summaries),
                task_reruns=len({row["task"] for row in rows if row["attempt"]}),
                layout=layout,
                task_threads=sorted({row["task"]: row["threads"] for row in rows}.values()),
                dead_letters=[
                    (row["topic"], row["partition"], offset)
                    for row in rows
                    for offset in row["dead_letter_offsets"] or []
                ],
                still_running=still_running,
            ),
            summaries,
        )

    def _show_wave(self, plan: Plan, wave: WaveOutcome, started: float, retry_in: float | None = None) -> None:
        handled = wave.audit.handled if wave.audit else 0
        state = "committed" if wave.committed else ("done" if wave.ok else f"failed: {wave.error or 'audit'}")
        most = 1 + self.config.wave_retries
        if retry_in is not None:
            state = f"attempt {wave.attempts} of {most} failed, retrying in {retry_in:.0f}s: {wave.error}"
        elif wave.attempts > 1:
            state += f" (attempt {wave.attempts} of {most})"
        line = (
            f"wave {wave.index + 1}/{len(plan.waves)} {state}: {handled:,} handled in {wave.seconds:.1f}s "
            f"({handled / wave.seconds if wave.seconds else 0:,.0f} msg/s)"
            + (f", {len(wave.dead_letters):,} dead-lettered" if wave.dead_letters else "")
            + (f", {wave.task_reruns} task re-runs after a lost executor" if wave.task_reruns else "")
            + (f", {wave.layout.layout.value} in {wave.layout.handler_tasks} tasks" if wave.layout else "")
            + _threads_note(wave.task_threads, self.config.task_workers)
            + f" · {time.monotonic() - started:.0f}s"
        )
        self.progress.done()
        log.info("%s", line)
        self.progress.show(line, force=True)  # a wave's outcome is never skipped, also in a log (not a TTY)
        self.progress.done()

    def _show_progress(
        self,
        plan: Plan,
        index: int,
        layout: WaveLayout,
        accumulator: Any,
        stop: threading.Event,
        started: float,
        handled_before: int,
    ) -> None:
        total = plan.offsets
        tracker = self.spark.sparkContext.statusTracker()
        while not stop.wait(0.5):
            live = self.live.total() if self.live is not None else 0
            done = handled_before + max(sum(dict(accumulator.value).values()), live)
            stages = []
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    stages.append(f"stage {stage_id} {info.numCompletedTasks}/{info.numTasks} tasks")
            elapsed = time.monotonic() - started
            last = " (the last)" if index == len(plan.waves) - 1 else ""
            attempt, most = self._attempt
            retry = f" (attempt {attempt} of {most})" if attempt > 1 else ""
            self.progress.show(
                f"catch-up wave {index + 1}/{len(plan.waves)}{last}{retry} · {done:,}/{total:,} handled "
                f"({done / total:.0%}) · {layout.layout.value} · {' · '.join(stages) or 'starting'} · "
                f"{done / elapsed:,.0f} msg/s · "
                f"{elapsed:.0f}s"
            )


def _key_name(key: bytes) -> str:
    """A key as text for people (not valid UTF-8: escaped; NUL bytes dropped)."""
    return bytes(key).decode("utf-8", "backslashreplace").replace("\x00", "")


_PYTHON_ERROR = re.compile(r"^\s*([\w.]+(?:Error|Exception|Blocked|Crashed|Violation)): (.+)$")
_SPARK_CAUSE = re.compile(r"SparkException: (?!Job aborted)([^\n]+)")


def _threads_note(threads: list[int], workers: int) -> str:
    """``, 1-2 of 16 task threads ran at once`` when the tasks ran fewer than ``--task-workers``."""
    if not threads or min(threads) >= workers:
        return ""
    low, high = min(threads), max(threads)
    counts = str(low) if low == high else f"{low}-{high}"
    return f", {counts} of {workers} task threads ran at once (the handler kept them busy)"


def _registered_cores(context: Any, conf: Mapping[str, str]) -> int:
    """Cores of the executors registered so far (0 before the first): Spark's default parallelism is
    their total (at least 2) unless spark.default.parallelism overrides it."""
    executors = len(context._jsc.sc().statusTracker().getExecutorInfos()) - 1  # the driver is listed too
    if executors <= 0:
        return 0
    if "spark.default.parallelism" in conf:
        return executors * int(conf.get("spark.executor.cores", "1"))
    return int(context.defaultParallelism)


def _first_line(error: BaseException) -> str:
    """The Python exception a Spark task died of (``SplitReadError: ...``), not the JVM's stack: the last
    line that looks like one. For the message only; no decision is taken on it (``wave_failure``)."""
    found = None
    for line in str(error).splitlines():
        match = _PYTHON_ERROR.match(line)
        if match and not match.group(1).startswith(("org.", "java.", "scala.", "py4j.")):
            found = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
    if found:
        return found
    text = str(error).strip()
    causes = _SPARK_CAUSE.findall(text)  # no Python exception (a crashed Python worker): Spark's innermost cause
    if causes:
        return f"SparkException: {causes[-1].strip()}"
    return text.splitlines()[0] if text else type(error).__name__
