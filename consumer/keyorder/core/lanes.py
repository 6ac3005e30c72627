"""The pod's lane scheduler: one FIFO per lane, ready lanes by their head's arrival, any idle worker runs any lane.

A *lane* is the unit of ordering (a key, a partition, or a single message when unordered, see
``routing``). Every delivery waits in its lane's own FIFO. A lane is **ready** when it has a head
delivery, is not running and is not parked; ready lanes wait in one queue, and whichever worker
is idle takes the ready lane whose head came first, runs it, then queues the lane again by its next
head if more is queued: oldest head first, so a partition's lowest unfinished offset (what the pod
commits) runs as soon as its lane is free, and the committed lag shows the work as it is done.
Lanes are never bound to workers, so:

* the worker count is just how many workers call ``take``; a resize changes nothing here and takes
  effect on the next message;
* a hot or slow lane occupies at most one worker and delays no other lane (no head-of-line
  blocking behind a shared worker queue);
* a failed delivery *parks* its lane until a due time: the lane holds no worker and no other lane
  waits for it; once due, it becomes ready with the failed delivery still at its head.

Invariants (property-tested): a lane's deliveries run in arrival order, one at a time (at most one
``take`` outstanding per lane); nothing is lost (every delivery added is taken and finished, or
handed back by ``withdraw`` or ``drain``).

Pure: time is a parameter and nothing here does I/O or locks. The worker pools own one instance
and serialise access to it with one lock.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

SPARE_LANES = 4096
"""Most empty lanes kept for reuse (``LaneScheduler._spare``): enough for the lanes a pod turns over between two
polls, not so many that a spike of keys keeps their memory (an empty lane is about 150 bytes)."""
LONG_LANE = 64
"""Deliveries at which a lane's FIFO becomes a ``deque`` (``_Lane.deliveries``)."""


class Delivery:
    """A message on its way through the pod, with its lane and retry state."""

    __slots__ = (
        "attempts", "lane_id", "message", "partition", "pending_dead_letter", "received_at", "run_alone", "sequence"
    )  # fmt: skip

    def __init__(self, message: Any, lane: Hashable | None, partition: Any, received_at: float) -> None:
        self.message = message
        self.lane_id: Hashable = lane if lane is not None else id(self)
        """The scheduler's key for this delivery's lane: its ordering lane, or, unordered (``lane`` is ``None``),
        the delivery itself, a lane of its own. An attribute, not a property: the scheduler reads it several
        times per message, and the poll loop makes one of these per message."""
        self.partition = partition
        """The runtime's per-partition state (opaque here)."""
        self.received_at = received_at
        self.attempts = 0
        self.sequence: int
        """Its place in the order the scheduler received deliveries, set by ``LaneScheduler.add`` (not here: one
        assignment less per message)."""
        self.pending_dead_letter: BaseException | None = None
        """Set when the handler gave up but the DLQ write failed: only the write is retried."""
        self.run_alone = False
        """Set when a batch handler's call with it died or timed out in a worker process: it goes into a call
        of its own next (``ProcessWorkerPool._run_batch``), so only a message that fails alone is charged.
        Cleared once a call with it gets an answer (success or a raised error), not when it dies alone."""

    @property
    def let_go(self) -> bool:
        """Whether the pod has let this delivery go (its partition is being revoked, or the partition's log
        was truncated below it: ``PartitionState.lets_go``): it is handed back, never started, retried,
        parked or dead-lettered."""
        message = self.message
        return bool(self.partition.lets_go(message.offset, message.leader_epoch))


class _Lane:
    __slots__ = ("blocked", "deliveries", "parked_until", "running")

    def __init__(self) -> None:
        self.deliveries: list[Delivery] | deque[Delivery] = []
        """The lane's FIFO, head first: a list while it is short, a ``deque`` from ``LONG_LANE`` deliveries on, so
        that taking the head (``del deliveries[0]``, which both allow) never moves more than ``LONG_LANE`` others.
        Most lanes of a pod with many keys hold a message or two, and a deque costs about 530 bytes however short
        (its first 64-slot block): at 10,000 keys in flight the lanes' deques took some 6 MB, beyond the CPU's
        caches, and with lists the pod's CPU a message under a batch handler fell by about a tenth
        (``tools/pod_path_cpu``, docs/performance.md)."""
        self.running = False
        self.parked_until: float | None = None
        self.blocked = False


