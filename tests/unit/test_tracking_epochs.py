"""PartitionOffsets and leader epochs (issue 36, simulation findings F3 and F6): a log truncated and refilled
under a greater epoch is told from a re-delivery, and from a clean leader change, which resets nothing."""

from __future__ import annotations

import pytest

from keyorder.core.tracking import EpochGap, LogTruncated, PartitionOffsets, ReceiveTimes


def fetched(start: int, offsets: range, epoch: int) -> PartitionOffsets:
    tracker = PartitionOffsets(start)
    for offset in offsets:
        assert tracker.received(offset, epoch) is True
    return tracker


def test_a_record_of_a_greater_epoch_at_an_offset_received_is_a_new_log_not_a_re_delivery() -> None:
    """F3: the log was truncated at 5 while 0-9 were received (0-2 finished, 6 finished too); librdkafka
    brought the position back to 5 and the new log's 5 arrives under epoch 2."""
    tracker = fetched(0, range(10), epoch=1)
    for offset in (0, 1, 2, 6):
        tracker.completed(offset, 1)
    assert tracker.received(5, 1) is False, "the same epoch at an offset received: a re-delivery"
    with pytest.raises(LogTruncated) as caught:
        tracker.received(5, 2)
    assert (caught.value.offset, caught.value.leader_epoch) == (5, 2)
    assert tracker.last_received == 9 and tracker.commit_position == 3, "raised before changing anything"

    tracker.truncate(5, 2)
    assert tracker.commit_position == 3, "3 and 4 (the same records in both logs) are still unfinished"
    assert tracker.completed_above_position() == [], "6 was done in the old log: not in the new one"
    assert tracker.resets == 1 and tracker.leader_epoch == 2
    for offset in range(5, 8):
        assert tracker.received(offset, 2) is True, f"the new log's {offset} is processed"
    assert tracker.inflight == 5  # 3, 4 of the old log; 5, 6, 7 of the new one


def test_the_old_logs_messages_still_running_never_mark_the_new_records_done() -> None:
    tracker = fetched(0, range(10), epoch=1)
    tracker.truncate(5, 2)
    for offset in (5, 6):
        tracker.received(offset, 2)
    assert tracker.is_stale(6, 1) and not tracker.is_stale(4, 1) and not tracker.is_stale(6, 2)
    assert tracker.completed(6, 1) is False, "old 6 finished: its completion is ignored"
    assert tracker.completed(8, 1) is False, "old 8 finished: not even received in the new log"
    for offset in range(5):
        assert tracker.completed(offset, 1) is True
    assert tracker.commit_position == 5, "new 5 and 6 are still unfinished"
    tracker.completed(5, 2)
    tracker.completed(6, 2)
    assert tracker.commit_position == 7


def test_a_truncation_below_every_unfinished_offset_moves_the_commit_position_back() -> None:
    tracker = fetched(10, range(10, 20), epoch=1)
    for offset in range(10, 20):
        tracker.completed(offset, 1)
    assert tracker.commit_position == 20
    sent = tracker.commit_sent()
    tracker.truncate(7, 2)  # below the committed offset the partition was assigned from
    assert tracker.commit_position == 7 and tracker.next_fetch == 7
    assert tracker.reset_from == 20
    assert tracker.commit_confirmed(sent) is False, "a late confirmation of the old log's 20 confirms nothing"
    assert tracker.uncommitted == 0
    assert tracker.received(7, 2) is True


def test_a_clean_leader_change_resets_nothing() -> None:
    """A greater epoch above the last received offset: new records after a leader change, same log."""
    tracker = fetched(0, range(5), epoch=1)
    assert tracker.received(5, 2) is True
    assert tracker.received(4, 2) is False, "a re-delivery of 4 (now under epoch 2 as the highest seen)"
    assert tracker.received(3, 1) is False
    assert tracker.resets == 0 and tracker.leader_epoch == 2 and tracker.commit_position == 0


def test_records_without_an_epoch_behave_as_before() -> None:
    tracker = fetched(0, range(5), epoch=1)
    assert tracker.received(3) is False, "no epoch: an offset received is a re-delivery"
    plain = PartitionOffsets(0)
    assert plain.received(0) is True and plain.received(0, 5) is False and plain.leader_epoch is None


