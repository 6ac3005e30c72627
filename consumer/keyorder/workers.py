"""The key workers: W single-consumer FIFO queues that run the user's handler.

Two pools share one contract (``WorkerPool``) and one failure-handling core:

* ``ThreadWorkerPool`` for plain handlers: one OS thread per slot.
* ``AsyncWorkerPool`` for ``async def`` handlers: one asyncio task per slot, all on one event
  loop thread, so thousands of workers cost little for IO-bound work.

Threading contract: the poll-loop thread calls ``submit``/``resize``/``retire``/``stop``; each
worker owns its ``LaneScheduler`` and its ``WorkerStats`` (only it writes them; metrics read the
plain integers, which is safe under the GIL). Finished deliveries are handed back through the
shared ``completions`` deque (``append`` and ``popleft`` are atomic), never through a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import queue
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from keyorder.contracts import DeadLetterSink
from keyorder.core.retry import RetryPolicy, Verdict
from keyorder.core.scheduling import Delivery, LaneScheduler

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
"""Histogram bucket bounds (seconds) for handler duration and end-to-end processing latency."""

Completions = deque  # of (Delivery, handled: bool); handled=False means abandoned unprocessed


class WorkerCrashed(RuntimeError):
    """A worker loop died from an unexpected error: the pod must exit rather than stall its keys."""


class PoolHealth:
    """Shared between a pool's workers and the poll loop: set once, read every poll."""

    __slots__ = ("crashed",)

    def __init__(self) -> None:
        self.crashed: str | None = None


def call_sync_handler(handler: Callable[[Any], Any], message: Any) -> None:
    """Call a plain handler; a handler that returns a coroutine was meant to be ``async def``."""
    result = handler(message)
    if result is not None and inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        raise TypeError(
            "the handler returned an awaitable without awaiting it: declare it 'async def' "
            "so keyorder runs it on asyncio workers"
        )


class LatencyHistogram:
    """A single-writer histogram: plain integer buckets, no lock on the hot path.

    prometheus_client's Histogram takes a lock per observation; with W workers writing their own
    instance and the collector summing at scrape time, the hot path stays lock-free.
    """

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.count += 1
        self.total += seconds


class WorkerStats:
    """Counters of one worker, written only by that worker."""

    __slots__ = (
        "blocked_lanes",
        "busy",
        "dead_lettered",
        "failed",
        "handler_seconds",
        "latency",
        "parked_lanes",
        "processed",
        "retried",
    )

    def __init__(self) -> None:
        self.processed = 0
        """Messages handled successfully."""
        self.failed = 0
        """Handler calls that raised."""
        self.retried = 0
        """Failures that scheduled a retry."""
        self.dead_lettered = 0
        """Messages published to the DLQ."""
        self.busy = False
        """True while the handler runs."""
        self.parked_lanes = 0
        self.blocked_lanes = 0
        self.handler_seconds = LatencyHistogram()
        self.latency = LatencyHistogram()

    def absorb(self, other: WorkerStats) -> None:
        """Add a retired worker's totals, so pod counters never go backwards after a shrink."""
        self.processed += other.processed
        self.failed += other.failed
        self.retried += other.retried
        self.dead_lettered += other.dead_lettered
        for mine, theirs in ((self.handler_seconds, other.handler_seconds), (self.latency, other.latency)):
            mine.buckets = [a + b for a, b in zip(mine.buckets, theirs.buckets, strict=True)]
            mine.count += theirs.count
            mine.total += theirs.total


class WorkerPool(Protocol):
    """What the poll loop needs from a pool of key workers."""

    size: int
    health: PoolHealth

    def start(self) -> None: ...
    def submit(self, batches: dict[int, list[Delivery]]) -> None: ...
    def resize(self, workers: int) -> None: ...
    def retiring_slots(self) -> list[int]: ...
    def retire(self, slot: int) -> None: ...
    def stop(self, timeout: float) -> None: ...
    def stats(self) -> list[WorkerStats]: ...