@dataclass(frozen=True)
class LaneSummary:
    """What the lanes look like right now: the signals behind the pod's lane metrics."""

    ready: int = 0
    """Lanes waiting for a worker."""
    running: int = 0
    """Lanes whose head is inside a handler (one per busy worker, or up to a batch's size with a batch handler)."""
    parked: int = 0
    """Lanes waiting for a retry's due time (blocked ones included)."""
    blocked: int = 0
    """Parked lanes whose head exhausted its attempts under the ``block`` policy."""
    next_retry_due: float | None = None
    """The earliest due time of the parked lanes that are not blocked (a retry's backoff; it may be
    past, for a lane due but not yet taken); ``None`` when no such lane is parked. A shutdown waits
    for it if it falls within its grace; a blocked lane's next retry is not counted."""
    queued: int = 0
    """Deliveries held by the lanes (running heads included)."""
    longest_backlog: int = 0
    """Deliveries held by the single busiest lane."""
    active: int = 0
    """Lanes holding at least one delivery (ready, running or parked)."""
    parked_heads: frozenset[tuple[Any, int, bool]] = frozenset()
    """``(partition, offset, blocked)`` of every parked head, and of every blocked head while it is
    retried: what holds back a partition's min-offset."""
    longest_lane: Hashable | None = None
    """The busiest lane's id (a key, or a partition's ``(topic, partition)``); ``None`` when nothing is queued."""
    longest_lane_partition: Any = None
    """The partition (runtime state, opaque here) of the busiest lane's head."""

    @property
    def longest_backlog_share(self) -> float:
        """The busiest lane's share of everything queued in the pod (0 when nothing is)."""
        return self.longest_backlog / self.queued if self.queued else 0.0


