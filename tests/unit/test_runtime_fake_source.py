"""The poll loop's offset logic with an in-memory FAKE source.

A fake is used here only for what the real test broker cannot do: Tansu does not store offset
commit metadata, so the restart-skips-completed-offsets path (and the exact commits it makes) can
only be observed with a source that keeps metadata. Everything else runs against the real broker
in tests/integration/.
"""

from __future__ import annotations

import base64
import threading
import zlib

from keyorder.core import offset_metadata
from keyorder.core.retry import RetryPolicy
from keyorder.core.routing import Ordering
from keyorder.engine.poll_loop import ConsumerRuntime, RuntimeSettings
from keyorder.engine.worker_pools import Completions, ThreadWorkerPool
from keyorder.message import Message
from tests.conftest import wait_until


class FakeMetadataSource:
    """FAKE in-memory Source: one topic, pre-loaded records, stores commits *with* metadata."""

    broker_reachable = True
    broker_error = None

    def __init__(self, records: dict[int, list[Message]], committed: dict[int, tuple[int, str | None]]) -> None:
        self.records = records
        self.committed_offsets = dict(committed)
        self.commits: list[dict] = []
        self.position = {partition: committed.get(partition, (0, None))[0] for partition in records}
        for partition, position in self.position.items():
            if position > len(records[partition]):  # out of range, like auto.offset.reset=earliest
                self.position[partition] = 0
        self.paused: set = set()
        self._assigned = False

    def subscribe(self, topics, on_assign, on_revoke, on_lost):
        self._on_assign = on_assign

    def consume(self, max_messages, timeout):
        if not self._assigned:
            self._assigned = True
            self._on_assign([("t", partition) for partition in self.records])
        out = []
        for partition, records in self.records.items():
            if ("t", partition) in self.paused:
                continue
            batch = [r for r in records if r.offset >= self.position[partition]][: max_messages - len(out)]
            if batch:
                self.position[partition] = batch[-1].offset + 1
            out.extend(batch)
        if not out:
            threading.Event().wait(min(timeout, 0.01))
        return out

    def pause(self, partitions):
        self.paused.update(partitions)

    def resume(self, partitions):
        self.paused.difference_update(partitions)

    def committed(self, partitions, timeout):
        return {pid: self.committed_offsets.get(pid[1], (None, None)) for pid in partitions}

    def commit(self, offsets, asynchronous):
        self.commits.append(dict(offsets))
        for (_topic, partition), value in offsets.items():
            self.committed_offsets[partition] = value
        return [(partition_id, offset, None) for partition_id, (offset, _metadata) in offsets.items()]

    def high_watermark(self, partition):
        return len(self.records[partition[1]])

    def fetch_queue(self, partition):
        return None

    def positions(self, partitions):
        return {pid: self.position.get(pid[1]) for pid in partitions}

    def close(self):
        pass


def message(offset: int, key: str) -> Message:
    return Message("t", 0, offset, key.encode(), b"{}")


def run_until(source, handled, expected_count, committed=10):
    completions = Completions()
    pool = ThreadWorkerPool(lambda m: handled.append(m.offset), 4, RetryPolicy(), None, completions)
    runtime = ConsumerRuntime(
        RuntimeSettings(topics=("t",), commit_interval=0.01), source, pool, Ordering.KEY, completions
    )
    stop = threading.Event()
    thread = threading.Thread(target=runtime.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: len(handled) >= expected_count and source.committed_offsets.get(0, (None, None))[0] == committed,
            10,
            "the backlog to be handled and committed",
        )
    finally:
        stop.set()
        thread.join(10)
    return runtime


def test_restart_skips_offsets_the_metadata_marks_done():
    records = {0: [message(offset, f"k{offset % 3}") for offset in range(10)]}
    metadata = offset_metadata.encode(5, [7, 8])
    source = FakeMetadataSource(records, committed={0: (5, metadata)})
    handled: list[int] = []
    runtime = run_until(source, handled, expected_count=3)
    assert sorted(handled) == [5, 6, 9], "offsets 7 and 8 were done before the restart and must be skipped"
    assert runtime.snapshot.skipped == 2
    assert source.committed_offsets[0][0] == 10


def test_without_metadata_everything_from_the_committed_offset_runs_again():
    records = {0: [message(offset, f"k{offset % 3}") for offset in range(10)]}
    source = FakeMetadataSource(records, committed={0: (5, None)})
    handled: list[int] = []
    run_until(source, handled, expected_count=5)
    assert sorted(handled) == [5, 6, 7, 8, 9]


def test_commits_carry_completed_offsets_above_a_stuck_one():
    records = {0: [message(offset, "slow" if offset == 0 else f"k{offset}") for offset in range(10)]}
    release = threading.Event()
    handled: list[int] = []

    def handler(m):
        if m.offset == 0:
            release.wait(10)
        handled.append(m.offset)

    source = FakeMetadataSource(records, committed={})
    completions = Completions()
    pool = ThreadWorkerPool(handler, 8, RetryPolicy(), None, completions)
    runtime = ConsumerRuntime(
        RuntimeSettings(topics=("t",), commit_interval=0.01), source, pool, Ordering.KEY, completions
    )
    stop = threading.Event()
    thread = threading.Thread(target=runtime.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(handled) == 9, 10, "every message but the stuck one")
        wait_until(
            lambda: (
                source.committed_offsets.get(0, (None, None))[1] is not None
                and offset_metadata.decode(source.committed_offsets[0][1], 0) == set(range(1, 10))
            ),
            10,
            "a commit at offset 0 whose metadata lists offsets 1-9 as done",
        )
        assert source.committed_offsets[0][0] == 0, "the commit passed an unfinished offset"
        release.set()
        wait_until(
            lambda: source.committed_offsets.get(0, (None, None))[0] == 10,
            10,
            "the commit to move past the released offset",
        )
    finally:
        release.set()
        stop.set()
        thread.join(10)


