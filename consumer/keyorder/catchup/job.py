"""The catch-up driver: plan on Kafka, run the ordered pipeline on Spark, audit, then commit.

The pipeline is ``read splits -> repartition(n, route) -> sortWithinPartitions(route, topic,
partition, offset) -> mapInPandas(handler)``. The sort is what guarantees order: Spark's
shuffle interleaves the splits of one partition, and only the sort puts a key's messages back in
offset order. The driver commits the fence only after the audit proves that every split reached
its fence and every record read was handled without an order violation. A failed job commits
nothing, so running it again is safe (at-least-once, like a pod's crash).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.accumulators import AccumulatorParam

from keyorder.catchup.apply import SUMMARY_SCHEMA, ApplyHandler
from keyorder.catchup.datasource import (
    OPTION_ORDERING,
    OPTION_PROPERTIES,
    OPTION_SPLITS,
    OPTION_TIMEOUT,
    SOURCE_NAME,
    KafkaRangeDataSource,
)
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
    key_statistics,
    offsets_a_commit_would_skip,
    refuse_live_group,
    resolve_ranges,
    split_ranges,
)
from keyorder.catchup.settings import CatchupConfig
from keyorder.config import consumer_properties, kafka_properties, producer_properties, redact
from keyorder.progress import Progress

log = logging.getLogger(__name__)
TASKS_PER_CORE = 4


class SparkStartError(RuntimeError):
    """The Spark session could not start; the message says what to check."""


@dataclass
class Plan:
    ranges: list[OffsetRange]
    splits: list[OffsetRange]
    notes: list[str]
    committed: dict[TopicPartition, int | None]
    """The group's offsets at planning: the final commit refuses to run if they moved."""
    commit: bool

    @property
    def offsets(self) -> int:
        return sum(r.offsets for r in self.ranges)

    def fence(self) -> dict[str, int]:
        return {f"{r.topic}:{r.partition}": r.end for r in self.ranges}


@dataclass
class Outcome:
    plan: Plan
    audit: Audit | None
    seconds: float
    committed: bool = False
    error: str | None = None
    spark_ui: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.audit is not None and self.audit.ok

    def report(self) -> dict[str, Any]:
        handled = self.audit.total("processed") + self.audit.total("dead_lettered") if self.audit else 0
        return {
            "ok": self.ok,
            "error": self.error,
            "committed": self.committed,
            "fence": self.plan.fence(),
            "seconds": round(self.seconds, 3),
            "messages_per_second": round(handled / self.seconds, 1) if self.seconds > 0 else None,
            "planned_offsets": self.plan.offsets,
            "read": self.audit.total("read") if self.audit else 0,
            "processed": self.audit.total("processed") if self.audit else 0,
            "dead_lettered": self.audit.total("dead_lettered") if self.audit else 0,
            "violations": self.audit.total("violations") if self.audit else 0,
            "problems": self.audit.problems if self.audit else [],
            "notes": self.plan.notes,
            "spark_ui": self.spark_ui,
            "partitions": [
                {
                    "topic": p.planned.topic,
                    "partition": p.planned.partition,
                    "start": p.planned.start,
                    "fence": p.planned.end,
                    "planned_offsets": p.planned.offsets,
                    "splits": p.expected_splits,
                    **{name: getattr(p.counts, name) for name in ("read", "processed", "dead_lettered", "violations")},
                }
                for p in (self.audit.partitions if self.audit else [])
            ],
            **self.extra,
        }