class LaneScheduler:
    """Per-lane FIFOs, the ready lanes (by their head's arrival, or for ``continue_first`` in one queue), and a
    heap of parked lanes by due time."""

    def __init__(self, continue_first: bool = False) -> None:
        self._continue_first = continue_first
        """A lane that finished a delivery and has more goes to the *head* of the ready queue. A batch
        (the Spark catch-up) wants the shortest makespan, which is its longest lane's: that lane must
        never queue behind light ones, so its worker goes on with it (True). The pods (False) take the
        ready lane whose head came first instead (``_oldest``). Order within a lane is the same."""
        self._lanes: dict[Hashable, _Lane] = {}
        self._ready: deque[Hashable] = deque()
        """Ready lanes in order. When ``continue_first``, all of them. Otherwise the lanes ``add`` made
        ready, whose heads arrived in this order (a lane's first delivery): with ``_oldest``, the ready
        lanes by their head's ``sequence``, so the head that came first runs first. A partition's lowest
        unfinished offset is then among the first heads to run, and its commit follows the work done (a
        round-robin over lanes held it back by a round of every lane: committed lag that did not move while
        the pod worked through the keys above it, and re-handled on every rebalance)."""
        self._oldest: list[int] = []
        """When not ``continue_first``: the other ready lanes (with more after a head finished, due after a
        park, or re-queued by ``withdraw``), a heap of their head's ``sequence``, which is unique (each lane
        is queued at most once, and two lanes never share a head); ``_oldest_lane`` maps it to the lane. A
        heap of plain ints: with ``(sequence, lane id)`` tuples a push and a pop cost about 1.5 times as much."""
        self._oldest_lane: dict[int, Hashable] = {}
        self._received = 0
        self._spare: list[_Lane] = []
        """Lanes forgotten (empty, not running, parked or blocked), kept to be reused by ``add``: most lanes of a
        pod with many keys hold one message at a time, and a new lane for each would cost an allocation."""
        self._due: list[tuple[float, int, Hashable]] = []  # (due, tie-breaker, lane id); stale entries skipped
        self._tie = 0
        self._running = 0
        self._parked = 0
        self._queued = 0

    # -- the poll loop's side --------------------------------------------------------------------------
    def add(self, deliveries: Iterable[Delivery]) -> int:
        """Append each delivery to its lane; returns how many lanes became ready (workers to wake)."""
        lanes, spare, ready = self._lanes, self._spare, self._ready
        woken = 0
        received = first = self._received
        for delivery in deliveries:
            delivery.sequence = received
            received += 1
            lane_id = delivery.lane_id
            lane = lanes.get(lane_id)
            if lane is None:
                lane = lanes[lane_id] = spare.pop() if spare else _Lane()
                ready.append(lane_id)  # in arrival order, whichever the mode
                woken += 1
                lane.deliveries.append(delivery)
                continue
            queue = lane.deliveries
            queue.append(delivery)
            if len(queue) == LONG_LANE and type(queue) is list:
                lane.deliveries = deque(queue)
        self._queued += received - first
        self._received = received
        return woken

    def withdraw(self, should_withdraw: Callable[[Delivery], bool]) -> list[Delivery]:
        """Remove every delivery that matches and is not running; a parked head is removed too.

        Used on revoke: the revoked partitions' queued and parked deliveries are handed back at once
        (the new owner receives them from the committed offset); only running ones are waited for.
        """
        withdrawn: list[Delivery] = []
        for lane_id, lane in list(self._lanes.items()):
            keep: list[Delivery] = []
            for index, delivery in enumerate(lane.deliveries):
                if should_withdraw(delivery) and not (index == 0 and lane.running):
                    withdrawn.append(delivery)
                else:
                    keep.append(delivery)
            if len(keep) == len(lane.deliveries):
                continue
            self._queued -= len(lane.deliveries) - len(keep)
            head_withdrawn = not keep or keep[0] is not lane.deliveries[0]
            lane.deliveries = keep if len(keep) < LONG_LANE else deque(keep)
            if head_withdrawn:
                lane.blocked = False  # blocked is the head's state: the next head has not failed yet
                if lane.parked_until is not None:
                    self._unpark(lane)
                    if keep:
                        self._make_ready(lane_id, lane)
            if not keep:
                self._forget(lane_id)
        if withdrawn:  # a ready lane whose head was withdrawn is ready with its new head, or not at all
            ready = [lane_id for lane_id in dict.fromkeys(self._ready) if self._is_ready(lane_id)]
            if self._continue_first:
                self._ready = deque(ready)
            else:  # new heads, so no longer in arrival order: all of them by their head's sequence
                ready += [lane_id for lane_id in self._oldest_lane.values() if self._is_ready(lane_id)]
                self._ready = deque()
                lanes = self._lanes
                self._oldest_lane = {lanes[lane_id].deliveries[0].sequence: lane_id for lane_id in dict.fromkeys(ready)}
                self._oldest = list(self._oldest_lane)
                heapq.heapify(self._oldest)
        return withdrawn

    def drain(self) -> list[Delivery]:
        """Remove and return every delivery that is not running (shutdown: abandoned unprocessed)."""
        return self.withdraw(lambda _delivery: True)

    # -- the workers' side ------------------------------------------------------------------------------
    def take(self, now: float, limit: int = 1) -> list[Delivery]:
        """The heads of up to ``limit`` ready lanes (distinct lanes), now marked running; empty when
        no lane is ready. The taker must finish or park each of them."""
        if self._due and self._due[0][0] <= now:
            self._wake_due(now)
        lanes = self._lanes
        taken: list[Delivery] = []
        # a lane id is in the ready queues at most once, and only while ready
        ready, oldest, oldest_lane = self._ready, self._oldest, self._oldest_lane
        if not oldest:  # one queue to take from (always so with continue_first)
            for _ in range(min(limit, len(ready))):
                lane = lanes[ready.popleft()]
                lane.running = True
                taken.append(lane.deliveries[0])
            self._running += len(taken)
            return taken
        # merge the two queues by head sequence; past the last sequence given out stands for "ready is empty"
        after_all = self._received
        ready_head = lanes[ready[0]].deliveries[0].sequence if ready else after_all
        heappop, append = heapq.heappop, taken.append
        for _ in range(limit):
            if oldest and oldest[0] < ready_head:
                lane = lanes[oldest_lane.pop(heappop(oldest))]
            elif ready:
                lane = lanes[ready.popleft()]
                ready_head = lanes[ready[0]].deliveries[0].sequence if ready else after_all
            else:
                break
            lane.running = True
            append(lane.deliveries[0])
        self._running += len(taken)
        return taken

    @property
    def ready(self) -> int:
        """Lanes ready to run now (parked lanes past their due time not counted until ``take``)."""
        return len(self._ready) + len(self._oldest)

    def seconds_until_due(self, now: float) -> float | None:
        """Seconds until the earliest parked lane is due (0 if one is); ``None`` if none is parked."""
        due = self._due
        while due and self._stale(due[0]):
            heapq.heappop(due)
        return max(due[0][0] - now, 0.0) if due else None

    def finished(self, delivery: Delivery) -> None:
        """The running head succeeded, was dead-lettered or handed back: the lane moves on."""
        lane_id = delivery.lane_id
        lane = self._running_lane(lane_id, delivery)
        del lane.deliveries[0]
        self._queued -= 1
        lane.running = False
        self._running -= 1
        lane.blocked = False
        if not lane.deliveries:
            self._forget(lane_id)
        elif self._continue_first:
            self._ready.appendleft(lane_id)
        else:
            sequence = lane.deliveries[0].sequence
            heapq.heappush(self._oldest, sequence)
            self._oldest_lane[sequence] = lane_id

    def finished_all(self, deliveries: Iterable[Delivery]) -> None:
        """``finished`` for each of ``deliveries`` (a batch call that succeeded whole), in one pass."""
        lanes, oldest, oldest_lane, continue_first = self._lanes, self._oldest, self._oldest_lane, self._continue_first
        count = 0
        for delivery in deliveries:
            lane_id = delivery.lane_id
            lane = lanes.get(lane_id)
            if lane is None or not lane.running or lane.deliveries[0] is not delivery:
                raise RuntimeError("a lane finished or parked a delivery that is not its running head")
            queue = lane.deliveries
            del queue[0]
            count += 1
            lane.running = False
            lane.blocked = False
            if not queue:
                del lanes[lane_id]
                if len(self._spare) < SPARE_LANES:
                    if type(queue) is not list:
                        lane.deliveries = []
                    self._spare.append(lane)
            elif continue_first:
                self._ready.appendleft(lane_id)
            else:
                sequence = queue[0].sequence
                heapq.heappush(oldest, sequence)
                oldest_lane[sequence] = lane_id
        self._queued -= count
        self._running -= count

    def park(self, delivery: Delivery, due: float, blocked: bool = False) -> None:
        """The running head failed: its lane waits until ``due`` (holding no worker), head first."""
        lane_id = delivery.lane_id
        lane = self._running_lane(lane_id, delivery)
        lane.running = False
        self._running -= 1
        lane.parked_until = due
        lane.blocked = blocked
        self._parked += 1
        self._tie += 1
        heapq.heappush(self._due, (due, self._tie, lane_id))

    # -- observation ------------------------------------------------------------------------------------
    def summary(self) -> LaneSummary:
        """Counts for metrics; O(lanes), so called at scrape time, not per message."""
        longest, blocked, heads = 0, 0, []
        longest_id: Hashable | None = None
        longest_partition: Any = None
        next_retry_due: float | None = None
        for lane_id, lane in self._lanes.items():
            if len(lane.deliveries) > longest:
                longest, longest_id, longest_partition = len(lane.deliveries), lane_id, lane.deliveries[0].partition
            if lane.parked_until is not None or lane.blocked:  # a blocked head being retried still holds
                head = lane.deliveries[0]
                heads.append((head.partition, head.message.offset, lane.blocked))
                blocked += lane.blocked
                due = lane.parked_until
                if due is not None and not lane.blocked and (next_retry_due is None or due < next_retry_due):
                    next_retry_due = due
        ready = self.ready
        return LaneSummary(
            ready=ready,
            running=self._running,
            parked=self._parked,
            blocked=blocked,
            next_retry_due=next_retry_due,
            queued=self._queued,
            longest_backlog=longest,
            parked_heads=frozenset(heads),
            active=len(self._lanes),
            longest_lane=longest_id,
            longest_lane_partition=longest_partition,
        )

    def __len__(self) -> int:
        """Deliveries held (queued, parked or running)."""
        return self._queued

    # -- internals ----------------------------------------------------------------------------------
    def _running_lane(self, lane_id: Hashable, delivery: Delivery) -> _Lane:
        lane = self._lanes.get(lane_id)
        if lane is None or not lane.running or lane.deliveries[0] is not delivery:
            raise RuntimeError("a lane finished or parked a delivery that is not its running head")
        return lane

    def _wake_due(self, now: float) -> None:
        due, lanes = self._due, self._lanes
        while due and due[0][0] <= now:
            entry = heapq.heappop(due)
            if self._stale(entry):
                continue
            lane = lanes[entry[2]]
            self._unpark(lane)
            self._make_ready(entry[2], lane)

    def _make_ready(self, lane_id: Hashable, lane: _Lane) -> None:
        """Queue a lane that just became ready (its head is ``lane.deliveries[0]``)."""
        if self._continue_first:
            self._ready.append(lane_id)
        else:
            sequence = lane.deliveries[0].sequence
            heapq.heappush(self._oldest, sequence)
            self._oldest_lane[sequence] = lane_id

    def _is_ready(self, lane_id: Hashable) -> bool:
        lane = self._lanes.get(lane_id)
        return lane is not None and not lane.running and lane.parked_until is None and bool(lane.deliveries)

    def _stale(self, entry: tuple[float, int, Hashable]) -> bool:
        lane = self._lanes.get(entry[2])
        return lane is None or lane.parked_until != entry[0]

    def _unpark(self, lane: _Lane) -> None:
        lane.parked_until = None  # a blocked lane stays blocked while its head is retried, until the head leaves
        self._parked -= 1

    def _forget(self, lane_id: Hashable) -> None:
        """The lane is empty: drop it, keeping its object for ``add`` to reuse (with no delivery it is neither
        running nor parked; ``blocked`` is its head's state, so cleared)."""
        lane = self._lanes.pop(lane_id)
        lane.blocked = False
        if len(self._spare) < SPARE_LANES:
            if type(lane.deliveries) is not list:
                lane.deliveries = []
            self._spare.append(lane)