class _WorkerCore:
    """Failure handling shared by thread and asyncio workers."""

    def __init__(
        self,
        slot: int,
        retry: RetryPolicy,
        dead_letters: DeadLetterSink | None,
        completions: Completions,
        clock: Callable[[], float],
        health: PoolHealth,
    ) -> None:
        self.slot = slot
        self.health = health
        self.retry = retry
        self.dead_letters = dead_letters
        self.completions = completions
        self.clock = clock
        self.scheduler = LaneScheduler()
        self.stats = WorkerStats()
        self.stopping = False

    def _succeeded(self, delivery: Delivery, started: float) -> None:
        now = self.clock()
        stats = self.stats
        stats.processed += 1
        stats.handler_seconds.observe(now - started)
        stats.latency.observe(now - delivery.received_at)
        if delivery.attempts > 1:
            self._finish_parked(delivery)
        self.completions.append((delivery, True))

    def _finish_parked(self, delivery: Delivery) -> None:
        self.scheduler.finished(delivery)
        self.stats.parked_lanes = self.scheduler.parked_lanes
        self.stats.blocked_lanes = len(self.scheduler.blocked)

    def _failed(self, delivery: Delivery, error: BaseException) -> Verdict:
        """Record a handler failure and decide; returns DEAD_LETTER when the caller must publish."""
        stats = self.stats
        stats.failed += 1
        message = delivery.message
        verdict, delay = self.retry.after_failure(delivery.attempts)
        if verdict is Verdict.RETRY:
            stats.retried += 1
            log.warning(
                "handler failed on %s[%d]@%d (attempt %d/%d), retrying its key in %.2fs: %s: %s",
                message.topic,
                message.partition,
                message.offset,
                delivery.attempts,
                self.retry.max_attempts,
                delay,
                type(error).__name__,
                error,
            )
            self._park(delivery, delay)
        elif verdict is Verdict.BLOCK:
            if delivery.park_key not in self.scheduler.blocked:
                self.scheduler.blocked.add(delivery.park_key)
                log.error(
                    "handler failed on %s[%d]@%d %d times; its key is BLOCKED (retrying every %.0fs, "
                    "the partition's commit waits): %s: %s",
                    message.topic,
                    message.partition,
                    message.offset,
                    delivery.attempts,
                    delay,
                    type(error).__name__,
                    error,
                )
            self._park(delivery, delay)
        return verdict

    def _dead_lettered(self, delivery: Delivery, error: BaseException, publish_error: Exception | None) -> None:
        if publish_error is not None:
            message = delivery.message
            log.error(
                "could not dead-letter %s[%d]@%d, keeping it in flight and retrying the DLQ write in %.0fs: %s",
                message.topic,
                message.partition,
                message.offset,
                self.retry.max_backoff,
                publish_error,
            )
            delivery.pending_dead_letter = error  # the handler is not run again, only the write
            self._park(delivery, self.retry.max_backoff)
            return
        delivery.pending_dead_letter = None
        self.stats.dead_lettered += 1
        self._finish_parked(delivery)
        self.completions.append((delivery, True))

    def _dropped_as_revoked(self, delivery: Delivery) -> bool:
        """Never start work of a partition being revoked: hand it back unprocessed (the new owner runs it)."""
        if not delivery.partition.revoked:
            return False
        self._finish_parked(delivery)
        self.completions.append((delivery, False))
        return True

    def _park(self, delivery: Delivery, delay: float) -> None:
        self.scheduler.park(delivery, self.clock() + delay)
        self.stats.parked_lanes = self.scheduler.parked_lanes
        self.stats.blocked_lanes = len(self.scheduler.blocked)

    def _crashed(self, error: BaseException) -> None:
        log.critical(
            "key worker %d crashed; the pod stops: %s: %s", self.slot, type(error).__name__, error, exc_info=error
        )
        self.health.crashed = f"worker {self.slot}: {type(error).__name__}: {error}"

    def _abandon_all(self) -> None:
        for delivery in self.scheduler.drain():
            self.completions.append((delivery, False))
        self.stats.parked_lanes = self.stats.blocked_lanes = 0


_STOP = object()


