"""Where a catch-up range starts and where it is fenced, as the user writes it on the command line.

Pure parsing: ``--start`` and ``--until`` accept ``committed``, ``earliest``, ``end``, a timestamp
(ISO 8601 with a zone, or epoch milliseconds as ``ms:<n>``) or explicit offsets
(``topic:partition=offset,...``). Errors name the flag and the part that is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class PositionKind(StrEnum):
    COMMITTED = "committed"
    """The group's committed offset (where the group has none: where its ``auto.offset.reset`` says)."""
    EARLIEST = "earliest"
    """The oldest offset Kafka still has."""
    END = "end"
    """The end offset (high watermark) when the job is planned."""
    TIMESTAMP = "timestamp"
    """The first offset whose record timestamp is at or after ``timestamp_ms``."""
    OFFSETS = "offsets"
    """Explicit offsets per (topic, partition)."""


@dataclass(frozen=True)
class Position:
    kind: PositionKind
    timestamp_ms: int | None = None
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def describe(self) -> str:
        if self.kind is PositionKind.TIMESTAMP:
            return f"timestamp {self.timestamp_ms} ms"
        if self.kind is PositionKind.OFFSETS:
            return ", ".join(
                f"{topic}:{partition}={offset}" for (topic, partition), offset in sorted(self.offsets.items())
            )
        return self.kind.value


class PositionError(ValueError):
    """A --start/--until value could not be understood; the message says which and why."""


_OFFSET_ITEM = re.compile(r"^(?P<topic>[\w.-]+):(?P<partition>\d+)=(?P<offset>\d+)$")


def parse_position(text: str, flag: str) -> Position:
    """``committed`` | ``earliest`` | ``end`` | ``ms:<epoch ms>`` | ISO 8601 time with zone | ``t:p=o,...``."""
    value = text.strip()
    if value in {kind.value for kind in (PositionKind.COMMITTED, PositionKind.EARLIEST, PositionKind.END)}:
        return Position(PositionKind(value))
    if value.startswith("ms:"):
        digits = value[3:]
        if not digits.isdigit():
            raise PositionError(f"{flag} {text!r}: expected ms:<epoch milliseconds>")
        return Position(PositionKind.TIMESTAMP, timestamp_ms=int(digits))
    if "=" in value:
        offsets: dict[tuple[str, int], int] = {}
        for item in value.split(","):
            match = _OFFSET_ITEM.match(item.strip())
            if not match:
                raise PositionError(f"{flag} {text!r}: {item.strip()!r} must look like topic:partition=offset")
            offsets[(match["topic"], int(match["partition"]))] = int(match["offset"])
        return Position(PositionKind.OFFSETS, offsets=offsets)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise PositionError(
            f"{flag} {text!r}: expected committed, earliest, end, ms:<epoch ms>, an ISO 8601 "
            "time with a zone (2026-11-22T08:00:00Z) or topic:partition=offset,..."
        ) from None
    if moment.tzinfo is None:
        raise PositionError(f"{flag} {text!r}: give a time zone (e.g. 2026-11-22T08:00:00Z) so the time is not guessed")
    return Position(PositionKind.TIMESTAMP, timestamp_ms=int(moment.timestamp() * 1000))
