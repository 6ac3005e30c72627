"""PartitionOffsets and ReceiveTimes: the commit position never passes an unfinished offset."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyorder.core.tracking import EpochGap, LogTruncated, OffsetOrderError, PartitionOffsets, ReceiveTimes


@st.composite
def received_and_completion_order(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    """A start offset, increasing received offsets with random gaps, and a completion order."""
    start = draw(st.integers(0, 10**12))
    gaps = draw(st.lists(st.integers(0, 5), min_size=1, max_size=60))
    offsets, cursor = [], start
    for gap in gaps:
        cursor += gap  # gap 0: consecutive; > 0: compaction / transaction markers
        offsets.append(cursor)
        cursor += 1
    order = draw(st.permutations(offsets))
    return start, offsets, order


def _check(tracker: PartitionOffsets, received: list[int], done: set[int]) -> None:
    unfinished = [offset for offset in received if offset not in done]
    position = tracker.commit_position
    assert position is not None
    assert all(position <= offset for offset in unfinished), "commit position passed an unfinished offset"
    if unfinished:
        assert position == min(unfinished)
        assert tracker.min_inflight == min(unfinished)
    else:
        assert position == received[-1] + 1
        assert tracker.min_inflight is None
    assert tracker.inflight == len(unfinished)
    assert tracker.completed_above_position() == sorted(offset for offset in done if offset > position)


@settings(max_examples=300)
@given(received_and_completion_order())
def test_commit_position_is_the_lowest_unfinished_offset_after_every_completion(
    case: tuple[int, list[int], list[int]],
) -> None:
    start, offsets, order = case
    tracker = PartitionOffsets(start)
    assert tracker.commit_position == start
    for offset in offsets:
        assert tracker.received(offset) is True
    _check(tracker, offsets, set())
    done: set[int] = set()
    for offset in order:
        tracker.completed(offset)
        done.add(offset)
        _check(tracker, offsets, done)
    assert tracker.commit_position == offsets[-1] + 1
    assert tracker.inflight == 0
    assert tracker.completed_above_position() == []


@settings(max_examples=150)
@given(data=st.data())
def test_interleaved_receives_and_completions_keep_the_invariant(data: st.DataObject) -> None:
    """Batches arrive while earlier messages are still finishing, as in the poll loop."""
    tracker = PartitionOffsets(start=data.draw(st.integers(0, 1000)))
    cursor = tracker.start
    assert cursor is not None
    received: list[int] = []
    done: set[int] = set()
    for _ in range(data.draw(st.integers(1, 40))):
        if data.draw(st.booleans()):
            for _ in range(data.draw(st.integers(1, 5))):
                cursor += data.draw(st.integers(0, 3))
                assert tracker.received(cursor) is True
                received.append(cursor)
                cursor += 1
        unfinished = [offset for offset in received if offset not in done]
        if unfinished and data.draw(st.booleans()):
            offset = data.draw(st.sampled_from(unfinished))
            tracker.completed(offset)
            done.add(offset)
        if received:
            _check(tracker, received, done)
            assert tracker.next_fetch == received[-1] + 1


@pytest.mark.parametrize("again", [0, 3, 4, 2])
def test_redelivery_of_an_already_received_offset_is_not_processed(again: int) -> None:
    tracker = PartitionOffsets(start=0)
    for offset in (0, 2, 4):
        assert tracker.received(offset) is True
    assert tracker.received(again) is False
    assert tracker.inflight == 3
    assert tracker.commit_position == 0


def test_an_offset_below_the_start_is_a_log_reset_and_is_processed() -> None:
    """Topic recreated or truncated: the client resets below the committed offset; nothing may be dropped."""
    tracker = PartitionOffsets(start=1000, prior_done={1001, 1002})
    assert tracker.received(3) is True
    assert (tracker.resets, tracker.reset_from, tracker.start) == (1, 1000, 3)
    assert tracker.commit_position == 3, "the new log is committed from the reset offset, not from the old start"
    assert tracker.received(4) is True
    tracker.completed(3)
    tracker.completed(4)
    assert tracker.commit_position == 5
    assert tracker.next_fetch == 5
    assert tracker.skipped == 0
    for offset in (5, 1001, 1002):  # the old log's commit metadata no longer applies
        assert tracker.received(offset) is True
    assert tracker.resets == 1


def test_a_reset_forgets_commits_sent_for_the_old_log() -> None:
    tracker = PartitionOffsets(start=1000)
    old = tracker.commit_sent()
    assert old == 1000
    for offset in range(5):
        tracker.received(offset)
        tracker.completed(offset)
    sent = tracker.commit_sent()
    tracker.commit_confirmed(old)  # a late confirmation of the old position supersedes nothing new
    tracker.commit_confirmed(sent)
    assert tracker.uncommitted == 0


def test_only_offsets_the_metadata_marked_done_count_as_skipped() -> None:
    tracker = PartitionOffsets(start=10, prior_done={12})
    for offset in (10, 11, 12, 13):
        tracker.received(offset)
    assert tracker.received(11) is False  # a re-delivery: not processed, not "skipped"
    assert tracker.received(12) is False
    assert tracker.skipped == 1
    assert tracker.resets == 0


def test_prior_done_offsets_are_skipped_and_count_as_completed() -> None:
    tracker = PartitionOffsets(start=10, prior_done={11, 12, 14})
    verdicts = {offset: tracker.received(offset) for offset in range(10, 16)}
    assert verdicts == {10: True, 11: False, 12: False, 13: True, 14: False, 15: True}
    assert tracker.inflight == 3  # 10, 13, 15
    assert tracker.commit_position == 10
    assert tracker.completed_above_position() == [11, 12, 14]

    tracker.completed(10)
    assert tracker.commit_position == 13
    assert tracker.completed_above_position() == [14]
    tracker.completed(15)
    assert tracker.commit_position == 13
    tracker.completed(13)
    assert tracker.commit_position == 16
    assert tracker.inflight == 0
    assert tracker.completed_above_position() == []


def test_prior_done_offsets_at_the_head_advance_the_position_directly() -> None:
    tracker = PartitionOffsets(start=10, prior_done={10, 11})
    assert tracker.received(10) is False
    assert tracker.commit_position == 11
    assert tracker.received(11) is False
    assert tracker.commit_position == 12
    assert tracker.inflight == 0
    assert tracker.received(12) is True
    assert tracker.commit_position == 12


def test_prior_done_offset_cannot_be_completed_again() -> None:
    tracker = PartitionOffsets(start=0, prior_done={1})
    tracker.received(0)
    tracker.received(1)
    with pytest.raises(OffsetOrderError):
        tracker.completed(1)


def test_completing_twice_raises() -> None:
    tracker = PartitionOffsets(start=0)
    for offset in range(3):
        tracker.received(offset)
    tracker.completed(1)  # above the head: remembered as done
    with pytest.raises(OffsetOrderError, match="offset 1"):
        tracker.completed(1)
    tracker.completed(0)  # the head: position moves past 0 and 1
    with pytest.raises(OffsetOrderError, match="offset 0"):
        tracker.completed(0)
    tracker.completed(2)
    with pytest.raises(OffsetOrderError):
        tracker.completed(2)  # nothing pending any more
    assert tracker.commit_position == 3


@pytest.mark.parametrize("offset", [0, 4])
def test_completing_below_the_lowest_unfinished_raises(offset: int) -> None:
    tracker = PartitionOffsets(start=5)
    tracker.received(5)
    with pytest.raises(OffsetOrderError):
        tracker.completed(offset)
    assert issubclass(OffsetOrderError, ValueError)


def test_completing_on_an_empty_tracker_raises() -> None:
    with pytest.raises(OffsetOrderError):
        PartitionOffsets(start=0).completed(0)


@pytest.mark.parametrize("never_received", [8, 100])
def test_completing_a_never_received_offset_raises(never_received: int) -> None:
    tracker = PartitionOffsets(start=5)
    tracker.received(5)
    tracker.received(7)  # 8 and 100 are beyond the last received offset
    with pytest.raises(OffsetOrderError):
        tracker.completed(never_received)
    assert tracker.inflight == 2
    assert tracker.completed_above_position() == []


@pytest.mark.parametrize(
    ("start", "received", "commit_position", "next_fetch"),
    [
        (None, [], None, None),
        (42, [], 42, 42),
        (None, [7], 7, 8),  # start unknown: the first received offset is the floor
        (42, [42, 45], 42, 46),
    ],
)
def test_positions_before_completion(
    start: int | None, received: list[int], commit_position: int | None, next_fetch: int | None
) -> None:
    tracker = PartitionOffsets(start)
    for offset in received:
        tracker.received(offset)
    assert tracker.commit_position == commit_position
    assert tracker.next_fetch == next_fetch


# Batches arrived at offsets 0 (t=100), 10 (t=105) and 20 (t=110); now is t=120.
@pytest.mark.parametrize(
    ("min_inflight", "age"),
    [(0, 20.0), (5, 20.0), (9, 20.0), (10, 15.0), (15, 15.0), (20, 10.0), (25, 10.0), (None, 0.0)],
)
def test_oldest_age_is_measured_from_the_batch_holding_the_min_offset(min_inflight: int | None, age: float) -> None:
    times = ReceiveTimes()
    for first_offset, at in ((0, 100.0), (10, 105.0), (20, 110.0)):
        times.mark(first_offset, at)
    assert times.oldest_age(min_inflight, now=120.0) == pytest.approx(age)


def test_oldest_age_without_marks_is_zero() -> None:
    assert ReceiveTimes().oldest_age(5, now=50.0) == 0.0


def test_oldest_age_follows_the_min_offset_forward_and_idle_forgets_marks() -> None:
    times = ReceiveTimes()
    times.mark(0, 1.0)
    times.mark(10, 2.0)
    assert times.oldest_age(3, now=5.0) == pytest.approx(4.0)
    assert times.oldest_age(12, now=6.0) == pytest.approx(4.0)
    assert times.oldest_age(None, now=7.0) == 0.0  # idle: old batches no longer matter
    assert times.oldest_age(12, now=8.0) == 0.0
    times.mark(30, 9.0)
    assert times.oldest_age(30, now=10.0) == pytest.approx(1.0)


@settings(max_examples=200)
@given(case=received_and_completion_order(), data=st.data())
def test_prior_done_offsets_never_hold_back_the_position(
    case: tuple[int, list[int], list[int]], data: st.DataObject
) -> None:
    start, offsets, order = case
    prior = set(data.draw(st.sets(st.sampled_from(offsets))))
    tracker = PartitionOffsets(start, prior_done=prior)
    for offset in offsets:
        assert tracker.received(offset) is (offset not in prior)
    done = set(prior)
    _check(tracker, offsets, done)
    for offset in order:
        if offset in prior:
            continue
        tracker.completed(offset)
        done.add(offset)
        _check(tracker, offsets, done)
    assert tracker.commit_position == offsets[-1] + 1


def test_uncommitted_window_shrinks_only_when_a_commit_is_confirmed() -> None:
    tracker = PartitionOffsets(start=0)
    for offset in range(10):
        tracker.received(offset)
    for offset in range(6):
        tracker.completed(offset)
    assert tracker.uncommitted == 10
    sent = tracker.commit_sent()
    assert sent == 6
    assert tracker.uncommitted == 10, "an unacknowledged commit must not shrink the window"
    tracker.commit_failed(sent)
    assert tracker.uncommitted == 10
    tracker.commit_confirmed(tracker.commit_sent())
    assert tracker.uncommitted == 4
    tracker.completed(6)
    first = tracker.commit_sent()
    tracker.completed(7)
    second = tracker.commit_sent()
    tracker.commit_confirmed(second)  # a newer confirmation supersedes the older pending send
    assert (first, second, tracker.uncommitted) == (7, 8, 2)
    tracker.commit_confirmed(first)  # a late, older confirmation never grows the window back
    assert tracker.uncommitted == 2


def _idle_tracker(start: int = 0, last: int = 9) -> PartitionOffsets:
    tracker = PartitionOffsets(start)
    for offset in range(start, last + 1):
        tracker.received(offset)
        tracker.completed(offset)
    return tracker


def test_an_idle_partition_commits_past_offsets_the_client_skipped() -> None:
    """Offsets 0-9 are data, 10 is a transaction's commit marker: the client's position is 11."""
    tracker = _idle_tracker()
    assert tracker.commit_position == 10
    assert tracker.passed_by_client(11) is True
    assert tracker.commit_position == 11, "lag 0: the marker is committed past"
    assert tracker.passed_by_client(11) is False, "already there"
    tracker.received(11)  # the next transaction's first record
    assert tracker.commit_position == 11
    tracker.completed(11)
    assert tracker.commit_position == 12


def test_a_marker_at_the_committed_offset_is_passed_before_anything_is_received() -> None:
    tracker = PartitionOffsets(start=10)
    assert tracker.passed_by_client(11) is True
    assert tracker.commit_position == 11


@pytest.mark.parametrize(
    ("name", "position"),
    [
        ("position unknown (nothing consumed yet)", None),
        ("position at the idle position", 10),
        ("position behind it (a seek back)", 7),
    ],
)
def test_the_client_position_never_moves_the_commit_position_back_or_from_nothing(
    name: str, position: int | None
) -> None:
    tracker = _idle_tracker()
    assert tracker.passed_by_client(position) is False, name
    assert tracker.commit_position == 10, name


def test_nothing_is_passed_while_a_message_is_in_flight() -> None:
    tracker = _idle_tracker(last=8)
    tracker.received(9)
    assert tracker.passed_by_client(12) is False
    assert tracker.commit_position == 9
    tracker.completed(9)
    assert tracker.commit_position == 10, "a position learned while busy is not kept"


def test_nothing_is_passed_when_the_partition_is_unknown() -> None:
    tracker = PartitionOffsets(start=None)
    assert tracker.passed_by_client(5) is False
    assert tracker.commit_position is None


def test_a_record_below_the_passed_position_is_still_processed() -> None:
    tracker = _idle_tracker()
    tracker.passed_by_client(12)
    assert tracker.received(10) is True, "only a seek back delivers it; it is processed, never dropped"
    assert tracker.commit_position == 10
    tracker.completed(10)
    assert tracker.commit_position == 12


def test_a_log_reset_forgets_the_passed_position() -> None:
    tracker = PartitionOffsets(start=1000)
    tracker.passed_by_client(1001)
    tracker.received(998)  # reset below the committed offset
    tracker.completed(998)
    assert tracker.commit_position == 999, "the new log's 999 and 1000 were never received or passed"


@settings(max_examples=200, deadline=None)
@given(
    first=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    run=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    epochs=st.lists(st.sampled_from([None, 3, 4, 5]), min_size=9, max_size=16),
    prior_done=st.sets(st.integers(0, 40), max_size=3),
    start=st.one_of(st.none(), st.integers(0, 10)),
)
def test_a_run_received_at_once_is_the_run_received_one_by_one_or_nothing(
    first: list[int], run: list[int], epochs: list[int | None], prior_done: set[int], start: int | None
) -> None:
    """``received_run`` records a run only when ``received`` for each of its records would take each, with
    nothing else happening; then both leave the same state. Otherwise it records nothing (the caller goes
    record by record)."""

    def tracker_after_first() -> PartitionOffsets:
        tracker = PartitionOffsets(start, prior_done, 3)
        for offset, epoch in zip(first, epochs, strict=False):
            # LogTruncated, EpochGap: what the runtime handles; not this test's subject
            with contextlib.suppress(LogTruncated, EpochGap):
                tracker.received(offset, epoch)
        return tracker

    run_epochs = epochs[len(first) : len(first) + len(run)] + [epochs[-1]] * len(run)
    run_epochs = run_epochs[: len(run)]
    at_once, one_by_one = tracker_after_first(), tracker_after_first()
    taken_at_once = at_once.received_run(list(run), list(run_epochs))
    if not taken_at_once:
        assert at_once.last_received == one_by_one.last_received and at_once.inflight == one_by_one.inflight
        assert at_once.received_count == one_by_one.received_count, "nothing recorded"
        return
    assert all(one_by_one.received(offset, epoch) for offset, epoch in zip(run, run_epochs, strict=True))
    for name in ("last_received", "leader_epoch", "received_count", "inflight", "commit_position", "skipped"):
        assert getattr(at_once, name) == getattr(one_by_one, name), name


def test_a_plain_run_is_received_at_once_and_the_other_cases_go_one_by_one() -> None:
    tracker = PartitionOffsets(10, (), 3)
    assert not tracker.received_run([10, 11], [3, 3]), "the partition's first record goes one by one"
    assert tracker.received(10, 3) and tracker.received(11, 3)
    assert tracker.received_run([12, 13, 15], [3, 3, 3]), "a gap (compaction, markers) is still plain"
    assert (tracker.last_received, tracker.inflight, tracker.commit_position) == (15, 5, 10)
    assert not tracker.received_run([15, 16], [3, 3]), "a re-delivery"
    assert not tracker.received_run([17, 16], [3, 3]), "not increasing"
    assert not tracker.received_run([16, 17], [3, 4]), "a new leader epoch"
    assert tracker.last_received == 15, "nothing recorded by a run refused"
    skipping = PartitionOffsets(10, {12}, 3)
    assert skipping.received(10, 3)
    assert not skipping.received_run([11, 12], [3, 3]), "an offset the commit metadata marks done"


@settings(max_examples=100, deadline=None)
@given(case=received_and_completion_order(), cut=st.integers(1, 10))
def test_completing_in_batches_is_completing_one_by_one(case: tuple[int, list[int], list[int]], cut: int) -> None:
    """``completed_all`` over slices of any completion order leaves what ``completed`` for each leaves."""
    start, offsets, order = case
    at_once, one_by_one = PartitionOffsets(start), PartitionOffsets(start)
    for offset in offsets:
        at_once.received(offset)
        one_by_one.received(offset)
    for index in range(0, len(order), cut):
        at_once.completed_all(order[index : index + cut])
        for offset in order[index : index + cut]:
            one_by_one.completed(offset)
        assert at_once.commit_position == one_by_one.commit_position
        assert at_once.inflight == one_by_one.inflight
        assert at_once.completed_above_position() == one_by_one.completed_above_position()


def test_completing_in_a_batch_what_was_completed_or_never_received_is_an_error_and_records_nothing() -> None:
    tracker = PartitionOffsets(0)
    for offset in range(5):
        tracker.received(offset)
    tracker.completed_all([3])
    for wrong in ([3], [2, 2], [5], [1, 4, 9]):
        with pytest.raises(OffsetOrderError):
            tracker.completed_all(wrong)
    assert (tracker.commit_position, tracker.inflight, tracker.completed_above_position()) == (0, 4, [3])


def test_done_offsets_of_the_metadata_that_never_arrive_do_not_keep_every_later_run_one_by_one() -> None:
    """The metadata marked 105 and 107 done; compaction removed 105 before this owner read it. Once past them,
    runs are plain again; a done offset still ahead keeps only the runs that hold it record by record."""
    tracker = PartitionOffsets(100, {105, 107, 140}, 3)
    for offset in (100, 101, 102, 103, 104, 106):
        assert tracker.received(offset, 3)
    assert not tracker.received(107, 3), "107 is skipped: done by the earlier owner"
    assert tracker.received_run([108, 109, 110], [3, 3, 3]), "105 and 107 are behind: they can never be skipped"
    assert tracker.received_run([111, 112], [3, 3]), "140 is ahead of this run"
    assert not tracker.received_run([139, 140, 141], [3, 3, 3]), "140 is in this run: one by one"
    assert tracker.skipped == 1 and tracker.last_received == 112
