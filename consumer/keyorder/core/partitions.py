"""What a pod knows about one assigned partition: its offsets, receive times and hand-over flags.

A plain record shared by the poll loop (which owns it), the committer and, read-only, the workers
(which ask ``lets_go`` before starting, retrying or dead-lettering a message). Pure data: no I/O, no clock.
"""

from __future__ import annotations

from keyorder.core.tracking import PartitionOffsets, ReceiveTimes


class PartitionState:
    """One assigned partition, owned by the poll-loop thread (workers call ``lets_go``, which only reads)."""

    __slots__ = (
        "client_sought",
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
    )

    def __init__(self, partition_id: tuple[str, int], offsets: PartitionOffsets) -> None:
        self.id = partition_id
        self.offsets = offsets
        self.receive_times = ReceiveTimes()
        self.revoked = False
        """Set when the partition is being revoked: workers skip its messages that have not started."""
        self.dropped = False
        """Set once the pod has let the partition go: late completions no longer touch its offsets."""
        self.client_sought = False
        """Set when the pod seeks the partition (a resume with a position, a fetch again), cleared by its next
        record: the client knows no position for it meanwhile (librdkafka's seek resets it), by the pod's doing."""
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
