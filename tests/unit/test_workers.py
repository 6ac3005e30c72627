"""Worker pools without a broker: failures never kill a worker, mistakes in handlers are failures.

The dead-letter sink here is a FAKE in-memory sink (the real one, producing to Kafka, is covered
by the poison-message test in tests/integration/); the pools and their threads are real.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import pytest

from keyorder.core.lanes import Delivery
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.message import Message
from keyorder.workers import AsyncWorkerPool, ThreadWorkerPool
from tests.conftest import wait_until


class FakeDeadLetters:
    """FAKE sink: records what would have been published."""

    def __init__(self) -> None:
        self.published: list[tuple[int, str, int]] = []

    def publish(self, message, error, attempts):
        self.published.append((message.offset, type(error).__name__, attempts))

    def close(self):
        pass


class Partition:
    revoked = False


def deliveries(offsets, lane=b"k"):
    partition = Partition()
    return [Delivery(Message("t", 0, offset, lane, b"{}"), lane, partition, time.monotonic()) for offset in offsets]


def run_pool(pool_type, handler, offsets, sink):
    completions: deque = deque()
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

    completions: deque = deque()
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
