"""Calling the user's handler on one Spark partition, in order, with the pod's retry/DLQ policy.

Spark hands ``mapInArrow`` the rows of one Spark partition with every source partition's offsets
increasing (sorted by ``(progress, source, offset)`` after the shuffle, or as the by-partition
reader interleaves them), the partitions and keys interleaved as in a pod's poll batches.
``TaskRunner`` runs them like a pod does: each message joins its *lane* (its route: the key within
its partition, or the partition; ``datasource.route_of``) in the pod's own ``LaneScheduler``; up
to ``task_workers`` threads take any ready lane, run its head message and put the lane back. So a
key's messages of one partition run one at a time in offset order, any free thread takes any
ready key, and a hot key occupies one thread while every other key passes it: there is no batch
barrier. The feeder reads ahead at most ``lookahead`` messages and ``lookahead_bytes`` of them
(backpressure into Spark's Arrow stream), and turns an Arrow input batch into Python objects a
slice at a time (``batch_slices``, ``SLICE_BYTES``), as the look-ahead admits them: a task's memory
is the look-ahead, one Arrow batch and one slice (``memory``; docs/catchup.md, Memory).

A failed attempt *parks* its lane until the retry's due time, holding no thread, exactly as in a
pod; after the last attempt the message is dead-lettered (with the run id and wave as
provenance headers) or, under ``block``, the task fails, because a batch job cannot park a key
forever: nothing of the wave is committed and the live pods take the key over. A dead-letter
write that fails is retried as a pod retries it (the lane stays parked, only the write is
repeated, not the handler), with a growing pause, for up to ``DEAD_LETTER_TIMEOUT`` seconds;
then the task fails (a pod would go on retrying, a batch job must end).

A built-in check stops the task (before calling the handler) if a row of a source partition
arrives at or below that partition's previous offset; the per-partition counts come back to the
driver, which audits them before committing anything.

Why one room of over 600 lines: ``TaskRunner`` is the pod's lane discipline inside a Spark task (the
feeder's look-ahead, the lane scheduler, the worker threads, parking and retries) and ``ApplyHandler``
is the ``mapInArrow`` function that drives it; they share the task's memory budget and its ordering
argument, which are stated once, above. The feeder (``batch_slices``) is the seam for a later split; the
fence's checks are being added here this session (issue 38).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import partial
from typing import Any

import pandas

from keyorder.adapters.dead_letters import KafkaDeadLetterSink
from keyorder.adapters.handlers import HandlerLoadError, LoadedHandler, load_for_catchup
from keyorder.catchup import shipped
from keyorder.catchup.datasource import route_of
from keyorder.catchup.live import REPORT_INTERVAL, TaskReporter, WaveAttempt
from keyorder.catchup.memory import SLICE_BYTES
from keyorder.catchup.plan import COUNTS, PartitionCounts
from keyorder.catchup.settings import TASK_LOOKAHEAD_MB
from keyorder.contracts import DeadLetterError, DeadLetterSink
from keyorder.core.concurrency import ThreadLimit
from keyorder.core.errors import error_text
from keyorder.core.lanes import Delivery, LaneScheduler
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy, Verdict
from keyorder.engine.worker_pools import (
    NO_HOOKS,
    Lifecycle,
    call_sync_handler,
    is_async_callable,
    run_async_hook,
    run_sync_hook,
)
from keyorder.message import Message

SUMMARY_SCHEMA = (
    "topic string, partition int, "
    + ", ".join(f"{name} long" for name in COUNTS)
    + ", task int, attempt int, threads int, dead_letter_offsets array<long>"
)
log = logging.getLogger(__name__)


class OrderViolation(RuntimeError):
    """A row arrived at or below its partition's previous offset: stop before handling it."""


class KeyBlocked(RuntimeError):
    """A message failed every attempt under ``on-exhausted=block``: the job stops without committing."""


class AttemptClosed(RuntimeError):
    """The driver closed the task's wave attempt (``live``): the task calls the handler no more."""


