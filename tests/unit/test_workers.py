"""Worker pools without a broker: failures never kill a worker, mistakes in handlers are failures.

The dead-letter sink here is a FAKE in-memory sink (the real one, producing to Kafka, is covered
by the poison-message test in tests/integration/); the pools and their threads are real.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from keyorder.core.lanes import Delivery
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.engine.worker_pools import AsyncWorkerPool, Completions, ThreadWorkerPool
from keyorder.message import Message
from tests.conftest import wait_until
from tests.guarantees import SerialPerKey


class FakeDeadLetters:
    """FAKE sink: records what would have been published."""

    def __init__(self) -> None:
        self.published: list[tuple[int, str, int]] = []
        self.errors: list[BaseException] = []

    def publish(self, message, error, attempts):
        self.published.append((message.offset, type(error).__name__, attempts))
        self.errors.append(error)

    def close(self):
        pass


class Partition:
    revoked = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:  # no truncation here: only a revoke
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


def deliveries(offsets, lane=b"k"):
    partition = Partition()
    return [Delivery(Message("t", 0, offset, lane, b"{}"), lane, partition, time.monotonic()) for offset in offsets]


def run_pool(pool_type, handler, offsets, sink):
    completions = Completions()
    pool = pool_type(
        handler,
        1,
        RetryPolicy(max_attempts=2, initial_backoff=0.0, max_backoff=0.01, exhausted=ExhaustedPolicy.DLQ),
        sink,
        completions,
    )
    pool.start()
    try:
        pool.submit(deliveries(offsets))
        wait_until(lambda: len(completions) == len(offsets), 10, "every delivery back")
    finally:
        pool.stop(2)
    assert pool.health.crashed is None
    return [(delivery.message.offset, handled) for delivery, handled in completions]


def test_a_sync_handler_returning_a_coroutine_is_a_failure_not_a_silent_success():
    async def forgot_async(_message):
        return None

    def handler(message):
        return forgot_async(message)

    sink = FakeDeadLetters()
    finished = run_pool(ThreadWorkerPool, handler, [0], sink)
    assert finished == [(0, True)]
    assert sink.published == [(0, "TypeError", 2)], "it must be dead-lettered, not counted as handled"


@pytest.mark.parametrize("pool_type", [ThreadWorkerPool, AsyncWorkerPool])
def test_system_exit_in_a_handler_fails_that_message_and_the_worker_goes_on(pool_type):
    calls = []

    def decide(message):
        calls.append(message.offset)
        if message.offset == 1:
            raise SystemExit("handler called sys.exit")

    if pool_type is AsyncWorkerPool:

        async def handler(message):
            await asyncio.sleep(0)
            decide(message)
    else:
        handler = decide
    sink = FakeDeadLetters()
    finished = run_pool(pool_type, handler, [0, 1, 2], sink)
    assert sorted(finished) == [(0, True), (1, True), (2, True)]
    assert sink.published == [(1, "SystemExit", 2)]
    assert calls.count(2) == 1, "the worker stopped after the SystemExit"


def test_a_failing_dead_letter_sink_keeps_the_message_in_flight_and_retries_only_the_write():
    class FlakySink(FakeDeadLetters):
        outage = 2

        def publish(self, message, error, attempts):
            if self.outage:
                self.outage -= 1
                raise ConnectionError("DLQ broker down")
            super().publish(message, error, attempts)

    calls = []

    def handler(message):
        calls.append(message.offset)
        raise ValueError("bad message")

    completions = Completions()
    sink = FlakySink()
    pool = ThreadWorkerPool(
        handler, 1, RetryPolicy(max_attempts=1, initial_backoff=0.0, max_backoff=0.3), sink, completions
    )
    pool.start()
    try:
        pool.submit(deliveries([0]))
        wait_until(lambda: sink.outage == 1, 5, "the first DLQ write to fail")
        assert not completions, "a message whose DLQ write failed was reported finished"
        wait_until(lambda: len(completions) == 1, 5, "the DLQ write to succeed after the outage")
        assert sink.published == [(0, "ValueError", 1)]
        assert calls == [0], "the handler must not run again while only the DLQ write is retried"
        assert pool.health.crashed is None
    finally:
        pool.stop(1)


def _keyed_deliveries(keys: list[bytes]) -> list[Delivery]:
    partition = Partition()
    sequence: dict[bytes, int] = {}
    out = []
    for offset, key in enumerate(keys):
        seq = sequence.get(key, 0)
        sequence[key] = seq + 1
        out.append(Delivery(Message("t", 0, offset, key, str(seq).encode()), key, partition, time.monotonic()))
    return out


@pytest.mark.parametrize("pool_type", [ThreadWorkerPool, AsyncWorkerPool])
def test_a_hot_key_holds_one_worker_and_the_other_keys_pass_it(pool_type):
    finished: list[bytes] = []

    def record(message):
        time.sleep(0.002)
        finished.append(message.key)

    if pool_type is AsyncWorkerPool:

        async def handler(message):
            await asyncio.sleep(0.002)
            finished.append(message.key)
    else:
        handler = record
    completions = Completions()
    pool = pool_type(handler, 2, RetryPolicy(), None, completions)
    pool.start()
    try:
        pool.submit(_keyed_deliveries([b"hot"] * 60 + [f"cold-{i}".encode() for i in range(20)]))
        wait_until(lambda: len(completions) == 80, 10, "everything handled")
    finally:
        pool.stop(2)
    last_cold = max(index for index, key in enumerate(finished) if key != b"hot")
    assert finished[: last_cold + 1].count(b"hot") <= 30, "the cold keys waited behind the hot key"


@pytest.mark.parametrize("pool_type", [ThreadWorkerPool, AsyncWorkerPool])
def test_live_resize_under_a_backlog_keeps_every_key_serial_and_in_order_and_takes_effect(pool_type):
    serial = SerialPerKey()
    seen: dict[bytes, list[int]] = {}

    def enter(message):
        serial.enter(message.key)
        seen.setdefault(message.key, []).append(int(message.value))

    if pool_type is AsyncWorkerPool:

        async def handler(message):
            enter(message)
            await asyncio.sleep(0.003)
            serial.leave(message.key)
    else:

        def handler(message):
            enter(message)
            time.sleep(0.003)
            serial.leave(message.key)

    keys = [f"k{i % 16}".encode() for i in range(600)]
    completions = Completions()
    pool = pool_type(handler, 2, RetryPolicy(), None, completions)
    pool.start()
    try:
        pool.submit(_keyed_deliveries(keys))
        wait_until(lambda: len(completions) >= 50, 10, "progress at W=2")
        assert serial.peak <= 2
        pool.resize(8)
        wait_until(lambda: serial.peak > 2, 10, "the new workers to take lanes")
        wait_until(lambda: len(completions) >= 300, 10, "progress at W=8")
        pool.resize(1)
        wait_until(lambda: len(completions) == 600, 20, "the backlog to drain at W=1")
        assert pool.size == 1
    finally:
        pool.stop(2)
    serial.assert_serial()
    assert all(sequence == list(range(len(sequence))) for sequence in seen.values()), "a key ran out of order"
    assert all(handled for _delivery, handled in completions)
    assert sum(stats.processed for stats in pool.stats()) == 600, "retired workers' counts are kept"


# -- Completions: the poll loop's wake-up -----------------------------------------------------------------


def test_completions_wait_returns_once_enough_have_arrived_from_another_thread() -> None:
    import threading

    completions = Completions()
    arrived = threading.Event()

    def workers() -> None:
        for index in range(5):
            completions.append((index, True))  # type: ignore[arg-type]
            completions.signal()
        arrived.set()

    threading.Timer(0.05, workers).start()
    assert completions.wait(5, timeout=30), "5 completions arrived: the wait must end with them"
    assert arrived.wait(5) and len(completions) == 5


def test_completions_wait_gives_up_at_its_timeout_and_reports_it() -> None:
    completions = Completions()
    completions.append((0, True))  # type: ignore[arg-type]
    assert completions.wait(1, timeout=0), "already there: no wait"
    assert not completions.wait(2, timeout=0.01), "only one of two: the timeout ends the wait"


def test_a_scrape_counts_a_worker_that_exits_meanwhile_once():
    """A scrape sums ``stats()`` outside the pool's lock; a retiring worker that exits meanwhile folds its
    totals into the retired ones. The list the scrape holds must not change under it (a review: the pod's
    counters read double for that scrape, then dropped, which Prometheus takes for a counter reset)."""
    from keyorder.engine.worker_pools import _Worker

    pool = ThreadWorkerPool(lambda message: None, 2, RetryPolicy(), None, Completions())
    worker = _Worker(0)
    worker.stats.processed = 100
    worker.stats.batches["full"] = 7
    pool._workers[0] = worker
    scrape = pool.stats()
    with pool._lock:
        pool._exit(worker)  # a shrink: the worker retires at the end of its call
    assert sum(stats.processed for stats in scrape) == 100
    assert sum(stats.batches["full"] for stats in scrape) == 7
    assert sum(stats.processed for stats in pool.stats()) == 100, "and the next scrape counts it once too"
