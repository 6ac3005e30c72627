"""Backpressure: which partitions to pause and resume, and how much to read, so that memory and
re-delivery stay bounded and no partition's backlog stops another's.

A blocking queue in the poll loop would stall every partition when one fills up. Instead the
poll loop pauses individual partitions, bounding two different resources:

* **in flight** (received, not finished): these hold their payloads in memory. Bounded by
  ``max_inflight`` per pod and ``max_inflight_per_partition``.
* **uncommitted** (received at or above the partition's committed offset, finished or not): what a
  crash would re-deliver, and the offsets the tracker keeps. Finished messages stay uncommitted
  while an older one is unfinished, so this window is larger; it is bounded by
  ``max_uncommitted`` per pod. A blocked key therefore cannot make the pod read the rest of its
  partition.

A partition is *full* when either of its counts reaches its bound, until both are at or below
the low-water mark (``resume_ratio`` of the bound). A partition's bounds are capped at its fair
share of the pod bounds (pod bound / assigned partitions), so the partitions' bounds add up to at
most the pod's: otherwise the first partitions fetched would take the whole pod budget and the
others would starve.

What fullness does comes in two steps, because pausing is not free: librdkafka drops a paused
partition's prefetched messages, and after the resume the partition waits a fetch round trip, or
up to ``fetch.queue.backoff.ms``, before it delivers again. With a fast handler the bounds are
reached many times a second, and pausing each time left the workers idle most of the time.

1. **Hold**: while a partition is full in flight, the poll loop stops reading and waits for the
   workers; the Kafka client's prefetch queue is the buffer meanwhile. Reading goes on the moment
   the count is back at the low-water mark, from messages already fetched.
2. **Pause**: a partition is paused, so the others can be read past it (a hot or blocked key, a
   slow handler), when it has been full in flight for ``pause_after`` seconds (since the fill
   began, paused on another bound or not), or when its *hold budget* of ``pause_after`` seconds is
   spent while another partition could be read; it stays paused until its low-water mark. The
   budget is spent only while the partition holds the reading and another assigned partition is
   neither full nor paused, over one fill or many, and renewed when a fill ends while the partition
   is paused (pausing dropped its prefetch, so what was fetched for the others comes first). A
   limit per hold alone was not enough: a partition that filled again at the read after each hold
   (a slow handler behind a backlog, or a bound of one message, which every message in flight
   fills) chained holds, each under ``pause_after``, and the others went unread for many times
   that. A budget spent by every hold was too much: a fast partition was paused once per
   ``pause_after`` of holds although pausing helped nobody (the only partition assigned, or the
   others full or paused themselves), and each pause cost it its prefetch. A read after a hold that
   returns other partitions' records does not renew the budget: it tells nothing of a third
   partition's records queued behind them (seed 1200's starved partition was one of three), and
   the counts flow control is given cannot tell a partition read from one with nothing to read. A
   partition paused either way is remembered as slow and paused at once the next time it fills,
   until a fill drains within ``pause_after`` again. A full uncommitted count pauses at once: only a commit
   confirmed by the broker lowers it, the client reports those only while it is called, and a
   blocked head offset can keep it full for long. A paused partition holds up nothing.

**The pod bound limits each read; the ceiling pauses.** A read takes at most the pod's headroom
(pod bound minus what the pod holds, in each count), so without a paused partition over its bound
the pod holds at most its bounds. But partitions that cannot drain (a blocked key under
``onExhausted: block``, a long retry backoff, a hung handler) may hold the pod bound by
themselves: one that filled while it was the only partition had the whole pod for its share, and
its messages never leave. Pausing the whole pod until it drained, as flow control once did, then
stopped every other partition for good, those assigned later too. So the read may also take what
the pod has room for when each paused partition counts only up to its bound (what it holds beyond
was read under a larger share, or in the read that crossed its bound) and handlers still running
for revoked partitions do not count: at least one message, at most one partition bound.

That alone would let memory grow with each change of the assignment: partitions assigned one at a
time while the others are blocked each add up to two partition bounds of a shrinking share, B * (1
+ 1/2 + 1/3 + ...) in all (2.9 * B with 10 partitions, 4.3 * B with 40). Hence a hard **ceiling**
of ``CEILING`` (3) times each pod bound: no read goes past it, and a pod that reaches it in either
count pauses every partition until that count is back one partition bound below it (room for one
more read). Three times, because a pod whose assignment is fixed never reaches it (below), so the
ceiling costs nothing where the rule above suffices; twice would stop a healthy partition behind
blocked ones with a fixed assignment (four partitions, three of them blocked: they can hold 2 * B
less two messages).

**Memory bound**, for each count (B: ``max_inflight`` for in flight, ``max_uncommitted`` for
uncommitted; b: a partition's bound). **The pod never holds more than 3 * B**, handlers still
running for revoked partitions included: payload memory at most 3 * ``max_inflight`` messages, a
crash re-delivers at most 3 * ``max_uncommitted``. The one exception is out of flow control's hands:
a message librdkafka returns from a paused partition (it drops their prefetch; the loop takes what
it returns rather than lose it), or from a partition assigned inside the call the loop makes while
no partition is assigned, when revoked partitions' handlers alone fill the ceiling. Below the
ceiling: a partition is read only while under its bounds, and a read takes at most the headroom, or
at most b. So the pod holds at most what it held when it last held at most B, plus, for each
partition read since, under twice the bound it was read under: under ``B + 2 * sum(b)``. With n
partitions assigned (n <= B), n * b <= B: **under 3 * B while the assignment has not changed since
the pod last held at most B**, so the ceiling stops no read then. Without a paused partition over
its bound, the pod holds at most B, plus the handlers still running for revoked partitions.

**Guarantee.** A partition that is not full (under its bounds, or back at its low-water marks
since it filled) is never paused while the pod is under its ceiling, whatever the other partitions
hold, and the loop may read at least one message once no partition holds the reading. A hold ends
at most ``pause_after`` after the fill of a partition holding the reading began. **How long holds
keep a partition from being read:** count only the time the partition Q could be read (assigned,
neither full nor paused) while the loop holds. Each instant of it is spent from the budget of every
partition holding then: the decision that starts a hold sees Q readable, or Q becomes readable
during it by draining to its low-water mark, which takes at least ``release_after`` completions, so
the loop wakes and decides again by then (a commit, which releases an uncommitted bound, happens
only between the loop's waits). A partition's budget is at most ``pause_after`` between two of its
pauses that end a fill, each of which drops its prefetch. So Q waits for reading because of holds
at most ``pause_after`` for each partition whose fetched messages the client queued ahead of its own
(partitions full together hold at the same time and spend their budgets together), however often
those refill; with a limit per hold alone it was unbounded. A partition alone, or beside partitions
that are full or paused, spends no budget and is paused only by a fill lasting ``pause_after``.

**What waits at the ceiling:** every partition, healthy ones included, until the pod is one
partition bound below it. Healthy partitions drain fast, so the ceiling stays reached only while
partitions that cannot drain (and handlers of revoked partitions that hang) hold nearly 3 * B by
themselves, which takes assignment changes while they were stuck: partitions assigned one at a
time, or partitions read under a larger share. Then nothing is read until those drain (a blocked
key's retry succeeds, a hung handler returns) or are revoked; the loop still calls the client, so
the pod stays in its group and rebalances go on.

Each hold ends by ``pause_after`` after its fill began, so the loop still calls the client
(rebalance callbacks, ``max.poll.interval.ms``) at least that often.

Pure: it is told the counts and the time, and answers with the partitions whose state must
change, whether the loop may read, and how much. Its answer changes over time only by a hold
ending.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

CEILING = 3
"""The pod never holds more than this many times its bounds (``max_inflight``, ``max_uncommitted``):
the least multiple a fixed assignment never reaches (module docstring)."""

SPENT_WITHIN = 1e-6
"""Seconds left of a hold (of the budget, or of ``pause_after`` since the fill began) below which it
counts as over: both are sums and differences of times, and their rounding must not leave a hold
too short for a clock to wait out."""


@dataclass(frozen=True, slots=True)
class FlowLimits:
    max_inflight: int = 10_000
    """Unfinished messages per pod (payload memory): the most one read brings the pod to, unless
    partitions paused at their bounds hold more than their bounds; never past ``CEILING`` times it
    (see the module docstring)."""
    max_inflight_per_partition: int = 5_000
    """Unfinished messages per partition before that partition is held, then paused."""
    max_uncommitted: int = 50_000
    """Messages at or above the committed offsets per pod (the crash re-delivery bound), as ``max_inflight``:
    never past ``CEILING`` times it."""
    resume_ratio: float = 0.5
    """A paused partition resumes when its counts fall to this fraction of its bounds."""
    pause_after: float = 0.5
    """Seconds a partition full in flight may hold up reading before it is paused (0: at once): per fill,
    and in all while another partition could be read, over fills that follow each other, until a fill
    of it ends while it is paused (module docstring)."""

    def __post_init__(self) -> None:
        if min(self.max_inflight, self.max_inflight_per_partition, self.max_uncommitted) < 1:
            raise ValueError("in-flight and uncommitted bounds must be >= 1")
        if self.max_uncommitted < self.max_inflight:
            raise ValueError(f"max_uncommitted ({self.max_uncommitted}) must be >= max_inflight ({self.max_inflight})")
        if not 0 < self.resume_ratio < 1:
            raise ValueError(f"resume_ratio must be in (0, 1), got {self.resume_ratio}")
        if not 0 <= self.pause_after < float("inf"):
            raise ValueError(f"pause_after must be a finite number of seconds >= 0, got {self.pause_after}")


@dataclass(frozen=True, slots=True)
class Load:
    """What a partition, or the whole pod, holds."""

    inflight: int
    uncommitted: int


PartitionKey = TypeVar("PartitionKey", bound=Hashable)
"""How the caller names a partition (the runtime uses ``(topic, partition)``)."""


@dataclass(frozen=True, slots=True)
class FlowDecision(Generic[PartitionKey]):
    """What the poll loop does next."""

    to_pause: list[PartitionKey]
    to_resume: list[PartitionKey]
    hold: float | None
    """Seconds the loop should not read (a partition full in flight within its hold), at most; None: read."""
    release_after: int
    """The fewest finished messages after which a hold or a pause may end (at least 1): a loop that
    does not read waits for that many completions rather than for a fixed time."""


class FlowControl(Generic[PartitionKey]):
    """Hold and pause state for each partition, and the size of the next read."""

    def __init__(self, limits: FlowLimits) -> None:
        self.limits = limits
        self.pod_bound = Load(limits.max_inflight, limits.max_uncommitted)
        self.ceiling = Load(CEILING * limits.max_inflight, CEILING * limits.max_uncommitted)
        self._at_ceiling = (False, False)  # in flight, uncommitted: reached, and not yet back a partition bound below
        self._inflight_full: dict[PartitionKey, float] = {}  # partitions full in flight, and since when
        self._uncommitted_full: set[PartitionKey] = set()
        self._slow: set[PartitionKey] = set()  # spent its hold budget: paused at once when full again
        self._hold_spent: dict[PartitionKey, float] = {}
        """Seconds each partition has held the reading while another partition could be read, over its
        fills, since a fill of it last ended while it was paused: how much of its hold budget is gone."""
        self._starving: set[PartitionKey] = set()
        """Partitions that held the reading under the last decision while another partition could be
        read (neither full nor paused): the time until the next decision is spent from their budgets."""
        self._decided_at: float | None = None
        self.paused: set[PartitionKey] = set()
        self._bound = self.partition_bound(0)  # each partition's, at the last decide
        self._uncounted = Load(0, 0)
        """What the pod held at the last decide that does not count against the next read: paused
        partitions' loads beyond their bounds, and handlers still running for revoked partitions."""

    def partition_bound(self, partitions: int) -> Load:
        """Per-partition bounds with ``partitions`` assigned: the configured ones, capped at a fair share."""
        limits, share = self.limits, max(partitions, 1)
        return Load(
            max(1, min(limits.max_inflight_per_partition, limits.max_inflight // share)),
            max(1, limits.max_uncommitted // share),
        )

    @property
    def at_ceiling(self) -> bool:
        """The pod reached its ceiling in a count, which is not yet back a partition bound below it:
        every partition is paused."""
        return any(self._at_ceiling)

    def capacity(self, pod: Load) -> int:
        """How many messages the next read may take, for the pod load the last ``decide`` was given.

        The pod's headroom in both counts; or, where that is less, up to one partition bound of the
        room left with each paused partition counted only up to its bound (module docstring); never
        past the ceiling. At least 1: the loop's call also serves the client, and a read happens only
        with a partition not paused, so under the ceiling.
        """
        bound, uncounted, ceiling = self._bound, self._uncounted, self.ceiling
        return max(
            1,
            min(
                self._room(self.pod_bound.inflight - pod.inflight, bound.inflight, uncounted.inflight),
                self._room(self.pod_bound.uncommitted - pod.uncommitted, bound.uncommitted, uncounted.uncommitted),
                ceiling.inflight - pod.inflight,
                ceiling.uncommitted - pod.uncommitted,
            ),
        )

    @staticmethod
    def _room(headroom: int, partition_bound: int, uncounted: int) -> int:
        return max(headroom, min(partition_bound, headroom + uncounted))

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

    def all_paused(self, partitions: int) -> bool:
        """True when ``partitions`` (the assigned count, at least one) are all paused: nothing to read."""
        return partitions > 0 and len(self.paused) >= partitions

    def _release_after(self, partitions: Mapping[PartitionKey, Load], pod: Load) -> int:
        """``FlowDecision.release_after``. A partition full in flight is released when its in-flight
        count falls to the low-water mark, the pod at its ceiling in flight a partition bound below
        it; an uncommitted bound or ceiling is released by committing instead, which the loop does
        when it wakes."""
        low_water = int(self._bound.inflight * self.limits.resume_ratio)
        needed = [partitions[key].inflight - low_water for key in self._inflight_full]
        if self._at_ceiling[0]:
            needed.append(pod.inflight - (self.ceiling.inflight - self._bound.inflight))
        return max(1, min(needed, default=1))

    def forget(self, partitions: Iterable[PartitionKey]) -> None:
        """Partitions no longer assigned: a later re-assignment starts with a clean state."""
        for partition in partitions:
            self._inflight_full.pop(partition, None)
            self._uncommitted_full.discard(partition)
            self._slow.discard(partition)
            self._hold_spent.pop(partition, None)
            self._starving.discard(partition)
            self.paused.discard(partition)

    def decide(self, partitions: Mapping[PartitionKey, Load], pod: Load, now: float) -> FlowDecision[PartitionKey]:
        """Hold, pause and resume for the current loads at time ``now``; updates ``paused``.

        ``pod`` is what the whole pod holds: the partitions' loads, and in flight also what handlers
        still run for revoked partitions. Each count of each partition has its own hysteresis (full
        at its bound, released at its low-water mark). A full uncommitted count pauses at once: only
        a commit releases it, and a blocked head offset may hold it for long. A full in-flight count
        holds reading for up to ``pause_after`` since its fill began, unless the partition is paused
        already, and, while another partition could be read (neither full nor paused), only while its
        hold budget lasts: the time since the last decision is spent from the budget of each partition
        that held the reading with another readable then (that decision stood until now). Each count
        of the pod has a hysteresis too: at its ceiling every partition is paused, until it is a
        partition bound below.
        """
        limits, ratio = self.limits, self.limits.resume_ratio
        self.forget([partition for partition in self._tracked() if partition not in partitions])
        inflight_full, uncommitted_full, spent = self._inflight_full, self._uncommitted_full, self._hold_spent
        elapsed = 0.0 if self._decided_at is None else max(now - self._decided_at, 0.0)
        self._decided_at = now
        for partition in self._starving:  # held the reading with another partition readable, until now
            spent[partition] = spent.get(partition, 0.0) + elapsed
        bound = self._bound = self.partition_bound(len(partitions))
        for partition, load in partitions.items():
            if load.inflight >= bound.inflight:
                inflight_full.setdefault(partition, now)
            elif load.inflight <= bound.inflight * ratio and partition in inflight_full:
                filled_at = inflight_full.pop(partition)
                if partition in self.paused:  # a paused fill dropped its prefetch: the others come first now
                    spent.pop(partition, None)
                if now - filled_at < limits.pause_after:
                    self._slow.discard(partition)  # drained within pause_after: fast again
            if load.uncommitted >= bound.uncommitted:
                uncommitted_full.add(partition)
            elif load.uncommitted <= bound.uncommitted * ratio:
                uncommitted_full.discard(partition)
        ceiling, (inflight_at_ceiling, uncommitted_at_ceiling) = self.ceiling, self._at_ceiling
        self._at_ceiling = (
            self._at_ceiling_now(inflight_at_ceiling, pod.inflight, ceiling.inflight, bound.inflight),
            self._at_ceiling_now(uncommitted_at_ceiling, pod.uncommitted, ceiling.uncommitted, bound.uncommitted),
        )

        # a partition neither full nor paused: the one a hold would keep from being read
        readable = not self.at_ceiling and any(
            partition not in inflight_full and partition not in uncommitted_full for partition in partitions
        )
        holds: dict[PartitionKey, float] = {}
        paused = set(partitions) if self.at_ceiling else set(uncommitted_full)
        for partition, filled_at in inflight_full.items():
            left = limits.pause_after - (now - filled_at)
            if readable:
                left = min(left, limits.pause_after - spent.get(partition, 0.0))
            if partition in self._slow or left < SPENT_WITHIN:
                self._slow.add(partition)
                paused.add(partition)
            elif partition not in paused:  # paused already: the others are read past it
                holds[partition] = left
        self._starving = set(holds) if readable else set()
        to_pause = [partition for partition in paused if partition not in self.paused]
        to_resume = [partition for partition in self.paused if partition not in paused]
        self.paused = paused
        self._uncounted = self._uncounted_load(partitions, pod)
        return FlowDecision(
            to_pause, to_resume, min(holds.values(), default=None), self._release_after(partitions, pod)
        )

    @staticmethod
    def _at_ceiling_now(was: bool, count: int, ceiling: int, partition_bound: int) -> bool:
        """A pod count's hysteresis: reached at the ceiling, released a partition bound below it."""
        return count >= ceiling or (was and count > ceiling - partition_bound)

    def _uncounted_load(self, partitions: Mapping[PartitionKey, Load], pod: Load) -> Load:
        """``_uncounted`` for these loads, with ``paused`` and ``_bound`` already decided."""
        bound = self._bound
        inflight = pod.inflight - sum(load.inflight for load in partitions.values())  # revoked partitions' handlers
        uncommitted = pod.uncommitted - sum(load.uncommitted for load in partitions.values())
        for partition in self.paused:
            load = partitions[partition]
            inflight += max(load.inflight - bound.inflight, 0)
            uncommitted += max(load.uncommitted - bound.uncommitted, 0)
        return Load(max(inflight, 0), max(uncommitted, 0))

    def _tracked(self) -> set[PartitionKey]:
        return {*self._inflight_full, *self._uncommitted_full, *self._slow, *self._hold_spent, *self.paused}