class TaskFailure(Enum):
    """Why a task failed, as the task itself classifies it (``TaskFailed``): the driver decides on this,
    never on the text of the error (a handler's message may hold any line)."""

    KEY_BLOCKED = "key-blocked"
    ORDER_VIOLATION = "order-violation"
    ATTEMPT_CLOSED = "attempt-closed"
    """The task stopped because the driver closed its wave attempt (``AttemptClosed``)."""
    HANDLER_NOT_LOADED = "handler-not-loaded"
    """The executor could not load the handler or its hooks (``HandlerLoadError``): every task of the wave will
    meet it again."""
    OTHER = "other"
    """Anything else the task raised: Kafka, a dead-letter write that kept failing."""

    @classmethod
    def of(cls, error: BaseException) -> TaskFailure:
        if isinstance(error, KeyBlocked):
            return cls.KEY_BLOCKED
        if isinstance(error, OrderViolation):
            return cls.ORDER_VIOLATION
        if isinstance(error, AttemptClosed):
            return cls.ATTEMPT_CLOSED
        if isinstance(error, HandlerLoadError):
            return cls.HANDLER_NOT_LOADED
        return cls.OTHER


FAILURE_MARKER = "keyorder-catchup-task-failed"
_FAILURE_LINE = re.compile(FAILURE_MARKER + r" (?P<token>[0-9a-f]{32}) (?P<kind>[a-z-]+): (?P<summary>[^\n]*)")


class TaskFailed(RuntimeError):
    """What a failed task raises to Spark. Its message starts with a typed marker line,
    ``keyorder-catchup-task-failed <token> <kind>: <Type>: <first line of the error>``, that survives
    Spark's wrapping of the Python traceback (``PythonException`` carries the whole traceback text) and
    that a handler cannot write by mistake: ``token`` is the wave attempt's own (``ApplyHandler``)."""

    @classmethod
    def of(cls, error: BaseException, token: str) -> TaskFailed:
        text = error_text(error)
        first = text.splitlines()[0] if text else ""
        return cls(f"{FAILURE_MARKER} {token} {TaskFailure.of(error).value}: {type(error).__name__}: {first}\n{text}")


def read_task_failure(text: str, token: str) -> tuple[TaskFailure, str] | None:
    """The kind and the one-line summary of the ``TaskFailed`` of the wave attempt with ``token`` in a
    Spark job's error text, or None when no task of it said why it failed (a crashed Python worker, a lost
    executor, a reader task's error) (pure)."""
    for match in _FAILURE_LINE.finditer(text):
        if match.group("token") == token:
            return TaskFailure(match.group("kind")), match.group("summary").strip()
    return None


class LazyDeadLetters:
    """Creates the dead-letter producer on the first dead letter: most tasks never need one."""

    def __init__(self, producer_properties: Callable[[], dict[str, str]], topic_template: str) -> None:
        self._properties = producer_properties
        """Called once, for the first dead letter: reads the shipped properties on the executor."""
        self._template = topic_template
        self._sink: KafkaDeadLetterSink | None = None
        self._lock = threading.Lock()

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        with self._lock:
            if self._sink is None:
                self._sink = KafkaDeadLetterSink(self._properties(), self._template)
        self._sink.publish(message, error, attempts)

    def close(self) -> None:
        if self._sink is not None:
            self._sink.close()


def _headers(value: list[dict[str, Any]] | None) -> tuple[tuple[str, bytes | None], ...]:
    """The headers column's value (Arrow hands a struct over as a dict) as a message's headers."""
    return () if value is None else tuple((item["name"], item["value"]) for item in value)


_DELIVERY_COLUMNS = ("source", "offset", "key", "value", "headers", "timestamp", "marker_read", "marker_skipped")


def as_arrow(batch: Any) -> Any:
    """An Arrow record batch as it is; a pandas frame (the unit tests' batches) converted to one."""
    import pyarrow

    if isinstance(batch, pandas.DataFrame):
        return pyarrow.RecordBatch.from_pandas(batch, preserve_index=False)
    return batch


def arrow_columns(batch: Any, names: tuple[str, ...]) -> list[list[Any]]:
    """The named columns of an Arrow record batch as Python lists (nulls as None)."""
    batch = as_arrow(batch)
    return [batch.column(name).to_pylist() for name in names]