def test_metadata_done_offsets_are_skipped_only_for_records_of_its_log() -> None:
    """F6: the metadata of a commit at 2 (greatest epoch 1) marks 3-5 done; records of epoch 1 there are the
    records it was about, skipped; a record of epoch 2 at 3 is another record: the log was truncated and
    refilled since, and the rest of the metadata is forgotten."""
    same = PartitionOffsets(2, {3, 4, 5}, prior_epoch=1)
    assert [same.received(offset, 1) for offset in range(2, 7)] == [True, False, False, False, True]
    assert same.skipped == 3

    refilled = PartitionOffsets(2, {3, 4, 5}, prior_epoch=1)
    assert refilled.leader_epoch == 1, "a commit before any record carries the metadata's epoch"
    assert [refilled.received(offset, 2) for offset in range(2, 7)] == [True] * 5
    assert refilled.skipped == 0


def test_metadata_done_offsets_survive_a_clean_leader_change_above_them() -> None:
    tracker = PartitionOffsets(2, {3, 4}, prior_epoch=1)
    assert [tracker.received(offset, epoch) for offset, epoch in [(2, 1), (3, 1), (4, 1), (5, 2)]] == [
        True,
        False,
        False,
        True,
    ]
    assert tracker.skipped == 2


def test_the_age_of_the_oldest_message_counts_from_the_new_logs_arrival_after_a_truncation() -> None:
    times = ReceiveTimes()
    times.mark(0, 1.0)
    times.mark(5, 2.0)
    times.mark(8, 3.0)
    times.truncate(6, 10.0)  # the old log's 8-... are gone; the new 6 arrived at 10.0
    assert times.oldest_age(3, now=12.0) == 11.0
    assert times.oldest_age(6, now=12.0) == 2.0, "not from the old log's mark of 8 at 3.0"


def test_a_greater_epoch_above_the_next_expected_offset_is_refused_once() -> None:
    """Prefetched records below a truncation point purged by librdkafka's seek: 6 of epoch 2 arrives after 2."""
    tracker = fetched(0, range(3), epoch=1)
    with pytest.raises(EpochGap) as caught:
        tracker.received(6, 2)
    assert (caught.value.offset, caught.value.resume_at, caught.value.leader_epoch) == (6, 3, 1)
    assert tracker.last_received == 2 and tracker.leader_epoch == 1, "raised before changing anything"
    assert tracker.received(6, 2) is True, "the same record again (a real gap after the seek back) is taken"
    assert tracker.leader_epoch == 2 and tracker.commit_position == 0


def test_without_a_known_epoch_or_right_after_the_last_offset_there_is_no_check() -> None:
    tracker = PartitionOffsets(0)
    assert tracker.received(0) and tracker.received(5, 1), "no epoch known before: as before"
    assert tracker.received(6, 2), "the next offset under a greater epoch: a clean leader change"
    assert tracker.received(9, 2), "a gap under the same epoch: compaction or transaction markers"
    resumed = PartitionOffsets(10, (), prior_epoch=3)
    with pytest.raises(EpochGap) as caught:
        resumed.received(12, 4)
    assert caught.value.resume_at == 10, "nothing received: the committed offset is expected"


def test_a_gap_is_checked_once_per_epoch_so_a_reset_after_the_seek_back_cannot_loop() -> None:
    """Review finding: the seek back went to an offset that no longer exists (retention moved the log's start;
    ``auto.offset.reset=latest``), so the client resets and hands out 1001, not 1000 again. Taking only the
    same record again refused 1001, 1002, ... one after the other, each with a seek back to 10: nothing ran."""
    resumed = PartitionOffsets(10, (), prior_epoch=3)
    with pytest.raises(EpochGap):
        resumed.received(1000, 5)
    assert resumed.received(1001, 5) is True, "another record of the refused epoch after the seek back: taken"
    assert resumed.received(1002, 5) is True
    assert resumed.commit_position == 1001, "1001 and 1002 wait to be handled"
    with pytest.raises(EpochGap):
        resumed.received(1100, 6)  # the next greater epoch above the next offset is checked again
