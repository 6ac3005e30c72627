"""The run queue of one key worker: FIFO, except that a lane waiting for a retry steps aside.

A worker is a single consumer of its queue, so same-lane messages on it run one at a time in
arrival (offset) order. When a message fails, its lane is *parked* until the backoff is due: the
failed message and every later message of that lane wait in the lane's own queue, while messages
of other lanes on the same worker keep flowing. When the retry succeeds, the lane's waiting
messages go back to the front of the queue, ahead of anything that arrived later, so the lane's
order is preserved.

Pure: the current time is a parameter. Owned by the one worker that runs it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any


class Delivery:
    """A message on its way through a worker, with its routing and retry state."""

    __slots__ = ("attempts", "lane", "message", "partition", "pending_dead_letter", "received_at", "slot")

    def __init__(self, message: Any, lane: Hashable | None, slot: int, partition: Any, received_at: float) -> None:
        self.message = message
        self.lane = lane
        self.slot = slot
        self.partition = partition  # the runtime's per-partition state (opaque here)
        self.received_at = received_at
        self.attempts = 0
        self.pending_dead_letter: BaseException | None = None
        """Set when the handler gave up but the DLQ write failed: only the write is retried."""

    @property
    def park_key(self) -> Hashable:
        """What waits together with this delivery when it fails: its lane, or just itself."""
        return self.lane if self.lane is not None else id(self)


class LaneScheduler:
    """Ready queue plus parked lanes with their due times."""

    def __init__(self) -> None:
        self._ready: deque[Delivery] = deque()
        self._parked: dict[Hashable, deque[Delivery]] = {}
        self._due: list[tuple[float, int, Hashable]] = []  # heap of (due, tie-breaker, park key)
        self._tie = 0
        self.blocked: set[Hashable] = set()
        """Park keys whose message exhausted its attempts under the block policy."""

    def push_all(self, deliveries: Iterable[Delivery]) -> None:
        self._ready.extend(deliveries)

    def next(self, now: float) -> Delivery | float | None:
        """The next delivery to run; else seconds until a parked lane is due; else ``None`` (idle)."""
        if self._due and self._due[0][0] <= now:
            _, _, key = heapq.heappop(self._due)
            return self._parked[key][0]  # stays parked (and first) until it succeeds
        ready, parked = self._ready, self._parked
        while ready:
            delivery = ready.popleft()
            if parked and delivery.park_key in parked:
                parked[delivery.park_key].append(delivery)
                continue
            return delivery
        if self._due:
            return self._due[0][0] - now
        return None

    def park(self, delivery: Delivery, due: float) -> None:
        """``delivery`` failed: its lane waits until ``due``; it will be retried first."""
        key = delivery.park_key
        lane_queue = self._parked.get(key)
        if lane_queue is None:
            self._parked[key] = deque((delivery,))
        elif lane_queue[0] is not delivery:
            raise RuntimeError("a parked lane ran a delivery other than its head")
        self._tie += 1
        heapq.heappush(self._due, (due, self._tie, key))

    def finished(self, delivery: Delivery) -> None:
        """``delivery`` succeeded or was dead-lettered: unpark its lane if it was parked."""
        key = delivery.park_key
        lane_queue = self._parked.get(key)
        if lane_queue is None or lane_queue[0] is not delivery:
            return
        lane_queue.popleft()
        del self._parked[key]
        self.blocked.discard(key)
        self._ready.extendleft(reversed(lane_queue))

    def drain(self) -> list[Delivery]:
        """Remove and return everything queued or parked (used when a worker is abandoned)."""
        everything = list(self._ready)
        for lane_queue in self._parked.values():
            everything.extend(lane_queue)
        self._ready.clear()
        self._parked.clear()
        self._due.clear()
        self.blocked.clear()
        return everything

    @property
    def parked_lanes(self) -> int:
        return len(self._parked)

    def __len__(self) -> int:
        return len(self._ready) + sum(len(q) for q in self._parked.values())
