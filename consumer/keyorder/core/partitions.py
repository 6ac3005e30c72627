"""What a pod knows about one assigned partition: its offsets, receive times and hand-over flags.

A plain record shared by the poll loop (which owns it), the committer and, read-only, the workers
(which ask ``lets_go`` before starting, retrying or dead-lettering a message). Pure data: no I/O, no clock.
"""

from __future__ import annotations

from keyorder.core.tracking import PartitionOffsets, ReceiveTimes

SOUGHT_PATIENCE = 1.0
"""Seconds after the pod sought a partition (``PartitionState.sought_at``) within which the client's first fetch
from there answers, when the broker holds records past it: a client that has handed out everything it holds
(``lost_place``'s ``drained_at``) later than this, and nothing of the partition, has lost its place."""


class PartitionState:
    """One assigned partition, owned by the poll-loop thread (workers call ``lets_go``, which only reads)."""

    __slots__ = (
        "completed",
        "confirmed",
        "dropped",
        "id",
        "last_committed",
        "offsets",
        "outstanding",
        "pauses",
        "receive_times",
        "revoked",
        "skipped_counted",
        "sought_at",
    )

    def __init__(self, partition_id: tuple[str, int], offsets: PartitionOffsets) -> None:
        self.id = partition_id
        self.offsets = offsets
        self.receive_times = ReceiveTimes()
        self.revoked = False
        """Set when the partition is being revoked: workers skip its messages that have not started."""
        self.dropped = False
        """Set once the pod has let the partition go: late completions no longer touch its offsets."""
        self.sought_at: float | None = None
        """When the pod last sought the partition (a resume with a position, a fetch again), until its next record
        (then ``None``): the client knows no position for it meanwhile (librdkafka's seek resets it), by the pod's
        doing. A purge by the client itself after that seek looks the same for a while (``lost_place``)."""
        self.pauses = 0
        """Times flow control paused the partition (holds, which leave it fetching, are not counted)."""
        self.outstanding = 0
        """Deliveries handed to workers and not yet returned (finished or handed back)."""
        self.last_committed: tuple[int, int, int | None, int] | None = None
        """(position, completed-above count, leader epoch, resets) of the last commit sent (``Committer``);
        ``None`` forces the next one."""
        self.confirmed: int | None = None
        """The last position the broker confirmed (an asynchronous commit may still be on its way)."""
        self.completed = 0
        """Messages finished (handled or dead-lettered) since the assignment."""
        self.skipped_counted = 0
        """``offsets.skipped`` already added to the pod's skipped total."""

    def lost_place(self, position: int | None, high_watermark: int | None, drained_at: float | None) -> bool:
        """Whether the client lost its place in this partition, given its ``position`` (``Source.positions``), the
        broker's end offset, and when the client last had nothing more to hand out (the start of the latest
        ``consume`` that returned fewer records than asked). It knows no position although the pod has read the
        partition, and either

        * the pod has not sought it since its last record: librdkafka sought it by itself (a truncation below its
          *fetch* position purges what it had prefetched, those records below the truncation point too), or
        * the pod sought it, and ``SOUGHT_PATIENCE`` later the client had handed out all it held, nothing of this
          partition, although the broker holds records past where the pod fetches next (or either is unknown):
          such a purge came after the pod's seek. Records of the partition queued behind other partitions' in the
          client are not taken for a loss: the client is not drained while it holds any.

        Either way no record may come to tell the pod (``EpochGap`` needs one above the gap): the purged records
        would wait for good."""
        offsets = self.offsets
        if position is not None or offsets.last_received is None:
            return False
        if self.sought_at is None:
            return True
        if drained_at is None or drained_at < self.sought_at + SOUGHT_PATIENCE:
            return False
        next_fetch = offsets.next_fetch
        return high_watermark is None or next_fetch is None or high_watermark > next_fetch

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:
        """Whether the pod has let the message at ``offset`` of ``leader_epoch`` go: its partition is being
        revoked, or the partition's log was truncated below it since it was received
        (``PartitionOffsets.is_stale``). Workers never start,
        retry, park or dead-letter such a message: they hand it back (a new owner, or the new log's record
        at its offset, is what runs)."""
        return self.revoked or self.offsets.is_stale(offset, leader_epoch)

    @property
    def may_let_go(self) -> bool:
        """Whether ``lets_go`` may be true of any message of the partition (it is being revoked, or its log was
        ever truncated): when not, none of its messages need asking, which a batch of them is spared."""
        return self.revoked or self.offsets.truncated

    @property
    def resets(self) -> int:
        """Times the partition's log was found reset below the committed offset since the assignment."""
        return self.offsets.resets
