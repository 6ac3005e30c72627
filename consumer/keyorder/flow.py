"""Backpressure: which partitions to pause and resume so that memory stays bounded.

A blocking queue in the poll loop would stall every partition when one fills up. Instead each
partition is paused while it holds ``max_inflight_per_partition`` *uncommitted* messages (received
at or above its last committed offset), and every partition is paused while the pod holds
``max_inflight``; both resume below a low-water mark (``resume_ratio`` of the bound), so
pause/resume does not flap on every message. Counting uncommitted rather than unfinished messages
also bounds what a crash re-delivers, and the memory held behind a stuck (blocked) key.

Fairness: a partition's bound is also capped at its fair share of the pod bound
(``max_inflight / assigned partitions``). Without it, the first partitions to be fetched fill
the whole pod budget and the others are never fetched until those drain.

Pure: it is told the in-flight counts and answers with the partitions whose state must change.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FlowLimits:
    max_inflight: int = 10_000
    """Uncommitted messages per pod before every partition is paused."""
    max_inflight_per_partition: int = 5_000
    """Uncommitted messages per partition before that partition is paused."""
    resume_ratio: float = 0.5
    """A paused partition (or pod) resumes when its count falls to this fraction of the bound."""

    def __post_init__(self) -> None:
        if self.max_inflight < 1 or self.max_inflight_per_partition < 1:
            raise ValueError("in-flight bounds must be >= 1")
        if not 0 < self.resume_ratio < 1:
            raise ValueError(f"resume_ratio must be in (0, 1), got {self.resume_ratio}")


class FlowControl:
    """Hysteresis state for the pod and each partition."""

    def __init__(self, limits: FlowLimits) -> None:
        self.limits = limits
        self.pod_saturated = False
        self._full: set[Hashable] = set()
        self.paused: set[Hashable] = set()

    def capacity(self, pod_uncommitted: int) -> int:
        """How many more messages the pod may take in now."""
        return max(self.limits.max_inflight - pod_uncommitted, 0)

    def partition_bound(self, partitions: int) -> int:
        """Per-partition bound with ``partitions`` assigned: the configured one, capped at a fair share."""
        limits = self.limits
        return max(1, min(limits.max_inflight_per_partition, limits.max_inflight // max(partitions, 1)))

    def commit_pressure(self, partition_uncommitted: Mapping[Hashable, int], pod_uncommitted: int) -> bool:
        """True when a commit now would let work resume: a bound is half-used by uncommitted messages.

        With fast handlers the window fills faster than the periodic commit interval; committing
        early keeps throughput from being capped at ``bound / commit_interval``.
        """
        limits = self.limits
        if pod_uncommitted >= limits.max_inflight * limits.resume_ratio:
            return True
        threshold = self.partition_bound(len(partition_uncommitted)) * limits.resume_ratio
        return any(count >= threshold for count in partition_uncommitted.values())

    def decide(self, partition_inflight: Mapping[Hashable, int], pod_inflight: int
               ) -> tuple[list[Hashable], list[Hashable]]:
        """``(to_pause, to_resume)`` for the current uncommitted counts; updates ``paused``."""
        limits = self.limits
        if pod_inflight >= limits.max_inflight:
            self.pod_saturated = True
        elif pod_inflight <= limits.max_inflight * limits.resume_ratio:
            self.pod_saturated = False
        high = self.partition_bound(len(partition_inflight))
        low = high * limits.resume_ratio
        full = self._full
        for partition, inflight in partition_inflight.items():
            if inflight >= high:
                full.add(partition)
            elif inflight <= low:
                full.discard(partition)
        full.intersection_update(partition_inflight)
        wanted = set(partition_inflight) if self.pod_saturated else full
        to_pause = [partition for partition in wanted if partition not in self.paused]
        to_resume = [partition for partition in self.paused if partition not in wanted]
        self.paused = set(wanted)
        return to_pause, to_resume