def batch_slices(batch: Any, max_bytes: int) -> Iterator[Any]:
    """Consecutive slices (zero-copy views) of an Arrow record batch, each with at most ``max_bytes`` of
    keys and values plus ``MESSAGE_OVERHEAD`` a row, and at least one row: what the feeder turns into
    Python objects at once."""
    import pyarrow
    import pyarrow.compute as compute

    rows = batch.num_rows

    def lengths(name: str) -> Any:
        column = batch.column(name)
        if column.type == pyarrow.null():  # an all-null column (markers only) of a pandas frame
            return pyarrow.array([0] * rows, pyarrow.int64())
        return compute.fill_null(compute.binary_length(column), 0)

    sizes = compute.add(lengths("key"), lengths("value")).to_pylist()
    start = held = 0
    for row, size in enumerate(sizes):
        if held and held + size + MESSAGE_OVERHEAD > max_bytes:
            yield batch.slice(start, row - start)
            start, held = row, 0
        held += size + MESSAGE_OVERHEAD
    if start < rows:
        yield batch.slice(start, rows - start)


@dataclass(frozen=True)
class TaskCaller:
    """How a task's threads call the handler (``thread_safe_caller``): ``call`` a message; ``prepare_thread``
    before a thread's first call and ``release_thread`` after its last, on that thread (``TaskRunner._worker``
    releases in a ``finally`` every thread it prepared, so nothing is left for the task to close)."""

    call: Callable[[Message], None]
    prepare_thread: Callable[[], None] = lambda: None
    release_thread: Callable[[], None] = lambda: None


def thread_safe_caller(loaded: LoadedHandler, loop_hooks: Lifecycle = NO_HOOKS) -> TaskCaller:
    """A plain handler is called directly. An ``async def`` one runs on an event loop of the calling thread's
    own, made by ``prepare_thread``, which runs ``loop_hooks``' set-up on it (an ``async def`` hook's resources
    belong to the loop that runs the handler, as on a pod's asyncio workers); ``release_thread`` runs their
    tear-down on it, on the same thread (an error logged), and closes it. Plain hooks are the task's, run once
    around it by ``ApplyHandler`` (``split_hooks``)."""
    if not loaded.is_async:
        return TaskCaller(lambda message: call_sync_handler(loaded.function, message))
    local = threading.local()

    def prepare_thread() -> None:
        if hasattr(local, "loop"):
            return
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(run_async_hook(loop_hooks.setup))
        except BaseException:
            loop.close()  # no tear-down after a set-up that failed, as on a pod
            raise
        local.loop = loop

    def call(message: Message) -> None:
        local.loop.run_until_complete(loaded.function(message))

    def release_thread() -> None:
        loop = getattr(local, "loop", None)
        if loop is None:
            return
        try:
            loop.run_until_complete(run_async_hook(loop_hooks.teardown))
        except (Exception, asyncio.CancelledError):
            log.exception("the tear-down hook failed on a task thread's event loop")
        finally:
            del local.loop
            loop.close()

    return TaskCaller(call, prepare_thread, release_thread)


def split_hooks(lifecycle: Lifecycle) -> tuple[Lifecycle, Lifecycle]:
    """``(task's, each loop's)``: plain hooks run once per task whatever the handler (a global client made once,
    closed once), ``async def`` ones on each task thread's loop (they come only with an async handler:
    ``load_lifecycle``)."""

    def of_kind(is_async: bool) -> Lifecycle:
        kept = [
            hook if hook is not None and is_async_callable(hook) == is_async else None
            for hook in (lifecycle.setup, lifecycle.teardown)
        ]
        return Lifecycle(*kept)

    return of_kind(False), of_kind(True)


Source = tuple[str, int]
HEADER_RUN = "keyorder.catchup.run"
HEADER_WAVE = "keyorder.catchup.wave"
LOOKAHEAD_BYTES = TASK_LOOKAHEAD_MB << 20
"""Estimated memory of the messages a task holds at most (``--task-lookahead-mb``'s default)."""
MESSAGE_OVERHEAD = 600
"""Bytes a held message costs besides its key, value and headers: the ``Message`` and ``Delivery``
objects, the bytes objects' headers and the lane's queue entry (measured with tracemalloc, rounded up)."""
REFILL = 0.75
"""A full task's feeder goes on once the task holds no more than this share of both look-ahead bounds."""


