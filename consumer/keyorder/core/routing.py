"""Which lane a message belongs to: the ordering contract in one place.

A *lane* is the unit of ordering: messages of one lane are handled one at a time, in offset
order (the ``lanes`` scheduler guarantees it). The ordering mode decides what a lane is: the
message key, the partition, or nothing at all. Lanes are not bound to workers, so no hashing is
needed: any idle worker may run any ready lane.

Pure functions; the poll loop calls the chosen one once per run of a partition's messages.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from enum import StrEnum


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

LanesOf = Callable[[tuple[str, int], list[bytes | None]], list[Lane]]
"""``lanes_of((topic, partition), keys)``: the lane of each of a run of one partition's messages, by their keys.
A run, not a message: the poll loop routes what one fetch of a partition hands out in one call."""


def _by_key(partition_id: tuple[str, int], keys: list[bytes | None]) -> list[Lane]:
    # A message without a key gets its partition's lane: keyless messages of one partition stay in
    # offset order among themselves (the safe reading of "no key").
    return [key if key is not None else partition_id for key in keys]


def _by_partition(partition_id: tuple[str, int], keys: list[bytes | None]) -> list[Lane]:
    return [partition_id] * len(keys)


def _unordered(partition_id: tuple[str, int], keys: list[bytes | None]) -> list[Lane]:
    return [None] * len(keys)


def lanes_function(ordering: Ordering | str) -> LanesOf:
    """The lanes of a partition's messages under ``ordering`` (raises ``ValueError`` for an unknown mode)."""
    return {Ordering.KEY: _by_key, Ordering.PARTITION: _by_partition, Ordering.UNORDERED: _unordered}[
        Ordering(ordering)
    ]
