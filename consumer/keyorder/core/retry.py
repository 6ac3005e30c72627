"""What happens after a handler fails: retry later, dead-letter, or block the lane.

Pure policy (no clock, no I/O, no hidden randomness): given how many attempts a message has had,
it says what to do next and when. Delays get "equal jitter" (half the backoff, plus a uniform
random part of the other half) from a random source passed in, so keys that failed together do
not retry in lock-step; without a source the schedule is deterministic. Only the failing
message's *lane* waits for the retry; the worker keeps running other lanes meanwhile (see
``scheduling``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum


class ExhaustedPolicy(StrEnum):
    """What to do with a message that failed ``max_attempts`` times."""

    DLQ = "dlq"
    """Publish it to the dead-letter topic (with its origin and error in headers), then go on."""
    BLOCK = "block"
    """Keep its lane parked, retrying at the maximum backoff until it succeeds."""


class Verdict(StrEnum):
    RETRY = "retry"
    DEAD_LETTER = "dead_letter"
    BLOCK = "block"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff per lane, then the exhausted policy."""

    max_attempts: int = 5
    """Handler attempts per message, the first one included."""
    initial_backoff: float = 0.2
    """Seconds before the second attempt."""
    max_backoff: float = 30.0
    """Upper bound on the wait between attempts (and the retry period of a blocked lane)."""
    multiplier: float = 2.0
    """Growth factor of the wait between consecutive attempts."""
    exhausted: ExhaustedPolicy = ExhaustedPolicy.DLQ
    """What happens after the last attempt."""
    random: Callable[[], float] | None = field(default=None, compare=False, repr=False)
    """Uniform source in [0, 1) (e.g. ``random.Random().random``) for the jitter; ``None``: no jitter."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 <= self.initial_backoff <= self.max_backoff:
            raise ValueError("need 0 <= initial_backoff <= max_backoff")
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")

    def backoff(self, failed_attempts: int) -> float:
        """Seconds to wait after the ``failed_attempts``-th consecutive failure (1-based)."""
        exponent = max(failed_attempts - 1, 0)
        try:
            return min(self.max_backoff, self.initial_backoff * self.multiplier**exponent)
        except OverflowError:
            return self.max_backoff

    def jittered(self, delay: float) -> float:
        """Equal jitter: ``delay / 2`` plus a uniform part of the other half (``delay`` without a source)."""
        if self.random is None or delay <= 0:
            return delay
        fraction = min(max(self.random(), 0.0), 1.0)
        return delay / 2 + delay / 2 * fraction

    def after_failure(self, failed_attempts: int) -> tuple[Verdict, float]:
        """The verdict after a failure, and the (jittered) delay before the lane runs again."""
        if failed_attempts < self.max_attempts:
            return Verdict.RETRY, self.jittered(self.backoff(failed_attempts))
        if self.exhausted is ExhaustedPolicy.DLQ:
            return Verdict.DEAD_LETTER, 0.0
        return Verdict.BLOCK, self.jittered(self.max_backoff)
