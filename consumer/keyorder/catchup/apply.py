"""Calling the user's handler on one Spark partition, in order, with the pod's retry/DLQ policy.

Spark hands ``mapInPandas`` the rows of one Spark partition, sorted by (route, topic, partition,
offset). ``ApplyHandler`` walks them one by one: a message is finished (handled or dead-lettered)
before the next one starts, so messages with the same key run in offset order. Each message gets
the same ``RetryPolicy`` as in a pod; the difference is that a retry waits in place (a batch job
has no other lanes to run meanwhile), and ``block`` after the last attempt fails the job, because
a batch cannot park a key: nothing is committed and the live pods take the key over.

A built-in check stops the job (before calling the handler) if a row arrives out of (route, topic,
partition, offset) order; the per-partition counts come back to the driver, which audits them
before committing anything.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas

from keyorder.catchup.plan import COUNTS, PartitionCounts
from keyorder.dead_letters import DeadLetterSink, KafkaDeadLetterSink
from keyorder.handlers import load_handler
from keyorder.message import Message
from keyorder.retry import ExhaustedPolicy, RetryPolicy, Verdict
from keyorder.workers import call_sync_handler

SUMMARY_SCHEMA = "topic string, partition int, " + ", ".join(f"{name} long" for name in COUNTS)
log = logging.getLogger(__name__)


class OrderViolation(RuntimeError):
    """A row arrived out of (route, topic, partition, offset) order: stop before handling it."""


class KeyBlocked(RuntimeError):
    """A message failed every attempt under ``on-exhausted=block``: the job stops without committing."""


def handle_with_retry(call: Callable[[Message], Any], message: Message, policy: RetryPolicy,
                      dead_letters: DeadLetterSink | None, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Run ``call`` until it succeeds (returns False) or the message is dead-lettered (returns True)."""
    failures = 0
    while True:
        try:
            call(message)
            return False
        except Exception as error:
            failures += 1
            verdict, delay = policy.after_failure(failures)
            if verdict is Verdict.RETRY:
                log.warning("%s[%d]@%d failed (attempt %d of %d), retrying in %.2fs: %s", message.topic,
                            message.partition, message.offset, failures, policy.max_attempts, delay, error)
                sleep(delay)
                continue
            if verdict is Verdict.DEAD_LETTER and dead_letters is not None:
                dead_letters.publish(message, error, failures)
                return True
            raise KeyBlocked(f"{message.topic}[{message.partition}]@{message.offset} failed {failures} times and "
                             f"on-exhausted is block: stopping without committing; last error: "
                             f"{type(error).__name__}: {error}") from error


class LazyDeadLetters:
    """Creates the dead-letter producer on the first dead letter: most tasks never need one."""

    def __init__(self, producer_properties: dict[str, str], topic_template: str) -> None:
        self._properties = producer_properties
        self._template = topic_template
        self._sink: KafkaDeadLetterSink | None = None

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        if self._sink is None:
            self._sink = KafkaDeadLetterSink(self._properties, self._template)
        self._sink.publish(message, error, attempts)

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()


@dataclass
class OrderCheck:
    """Counts rows that are not strictly after the previous one in (route, topic, partition, offset)."""

    previous: tuple | None = None
    violations: int = 0

    @property
    def previous_ok(self) -> str:
        return "the start" if self.previous is None else f"{self.previous[1]}[{self.previous[2]}]@{self.previous[3]}"

    def check(self, position: tuple) -> bool:
        ok = self.previous is None or position > self.previous
        if not ok:
            self.violations += 1
        else:
            self.previous = position
        return ok


def _headers(value: Any) -> tuple[tuple[str, bytes | None], ...]:
    if _missing(value):
        return ()
    result = []
    for item in value:
        if isinstance(item, dict):
            result.append((item["name"], item["value"]))
        else:
            result.append((item[0], item[1]))
    return tuple(result)


def _missing(value: Any) -> bool:
    """Null as pandas hands it over: None, NaN (float columns) or pandas.NA (nullable integer columns)."""
    return value is None or value is pandas.NA or (isinstance(value, float) and math.isnan(value))


@dataclass
class ApplyHandler:
    """The ``mapInPandas`` function (picklable: Spark ships it to the executors)."""

    handler: str
    policy: RetryPolicy
    dlq_topic: str
    producer_properties: dict[str, str] = field(default_factory=dict)
    progress: Any = None
    """A Spark accumulator of ``{(topic, partition): finished}``, or None."""

    def __call__(self, frames: Iterator[Any]) -> Iterator[Any]:
        loaded = load_handler(self.handler)
        loop = asyncio.new_event_loop() if loaded.is_async else None
        if loop is not None:
            def call(message: Message) -> None:
                loop.run_until_complete(loaded.function(message))
        else:
            def call(message: Message) -> None:
                call_sync_handler(loaded.function, message)
        sink = LazyDeadLetters(self.producer_properties, self.dlq_topic) \
            if self.policy.exhausted is ExhaustedPolicy.DLQ else None
        counts: dict[tuple[str, int], PartitionCounts] = {}
        order = OrderCheck()
        try:
            for frame in frames:
                finished: dict[tuple[str, int], int] = {}
                for row in frame.itertuples(index=False):
                    source = (row.topic, int(row.partition))
                    entry = counts.setdefault(source, PartitionCounts())
                    if not _missing(row.marker_read):
                        entry.read += int(row.marker_read)
                        entry.splits += 1
                        continue
                    if not order.check((bytes(row.route), row.topic, int(row.partition), int(row.offset))):
                        raise OrderViolation(f"{row.topic}[{row.partition}]@{row.offset} arrived after "
                                             f"{order.previous_ok}: the job stops before handling it out of order")
                    message = Message(topic=row.topic, partition=int(row.partition), offset=int(row.offset),
                                      key=None if _missing(row.key) else bytes(row.key),
                                      value=None if _missing(row.value) else bytes(row.value),
                                      headers=_headers(row.headers),
                                      timestamp=None if _missing(row.timestamp) else float(row.timestamp))
                    if handle_with_retry(call, message, self.policy, sink):
                        entry.dead_lettered += 1
                    else:
                        entry.processed += 1
                    finished[source] = finished.get(source, 0) + 1
                if self.progress is not None and finished:
                    self.progress.add(finished)
        finally:
            if sink is not None:
                sink.close()
            if loop is not None:
                loop.close()
        rows = [{"topic": topic, "partition": partition, **asdict(partition_counts)}
                for (topic, partition), partition_counts in sorted(counts.items())]
        columns = {"topic": "object", "partition": "int32", **dict.fromkeys(COUNTS, "int64")}
        yield pandas.DataFrame(rows, columns=list(columns)).astype(columns)
