"""Calling the user's handler on one Spark partition, in order, with the pod's retry/DLQ policy.

Spark hands ``mapInPandas`` the rows of one Spark partition, sorted by (route, topic, partition,
offset). ``ApplyHandler`` cuts each batch into runs of one route; a run's messages are handled one
after another (a message is finished, handled or dead-lettered, before the next starts), so
messages with the same key run in offset order, while up to ``task_workers`` runs proceed at
once. Each message gets the same ``RetryPolicy`` as in a pod: a retry waits on its route's
thread, and ``block`` after the last attempt fails the job, because a batch cannot park a key:
nothing is committed and the live pods take the key over.

A built-in check stops the job (before calling the handler) if a row arrives out of (route, topic,
partition, offset) order; the per-partition counts come back to the driver, which audits them
before committing anything.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas

from keyorder.adapters.dead_letters import KafkaDeadLetterSink
from keyorder.adapters.handlers import LoadedHandler, load_handler
from keyorder.catchup.plan import COUNTS, PartitionCounts
from keyorder.contracts import DeadLetterSink
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy, Verdict
from keyorder.message import Message
from keyorder.workers import call_sync_handler

SUMMARY_SCHEMA = "topic string, partition int, " + ", ".join(f"{name} long" for name in COUNTS)
log = logging.getLogger(__name__)


class OrderViolation(RuntimeError):
    """A row arrived out of (route, topic, partition, offset) order: stop before handling it."""


class KeyBlocked(RuntimeError):
    """A message failed every attempt under ``on-exhausted=block``: the job stops without committing."""


def handle_with_retry(
    call: Callable[[Message], Any],
    message: Message,
    policy: RetryPolicy,
    dead_letters: DeadLetterSink | None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
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
                log.warning(
                    "%s[%d]@%d failed (attempt %d of %d), retrying in %.2fs: %s",
                    message.topic,
                    message.partition,
                    message.offset,
                    failures,
                    policy.max_attempts,
                    delay,
                    error,
                )
                sleep(delay)
                continue
            if verdict is Verdict.DEAD_LETTER and dead_letters is not None:
                dead_letters.publish(message, error, failures)
                return True
            raise KeyBlocked(
                f"{message.topic}[{message.partition}]@{message.offset} failed {failures} times and "
                f"on-exhausted is block: stopping without committing; last error: "
                f"{type(error).__name__}: {error}"
            ) from error


class LazyDeadLetters:
    """Creates the dead-letter producer on the first dead letter: most tasks never need one."""

    def __init__(self, producer_properties: dict[str, str], topic_template: str) -> None:
        self._properties = producer_properties
        self._template = topic_template
        self._sink: KafkaDeadLetterSink | None = None
        self._lock = threading.Lock()

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        with self._lock:
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


def split_into_runs(frame: Any, counts: dict[Source, PartitionCounts], order: OrderCheck) -> list[Run]:
    """One batch as runs of one route each, after the order check (which raises before anything runs);
    end markers are counted into ``counts`` here."""
    runs: list[Run] = []
    current_route = None
    for row in frame.itertuples(index=False):
        source = (row.topic, int(row.partition))
        if not _missing(row.marker_read):
            entry = counts.setdefault(source, PartitionCounts())
            entry.read += int(row.marker_read)
            entry.splits += 1
            continue
        route = bytes(row.route)
        if not order.check((route, row.topic, int(row.partition), int(row.offset))):
            raise OrderViolation(
                f"{row.topic}[{row.partition}]@{row.offset} arrived after {order.previous_ok}: "
                "the job stops before handling it out of order"
            )
        message = Message(
            topic=row.topic,
            partition=int(row.partition),
            offset=int(row.offset),
            key=None if _missing(row.key) else bytes(row.key),
            value=None if _missing(row.value) else bytes(row.value),
            headers=_headers(row.headers),
            timestamp=None if _missing(row.timestamp) else float(row.timestamp),
        )
        if route != current_route:
            runs.append([])
            current_route = route
        runs[-1].append((source, message))
    return runs


def _missing(value: Any) -> bool:
    """Null as pandas hands it over: None, NaN (float columns) or pandas.NA (nullable integer columns)."""
    return value is None or value is pandas.NA or (isinstance(value, float) and math.isnan(value))


def thread_safe_caller(loaded: LoadedHandler) -> tuple[Callable[[Message], None], Callable[[], None]]:
    """``(call, close)``: a plain handler is called directly; an ``async def`` one runs on an event loop
    of the calling thread's own (created once per thread, all closed by ``close``)."""
    if not loaded.is_async:
        return (lambda message: call_sync_handler(loaded.function, message)), (lambda: None)
    local, loops, lock = threading.local(), [], threading.Lock()

    def call(message: Message) -> None:
        if not hasattr(local, "loop"):
            local.loop = asyncio.new_event_loop()
            with lock:
                loops.append(local.loop)
        local.loop.run_until_complete(loaded.function(message))

    def close() -> None:
        for loop in loops:
            loop.close()

    return call, close


Source = tuple[str, int]
Run = list[tuple[Source, Message]]
"""Consecutive messages of one route in a batch: handled one after another, in this order."""


@dataclass
class ApplyHandler:
    """The ``mapInPandas`` function (picklable: Spark ships it to the executors).

    Each Arrow batch is split into runs of one route; up to ``task_workers`` runs are handled at
    once, each strictly in order. The next batch starts only when every run of this one is done,
    so a route that continues into the next batch keeps its order.
    """

    handler: str
    policy: RetryPolicy
    dlq_topic: str
    producer_properties: dict[str, str] = field(default_factory=dict)
    progress: Any = None
    """A Spark accumulator of ``{(topic, partition): finished}``, or None."""
    task_workers: int = 1
    """Threads per Spark task: distinct routes run in parallel, a route's messages one at a time."""

    def __call__(self, frames: Iterator[Any]) -> Iterator[Any]:
        call, close_loops = thread_safe_caller(load_handler(self.handler))
        sink = (
            LazyDeadLetters(self.producer_properties, self.dlq_topic)
            if self.policy.exhausted is ExhaustedPolicy.DLQ
            else None
        )
        counts: dict[Source, PartitionCounts] = {}
        order = OrderCheck()
        pool = (
            ThreadPoolExecutor(self.task_workers, thread_name_prefix="keyorder-catchup")
            if self.task_workers > 1
            else None
        )

        def handle_run(run: Run) -> list[tuple[Source, bool]]:
            return [(source, handle_with_retry(call, message, self.policy, sink)) for source, message in run]

        try:
            for frame in frames:
                runs = split_into_runs(frame, counts, order)
                finished: dict[Source, int] = {}
                for outcomes in pool.map(handle_run, runs) if pool is not None else map(handle_run, runs):
                    for source, dead_lettered in outcomes:
                        entry = counts.setdefault(source, PartitionCounts())
                        if dead_lettered:
                            entry.dead_lettered += 1
                        else:
                            entry.processed += 1
                        finished[source] = finished.get(source, 0) + 1
                if self.progress is not None and finished:
                    self.progress.add(finished)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            if sink is not None:
                sink.close()
            close_loops()
        rows = [
            {"topic": topic, "partition": partition, **asdict(partition_counts)}
            for (topic, partition), partition_counts in sorted(counts.items())
        ]
        columns = {"topic": "object", "partition": "int32", **dict.fromkeys(COUNTS, "int64")}
        yield pandas.DataFrame(rows, columns=list(columns)).astype(columns)
