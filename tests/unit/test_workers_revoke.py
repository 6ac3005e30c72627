"""A revoke waits only for handlers that run: a delivery whose partition was revoked while its handler
ran goes back to the poll loop as soon as the handler returns, whatever the handler did.

Issue 36 defect 3: a handler that failed after the revoke's ``withdraw`` parked its lane for the
backoff, so the revoke waited its whole drain timeout for a delivery no handler ran, and the stale
parked head then held the key's lane against the partition's next owner on this pod. The pools and
their threads are real; the clock is a FAKE that stands still, so a parked lane never becomes due.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from keyorder.core.lanes import Delivery
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy, Verdict
from keyorder.engine.worker_pools import AsyncWorkerPool, Completions, ThreadWorkerPool
from keyorder.message import Message
from tests.conftest import wait_until
from tests.fakes import FakeClock

KEY = b"k"
RETRY_LATER = RetryPolicy(max_attempts=5, initial_backoff=60.0, max_backoff=60.0)
DEAD_LETTER_NOW = RetryPolicy(max_attempts=1, exhausted=ExhaustedPolicy.DLQ)
BLOCK_NOW = RetryPolicy(max_attempts=1, max_backoff=60.0, exhausted=ExhaustedPolicy.BLOCK)


class Partition:
    """Stands in for the runtime's partition state: the pools read only ``revoked`` (through ``lets_go``)."""

    def __init__(self) -> None:
        self.revoked = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:  # no truncation here: only a revoke
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


class FakeDeadLetters:
    """FAKE sink: records what would have been published."""

    def __init__(self) -> None:
        self.published: list[int] = []

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        self.published.append(message.offset)

    def close(self) -> None:
        pass


def delivery(offset: int, partition: Partition) -> Delivery:
    return Delivery(Message("t", 0, offset, KEY, b"{}"), KEY, partition, 0.0)


class HeldHandler:
    """Offset 0 waits until released, then fails or returns; every other offset returns at once."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.started = threading.Event()
        self.release = threading.Event()
        self.ran: list[int] = []

    def __call__(self, message: Message) -> None:
        self.ran.append(message.offset)
        if message.offset == 0:
            self.started.set()
            self.release.wait(10)  # hang guard: the test releases it
            if self.fail:
                raise ValueError("the handler failed after its partition was revoked")


def pool_running(pool_type: type, handler: HeldHandler, retry: RetryPolicy, sink: FakeDeadLetters) -> Any:
    completions = Completions()
    clock = FakeClock()  # stands still: a lane parked for any backoff is never due
    if pool_type is AsyncWorkerPool:

        async def run(message: Message) -> None:
            await asyncio.to_thread(handler, message)

        pool = AsyncWorkerPool(run, 2, retry, sink, completions, clock=clock)
    else:
        pool = ThreadWorkerPool(handler, 2, retry, sink, completions, clock=clock)
    pool.start()
    return pool


def settled(completions: Completions) -> list[tuple[int, bool]]:
    return [(item.message.offset, handled) for item, handled in completions]


def revoke_while_running(pool: Any, handler: HeldHandler, partition: Partition) -> None:
    """What the runtime's ``_on_revoke`` does with offset 0 inside the handler: flag, withdraw, release."""
    wait_until(handler.started.is_set, 10, "the handler to start")  # hang guard
    partition.revoked = True
    assert pool.withdraw(lambda item: item.partition.revoked) == [], "a running head is waited for, not withdrawn"
    handler.release.set()


@pytest.mark.parametrize("pool_type", [ThreadWorkerPool, AsyncWorkerPool])
@pytest.mark.parametrize("retry", [RETRY_LATER, DEAD_LETTER_NOW, BLOCK_NOW], ids=["retry", "dlq", "block"])
def test_a_failure_after_the_revoke_goes_back_at_once_and_the_key_runs_for_its_next_owner(
    pool_type: type, retry: RetryPolicy
) -> None:
    handler, sink, first_owner, next_owner = HeldHandler(fail=True), FakeDeadLetters(), Partition(), Partition()
    pool = pool_running(pool_type, handler, retry, sink)
    try:
        pool.submit([delivery(0, first_owner)])
        revoke_while_running(pool, handler, first_owner)
        wait_until(lambda: pool.completions, 10, "the failed delivery back while the clock stands still")  # hang guard
        assert settled(pool.completions) == [(0, False)], "handed back unprocessed: the new owner retries it"
        assert sink.published == [], "never dead-lettered: the new owner decides under its own retry policy"
        summary = pool.lane_summary()
        assert (summary.active, summary.parked, summary.blocked) == (0, 0, 0), "no stale parked head is left"
        pool.completions.clear()
        # the partition comes back to this pod: the same key's next message must not wait behind offset 0
        pool.submit([delivery(1, next_owner)])
        wait_until(lambda: pool.completions, 10, "the next owner's message to run")  # hang guard
        assert settled(pool.completions) == [(1, True)]
        assert handler.ran == [0, 1]
        assert pool.health.crashed is None
    finally:
        handler.release.set()
        pool.stop(5)