def footprint(message: Message) -> int:
    """A held message's estimated memory in the Python worker."""
    size = MESSAGE_OVERHEAD + len(message.key or b"") + len(message.value or b"")
    for name, value in message.headers:
        size += len(name) + len(value or b"")
    return size


DEAD_LETTER_REFS = 1_000
"""Most dead-lettered offsets a task reports per source partition (the count is always exact)."""
DEAD_LETTER_TIMEOUT = 300.0
"""Seconds a message's dead-letter write is retried after its first failure before the task fails."""


def with_provenance(message: Message, run_id: str, wave: int) -> Message:
    """The message as dead-lettered by a catch-up: its headers plus the run and the wave, so a rerun's
    duplicate dead letters (same original offset, another run) can be told apart."""
    headers = (*message.headers, (HEADER_RUN, run_id.encode()), (HEADER_WAVE, str(wave).encode()))
    return dataclasses.replace(message, headers=headers)


def _task_attempt() -> tuple[int, int]:
    """Spark's (partition id, attempt number) of the running task ((0, 0) outside Spark). With
    ``spark.task.maxFailures=1`` the attempt is above 0 only after an executor was lost."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except ImportError:  # pyspark missing (unit tests without Spark)
        return 0, 0
    return (context.partitionId(), context.attemptNumber()) if context is not None else (0, 0)


class TaskRunner:
    """One Spark task's handler loop: a feeder (the calling thread) and ``workers`` handler threads.

    Threading: ``_lock`` guards the scheduler, the counts, the held bytes, ``_error`` and
    ``_input_done``. Handlers run outside it, and a worker takes it once per message: it records the
    outcome of its last message and takes the next one in the same hold, because with a CPU-bound
    handler every acquisition is a chance to queue behind a thread that lost the GIL while holding it.
    Workers wait on ``_work`` for a ready lane (with a timeout at the next parked lane's due time).

    The look-ahead is bounded twice, by messages (``lookahead``) and by their estimated memory
    (``lookahead_bytes``, ``footprint``), so large values cannot exhaust the Python worker. A full
    task's feeder waits on ``_space`` until the task is back at the low-water mark (``REFILL`` of both
    bounds) and then adds a whole chunk: woken for every finished message, it would take the lock and
    the GIL once per message for one delivery each time.
    """

    def __init__(
        self,
        call: Callable[[Message], Any],
        policy: RetryPolicy,
        dead_letters: DeadLetterSink | None,
        sources: list[Source],
        ordering: str,
        workers: int,
        lookahead: int,
        run_id: str = "",
        wave: int = 0,
        clock: Callable[[], float] = time.monotonic,
        dead_letter_timeout: float = DEAD_LETTER_TIMEOUT,
        lookahead_bytes: int = LOOKAHEAD_BYTES,
        cpu_clock: Callable[[], float] = time.process_time,
        report: Callable[[int], None] | None = None,
        report_interval: float = REPORT_INTERVAL,
        fence: Callable[[], str | None] | None = None,
        slice_bytes: int = SLICE_BYTES,
        prepare_thread: Callable[[], None] = lambda: None,
        release_thread: Callable[[], None] = lambda: None,
    ) -> None:
        self.call = call
        self.prepare_thread = prepare_thread
        """Run by each handler thread before its first attempt; an error fails the task (not a message)."""
        self.release_thread = release_thread
        """Run by each handler thread that was prepared, as it ends."""
        self.policy = policy
        self.dead_letters = dead_letters
        self.sources = sources
        self.ordering = ordering
        self.workers = max(workers, 1)
        self.lookahead = max(lookahead, 1)
        self.lookahead_bytes = max(lookahead_bytes, 1)
        self.slice_bytes = max(slice_bytes, 1)
        self.run_id = run_id
        self.wave = wave
        self.clock = clock
        self.cpu_clock = cpu_clock
        """The process's CPU seconds (``ThreadLimit`` compares them with ``clock``)."""
        self.dead_letter_timeout = dead_letter_timeout
        # (source, offset) -> (first failed write, failed writes) of a message whose dead letter is pending;
        # only the worker running the message's lane touches its entry (a lane runs on one thread at a time)
        self._dead_letter_failures: dict[tuple[int, int], tuple[float, int]] = {}
        self.counts: dict[int, PartitionCounts] = {}
        self.dead_letter_offsets: dict[int, list[int]] = {}
        self._scheduler = LaneScheduler(continue_first=True)  # a hot key's thread goes on with it
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._space = threading.Condition(self._lock)
        self._error: BaseException | None = None
        self._input_done = False
        self._held_bytes = 0
        self._feeder_waiting = False
        self._threads = ThreadLimit(self.workers)
        """How many of the workers may run a handler at once (fewer when the handler keeps the GIL busy)."""
        self._active = 0
        self._last_offset: dict[int, int] = {}
        self.report = report
        """Called with the task's handled count about every ``report_interval`` seconds and once at the end
        (``live.TaskReporter``: the driver's progress line while the task runs)."""
        self.report_interval = report_interval
        self.fence = fence
        """Asked before every handler call: why the task must call the handler no more (its wave attempt was
        closed: ``live.TaskReporter.fenced``), or None."""

    # -- the feeder (Spark's iterator of Arrow batches, on the calling thread) ------------------------
    def run(self, frames: Iterator[Any]) -> None:
        if self.report is not None:  # before the first handler call: the driver knows of this copy, and it
            self.report(self.handled())  # has its fence (an answer) from the start
        threads = [
            threading.Thread(target=self._worker, name=f"keyorder-catchup-{index}", daemon=True)
            for index in range(self.workers)
        ]
        for thread in threads:
            thread.start()
        finished = threading.Event()
        reporter = None
        if self.report is not None:
            reporter = threading.Thread(
                target=self._report_until, args=(finished,), name="keyorder-catchup-report", daemon=True
            )
            reporter.start()
        try:
            frames = iter(frames)
            while self._error is None:
                frame = next(frames, None)
                if frame is None:
                    break
                self._feed(as_arrow(frame))
                del frame  # before the next batch is read: the task holds one input batch at a time
        except BaseException as error:
            with self._lock:
                if self._error is None:
                    self._error = error
                self._work.notify_all()
        finally:
            with self._lock:
                self._input_done = True
                self._work.notify_all()
            for thread in threads:
                thread.join()
            finished.set()
            if reporter is not None:
                reporter.join()
        if self._error is not None:
            raise self._error

    def _feed(self, batch: Any) -> None:
        """Admit one input batch's messages, a slice at a time: a slice is turned into messages (and checked
        whole before any of it is handled) only when the look-ahead has room for more."""
        for piece in batch_slices(batch, self.slice_bytes):
            deliveries = self._deliveries(piece)
            while deliveries:
                with self._lock:
                    if self._full():
                        self._feeder_waiting = True
                        while self._error is None and not self._at_low_water():
                            self._space.wait()
                        self._feeder_waiting = False
                    if self._error is not None:
                        return
                    chunk, deliveries = self._admit(deliveries)
                    woken = self._scheduler.add(chunk)
                    if woken:
                        self._work.notify(woken)

    def handled(self) -> int:
        """Messages handled or dead-lettered so far."""
        with self._lock:
            return sum(counts.handled for counts in self.counts.values())

    def _report_until(self, finished: threading.Event) -> None:
        assert self.report is not None
        while not finished.wait(self.report_interval):
            self.report(self.handled())
        self.report(self.handled())

    @property
    def thread_limit(self) -> int:
        """How many handler threads the task ran at once when it ended (``ThreadLimit``)."""
        return self._threads.limit

    def _full(self) -> bool:
        return len(self._scheduler) >= self.lookahead or self._held_bytes >= self.lookahead_bytes

    def _at_low_water(self) -> bool:
        return len(self._scheduler) <= self.lookahead * REFILL and self._held_bytes <= self.lookahead_bytes * REFILL

    def _admit(self, deliveries: list[Delivery]) -> tuple[list[Delivery], list[Delivery]]:
        """``(admitted, the rest)``: a prefix that fits both bounds; at least one message when the task holds
        none, so a message larger than ``lookahead_bytes`` still runs (alone)."""
        room = self.lookahead - len(self._scheduler)
        held, count = self._held_bytes, 0
        for delivery in deliveries[: max(room, 1)]:
            if held >= self.lookahead_bytes and (count or len(self._scheduler)):
                break
            held += footprint(delivery.message)
            count += 1
        self._held_bytes = held
        return deliveries[:count], deliveries[count:]

    def _deliveries(self, batch: Any) -> list[Delivery]:
        """One slice of an Arrow record batch as deliveries, read column by column (``to_pylist`` builds the Python
        values in C; row by row through pandas cost several microseconds a message)."""
        columns = arrow_columns(batch, _DELIVERY_COLUMNS)
        deliveries = []
        sources, ordering, last_offset = self.sources, self.ordering, self._last_offset
        for source, offset, key, value, headers, timestamp, marker_read, marker_skipped in zip(*columns, strict=True):
            if marker_read is not None:
                with self._lock:  # the workers update the same counts
                    entry = self.counts.setdefault(source, PartitionCounts())
                    entry.read += marker_read
                    entry.skipped += marker_skipped or 0
                    entry.splits += 1
                continue
            topic, partition = sources[source]
            previous = last_offset.get(source)
            if previous is not None and offset <= previous:
                with self._lock:
                    self.counts.setdefault(source, PartitionCounts()).violations += 1
                raise OrderViolation(
                    f"{topic}[{partition}]@{offset} arrived after {topic}[{partition}]@{previous}: "
                    "the job stops before handling it out of order"
                )
            last_offset[source] = offset
            message = Message(
                topic=topic,
                partition=partition,
                offset=offset,
                key=key,
                value=value,
                headers=_headers(headers),
                timestamp=timestamp,
            )
            deliveries.append(Delivery(message, route_of(ordering, topic, partition, key), source, 0.0))
        return deliveries

    # -- the handler threads ------------------------------------------------------------------------
    def _worker(self) -> None:
        prepared = [False]  # set once this thread ran ``prepare_thread``: it then releases what it made
        try:
            self._work_on(prepared)
        finally:
            if prepared[0]:
                self.release_thread()

    def _work_on(self, prepared: list[bool]) -> None:
        scheduler = self._scheduler
        done: tuple[Delivery, str, float] | None = None
        while True:
            with self._lock:
                if done is not None:
                    self._record(*done)
                    done = None
                while True:
                    if self._error is not None:
                        return
                    taken = scheduler.take(self.clock()) if self._active < self._threads.limit else None
                    if taken:
                        self._active += 1
                        break
                    if self._input_done and not len(scheduler):
                        self._work.notify_all()
                        return
                    self._work.wait(scheduler.seconds_until_due(self.clock()))
            delivery = taken[0]
            try:
                if not prepared[0]:  # outside the attempt: a set-up that fails fails the task, no message
                    self.prepare_thread()
                    prepared[0] = True
                outcome, delay = self._attempt(delivery)
            except BaseException as error:
                with self._lock:
                    if self._error is None:
                        self._error = error
                    self._work.notify_all()
                    self._space.notify_all()
                return
            done = (delivery, outcome, delay)

    def _record(self, delivery: Delivery, outcome: str, delay: float) -> None:
        """A worker's last attempt, under ``_lock``: park the lane for its retry, or count the message
        and let the next one of its lane (and the feeder, at the low-water mark) go on."""
        scheduler = self._scheduler
        self._active -= 1
        before = self._threads.limit
        if self._threads.update(self.clock(), self.cpu_clock(), scheduler.ready) > before:
            self._work.notify(self._threads.limit - before)
        if outcome == "retry":
            scheduler.park(delivery, self.clock() + delay)
            return
        scheduler.finished(delivery)
        self._held_bytes -= footprint(delivery.message)
        entry = self.counts.setdefault(delivery.partition, PartitionCounts())
        if outcome == "dead_lettered":
            entry.dead_lettered += 1
            refs = self.dead_letter_offsets.setdefault(delivery.partition, [])
            if len(refs) < DEAD_LETTER_REFS:
                refs.append(delivery.message.offset)
        else:
            entry.processed += 1
        if self._feeder_waiting and self._at_low_water():
            self._space.notify()
        if self._input_done and not len(scheduler):
            self._work.notify_all()

    def _attempt(self, delivery: Delivery) -> tuple[str, float]:
        """One handler attempt: ``("processed" | "dead_lettered" | "retry", retry delay)``."""
        message = delivery.message
        stop = self.fence() if self.fence is not None else None
        if stop is not None:
            raise AttemptClosed(
                f"{message.topic}[{message.partition}]@{message.offset} not handled: {stop}; the task stops"
            )
        if delivery.pending_dead_letter is not None:  # the handler gave up; only the write is retried
            return self._dead_letter(delivery, delivery.pending_dead_letter)
        try:
            self.call(message)
            return "processed", 0.0
        except Exception as error:
            delivery.attempts += 1
            verdict, delay = self.policy.after_failure(delivery.attempts)
            if verdict is Verdict.RETRY:
                log.warning(
                    "%s[%d]@%d failed (attempt %d of %d), retrying in %.2fs: %s",
                    message.topic,
                    message.partition,
                    message.offset,
                    delivery.attempts,
                    self.policy.max_attempts,
                    delay,
                    error,
                )
                return "retry", delay
            if verdict is Verdict.DEAD_LETTER and self.dead_letters is not None:
                return self._dead_letter(delivery, error)
            raise KeyBlocked(
                f"{message.topic}[{message.partition}]@{message.offset} failed {delivery.attempts} times and "
                f"on-exhausted is block: stopping without committing this wave; last error: "
                f"{type(error).__name__}: {error_text(error)}"
            ) from error

    def _dead_letter(self, delivery: Delivery, error: BaseException) -> tuple[str, float]:
        """Publish the dead letter; a failed write parks the lane and is retried, as in a pod (the handler is
        not run again), with a growing pause, until ``dead_letter_timeout`` after its first failure."""
        message = delivery.message
        assert self.dead_letters is not None, "dlq policy without a dead-letter sink"
        where = (delivery.partition, message.offset)
        try:
            self.dead_letters.publish(with_provenance(message, self.run_id, self.wave), error, delivery.attempts)
        except Exception as failure:  # DeadLetterError, or anything a custom sink raises
            now = self.clock()
            first, failed = self._dead_letter_failures.get(where, (now, 0))
            failed += 1
            if now - first >= self.dead_letter_timeout:
                raise DeadLetterError(
                    f"could not dead-letter {message.topic}[{message.partition}]@{message.offset}: {failed} writes "
                    f"failed in {now - first:.0f}s, the last: {type(failure).__name__}: {failure}"
                ) from failure
            self._dead_letter_failures[where] = (first, failed)
            delivery.pending_dead_letter = error
            delay = max(self.policy.backoff(failed), 0.05)  # never a busy loop, even with a zero backoff
            log.warning(
                "could not dead-letter %s[%d]@%d (write %d failed), keeping its key parked and retrying the write "
                "in %.2fs: %s",
                message.topic,
                message.partition,
                message.offset,
                failed,
                delay,
                failure,
            )
            return "retry", delay
        self._dead_letter_failures.pop(where, None)
        delivery.pending_dead_letter = None
        return "dead_lettered", 0.0


