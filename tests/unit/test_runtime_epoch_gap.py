"""Records librdkafka prefetched below a truncation point and purged are fetched again, not skipped (issue 36).

librdkafka validates its *fetch* position, which runs ahead of what it handed out; on a truncation below it,
it seeks to the truncation point T and the seek's version barrier purges the partition's queued records,
those below T too (src/rdkafka_topic.c ``rd_kafka_toppar_leader_update`` ->
``rd_kafka_toppar_fetch_decide_next_fetch_start_pos`` -> ``rd_kafka_offset_validate``; src/rdkafka_offset.c
``rd_kafka_toppar_handle_OffsetForLeaderEpoch`` -> ``rd_kafka_toppar_op_seek``). The pod then sees T, of a
greater leader epoch, above its last received offset + 1. The poll loop's ``_dispatch`` runs on the test's
thread with a FAKE source that records seeks and a FAKE pool that only keeps what it is given.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from keyorder.contracts import FetchPosition, TopicPartitionId
from keyorder.core.flow import FlowLimits
from keyorder.core.routing import Ordering
from keyorder.engine.poll_loop import ConsumerRuntime, RuntimeSettings
from keyorder.engine.worker_pools import Completions
from keyorder.message import Message
from tests.fakes import FakeClock, HoldingPool, RecordingSource

P0 = ("t", 0)


class SeekingSource(RecordingSource):
    """FAKE Source recording each resume's positions (a resume with a position is a seek)."""

    def __init__(self) -> None:
        super().__init__({P0: 0})
        self.seeks: list[dict[TopicPartitionId, FetchPosition | None]] = []

    def resume(self, partitions: Mapping[TopicPartitionId, FetchPosition | None]) -> None:
        self.seeks.append(dict(partitions))


def message(offset: int, leader_epoch: int) -> Message:
    return Message("t", 0, offset, f"k{offset % 3}".encode(), b"{}", leader_epoch=leader_epoch)


def runtime_assigned() -> tuple[ConsumerRuntime, SeekingSource, HoldingPool]:
    clock, completions = FakeClock(), Completions()
    source, pool = SeekingSource(), HoldingPool(completions)
    limits = FlowLimits(max_inflight=100, max_inflight_per_partition=100, max_uncommitted=100, pause_after=1.0)
    settings = RuntimeSettings(topics=("t",), flow=limits)
    runtime = ConsumerRuntime(settings, source, pool, Ordering.KEY, completions, clock, clock.sleep)
    runtime._on_assign([P0])
    return runtime, source, pool


def held(pool: HoldingPool) -> list[tuple[int, int | None]]:
    return [(delivery.message.offset, delivery.message.leader_epoch) for delivery in pool.held]


def test_a_greater_epoch_above_the_next_offset_is_fetched_again_from_the_next_offset() -> None:
    """0-2 handed out; the log truncated at 6 while 3-7 were prefetched: librdkafka purged 3-5 and hands out 6
    of epoch 2. The pod must not take 3-5 for a gap: it seeks back to 3 with epoch 1 and drops the rest."""
    runtime, source, pool = runtime_assigned()
    runtime._dispatch([message(offset, 1) for offset in range(3)], 0.0)
    runtime._dispatch([message(6, 2), message(7, 2)], 0.0)
    assert held(pool) == [(0, 1), (1, 1), (2, 1)], "6 and 7 are not taken past the missing 3-5"
    assert source.seeks == [{P0: FetchPosition(3, 1)}], "fetched again from 3, validated with epoch 1"
    assert runtime.partitions[P0].offsets.commit_position == 0

    runtime._dispatch([*(message(offset, 1) for offset in range(3, 6)), message(6, 2), message(7, 2)], 0.0)
    assert [offset for offset, _epoch in held(pool)] == list(range(8)), "3-5 (the same in both logs), then 6, 7"
    assert len(source.seeks) == 1


def test_the_same_record_arriving_again_across_a_real_gap_is_accepted() -> None:
    """A clean leader change after a compaction gap: 3-5 do not exist; 6 of epoch 2 arrives again after the
    seek, and is taken (one extra fetch, no loop)."""
    runtime, source, pool = runtime_assigned()
    runtime._dispatch([message(offset, 1) for offset in range(3)], 0.0)
    runtime._dispatch([message(6, 2)], 0.0)
    runtime._dispatch([message(6, 2), message(7, 2)], 0.0)
    assert held(pool) == [(0, 1), (1, 1), (2, 1), (6, 2), (7, 2)]
    assert len(source.seeks) == 1