def spark_session(config: CatchupConfig):
    """A Spark session for the job: spark-submit's master if launched by it, else ``config.master`` or local[*]."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run the driver's interpreter locally
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per closed gateway connection otherwise
    builder = SparkSession.builder.appName(f"keyorder-catchup-{config.group_id}")
    launched_by_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if config.master or not launched_by_submit:
        builder = builder.master(config.master or "local[*]")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for name, value in config.spark_settings().items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    if config.log_level != "DEBUG":
        session.sparkContext.setLogLevel("ERROR")  # task failures are reported once, by the job
    return session


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
        self.offsets = KafkaOffsets(consumer_properties(config, self.properties), config.group_id)
        self._spark = spark
        self._owns_spark = False
        self.progress = progress or Progress()

    @property
    def spark(self):
        if self._spark is None:
            from pyspark.sql import SparkSession

            self._owns_spark = SparkSession.getActiveSession() is None  # never stop a notebook's session
            try:
                self._spark = spark_session(self.config)
            except Exception as error:  # PySparkRuntimeError JAVA_GATEWAY_EXITED, a bad master URL, ...
                raise SparkStartError(
                    f"could not start Spark (master {self.config.master or 'local[*]'!r}): "
                    f"{_first_line(error)}. Is a Java 17+ runtime installed (java -version, "
                    "JAVA_HOME)?"
                ) from error
        return self._spark

    def close(self) -> None:
        self.offsets.close()
        if self._owns_spark and self._spark is not None:
            stop_spark(self._spark)

    def plan(self) -> Plan:
        start, until = self.config.start_position(), self.config.until_position()
        snapshots = self.offsets.snapshot(self.config.topics, start, until)
        ranges, notes = resolve_ranges(snapshots, start, until)
        commit = commits_fence(self.config.commit, start)
        skipped = offsets_a_commit_would_skip(ranges, snapshots) if commit else []
        if skipped:
            raise PlanError(
                "committing the fence would skip offsets that were never handled ("
                + "; ".join(skipped)
                + "): start at or before the group's offsets, or --commit never"
            )
        refuse_live_group(self.offsets.members() if commit else None, commit, self.config.group_id)
        return Plan(
            ranges=ranges,
            splits=split_ranges(ranges, self.config.split_offsets),
            notes=notes,
            committed={tp: snapshot.committed for tp, snapshot in snapshots.items()},
            commit=commit,
        )

    def _records(self, plan: Plan):
        self.spark.dataSource.register(KafkaRangeDataSource)
        splits = [[s.topic, s.partition, s.start, s.end] for s in plan.splits]
        reader_properties = {
            name: value for name, value in self.properties.items() if not name.startswith(("group.", "enable.auto."))
        }
        return (
            self.spark.read.format(SOURCE_NAME)
            .option(OPTION_SPLITS, json.dumps(splits))
            .option(OPTION_PROPERTIES, json.dumps(reader_properties))
            .option(OPTION_ORDERING, self.config.ordering.value)
            .option(OPTION_TIMEOUT, str(self.config.read_timeout))
            .load()
        )

    def key_partitions(self) -> int:
        return self.config.key_partitions or TASKS_PER_CORE * self.spark.sparkContext.defaultParallelism

    def key_statistics(self, plan: Plan, top: int = 10) -> KeyStatistics:
        """Messages per route over the whole range (one read pass, no handler)."""
        from pyspark.sql import functions

        if not plan.splits:
            return key_statistics([])
        counts = self._records(plan).where(functions.col("marker_read").isNull()).groupBy("route").count()
        rows = counts.collect() if plan.offsets <= 5_000_000 else None
        if rows is None:  # too many keys to ship to the driver: aggregate on Spark
            totals = counts.agg(functions.sum("count").alias("messages"), functions.count("*").alias("keys")).first()
            hottest = counts.orderBy(functions.desc("count")).limit(top).collect()
            return KeyStatistics(
                messages=totals["messages"] or 0,
                distinct_keys=totals["keys"],
                hottest=[(_route_name(row["route"]), row["count"]) for row in hottest],
            )
        return key_statistics(((_route_name(row["route"]), row["count"]) for row in rows), top=top)

    def run(self, plan: Plan) -> Outcome:
        """Handle every message of the plan in key order; commit the fence only after a clean audit."""
        started = time.monotonic()
        if not plan.splits:
            outcome = Outcome(plan, audit(plan.ranges, plan.splits, []), 0.0)
            return self._commit(outcome)
        accumulator = self.spark.sparkContext.accumulator({}, _DictSum())
        handler = ApplyHandler(
            handler=self.config.handler,
            policy=self.config.retry_policy(),
            dlq_topic=self.config.dlq_topic,
            producer_properties=producer_properties(self.properties),
            progress=accumulator,
            task_workers=self.config.task_workers,
        )
        ordered = (
            self._records(plan)
            .repartition(self.key_partitions(), "route")
            .sortWithinPartitions("route", "topic", "partition", "offset")
        )
        stop = threading.Event()
        watcher = threading.Thread(
            target=self._show_progress, args=(plan, accumulator, stop, started), name="catchup-progress", daemon=True
        )
        watcher.start()
        try:
            rows = ordered.mapInPandas(handler, SUMMARY_SCHEMA).collect()
        except Exception as error:  # a task failed: the handler, Kafka, or a blocked key
            return Outcome(
                plan,
                None,
                time.monotonic() - started,
                error=_first_line(error),
                spark_ui=self.spark.sparkContext.uiWebUrl,
            )
        finally:
            stop.set()
            watcher.join()
            self.progress.done()
        summaries = [
            TaskSummary(row["topic"], row["partition"], PartitionCounts(**{name: row[name] for name in COUNTS}))
            for row in rows
        ]
        outcome = Outcome(
            plan,
            audit(plan.ranges, plan.splits, summaries),
            time.monotonic() - started,
            spark_ui=self.spark.sparkContext.uiWebUrl,
        )
        return self._commit(outcome)

    def _commit(self, outcome: Outcome) -> Outcome:
        if not outcome.ok or not outcome.plan.commit:
            return outcome
        try:
            self.offsets.commit_fence(outcome.plan.ranges, outcome.plan.committed)
        except CatchupKafkaError as error:
            outcome.error = str(error)
            return outcome
        outcome.committed = True
        return outcome

    def _show_progress(self, plan: Plan, accumulator: Any, stop: threading.Event, started: float) -> None:
        planned = {(r.topic, r.partition): r.offsets for r in plan.ranges if r.offsets}
        total = sum(planned.values())
        tracker = self.spark.sparkContext.statusTracker()
        while not stop.wait(0.5):
            done_by_partition = dict(accumulator.value)
            done = sum(done_by_partition.values())
            slowest = min(done_by_partition.get(tp, 0) / offsets for tp, offsets in planned.items())
            stages = []
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    stages.append(f"stage {stage_id} {info.numCompletedTasks}/{info.numTasks} tasks")
            elapsed = time.monotonic() - started
            self.progress.show(
                f"catch-up {done:,}/{total:,} handled ({done / total:.0%}) · slowest of "
                f"{len(planned)} partitions {slowest:.0%} · {' · '.join(stages) or 'starting'} · "
                f"{done / elapsed:,.0f} msg/s · {elapsed:.0f}s"
            )


def _route_name(route: bytes) -> str:
    return bytes(route).decode("utf-8", "backslashreplace").replace("\x00", "")


_PYTHON_ERROR = re.compile(r"^\s*([\w.]+(?:Error|Exception|Blocked|Crashed)): (.+)$")


def _first_line(error: BaseException) -> str:
    """The Python exception a Spark task died of (``KeyBlocked: ...``), not the JVM's stack."""
    found = None
    for line in str(error).splitlines():
        match = _PYTHON_ERROR.match(line)
        if match and not match.group(1).startswith(("org.", "java.", "scala.", "py4j.")):
            found = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}"
    if found:
        return found
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
