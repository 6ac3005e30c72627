"""Backpressure: which partitions to pause and resume so that memory and re-delivery stay bounded.

A blocking queue in the poll loop would stall every partition when one fills up. Instead the
poll loop pauses individual partitions, bounding two different resources:

* **in flight** (received, not finished): these hold their payloads in memory. Bounded by
  ``max_inflight`` per pod and ``max_inflight_per_partition``.
* **uncommitted** (received at or above the partition's committed offset, finished or not): what a
  crash would re-deliver, and the offsets the tracker keeps. Finished messages stay uncommitted
  while an older one is unfinished, so this window is larger; it is bounded by
  ``max_uncommitted`` per pod. A blocked key therefore cannot make the pod read the rest of its
  partition.

A partition is paused when either of its counts reaches its bound and resumes when both are at
or below the low-water mark (``resume_ratio`` of the bound), so pause/resume does not flap. A
partition's bounds are capped at its fair share of the pod bounds (pod bound / assigned
partitions): otherwise the first partitions fetched would take the whole pod budget and the
others would starve. The pod-wide bounds pause everything as a last resort.

Pure: it is told the counts and answers with the partitions whose state must change.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar


@dataclass(frozen=True, slots=True)
class FlowLimits:
    max_inflight: int = 10_000
    """Unfinished messages per pod (payload memory) before every partition is paused."""
    max_inflight_per_partition: int = 5_000
    """Unfinished messages per partition before that partition is paused."""
    max_uncommitted: int = 50_000
    """Messages at or above the committed offsets per pod (the crash re-delivery bound)."""
    resume_ratio: float = 0.5
    """A paused partition (or pod) resumes when its counts fall to this fraction of the bounds."""

    def __post_init__(self) -> None:
        if min(self.max_inflight, self.max_inflight_per_partition, self.max_uncommitted) < 1:
            raise ValueError("in-flight and uncommitted bounds must be >= 1")
        if self.max_uncommitted < self.max_inflight:
            raise ValueError(f"max_uncommitted ({self.max_uncommitted}) must be >= max_inflight ({self.max_inflight})")
        if not 0 < self.resume_ratio < 1:
            raise ValueError(f"resume_ratio must be in (0, 1), got {self.resume_ratio}")


@dataclass(frozen=True, slots=True)
class Load:
    """What a partition (or the pod) holds."""

    inflight: int
    uncommitted: int

    def reaches(self, bound: Load) -> bool:
        return self.inflight >= bound.inflight or self.uncommitted >= bound.uncommitted

    def within(self, bound: Load, ratio: float) -> bool:
        return self.inflight <= bound.inflight * ratio and self.uncommitted <= bound.uncommitted * ratio


PartitionKey = TypeVar("PartitionKey", bound=Hashable)
"""How the caller names a partition (the runtime uses ``(topic, partition)``)."""


class FlowControl(Generic[PartitionKey]):
    """Hysteresis state for the pod and each partition."""

    def __init__(self, limits: FlowLimits) -> None:
        self.limits = limits
        self.pod_bound = Load(limits.max_inflight, limits.max_uncommitted)
        self.pod_saturated = False
        self._full: set[PartitionKey] = set()
        self.paused: set[PartitionKey] = set()

    def partition_bound(self, partitions: int) -> Load:
        """Per-partition bounds with ``partitions`` assigned: the configured ones, capped at a fair share."""
        limits, share = self.limits, max(partitions, 1)
        return Load(
            max(1, min(limits.max_inflight_per_partition, limits.max_inflight // share)),
            max(1, limits.max_uncommitted // share),
        )

    def capacity(self, pod: Load) -> int:
        """How many more messages the pod may take in now."""
        limits = self.limits
        return max(min(limits.max_inflight - pod.inflight, limits.max_uncommitted - pod.uncommitted), 0)

    def commit_pressure(self, partitions: Mapping[PartitionKey, Load], pod: Load) -> bool:
        """True when a commit now would let work resume: an uncommitted bound is half-used.

        With fast handlers the window fills faster than the periodic commit interval; committing
        early keeps throughput from being capped at ``bound / commit_interval``.
        """
        ratio = self.limits.resume_ratio
        if pod.uncommitted >= self.limits.max_uncommitted * ratio:
            return True
        threshold = self.partition_bound(len(partitions)).uncommitted * ratio
        return any(load.uncommitted >= threshold for load in partitions.values())

    def decide(
        self, partitions: Mapping[PartitionKey, Load], pod: Load
    ) -> tuple[list[PartitionKey], list[PartitionKey]]:
        """``(to_pause, to_resume)`` for the current loads; updates ``paused``."""
        ratio = self.limits.resume_ratio
        if pod.reaches(self.pod_bound):
            self.pod_saturated = True
        elif pod.within(self.pod_bound, ratio):
            self.pod_saturated = False
        bound = self.partition_bound(len(partitions))
        full = self._full
        for partition, load in partitions.items():
            if load.reaches(bound):
                full.add(partition)
            elif load.within(bound, ratio):
                full.discard(partition)
        full.intersection_update(partitions)
        wanted = set(partitions) if self.pod_saturated else full
        to_pause = [partition for partition in wanted if partition not in self.paused]
        to_resume = [partition for partition in self.paused if partition not in wanted]
        self.paused = set(wanted)
        return to_pause, to_resume