def test_a_greater_epoch_right_after_the_last_offset_needs_no_check() -> None:
    runtime, source, pool = runtime_assigned()
    runtime._dispatch([message(0, 1), message(1, 1), message(2, 2)], 0.0)
    assert len(held(pool)) == 3 and source.seeks == []


def test_a_paused_partition_is_not_sought_now_and_its_resume_goes_back_to_the_next_offset() -> None:
    """The gap is found in records a paused partition's client still returned: no seek now (flow control's
    resume seeks the partition to the next offset with the known epoch, which validates it the same way)."""
    runtime, source, pool = runtime_assigned()
    runtime._dispatch([message(offset, 1) for offset in range(3)], 0.0)
    runtime.flow.paused.add(P0)
    runtime._dispatch([message(6, 2)], 0.0)
    assert source.seeks == [], "a paused partition is not sought: its resume does that"
    assert held(pool) == [(0, 1), (1, 1), (2, 1)]
    assert runtime.partitions[P0].receive_times.oldest_age(0, now=5.0) == 5.0


def test_another_partitions_records_in_the_same_batch_are_taken() -> None:
    runtime, source, pool = runtime_assigned()
    runtime._on_assign([("t", 1)])
    runtime._dispatch([message(offset, 1) for offset in range(3)], 0.0)
    other = [Message("t", 1, offset, b"x", b"{}", leader_epoch=1) for offset in range(2)]
    runtime._dispatch([message(6, 2), message(7, 2), *other], 0.0)
    assert [(d.message.partition, d.message.offset) for d in pool.held][3:] == [(1, 0), (1, 1)]
    assert source.seeks == [{P0: FetchPosition(3, 1)}]


def test_records_before_the_gap_in_the_same_run_are_taken_and_those_from_it_on_are_not() -> None:
    """3-5 of epoch 1 arrive in one run with 8 of epoch 2 after them (9 and 10 behind it): the run is not plain,
    so it goes record by record. 3-5 are taken (received, so the pod must run them: it will not fetch them
    again), and the partition is fetched again from 6; 8-10 arrive again."""
    runtime, source, pool = runtime_assigned()
    runtime._dispatch([message(offset, 1) for offset in range(3)], 0.0)
    runtime._dispatch(
        [*(message(offset, 1) for offset in range(3, 6)), *(message(offset, 2) for offset in (8, 9, 10))], 1.0
    )
    assert held(pool) == [(offset, 1) for offset in range(6)], "3-5 taken, 8-10 not"
    assert source.seeks == [{P0: FetchPosition(6, 1)}]
    assert runtime.partitions[P0].outstanding == 6 and runtime.inflight == 6
    assert runtime.partitions[P0].receive_times._marks[-1] == (3, 1.0), "the run's mark stays: 3-5 were taken"


def test_a_refused_batch_leaves_no_receive_time_behind() -> None:
    """The refused record's batch mark would make the re-fetched 3-5 look older than they are."""
    runtime, _source, _pool = runtime_assigned()
    runtime._dispatch([message(offset, 1) for offset in range(3)], 0.0)
    runtime._dispatch([message(6, 2)], 4.0)
    runtime._dispatch([message(offset, 1) for offset in range(3, 6)], 5.0)
    times = runtime.partitions[P0].receive_times
    assert times._marks[-1] == (3, 5.0) and (6, 4.0) not in times._marks


def test_a_truncation_with_no_new_record_yet_is_found_by_the_clients_lost_position() -> None:
    """Soak seeds 2140, 4024, 4136, 4751: the log truncated at 30 while the pod had read 0-9 and the client had
    prefetched to 37; librdkafka sought to 30, purging 10-36, and no record was written past 30 yet, so no
    record came to raise EpochGap: 10-29 (the same in both logs) waited for good. A partition whose position
    the client no longer knows, though the pod read it and did not seek it, is sought back."""
    runtime, source, pool = runtime_assigned()
    runtime._dispatch([message(offset, 1) for offset in range(10)], 0.0)
    pool.finish(10)
    runtime._collect_completions()
    source.client_positions[P0] = 10
    runtime._fetch_where_the_client_lost_its_place()
    assert source.seeks == [], "the client knows its place: nothing to do"
    del source.client_positions[P0]  # librdkafka's own seek to the truncation point reset its position
    runtime._fetch_where_the_client_lost_its_place()
    assert source.seeks == [{P0: FetchPosition(10, 1)}], "sought back to where the pod is, validated with epoch 1"
    runtime._fetch_where_the_client_lost_its_place()
    assert len(source.seeks) == 1, "once: the pod's own seek leaves the position unknown until the next record"
    runtime._dispatch([message(10, 1)], 1.0)
    assert runtime.partitions[P0].sought_at is None, "a record: the client knows its place again"


