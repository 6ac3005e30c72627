"""The commit protocol with a FAKE clock and a FAKE recording source: pacing, skips and resends."""

from __future__ import annotations

import pytest

from keyorder.core import offset_metadata
from keyorder.core.partitions import PartitionState
from keyorder.core.tracking import PartitionOffsets
from keyorder.engine.committer import EARLY_COMMIT_SPACING, Committer
from tests.fakes import RecordingSource

PID = ("orders", 0)


def partition(start: int = 100, done: range = range(100, 103)) -> PartitionState:
    state = PartitionState(PID, PartitionOffsets(start, set()))
    for offset in range(start, start + 10):
        state.offsets.received(offset)
    for offset in done:
        state.offsets.completed(offset)
    return state


def committed_positions(source: RecordingSource) -> list[int]:
    return [offsets[PID][0] for offsets, _asynchronous in source.commits]


def test_periodic_commits_once_per_interval_and_skips_an_unchanged_mark() -> None:
    source, state = RecordingSource(), partition()
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    committer.periodic([state], now=0.0)
    assert committed_positions(source) == [103], "the lowest unfinished offset"
    state.offsets.completed(103)
    committer.periodic([state], now=0.99)
    assert committed_positions(source) == [103], "not before the interval"
    committer.periodic([state], now=1.0)
    assert committed_positions(source) == [103, 104]
    committer.periodic([state], now=2.0)
    assert committed_positions(source) == [103, 104], "nothing moved: no commit"
    assert committer.commits == 2


def test_a_changed_completed_set_above_a_stuck_offset_is_committed_again() -> None:
    source, state = RecordingSource(), partition(done=range(101, 103))  # 100 is stuck
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    committer.periodic([state], now=0.0)
    state.offsets.completed(105)
    committer.periodic([state], now=1.0)
    assert committed_positions(source) == [100, 100], "same position, new metadata"
    state.offsets.completed(106)
    committer.early([state], now=2.0, pressure=True)
    assert committed_positions(source) == [100, 100], "an early commit only goes out when the position moved"


@pytest.mark.parametrize(
    ("pressure", "times", "expected"),
    [
        (False, [0.0, 0.5], 0),
        (True, [0.0], 1),
        (True, [0.0, EARLY_COMMIT_SPACING / 2], 1),  # paced
        (True, [0.0, EARLY_COMMIT_SPACING], 2),
    ],
)
def test_early_commits_only_under_pressure_and_paced(pressure: bool, times: list[float], expected: int) -> None:
    source, state = RecordingSource(), partition(done=range(0))
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    for now in times:
        state.offsets.completed(state.offsets.commit_position or 0)  # the position moves every time
        committer.early([state], now=now, pressure=pressure)
    assert len(source.commits) == expected
    assert all(asynchronous for _offsets, asynchronous in source.commits)


def test_a_failed_commit_request_is_sent_again_by_the_next_commit() -> None:
    source, state = RecordingSource(), partition()
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    source.fail_next_commit = "rebalance in progress"
    committer.periodic([state], now=0.0)
    assert source.commits == [] and committer.failures == 1 and state.last_committed is None
    committer.periodic([state], now=1.0)
    assert committed_positions(source) == [103], "the same mark is sent again"


def test_a_failed_partition_result_forces_a_resend() -> None:
    source, state = RecordingSource(), partition()
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    committer.commit([state], asynchronous=True)
    committer.record_outcomes([(PID, 103, "coordinator moved")])
    assert state.last_committed is None and committer.failures == 1
    committer.commit([state], asynchronous=False)
    assert committed_positions(source) == [103, 103]


def test_a_synchronous_commit_resends_a_mark_the_broker_has_not_confirmed() -> None:
    """Shutdown right after an asynchronous commit: its result may never arrive, so send it again."""
    source, state = RecordingSource(), partition()
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    committer.periodic([state], now=0.0)  # asynchronous: no result yet
    committer.commit([state], asynchronous=False)
    assert [asynchronous for _offsets, asynchronous in source.commits] == [True, False]
    committer.commit([state], asynchronous=False)
    assert len(source.commits) == 2, "confirmed by the synchronous commit: nothing to resend"


