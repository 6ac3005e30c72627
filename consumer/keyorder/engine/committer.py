"""The commit protocol of a pod: what to commit for each partition, when, and what a result means.

Each partition commits its **lowest unfinished offset** (its min-offset), with the offsets already
finished above it encoded in the commit metadata (``core.offset_metadata``), so a restart neither
skips a message nor re-runs the finished ones. The metadata also records the greatest leader epoch
the partition received, which tells the next owner whether its done offsets are about the log it
reads (a log truncated and refilled since has a greater one; ``core.tracking``). Commits are sent:

* periodically (``interval``, asynchronous), skipping partitions whose mark (position, number of done
  offsets above it, leader epoch, resets and truncations) did not change;
* early, when backpressure says the uncommitted window is half full, at most every
  ``EARLY_COMMIT_SPACING`` seconds and only for partitions whose position moved;
* synchronously on revoke and on shutdown (the runtime calls ``commit`` directly); these send the
  mark again unless the broker already confirmed it, because an asynchronous commit still in
  flight may never arrive.

Before each commit, partitions with nothing in flight learn the client's position
(``Source.positions``), so a partition whose log ends in a transaction marker commits past it
(``PartitionOffsets.passed_by_client``) and reaches a lag of 0.

A failed commit (a whole request, or one partition's result) clears the partition's mark, so the
next commit sends it again. Time is a parameter (``now``); the clock is injected. Runs on the
poll-loop thread only, including ``record_outcomes`` (librdkafka calls it inside ``consume``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from keyorder.contracts import CommitError, CommitOutcome, Source, TopicPartitionId
from keyorder.core import offset_metadata
from keyorder.core.partitions import PartitionState

log = logging.getLogger(__name__)

EARLY_COMMIT_SPACING = 0.02
"""Seconds between commits made early because the uncommitted window is half full (each commit
encodes metadata and is a broker request: once per poll batch would be wasteful)."""


class Committer:
    """Sends min-offset commits for a pod's partitions and tracks what the broker confirmed."""

    def __init__(
        self,
        source: Source,
        interval: float,
        partition: Callable[[TopicPartitionId], PartitionState | None],
        now: float,
    ) -> None:
        self.source = source
        self.interval = interval
        self._partition = partition
        self._next_periodic = now
        self._next_early = now
        self.learn_client_positions = True
        """Whether commits may move idle partitions past offsets the client read and never handed out
        (transaction markers). The runtime turns it off for its shutdown: after the loop, and above all
        after a fatal ``consume`` error that dropped the records of its batch, the client's position may
        be past records nobody ran, and committing it would lose them."""
        self.commits = 0
        """Commit requests sent."""
        self.failures = 0
        """Commit requests (or batches of results) that failed."""

    def periodic(self, states: Iterable[PartitionState], now: float) -> None:
        """The asynchronous commit every ``interval`` seconds."""
        if now >= self._next_periodic:
            self.commit(states, asynchronous=True)
            self._next_periodic = now + self.interval

    def early(self, states: Iterable[PartitionState], now: float, pressure: bool) -> bool:
        """Commit ahead of schedule under backpressure (paced); returns whether it committed."""
        if not pressure or now < self._next_early:
            return False
        self.commit(states, asynchronous=True, only_if_moved=True)
        self._next_early = now + min(self.interval, EARLY_COMMIT_SPACING)
        return True

    def commit(self, states: Iterable[PartitionState], asynchronous: bool, only_if_moved: bool = False) -> None:
        """Commit each partition's lowest unfinished offset, with its completed-above set as metadata.

        Partitions whose position and completed set are unchanged are skipped; ``only_if_moved``
        also skips those whose position did not move (early commits under backpressure).
        """
        states = list(states)
        # Only the poll loop's commits learn the client's positions: a revoke's commit runs inside
        # consume(), where an older librdkafka may already count a batch it has not handed out.
        if asynchronous and self.learn_client_positions:
            self._learn_client_positions(states)
        offsets: dict[TopicPartitionId, tuple[int, str]] = {}
        marks = []
        for state in states:
            position = state.offsets.commit_position
            if position is None:
                continue
            if only_if_moved and state.last_committed and state.last_committed[0] == position:
                continue
            done = state.offsets.completed_above_position()
            # the epoch and the reset count tell a done set of a truncated (or reset) log from the new log's
            # one of the same size at the same position: the metadata differs, so it is sent again
            mark = (position, len(done), state.offsets.leader_epoch, state.offsets.resets)
            if mark == state.last_committed and (asynchronous or state.confirmed == position):
                continue  # a synchronous commit (revoke, shutdown) resends a mark not yet confirmed
            metadata = offset_metadata.encode(position, done, leader_epoch=state.offsets.leader_epoch)
            offsets[state.id] = (position, metadata)
            marks.append((state, mark))
        if not offsets:
            return
        for state, _mark in marks:
            state.offsets.commit_sent()
        try:
            outcomes = self.source.commit(offsets, asynchronous=asynchronous)
        except CommitError as error:  # e.g. a rebalance is in progress: the next commit retries
            self.record_outcomes([(state.id, mark[0], str(error)) for state, mark in marks])
            return
        self.commits += 1
        for state, mark in marks:
            state.last_committed = mark
        self.record_outcomes(outcomes)

    def _learn_client_positions(self, states: list[PartitionState]) -> None:
        """Idle partitions may commit past offsets the client read and never handed out (markers). (A position
        the client lost is the poll loop's business: ``ConsumerRuntime._fetch_where_the_client_lost_its_place``.)"""
        idle = {state.id: state for state in states if state.offsets.min_inflight is None}
        if not idle:
            return
        for partition_id, position in self.source.positions(list(idle)).items():
            state = idle.get(partition_id)
            if state is not None:
                state.offsets.passed_by_client(position)

    def record_outcomes(self, outcomes: list[CommitOutcome]) -> None:
        """Commit results: confirm positions, or force a resend on failure."""
        failures = []
        for partition_id, offset, error in outcomes:
            state = self._partition(partition_id)
            if error is None:
                if state is not None and offset >= 0 and state.offsets.commit_confirmed(offset):
                    state.confirmed = offset
                continue
            failures.append(f"{partition_id[0]}[{partition_id[1]}]@{offset}: {error}")
            if state is not None:
                state.offsets.commit_failed(offset)
                state.last_committed = None  # the next periodic commit sends it again
        if failures:
            self.failures += 1
            log.warning("offset commit failed (the next commit retries): %s", "; ".join(failures))