class DrainingSource(SeekingSource):
    """FAKE Source whose ``consume`` hands out nothing (the client holds nothing more), with a settable end offset."""

    def __init__(self) -> None:
        super().__init__()
        self.end: int | None = None

    def high_watermark(self, partition: TopicPartitionId) -> int | None:
        # the end offset as librdkafka caches it from fetch responses (src/rdkafka_fetcher.c keeps the response's
        # HighwaterMarkOffset in rktp_hi_offset; rd_kafka_get_watermark_offsets reads it)
        return self.end


@pytest.mark.parametrize("blocked_key", [False, True], ids=["idle partition", "a blocked key in flight"])
def test_a_purge_after_the_pods_own_seek_is_found_once_the_client_has_handed_out_all_it_held(
    blocked_key: bool,
) -> None:
    """Simulation seed 51737: flow control resumed the partition with a seek to 12 (its position unknown until
    the next record), the client prefetched 12-77, then the log was truncated at 56: librdkafka sought to 56
    and purged 12-77, 12-55 too, and no record past 56 came. The pod's own seek hid the loss, and a key blocked
    in flight (``on_exhausted=block``) kept the partition from counting as idle: 12-55 waited for good. Now, a
    second after the pod's seek, a client that has handed out all it held, none of the partition, while the
    broker has records past 12, has lost its place. Records of the partition queued behind others' are not
    taken for a loss: until the client is drained, nothing is done."""
    clock, completions = FakeClock(), Completions()
    source, pool = DrainingSource(), HoldingPool(completions)
    limits = FlowLimits(max_inflight=100, max_inflight_per_partition=100, max_uncommitted=100, pause_after=1.0)
    runtime = ConsumerRuntime(
        RuntimeSettings(topics=("t",), flow=limits), source, pool, Ordering.KEY, completions, clock, clock.sleep
    )
    runtime._on_assign([P0])
    runtime._dispatch([message(offset, 1) for offset in range(12)], clock())
    pool.finish(11 if blocked_key else 12)
    runtime._collect_completions()
    runtime._resume({P0: FetchPosition(12, 1)})  # flow control's resume after a pause: the pod's own seek
    source.seeks.clear()
    source.end = 56
    runtime._read()  # the client is drained right after the seek: its first fetch may still be on its way
    clock.now += 0.5
    runtime._fetch_where_the_client_lost_its_place()
    assert source.seeks == [], "half a second after the pod's seek: its fetch may still be on its way"
    clock.now += 0.6
    runtime._fetch_where_the_client_lost_its_place()
    assert source.seeks == [], "the client has not been drained since the seek's patience ran out"
    runtime._read()  # drained again, past the patience: nothing of the partition came
    runtime._fetch_where_the_client_lost_its_place()
    assert source.seeks == [{P0: FetchPosition(12, 1)}], "sought back to 12, validated with epoch 1"
    assert runtime.partitions[P0].sought_at == clock.now


def test_a_sought_partition_at_the_end_of_its_log_has_not_lost_its_place() -> None:
    """Sought, drained and idle at the end of the log (nothing past where the pod fetches): no record is due."""
    runtime, _source, _pool = runtime_assigned()
    runtime._dispatch([message(offset, 1) for offset in range(12)], 0.0)
    runtime._resume({P0: FetchPosition(12, 1)})
    state = runtime.partitions[P0]
    assert state.sought_at is not None
    assert not state.lost_place(None, 12, drained_at=state.sought_at + 5.0), "the broker has nothing past 12"
    assert state.lost_place(None, 13, drained_at=state.sought_at + 5.0), "the broker has 12: it did not come"
    assert state.lost_place(None, None, drained_at=state.sought_at + 5.0), "an unknown end offset: fetch again"
    assert not state.lost_place(12, 56, drained_at=state.sought_at + 5.0), "the client knows its place"


def test_an_offset_completed_twice_leaves_the_other_partitions_counts_right() -> None:
    """Completing an offset twice is a bug (``OffsetOrderError``, the poll loop stops); the other partitions'
    completions taken in the same turn still leave their in-flight counts, or a revoke or the shutdown would
    wait for them out its whole timeout."""
    from keyorder.core.tracking import OffsetOrderError

    runtime, _source, pool = runtime_assigned()
    runtime._on_assign([("t", 1)])
    runtime._dispatch([message(0, 1), Message("t", 1, 0, b"x", b"{}", leader_epoch=1)], 0.0)
    first, other = pool.held
    runtime.completions.extend([(first, True), (first, True), (other, True)])
    with pytest.raises(OffsetOrderError):
        runtime._collect_completions()
    assert runtime.partitions[("t", 1)].outstanding == 0
