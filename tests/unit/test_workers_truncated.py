"""A message whose log was truncated below it while its handler ran is let go, whatever the handler did.

Soak seed 522 (issue 36 simulation): the old log's record at offset 15 of a partition was in its
handler when the log was truncated at 0 and refilled (an unclean leader election). The handler failed;
the pool parked the stale delivery for its retry, retried it twice more and blocked its key, so the key's
record of the new log (and the same key's records of another partition) never ran. The pools and their
threads are real, and so are the runtime's partition state and its offset tracker; the clock is a FAKE
that stands still, so a parked lane never becomes due.
"""

from __future__ import annotations

import pytest

from keyorder.core.lanes import Delivery
from keyorder.core.partitions import PartitionState
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.core.tracking import PartitionOffsets
from keyorder.engine.worker_pools import AsyncWorkerPool, ThreadWorkerPool
from keyorder.message import Message
from tests.conftest import wait_until
from tests.unit.test_workers_revoke import (
    DEAD_LETTER_NOW,
    RETRY_LATER,
    FakeDeadLetters,
    HeldHandler,
    pool_running,
    settled,
)

KEY = b"k"
BLOCK_NOW = RetryPolicy(max_attempts=1, max_backoff=60.0, exhausted=ExhaustedPolicy.BLOCK)


def delivery(offset: int, leader_epoch: int, state: PartitionState) -> Delivery:
    return Delivery(Message("t", 0, offset, KEY, b"{}", leader_epoch=leader_epoch), KEY, state, 0.0)


@pytest.mark.parametrize("pool_type", [ThreadWorkerPool, AsyncWorkerPool])
@pytest.mark.parametrize("retry", [RETRY_LATER, DEAD_LETTER_NOW, BLOCK_NOW], ids=["retry", "dlq", "block"])
def test_a_failure_after_a_truncation_below_it_goes_back_and_the_new_record_runs(
    pool_type: type, retry: RetryPolicy
) -> None:
    handler, sink = HeldHandler(fail=True), FakeDeadLetters()
    state = PartitionState(("t", 0), PartitionOffsets(start=0))
    assert state.offsets.received(0, 0)
    pool = pool_running(pool_type, handler, retry, sink)
    try:
        pool.submit([delivery(0, 0, state)])
        wait_until(handler.started.is_set, 10, "the old log's record in its handler")  # hang guard
        state.offsets.truncate(0, 1)  # what the runtime does on LogTruncated: the log refilled under epoch 1
        assert pool.withdraw(lambda item: item.message.leader_epoch < 1) == [], "a running head is waited for"
        handler.release.set()
        wait_until(lambda: pool.completions, 10, "the failed stale delivery back")  # hang guard
        assert settled(pool.completions) == [(0, False)], "handed back: its record is gone from the log"
        assert sink.published == [], "never dead-lettered: the record it would name no longer exists"
        summary = pool.lane_summary()
        assert (summary.active, summary.parked, summary.blocked) == (0, 0, 0), "no stale head holds the key"
        pool.completions.clear()
        handler.fail = False
        assert state.offsets.received(0, 1), "the new log's record at the reused offset"
        pool.submit([delivery(0, 1, state)])
        wait_until(lambda: pool.completions, 10, "the new log's record to run")  # hang guard
        assert settled(pool.completions) == [(0, True)]
        assert handler.ran == [0, 0]
        assert pool.health.crashed is None
    finally:
        handler.release.set()
        pool.stop(5)
