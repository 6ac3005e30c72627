"""The one object a user's handler receives.

It exists so that handlers never depend on confluent-kafka's types: the runtime copies the few
fields a handler needs into this small, documented value object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Message:
    """A record consumed from Kafka, handed to ``handler(message)``.

    Treat it as read-only; the runtime never looks at it again after the handler returns.
    """

    topic: str
    """Topic the record was read from."""
    partition: int
    """Partition within the topic."""
    offset: int
    """Offset within the partition."""
    key: bytes | None
    """Record key as raw bytes (``None`` for records without a key)."""
    value: bytes | None
    """Record value as raw bytes (``None`` for tombstones)."""
    headers: tuple[tuple[str, bytes | None], ...] = ()
    """Record headers in their original order (names may repeat)."""
    timestamp: float | None = None
    """Record timestamp in seconds since the epoch, or ``None`` when the broker gave none."""
    leader_epoch: int | None = None
    """The partition's leader epoch the record was written in (KIP-320), or ``None`` when the broker gave
    none. Epochs grow along a partition's log; the runtime uses them to tell a truncated and refilled log
    from a re-delivery (``core.tracking``)."""

    def header(self, name: str) -> bytes | None:
        """Value of the last header called ``name``, or ``None``."""
        found = None
        for header_name, header_value in self.headers:
            if header_name == name:
                found = header_value
        return found

    def json(self) -> Any:
        """The value decoded as JSON (raises ``ValueError`` on a tombstone or invalid JSON)."""
        if self.value is None:
            raise ValueError(f"{self.topic}[{self.partition}]@{self.offset} has no value (tombstone)")
        return json.loads(self.value)