def test_a_failed_commit_is_sent_again():
    records = {0: [message(offset, f"k{offset}") for offset in range(10)]}

    class FlakySource(FakeMetadataSource):
        failures = 2

        def commit(self, offsets, asynchronous):
            if self.failures:
                self.failures -= 1
                return [
                    (partition_id, offset, "REBALANCE_IN_PROGRESS") for partition_id, (offset, _m) in offsets.items()
                ]
            return super().commit(offsets, asynchronous)

    source = FlakySource(records, committed={})
    handled: list[int] = []
    runtime = run_until(source, handled, expected_count=10)
    assert source.committed_offsets[0][0] == 10
    assert runtime.snapshot.commit_failures == 2, "both failed commits must be counted"


def test_a_log_reset_below_the_committed_offset_is_processed_and_committed(caplog):
    """The topic was recreated: committed 1000, but the new log holds offsets 0-9 only."""
    records = {0: [message(offset, f"k{offset % 3}") for offset in range(10)]}
    metadata = offset_metadata.encode(1000, [1002])
    source = FakeMetadataSource(records, committed={0: (1000, metadata)})
    handled: list[int] = []
    with caplog.at_level("WARNING", logger="keyorder.engine.poll_loop"):
        runtime = run_until(source, handled, expected_count=10)
    assert sorted(handled) == list(range(10)), "messages of the reset log must not be dropped"
    assert source.committed_offsets[0][0] == 10
    assert runtime.snapshot.skipped == 0, "nothing was marked done for the new log"
    assert [p.resets for p in runtime.snapshot.partitions] == [1]
    assert "t[0]: offset reset: committed offset 1000 but received 0" in caplog.text


def test_re_deliveries_are_not_counted_as_skipped():
    records = {0: [message(offset, f"k{offset % 3}") for offset in [*range(10), 3, 4]]}
    source = FakeMetadataSource(records, committed={0: (0, None)})
    handled: list[int] = []
    runtime = run_until(source, handled, expected_count=10)
    assert sorted(handled) == list(range(10))
    assert runtime.snapshot.skipped == 0, "skipped counts only offsets the commit metadata marked done"
    assert [p.resets for p in runtime.snapshot.partitions] == [0]


def test_out_of_bounds_commit_metadata_is_ignored_with_a_warning(caplog):
    """Forged metadata (a run of 3 million offsets) must neither exhaust memory nor skip anything."""
    records = {0: [message(offset, f"k{offset % 3}") for offset in range(10)]}
    forged = "ko1:5:r:" + base64.urlsafe_b64encode(zlib.compress(bytes([0, 0xC0, 0x8D, 0xB7, 0x01]))).decode()
    assert len(forged) < 40
    source = FakeMetadataSource(records, committed={0: (5, forged)})
    handled: list[int] = []
    with caplog.at_level("WARNING", logger="keyorder.engine.poll_loop"):
        runtime = run_until(source, handled, expected_count=5)
    assert sorted(handled) == [5, 6, 7, 8, 9]
    assert runtime.snapshot.skipped == 0
    assert "t[0]: commit metadata ignored (3000000 offsets" in caplog.text


class FakeTransactionalSource(FakeMetadataSource):
    """FAKE: the log of partition 0 ends in ``log_end`` with offsets the client reads but never hands
    out (an aborted transaction's records and markers under read_committed): once it has handed out
    the last record, its position is the log end, as librdkafka's is. The real broker covers
    committed transactions (tests/integration/test_pod_kafka.py); Tansu does not filter aborted
    transactions under read_committed, so this path needs a fake."""

    def __init__(self, records, log_end: int) -> None:
        super().__init__(records, committed={})
        self.log_end = log_end

    def consume(self, max_messages, timeout):
        out = super().consume(max_messages, timeout)
        if self.position[0] == self.records[0][-1].offset + 1:
            self.position[0] = self.log_end  # the client read past the trailing control records
        return out

    def high_watermark(self, partition):
        return self.log_end


def test_an_aborted_tail_the_client_skipped_is_committed_past():
    """0-9 data; 10-12 an aborted transaction, 13 its abort marker: the group commits 14 (lag 0)."""
    records = {0: [message(offset, f"k{offset % 3}") for offset in range(10)]}
    source = FakeTransactionalSource(records, log_end=14)
    handled: list[int] = []
    runtime = run_until(source, handled, 10, committed=14)
    assert sorted(handled) == list(range(10))
    assert [offsets[("t", 0)][0] for offsets in source.commits][-1] == 14
    assert [p.lag for p in runtime.snapshot.partitions] == [0]