def summary_batch(rows: list[dict[str, Any]]) -> Any:
    """The task's summary rows as an Arrow record batch of ``SUMMARY_SCHEMA``."""
    import pyarrow

    schema = pyarrow.schema(
        [
            ("topic", pyarrow.string()),
            ("partition", pyarrow.int32()),
            *[(name, pyarrow.int64()) for name in COUNTS],
            ("task", pyarrow.int32()),
            ("attempt", pyarrow.int32()),
            ("threads", pyarrow.int32()),
            ("dead_letter_offsets", pyarrow.list_(pyarrow.int64())),
        ]
    )
    return pyarrow.RecordBatch.from_pylist(rows, schema=schema)


def _tear_down(teardown: Callable[[], Any] | None) -> None:
    """A task's tear-down, after its last message or its failure: an error is logged, as a pod's is, and fails
    nothing (the messages were handled; a failed task's own error is the one the driver reads: a tear-down
    error must not turn a blocked key, which is not retried, into a wave that is, nor fail a wave that
    succeeded, which would then run again)."""
    try:
        run_sync_hook(teardown)
    except (Exception, asyncio.CancelledError):
        log.exception("the tear-down hook failed")


@dataclass
class ApplyHandler:
    """The ``mapInArrow`` function (picklable: Spark ships it to the executors): one ``TaskRunner``
    per Spark task, then one summary row per source partition the task saw."""

    handler: str
    policy: RetryPolicy
    dlq_topic: str
    sources: list[Source] = field(default_factory=list)
    """The plan's partitions: rows carry their index (``source``), not the topic name."""
    ordering: str = "key"
    properties_file: str = ""
    """The run's shipped Kafka properties (``shipped``), read for the first dead letter: the dead-letter
    producer's properties stay out of this function's pickle, which Spark sends with every task."""
    progress: Any = None
    """A Spark accumulator of ``{(topic, partition): finished}``, or None."""
    task_workers: int = 1
    """Threads per Spark task: distinct routes run in parallel, a route's messages one at a time."""
    lookahead: int = 100_000
    """Messages a task holds at most (queued, parked or running)."""
    lookahead_bytes: int = LOOKAHEAD_BYTES
    """Their estimated memory at most (``footprint``)."""
    run_id: str = ""
    wave: int = 0
    wave_attempt: int = 1
    live_address: tuple[str, int] | None = None
    """Where the driver's ``live.ProgressListener`` takes the running task's handled counts, or None."""
    failure_token: str = "0" * 32
    """The wave attempt's own token (32 hex digits) in the marker of a failed task's ``TaskFailed``."""
    setup: str | None = None
    """``--handler-setup``: run once per task before its first message (an ``async def`` handler's: once per
    task thread, on the thread's event loop, before its first message)."""
    teardown: str | None = None
    """``--handler-teardown``: run once per task (or task thread's loop) after its last message, also when the
    task failed; an error is logged."""

    def __call__(self, frames: Iterator[Any]) -> Iterator[Any]:
        task, attempt = _task_attempt()
        try:  # a handler the executor cannot load, or a set-up that fails: the task fails before any message
            loaded, lifecycle = load_for_catchup(self.handler, self.setup, self.teardown)
            task_hooks, loop_hooks = split_hooks(lifecycle)
            run_sync_hook(task_hooks.setup)  # once per task, before the driver's clock (the reporter) starts
        except Exception as error:
            raise TaskFailed.of(error, self.failure_token) from error
        caller = thread_safe_caller(loaded, loop_hooks)
        sink = (
            LazyDeadLetters(partial(shipped.load, self.properties_file, shipped.PRODUCER), self.dlq_topic)
            if self.policy.exhausted is ExhaustedPolicy.DLQ
            else None
        )
        reporter = (
            TaskReporter(self.live_address, WaveAttempt(self.run_id, self.wave, self.wave_attempt), task, attempt)
            if self.live_address is not None
            else None
        )
        runner = TaskRunner(
            caller.call,
            self.policy,
            sink,
            self.sources,
            self.ordering,
            self.task_workers,
            self.lookahead,
            self.run_id,
            self.wave,
            lookahead_bytes=self.lookahead_bytes,
            report=reporter,
            fence=reporter.fenced if reporter is not None else None,
            prepare_thread=caller.prepare_thread,
            release_thread=caller.release_thread,
        )
        try:
            runner.run(frames)
        except (Exception, asyncio.CancelledError) as error:  # typed for the driver's retry decision
            raise TaskFailed.of(error, self.failure_token) from error
        finally:
            if sink is not None:
                sink.close()
            if reporter is not None:
                reporter(runner.handled(), ended=True)  # the driver waits for it before the next attempt
                reporter.close()
            _tear_down(task_hooks.teardown)
        if self.progress is not None:
            finished = {
                self.sources[source]: counts.handled for source, counts in runner.counts.items() if counts.handled
            }
            if finished:
                self.progress.add(finished)
        rows = [
            {
                "topic": self.sources[source][0],
                "partition": self.sources[source][1],
                **asdict(counts),
                "task": task,
                "attempt": attempt,
                "threads": runner.thread_limit,
                "dead_letter_offsets": runner.dead_letter_offsets.get(source, []),
            }
            for source, counts in sorted(runner.counts.items())
        ]
        yield summary_batch(rows)