@pytest.mark.parametrize("pool_type", [ThreadWorkerPool, AsyncWorkerPool])
def test_a_success_after_the_revoke_still_counts_as_handled(pool_type: type) -> None:
    handler, first_owner = HeldHandler(fail=False), Partition()
    pool = pool_running(pool_type, handler, RETRY_LATER, FakeDeadLetters())
    try:
        pool.submit([delivery(0, first_owner)])
        revoke_while_running(pool, handler, first_owner)
        wait_until(lambda: pool.completions, 10, "the finished delivery back")  # hang guard
        assert settled(pool.completions) == [(0, True)], "it ran: the revoke's final commit may include it"
    finally:
        handler.release.set()
        pool.stop(5)


def revoke_inside_the_retry_policy(partition: Partition) -> RetryPolicy:
    """A retry policy whose verdict is taken while the revoke lands: after the failure checked the
    partition, before the worker's next turn settles the lane (the race the settling itself must cover)."""

    class RevokedMeanwhile(RetryPolicy):
        __slots__ = ()

        def after_failure(self, failed_attempts: int) -> tuple[Verdict, float]:
            partition.revoked = True
            return RetryPolicy.after_failure(self, failed_attempts)

    return RevokedMeanwhile(max_attempts=5, initial_backoff=60.0, max_backoff=60.0)


def test_a_revoke_between_the_failure_and_the_settling_still_hands_the_delivery_back() -> None:
    partition = Partition()

    def failing(_message: Message) -> None:
        raise ValueError("the handler failed")

    completions = Completions()
    pool = ThreadWorkerPool(failing, 1, revoke_inside_the_retry_policy(partition), None, completions, clock=FakeClock())
    pool.start()
    try:
        pool.submit([delivery(0, partition)])
        wait_until(lambda: completions, 10, "the failed delivery back while the clock stands still")  # hang guard
        assert settled(completions) == [(0, False)]
        assert pool.lane_summary().active == 0
    finally:
        pool.stop(5)


class SinkDownDuringTheRevoke(FakeDeadLetters):
    """The DLQ write fails while the delivery's partition is revoked (the revoke lands during the write)."""

    def __init__(self, partition: Partition) -> None:
        super().__init__()
        self.partition = partition

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        self.partition.revoked = True
        raise ConnectionError("DLQ broker down")


@pytest.mark.parametrize("pool_type", [ThreadWorkerPool, AsyncWorkerPool])
def test_a_failed_dead_letter_write_in_a_revoked_partition_is_logged_as_handed_back(
    pool_type: type, caplog: pytest.LogCaptureFixture
) -> None:
    partition = Partition()

    def failing(_message: Message) -> None:
        raise ValueError("bad message")

    if pool_type is AsyncWorkerPool:

        async def handler(message: Message) -> None:
            failing(message)

        run: Any = handler
    else:
        run = failing
    completions = Completions()
    pool = pool_type(run, 1, DEAD_LETTER_NOW, SinkDownDuringTheRevoke(partition), completions, clock=FakeClock())
    pool.start()
    try:
        pool.submit([delivery(0, partition)])
        wait_until(lambda: completions, 10, "the delivery back while the clock stands still")  # hang guard
        assert settled(completions) == [(0, False)], "handed back: its new owner runs it again"
        assert pool.lane_summary().active == 0
    finally:
        pool.stop(5)
    (record,) = [record for record in caplog.records if "could not dead-letter" in record.getMessage()]
    assert "keeping it in flight" not in record.getMessage(), "nothing here keeps it in flight"
    assert "handed back" in record.getMessage() and "new owner" in record.getMessage()
