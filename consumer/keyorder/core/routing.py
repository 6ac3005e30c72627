"""Which key worker runs a message: the ordering contract in one place.

A *lane* is the unit of ordering: messages of one lane are handled one at a time, in offset
order. The router maps a message to its lane (by ordering mode) and a lane to a worker slot with
a salted, process-independent hash (Python's ``hash()`` is randomised per process, so it would
route the same key differently after every restart and across pods). Partition lanes of one
topic take consecutive slots (topic hash + partition number), so with at least as many workers
as partitions every partition has a worker of its own, exactly like a classic ordered consumer.

``LaneAffinity`` makes live resizing safe: while a lane has messages in flight, new messages of
that lane keep going to the slot that already holds them, whatever the current worker count. A
lane moves to its new slot only once it has drained, so it never runs on two workers at once.
Pure data structures: owned and mutated by the poll-loop thread only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from enum import StrEnum

DEFAULT_SALT = b"keyorder/v1"


class Ordering(StrEnum):
    """How messages are ordered inside a pod."""

    KEY = "key"
    """Same key: in offset order, one at a time. Keyless messages are ordered per partition."""
    PARTITION = "partition"
    """Same partition: in offset order, one at a time (what a classic ordered consumer gives)."""
    UNORDERED = "unordered"
    """No ordering: any message may run concurrently with any other."""


Lane = Hashable | None
"""A lane: message key bytes, a ``(topic, partition)`` tuple, or ``None`` for unordered."""


def stable_hash(data: bytes, salt: bytes = DEFAULT_SALT) -> int:
    """64-bit keyed BLAKE2b hash: identical in every process, machine and Python version.

    The salt decorrelates worker slots from the producer's partitioner (which also hashes the
    key): without it, the keys of one partition would cluster on a few slots whenever the
    worker count shares a factor with the partition count.
    """
    return int.from_bytes(hashlib.blake2b(data, digest_size=8, key=salt).digest(), "little")


class KeyRouter:
    """Maps messages to lanes and lanes to worker slots for one ordering mode."""

    def __init__(self, ordering: Ordering, workers: int, salt: bytes = DEFAULT_SALT) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.ordering = Ordering(ordering)
        self.workers = workers
        self._salt = salt
        self._round_robin = 0
        self._partition_hashes: dict[tuple[str, int], int] = {}

    def lane(self, topic: str, partition: int, key: bytes | None) -> Lane:
        """The ordering lane of a message.

        In key mode a message without a key gets its partition's lane: keyless messages of one
        partition stay in offset order among themselves (the safe reading of "no key").
        """
        if self.ordering is Ordering.KEY:
            return key if key is not None else (topic, partition)
        if self.ordering is Ordering.PARTITION:
            return (topic, partition)
        return None

    def slot(self, lane: Lane) -> int:
        """Worker slot in ``[0, workers)`` for a lane under the current worker count."""
        if lane is None:
            self._round_robin = (self._round_robin + 1) % self.workers
            return self._round_robin
        if isinstance(lane, bytes):
            return stable_hash(lane, self._salt) % self.workers
        cached = self._partition_hashes.get(lane)
        if cached is None:  # partition lanes spread round the slots: W >= partitions gives one each
            topic, partition = lane
            cached = stable_hash(topic.encode(), self._salt) + partition
            self._partition_hashes[lane] = cached
        return cached % self.workers


class LaneAffinity:
    """Pins in-flight lanes to their slot, and counts the in-flight load of every slot.

    Invariant: a lane with ``n > 0`` messages in flight is pinned to exactly one slot, so two
    workers never hold messages of the same lane, even across a resize.
    """

    def __init__(self, router: KeyRouter) -> None:
        self.router = router
        self._pinned: dict[Hashable, list[int]] = {}  # lane -> [slot, in-flight count]
        self.slot_load: dict[int, int] = {}

    def assign(self, lane: Lane) -> int:
        """Slot for the next message of ``lane``; the caller must ``release`` it when done."""
        if lane is None:
            slot = self.router.slot(None)
        else:
            pin = self._pinned.get(lane)
            if pin is None:
                slot = self.router.slot(lane)
                self._pinned[lane] = [slot, 1]
            else:
                slot = pin[0]
                pin[1] += 1
        self.slot_load[slot] = self.slot_load.get(slot, 0) + 1
        return slot

    def release(self, lane: Lane, slot: int) -> None:
        """One message of ``lane`` on ``slot`` has finished (or was abandoned)."""
        if lane is not None:
            pin = self._pinned[lane]
            pin[1] -= 1
            if pin[1] == 0:
                del self._pinned[lane]
        load = self.slot_load[slot] - 1
        if load:
            self.slot_load[slot] = load
        else:
            del self.slot_load[slot]

    def pinned_lanes(self) -> int:
        """Number of lanes with messages in flight."""
        return len(self._pinned)