class _ThreadWorker(_WorkerCore):
    def __init__(self, handler: Callable[[Any], Any], **core: Any) -> None:
        super().__init__(**core)
        self.handler = handler
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"keyorder-worker-{self.slot}", daemon=True)

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as error:  # a bug, not a handler failure (those are caught per message)
            self._crashed(error)
        finally:
            self._abandon_all()

    def _loop(self) -> None:
        scheduler, inbox, clock = self.scheduler, self.inbox, self.clock
        while not self.stopping:
            item = scheduler.next(clock())
            if item.__class__ is Delivery:
                self._execute(item)
                continue
            try:
                batch = inbox.get() if item is None else inbox.get(timeout=item)
            except queue.Empty:
                continue
            if batch is _STOP:
                break
            scheduler.push_all(batch)
        while True:  # abandon whatever is still queued so the poll loop can release it
            try:
                batch = inbox.get_nowait()
            except queue.Empty:
                break
            if batch is not _STOP:
                scheduler.push_all(batch)

    def _execute(self, delivery: Delivery) -> None:
        if self._dropped_as_revoked(delivery):
            return
        if delivery.pending_dead_letter is not None:
            self._publish_dead_letter(delivery, delivery.pending_dead_letter)
            return
        delivery.attempts += 1
        stats = self.stats
        stats.busy = True
        started = self.clock()
        try:
            call_sync_handler(self.handler, delivery.message)
        except BaseException as error:  # SystemExit from a handler is a failed message, not a dead worker
            stats.busy = False
            if self._failed(delivery, error) is Verdict.DEAD_LETTER:
                self._publish_dead_letter(delivery, error)
            return
        stats.busy = False
        self._succeeded(delivery, started)

    def _publish_dead_letter(self, delivery: Delivery, error: BaseException) -> None:
        publish_error = None
        try:
            assert self.dead_letters is not None, "dlq policy without a dead-letter sink"
            self.dead_letters.publish(delivery.message, error, delivery.attempts)
        except Exception as failure:  # DeadLetterError, or anything a custom sink raises
            publish_error = failure
        self._dead_lettered(delivery, error, publish_error)


class _PoolBase:
    """Bookkeeping shared by both pools: the slot -> worker map, the target size, retired totals."""

    def __init__(
        self,
        handler: Callable[[Any], Any],
        workers: int,
        retry: RetryPolicy,
        dead_letters: DeadLetterSink | None,
        completions: Completions,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._handler = handler
        self._core = {"retry": retry, "dead_letters": dead_letters, "completions": completions, "clock": clock}
        self.health = PoolHealth()
        self._core["health"] = self.health
        self._workers: dict[int, Any] = {}
        self._retired = WorkerStats()
        self.size = workers

    def retiring_slots(self) -> list[int]:
        """Workers above the target size, still alive until their queues are empty."""
        return [slot for slot in list(self._workers) if slot >= self.size]

    def stats(self) -> list[WorkerStats]:
        return [self._retired, *(worker.stats for worker in list(self._workers.values()))]


class ThreadWorkerPool(_PoolBase):
    """Key workers as OS threads, for plain (synchronous) handlers."""

    def _spawn(self, slot: int) -> None:
        worker = _ThreadWorker(self._handler, slot=slot, **self._core)
        self._workers[slot] = worker
        worker.thread.start()

    def start(self) -> None:
        for slot in range(self.size):
            self._spawn(slot)

    def submit(self, batches: dict[int, list[Delivery]]) -> None:
        workers = self._workers
        for slot, batch in batches.items():
            workers[slot].inbox.put(batch)

    def resize(self, workers: int) -> None:
        self.size = workers
        for slot in range(workers):
            if slot not in self._workers:
                self._spawn(slot)

    def retire(self, slot: int) -> None:
        worker = self._workers[slot]
        self._retired.absorb(worker.stats)  # before removal: a scrape never sees the counters drop
        del self._workers[slot]
        worker.inbox.put(_STOP)

    def stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for worker in self._workers.values():
            worker.stopping = True
            worker.inbox.put(_STOP)
        for worker in self._workers.values():
            worker.thread.join(max(deadline - time.monotonic(), 0.0))
            if worker.thread.is_alive():
                log.warning("worker %d still inside the handler after the shutdown grace period", worker.slot)


class _AsyncWorker(_WorkerCore):
    def __init__(self, handler: Callable[[Any], Any], **core: Any) -> None:
        super().__init__(**core)
        self.handler = handler
        self.wakeup = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            self._crashed(error)
        finally:
            self._abandon_all()

    async def _loop(self) -> None:
        scheduler, clock = self.scheduler, self.clock
        while not self.stopping:
            item = scheduler.next(clock())
            if item.__class__ is Delivery:
                await self._execute(item)
                continue
            self.wakeup.clear()  # no await since next(): nothing was pushed in between
            if item is None:
                await self.wakeup.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wakeup.wait(), item)

    async def _execute(self, delivery: Delivery) -> None:
        if self._dropped_as_revoked(delivery):
            return
        if delivery.pending_dead_letter is not None:
            await self._publish_dead_letter(delivery, delivery.pending_dead_letter)
            return
        delivery.attempts += 1
        stats = self.stats
        stats.busy = True
        started = self.clock()
        try:
            await self.handler(delivery.message)
        except BaseException as error:
            stats.busy = False
            task = asyncio.current_task()
            if isinstance(error, asyncio.CancelledError) and task is not None and task.cancelling():
                raise  # the pool is cancelling this worker (shutdown), not a failing message
            if self._failed(delivery, error) is Verdict.DEAD_LETTER:
                await self._publish_dead_letter(delivery, error)
            return
        stats.busy = False
        self._succeeded(delivery, started)

    async def _publish_dead_letter(self, delivery: Delivery, error: BaseException) -> None:
        publish_error = None
        try:
            assert self.dead_letters is not None, "dlq policy without a dead-letter sink"
            await asyncio.to_thread(self.dead_letters.publish, delivery.message, error, delivery.attempts)
        except Exception as failure:  # DeadLetterError, or anything a custom sink raises
            publish_error = failure
        self._dead_lettered(delivery, error, publish_error)


