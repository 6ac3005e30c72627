"""How many handler threads of one process are worth running at once, learnt from the handlers' CPU time.

Threads help a handler that waits (I/O): while one waits, another runs. They do not help a handler
that computes in Python: the GIL lets one thread run at a time, and every extra runnable thread
costs GIL hand-overs and lock queues. Measured on a catch-up task with a CPU-bound handler, 16
threads spent about a third more CPU per message than 4, and twice the CPU of 1 (docs/catchup.md).
A fixed count cannot serve both, so ``ThreadLimit`` adjusts it.

It watches *u*, the process's CPU seconds (``time.process_time``: the handlers, the feeding and
the hand-overs between threads) per second of wall time, once per ``window``. Only the process as a
whole shows saturation: per call, the handlers' own CPU time drops as threads queue for the GIL,
which would read as "waiting, add threads".

* u at or above ``busy`` (a core's worth: the threads already keep the GIL busy) -> try half as
  many threads;
* if that lowered u by more than ``tolerance`` compared with the window before, the step cut into
  useful work (a handler that waits, or one that computes outside the GIL on several cores): go back
  and hold that count for ``hold`` seconds before trying again;
* u below ``idle`` while ready work waits for a thread -> double the threads (up to ``maximum``),
  because too few threads cost a waiting handler far more than too many cost a computing one.

So an I/O-bound handler keeps every thread (its u stays low), a CPU-bound one ends at one or two,
and a mixed one at the fewest that keep the GIL busy. Pure: told CPU seconds, the time and the
demand; answers with the limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class ThreadLimit:
    maximum: int
    """The configured thread count: the limit never exceeds it."""
    window: float = 0.25
    """Seconds of measurement behind each decision."""
    busy: float = 0.9
    """Process CPU per wall second at which the threads are taken to saturate the GIL."""
    idle: float = 0.7
    """Process CPU per wall second below which more threads are added (when work waits)."""
    tolerance: float = 0.1
    """Relative drop of u after a step down that counts as having cut into useful work."""
    hold: float = 30.0
    """Seconds a count that proved needed is kept before stepping down again."""

    def __post_init__(self) -> None:
        self.maximum = max(int(self.maximum), 1)
        self.limit = self.maximum
        self._window_start: tuple[float, float] | None = None
        """(wall, process CPU) at the start of the current window."""
        self._previous: tuple[int, float] | None = None
        """(limit, u) of the last window, to judge a step down."""
        self._floor = 1
        self._floor_until = -math.inf

    def update(self, now: float, cpu: float, waiting: int) -> int:
        """The limit at wall time ``now`` and process CPU time ``cpu`` (seconds); ``waiting``: ready work
        that no thread runs. Decides at most once a window."""
        if self._window_start is None:
            self._window_start = (now, cpu)
            return self.limit
        elapsed = now - self._window_start[0]
        if elapsed < self.window:
            return self.limit
        usage = (cpu - self._window_start[1]) / elapsed
        self._window_start = (now, cpu)
        previous, self._previous = self._previous, (self.limit, usage)
        if previous is not None and previous[0] > self.limit and usage < previous[1] * (1 - self.tolerance):
            self._floor, self._floor_until = previous[0], now + self.hold  # the step down cost work: undo it
            self.limit = previous[0]
            self._previous = None
            return self.limit
        floor = self._floor if now < self._floor_until else 1
        if usage >= self.busy and self.limit > floor:
            self.limit = max(floor, self.limit // 2)
        elif usage < self.idle and waiting > 0 and self.limit < self.maximum:
            self.limit = min(self.maximum, self.limit * 2)
        return self.limit