def test_an_idle_partition_commits_the_clients_position_past_a_transaction_marker() -> None:
    """FAKE source reporting the client's position: 0-9 handled, the marker at 10 passed by the client."""
    source = RecordingSource()
    state = PartitionState(PID, PartitionOffsets(0, set()))
    for offset in range(10):
        state.offsets.received(offset)
    for offset in range(9):
        state.offsets.completed(offset)
    source.client_positions[PID] = 11
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    committer.periodic([state], now=0.0)
    assert committed_positions(source) == [9], "offset 9 is still in flight: the client's position is not used"
    state.offsets.completed(9)
    committer.periodic([state], now=1.0)
    assert committed_positions(source) == [9, 11], "idle: past the marker to the client's position"
    del source.client_positions[PID]
    committer.commit([state], asynchronous=False)
    assert committed_positions(source)[-1] == 11, "a position once passed stays passed"


def test_a_commit_records_the_greatest_leader_epoch_received_in_its_metadata() -> None:
    """Issue 36, finding F6: the next owner tells by it whether the done offsets are about the log it reads."""
    source = RecordingSource()
    state = PartitionState(PID, PartitionOffsets(100, set()))
    for offset, epoch in [(100, 3), (101, 3), (102, 4)]:
        state.offsets.received(offset, epoch)
    state.offsets.completed(101, 3)
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    committer.periodic([state], now=0.0)
    ((offsets, _asynchronous),) = source.commits
    position, metadata = offsets[PID]
    decoded = offset_metadata.decode_checked(metadata, position)
    assert (position, decoded.done, decoded.leader_epoch) == (100, {101}, 4)


def test_a_late_confirmation_of_a_position_from_before_a_truncation_confirms_nothing() -> None:
    source = RecordingSource()
    state = PartitionState(PID, PartitionOffsets(100, set()))
    for offset in range(100, 110):
        state.offsets.received(offset, 1)
        state.offsets.completed(offset, 1)
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    committer.periodic([state], now=0.0)
    assert committed_positions(source) == [110]
    state.offsets.truncate(104, 2)  # the log was truncated at 104 and refilled under epoch 2
    committer.record_outcomes([(PID, 110, None)])  # the asynchronous commit of 110 answers only now
    assert state.confirmed is None, "110 is a position in a log that is gone"
    committer.commit([state], asynchronous=False)
    assert committed_positions(source) == [110, 104], "the commit position moved back to the truncation point"


def test_a_truncation_that_leaves_the_mark_the_same_size_still_sends_the_new_metadata() -> None:
    """The mark once was (position, number of done offsets): after a truncation, the new log's done set of the
    same size at the same position was never sent, and the stored metadata kept the old log's set."""
    source = RecordingSource()
    state = PartitionState(PID, PartitionOffsets(100, set()))
    for offset in range(100, 103):
        state.offsets.received(offset, 1)
    state.offsets.completed(102, 1)
    committer = Committer(source, interval=1.0, partition={PID: state}.get, now=0.0)
    committer.periodic([state], now=0.0)
    state.offsets.truncate(101, 2)  # 101 and 102 are gone; the new log's 101-103 arrive under epoch 2
    for offset in range(101, 104):
        state.offsets.received(offset, 2)
    state.offsets.completed(103, 2)
    committer.periodic([state], now=1.0)
    sent = [offsets[PID] for offsets, _asynchronous in source.commits]
    decoded = [offset_metadata.decode_checked(metadata, position) for position, metadata in sent]
    assert [(position, d.done, d.leader_epoch) for (position, _m), d in zip(sent, decoded, strict=True)] == [
        (100, {102}, 1),
        (100, {103}, 2),
    ]
