"""Which offset of a partition is safe to commit: the lowest offset not yet completed.

Messages of one partition finish out of order (different keys run concurrently), so the
committed offset cannot simply follow the last completed message. ``PartitionOffsets`` records
every offset it actually received (gaps from compaction or transactions are never invented) and
reports the *commit position*: the lowest received offset not yet completed, or the last
received offset + 1 when nothing is in flight. A crash therefore re-delivers from the oldest
unfinished message and never skips one.

An offset below the committed start, before anything was received, means the log was reset
under the pod (topic recreated or truncated, and the client reset its position below the
committed offset): the tracker re-bases at that offset (``reset_from``, counted in ``resets``)
so the new records are processed and committed from there, never dropped.

The one exception to "only offsets actually received": offsets the *client* passed without handing
them out. A transaction's commit marker (and, under read_committed, an aborted transaction's
records) occupies log offsets that librdkafka skips, so "last received + 1" would stop before a
trailing marker forever (a lag of 1 on every transactional partition). The client's position
(the offset after the last record it handed out, moved past the control records it skipped) is
evidence that those offsets will never be delivered; ``passed_by_client`` lets an idle partition's
commit position follow it, and nothing else moves the position past an unreceived offset.

Completed offsets above the commit position are kept too: they go into the commit metadata
(see ``offset_metadata``) so that a restart can skip what is already done.

Leader epochs tell a new log from a re-delivery (KIP-320). Each record carries the leader epoch it
was written in (``None`` where the broker gives none: then everything above works as it always
did). Epochs only grow along a partition's log, and a log truncated by an unclean leader election
is refilled under a greater epoch than any it had. So:

* a record at or below the last received offset whose epoch is greater than every epoch received is
  not a re-delivery but a *new* record at a reused offset: ``received`` raises ``LogTruncated`` and
  the caller truncates the tracker there (``truncate``): the offsets received from that point on
  are forgotten (their messages, still queued or running, belong to a log that is gone: their
  completions are ignored, ``completed`` returns ``False``), and the commit position moves back to
  it. Librdkafka brings the fetch position back there after a truncation (KIP-320 validation);
* the commit metadata records the greatest epoch received (``leader_epoch``); a later owner that
  receives, at an offset the metadata marks done, a record of a greater epoch knows the log was
  truncated and refilled since: it forgets the rest of that metadata and processes the records.

* a record of a greater epoch than every epoch received, *above* the next expected offset (last
  received + 1), is not taken on trust: ``received`` raises ``EpochGap`` once for it. Librdkafka
  validates its *fetch* position, which runs ahead of what it handed out (prefetched records), and on a
  truncation below it seeks to the truncation point, purging the partition's queued records, those
  below the truncation point too (src/rdkafka_topic.c ``rd_kafka_toppar_leader_update`` validates
  ``rd_kafka_toppar_fetch_decide_next_fetch_start_pos``; src/rdkafka_offset.c
  ``rd_kafka_toppar_handle_OffsetForLeaderEpoch`` -> ``rd_kafka_toppar_op_seek``, whose version barrier
  drops them). The records between the expected offset and the new log would then never arrive, and
  taking the jump for an ordinary gap (compaction, transaction markers) would commit past them. The
  caller drops the partition's rest of the batch and seeks back to the expected offset with the known
  epoch, which librdkafka validates. The check is made once per epoch: whatever arrives next of that
  epoch or a greater one is accepted, the same record (a real gap) or another (the offset left the log
  and ``auto.offset.reset`` moved the fetch; the seek failed), so it can never refuse record after
  record.

A clean leader change raises the epoch too, but only for records above the last one written, so it
never resets anything: such records arrive above the last received offset and above every offset
the metadata marks done (at most one extra fetch, when such a record follows a gap).

Pure and synchronous; owned by the poll-loop thread, save ``PartitionOffsets.is_stale``, which worker
threads call too (it reads one attribute the poll loop replaces whole).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterable


class OffsetOrderError(ValueError):
    """An offset was completed twice, or below the head or above the last received offset.

    (An unreceived offset inside a gap between received ones is not detected: that would cost a
    set lookup per message, and the runtime only completes offsets it dispatched.)
    """


class LogTruncated(Exception):
    """A record at an offset already received, of a greater leader epoch: the log was truncated there.

    Raised by ``PartitionOffsets.received`` before it changes anything; the caller decides what to do
    with the work of the old log (see ``PartitionOffsets.truncate``) and then calls ``received`` again."""

    def __init__(self, offset: int, leader_epoch: int) -> None:
        super().__init__(f"offset {offset} received again under the greater leader epoch {leader_epoch}")
        self.offset = offset
        self.leader_epoch = leader_epoch


class EpochGap(Exception):
    """A record of a greater leader epoch than any received, above the next expected offset: the client may have
    dropped records below a truncation point (see the module docstring). Raised by ``PartitionOffsets.received``
    before it changes anything, once per such record; the caller drops the partition's rest of the batch and
    fetches again from ``resume_at``, validated with ``leader_epoch`` (the greatest epoch received)."""

    def __init__(self, offset: int, leader_epoch: int, resume_at: int, known_epoch: int) -> None:
        super().__init__(
            f"offset {offset} of the greater leader epoch {leader_epoch} arrived while {resume_at} was expected"
        )
        self.offset = offset
        self.resume_at = resume_at
        self.leader_epoch = known_epoch


class PartitionOffsets:
    """Received, completed and committable offsets of one partition.

    Invariants: ``pending`` holds received offsets in increasing order whose head is not
    completed; ``done`` is exactly the completed offsets still in ``pending``.
    """

    __slots__ = (
        "_client_passed",
        "_committed_received",
        "_done",
        "_gap_checked",
        "_pending",
        "_prior_done",
        "_sent",
        "_truncations",
        "last_received",
        "leader_epoch",
        "received_count",
        "reset_from",
        "resets",
        "skipped",
        "start",
    )

    def __init__(
        self, start: int | None = None, prior_done: Iterable[int] = (), prior_epoch: int | None = None
    ) -> None:
        """``start``: the committed offset consumption begins at (``None`` if unknown yet).

        ``prior_done``: offsets above ``start`` that an earlier owner already completed (from the
        commit metadata); they are skipped when received, unless a record of a greater leader epoch
        than ``prior_epoch`` (the metadata's, ``None``: unknown) arrives first.
        """
        self.start = start
        self.last_received: int | None = None
        self.leader_epoch = prior_epoch
        """The greatest leader epoch received (or the commit metadata's, before any); ``None``: unknown."""
        self._pending: deque[int] = deque()
        self._done: set[int] = set()
        self._prior_done: set[int] = set(prior_done)
        self.received_count = 0
        """Offsets received so far (skipped ones included)."""
        self.skipped = 0
        """Offsets not processed because the commit metadata marked them done (and only those)."""
        self.resets = 0
        """Times the log was found reset below ``start`` (tracking re-based at the new offset)."""
        self.reset_from: int | None = None
        """The ``start`` before the last reset (``None`` if there was none)."""
        self._committed_received = 0  # received offsets below the last *confirmed* committed position
        self._sent: dict[int, int] = {}  # commit position sent, not yet confirmed -> received offsets below it
        self._client_passed: int | None = None  # the client's position, when beyond the idle position
        # (offset, the new log's leader epoch) of each truncation; a tuple replaced whole, never changed in
        # place: worker threads read it through ``is_stale`` (``PartitionState.lets_go``) while the poll loop
        # may add one
        self._truncations: tuple[tuple[int, int], ...] = ()
        self._gap_checked: int | None = None  # the epoch an EpochGap was raised for, until a record of it is taken

    def received(self, offset: int, leader_epoch: int | None = None) -> bool:
        """Record a fetched offset and the leader epoch of its record; ``True`` if it must be processed.

        ``False`` for a re-delivery of an offset already received, and for an offset that the
        commit metadata says is already done (it is recorded as completed at once and counted in
        ``skipped``).

        The first offset received below ``start`` is a log reset (see the module docstring): the
        partition is re-based at ``offset``, its commit metadata (about the old log) forgotten,
        ``resets`` counted and ``True`` returned, so it is processed.

        Raises ``LogTruncated`` (changing nothing) for an offset at or below the last received one
        whose ``leader_epoch`` is greater than every epoch received: see ``truncate``. Raises
        ``EpochGap`` (changing nothing) the first time a record of such an epoch arrives above the next
        expected offset: once per epoch, so whatever arrives next of that epoch or a greater one is taken,
        the same record (a real gap: compaction, transaction markers) or another (the fetch sent back to an
        offset that no longer exists was reset by ``auto.offset.reset``; a seek that failed): never a loop.
        """
        known = self.leader_epoch
        last = self.last_received
        if last is not None:
            if offset <= last:
                if leader_epoch is not None and known is not None and leader_epoch > known:
                    raise LogTruncated(offset, leader_epoch)
                return False
        elif self.start is not None and offset < self.start:
            self._reset(offset)
        if leader_epoch is not None and (known is None or leader_epoch > known):
            expected = last + 1 if last is not None else self.start
            checked = self._gap_checked is not None and leader_epoch >= self._gap_checked
            if known is not None and expected is not None and offset > expected and not checked:
                self._gap_checked = leader_epoch
                raise EpochGap(offset, leader_epoch, expected, known)
            self._gap_checked = None  # the next greater epoch is checked again
            if known is not None:
                # the metadata's done offsets are about records of epochs up to ``known``: a record of a
                # greater one at an offset it marks done is another record (the log was truncated and
                # refilled); above this offset, any record of the old log has an epoch >= this one's
                self._prior_done.clear()
            self.leader_epoch = leader_epoch
        self.last_received = offset
        self.received_count += 1
        if self._prior_done and offset in self._prior_done:
            self._prior_done.discard(offset)
            self.skipped += 1
            if self._pending:
                self._pending.append(offset)
                self._done.add(offset)
            return False
        self._pending.append(offset)
        return True

    def received_run(self, offsets: list[int], leader_epochs: list[int | None]) -> bool:
        """``received`` for a run of one fetch's records, in one step, when it is the plain case: each offset
        above the last received and above the one before it, each record of the greatest leader epoch known,
        and no commit metadata left to skip by. Then each would be received fresh with nothing else
        happening, so they are recorded at once and ``True`` returned (every one must be processed).
        Otherwise nothing is recorded and ``False`` returned: the caller calls ``received`` for each (the
        first record of a partition, a new leader epoch, a truncation, a re-delivery, offsets to skip)."""
        last = self.last_received
        if last is None or offsets[0] <= last:
            return False
        if self._prior_done:
            self._forget_prior_done_through(last)
            if self._prior_done and min(self._prior_done) <= offsets[-1]:
                return False  # one of the run's offsets may be one to skip
        if leader_epochs.count(self.leader_epoch) != len(leader_epochs):
            return False
        if len(offsets) > 1 and not all(map(operator.lt, offsets, offsets[1:])):
            return False
        self.last_received = offsets[-1]
        self.received_count += len(offsets)
        self._pending.extend(offsets)
        return True

    def _forget_prior_done_through(self, last: int) -> None:
        """Drop the commit metadata's done offsets at or below ``last`` received: they can never be skipped any
        more (a record at or below it is a re-delivery), and one that never arrived (compacted away) would
        otherwise keep every later run of the partition on the record-by-record path."""
        prior = self._prior_done
        if min(prior) <= last:
            prior.difference_update([offset for offset in prior if offset <= last])

    def _reset(self, offset: int) -> None:
        """Nothing received yet and ``offset`` < ``start``: the log was reset; track from ``offset``."""
        self.reset_from = self.start
        self.start = offset
        self._prior_done.clear()  # finished offsets of the old log say nothing about the new one
        self._sent.clear()  # a late confirmation of an old-log position must not confirm new-log work
        self._client_passed = None  # a position in the old log says nothing about the new one
        self.resets += 1

    def truncate(self, offset: int, leader_epoch: int) -> None:
        """The log was truncated at ``offset`` and refilled under ``leader_epoch`` (after ``LogTruncated``).

        Offsets received from ``offset`` on are forgotten, finished or not: they were records of the
        old log. Their messages may still be queued or running; when one of them completes (an epoch
        below ``leader_epoch`` at or above ``offset``: ``is_stale``), ``completed`` ignores it, so it
        never marks the new record at its offset done. Unfinished offsets below ``offset`` stay (the
        same records in both logs). The commit position becomes the lowest of those, else ``offset``:
        it moves back. The commit metadata's done offsets, commits sent and not yet confirmed at
        positions above ``offset``, and the client's position are forgotten too; ``resets`` counts it.
        """
        pending, done = self._pending, self._done
        self.reset_from = self.commit_position
        head = pending[0] if pending else (self.last_received + 1 if self.last_received is not None else offset)
        if head > offset:  # finished offsets of the old log below the head: at most one per offset (gaps: fewer)
            self.received_count -= min(head - offset, self.received_count - len(pending))
        while pending and pending[-1] >= offset:
            done.discard(pending.pop())
            self.received_count -= 1
        self._committed_received = min(self._committed_received, self.received_count - len(pending))
        self.last_received = offset - 1
        if self.start is not None and self.start > offset:
            self.start = offset
        self._prior_done.clear()
        for position in [position for position in self._sent if position > offset]:
            del self._sent[position]  # a confirmation of an old-log position says nothing about the new log
        self._client_passed = None
        self._truncations = (*self._truncations, (offset, leader_epoch))
        self.leader_epoch = leader_epoch
        self.resets += 1

    @property
    def truncated(self) -> bool:
        """Whether the log was ever truncated since tracking began (``truncate``): only then can a message be
        stale."""
        return bool(self._truncations)

    def is_stale(self, offset: int, leader_epoch: int | None) -> bool:
        """Whether a message at ``offset`` of ``leader_epoch`` belongs to a log truncated since it was received."""
        if leader_epoch is None or not self._truncations:
            return False
        return any(offset >= at and leader_epoch < epoch for at, epoch in self._truncations)

    def completed(self, offset: int, leader_epoch: int | None = None) -> bool:
        """Record that the message at ``offset`` is finished (handled or dead-lettered).

        ``False`` (nothing recorded) when the message belongs to a log truncated since (``is_stale``)."""
        if self._truncations and self.is_stale(offset, leader_epoch):
            return False
        pending = self._pending
        if pending and pending[0] == offset:
            pending.popleft()
            done = self._done
            while pending and pending[0] in done:
                done.remove(pending.popleft())
            return True
        last = self.last_received  # not None whenever ``pending`` is non-empty
        if offset in self._done or not pending or offset < pending[0] or last is None or offset > last:
            raise OffsetOrderError(f"offset {offset} completed twice or never received")
        self._done.add(offset)
        return True

    def completed_all(self, offsets: list[int]) -> None:
        """``completed`` for each of ``offsets`` at once (a batch's messages of this partition), in any order.

        Only while the log was never truncated (``truncated``: none can be stale); the caller goes one by one
        otherwise. Raises ``OffsetOrderError``, recording nothing, when one was completed already, twice in
        ``offsets``, or never received."""
        pending, done = self._pending, self._done
        new = set(offsets)
        last = self.last_received  # not None whenever ``pending`` is non-empty
        if (
            len(new) != len(offsets)
            or not pending
            or last is None
            or min(new) < pending[0]
            or max(new) > last
            or not done.isdisjoint(new)
        ):
            raise OffsetOrderError(f"offsets {sorted(offsets)} completed twice or never received")
        done |= new
        while pending and pending[0] in done:
            done.remove(pending.popleft())

    @property
    def commit_position(self) -> int | None:
        """The offset to commit: lowest unfinished, else the idle position (``None``: nothing known).

        The idle position is last received + 1 (or ``start``), or the client's position when it
        passed offsets it never handed out (``passed_by_client``)."""
        if self._pending:
            return self._pending[0]
        received = self.last_received + 1 if self.last_received is not None else self.start
        passed = self._client_passed
        if passed is not None and received is not None and passed > received:
            return passed
        return received

    def passed_by_client(self, position: int | None) -> bool:
        """The client's position for this partition; ``True`` if the commit position moved to it.

        The client's position is the offset after the last record it handed to the pod, moved
        past the control records (transaction markers) and aborted records it skipped after it.
        When nothing is in flight and that position is beyond the idle position, every offset in
        between was read by the client and will never be delivered: the commit position may pass
        them. Nothing happens while messages are in flight (the lowest unfinished one is the
        commit position anyway), when the position is unknown (``None``), or when nothing is
        known of the partition yet (no committed offset, nothing received).

        Should a record below that position arrive after all (only a seek back would do that), it
        is processed, and the commit position goes back to it until it is finished.
        """
        if position is None or self._pending:
            return False
        received = self.last_received + 1 if self.last_received is not None else self.start
        if received is None or position <= max(received, self._client_passed or received):
            return False
        self._client_passed = position
        return True

    @property
    def min_inflight(self) -> int | None:
        """The lowest unfinished offset (the *min-offset*), or ``None`` when idle."""
        return self._pending[0] if self._pending else None

    @property
    def inflight(self) -> int:
        """Messages received and not yet completed."""
        return len(self._pending) - len(self._done)

    def commit_sent(self) -> int | None:
        """A commit of the current ``commit_position`` was sent; returns that position."""
        position = self.commit_position
        if position is not None:
            self._sent[position] = self.received_count - len(self._pending)
        return position

    def commit_confirmed(self, position: int) -> bool:
        """The broker acknowledged the commit of ``position`` (older pending sends are superseded).

        ``False`` when that position was not sent, or was forgotten at a log reset or truncation: the
        confirmation then says nothing about this log."""
        below = self._sent.pop(position, None)
        if below is None:
            return False
        if below > self._committed_received:
            self._committed_received = below
        for older in [sent for sent in self._sent if sent < position]:
            del self._sent[older]
        return True

    def commit_failed(self, position: int) -> None:
        """The commit of ``position`` failed: the uncommitted window keeps counting from the last success."""
        self._sent.pop(position, None)

    @property
    def uncommitted(self) -> int:
        """Received offsets at or above the last confirmed committed position: what a crash would re-deliver.

        Backpressure bounds this number (not just ``inflight``), so a stuck head offset cannot let
        completed-but-uncommittable offsets, memory and crash re-deliveries grow without limit.
        """
        return self.received_count - self._committed_received

    def completed_above_position(self) -> list[int]:
        """Completed offsets above the commit position, ascending (for the commit metadata)."""
        return sorted(self._done)

    @property
    def next_fetch(self) -> int | None:
        """Offset the source should fetch next (to re-seek after a resume)."""
        if self.last_received is not None:
            return self.last_received + 1
        return self.start


class ReceiveTimes:
    """When the messages of one partition arrived, per poll batch, to age the oldest in-flight one.

    One mark per batch (not per message) keeps this cheap: the age of the min-offset is measured
    from the arrival of the batch that contained it.
    """

    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: deque[tuple[int, float]] = deque()  # (first offset of a batch, arrival time)

    def mark(self, first_offset: int, at: float) -> None:
        self._marks.append((first_offset, at))

    def unmark(self, first_offset: int) -> None:
        """Forget the last mark if it is ``first_offset``'s: its batch was not taken (``EpochGap``)."""
        if self._marks and self._marks[-1][0] == first_offset:
            self._marks.pop()

    def truncate(self, offset: int, at: float) -> None:
        """The log was truncated at ``offset`` (``PartitionOffsets.truncate``): its records from there on arrive
        again, now; the marks of the old log's records there are forgotten."""
        marks = self._marks
        while marks and marks[-1][0] >= offset:
            marks.pop()
        marks.append((offset, at))

    def oldest_age(self, min_inflight: int | None, now: float) -> float:
        """Seconds since the message at ``min_inflight`` arrived (0 when nothing is in flight)."""
        marks = self._marks
        if min_inflight is None:
            marks.clear()
            return 0.0
        while len(marks) > 1 and marks[1][0] <= min_inflight:
            marks.popleft()
        return now - marks[0][1] if marks else 0.0