class AsyncWorkerPool(_PoolBase):
    """Key workers as asyncio tasks on one event-loop thread, for ``async def`` handlers.

    Threading: ``_workers`` is mutated only on the loop thread; the poll thread reaches it through
    ``call_soon_threadsafe`` (and reads it with ``list()``, atomic under the GIL).
    """

    def __init__(
        self,
        handler: Callable[[Any], Any],
        workers: int,
        retry: RetryPolicy,
        dead_letters: DeadLetterSink | None,
        completions: Completions,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(handler, workers, retry, dead_letters, completions, clock)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="keyorder-async-workers", daemon=True)

    def _spawn(self, slot: int) -> None:  # on the loop thread
        worker = _AsyncWorker(self._handler, slot=slot, **self._core)
        self._workers[slot] = worker
        worker.task = self._loop.create_task(worker.run())

    def _call(self, function: Callable[..., Any], *args: Any) -> None:
        self._loop.call_soon_threadsafe(function, *args)

    def start(self) -> None:
        self._thread.start()
        self._call(self._grow, self.size)

    def _grow(self, workers: int) -> None:
        for slot in range(workers):
            if slot not in self._workers:
                self._spawn(slot)

    def submit(self, batches: dict[int, list[Delivery]]) -> None:
        self._call(self._accept, batches)

    def _accept(self, batches: dict[int, list[Delivery]]) -> None:
        for slot, batch in batches.items():
            worker = self._workers[slot]
            worker.scheduler.push_all(batch)
            worker.wakeup.set()

    def resize(self, workers: int) -> None:
        self.size = workers
        self._call(self._grow, workers)

    def retire(self, slot: int) -> None:
        self._call(self._retire, slot)

    def _retire(self, slot: int) -> None:
        worker = self._workers.get(slot)
        if worker is not None:
            self._retired.absorb(worker.stats)  # before removal: a scrape never sees the counters drop
            del self._workers[slot]
            worker.stopping = True
            worker.wakeup.set()

    def stop(self, timeout: float) -> None:
        async def shutdown() -> None:
            for worker in self._workers.values():
                worker.stopping = True
                worker.wakeup.set()
            tasks = [worker.task for worker in self._workers.values() if worker.task]
            _done, still_running = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
            for task in still_running:
                task.cancel()
            if still_running:
                log.warning(
                    "%d async workers still inside the handler after the shutdown grace period", len(still_running)
                )

        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout + 5)
            except TimeoutError:  # a handler blocks the event loop (a sync call inside async def)
                log.error(
                    "async workers did not stop within %.0fs: the event loop is blocked by a handler", timeout + 5
                )
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()
