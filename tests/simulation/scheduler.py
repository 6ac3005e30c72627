"""Deterministic scheduling of real threads on a virtual clock: the ground the pod simulation runs on.

The pod's defects that reviews found (a worker process dying while idle, a retry whose due time
nobody wakes for, a handler failing after a revoke's withdraw) each need one interleaving of the
poll thread and the workers that no scripted test produces, and that real threads produce only
sometimes. FoundationDB and TigerBeetle answer this by running the real code in a simulated world
where one seed decides everything. Here the real code keeps its real threads, but:

* only one *managed* thread runs at a time; the others wait for the baton;
* control returns to the driver (``run``) at every blocking point, which the code reaches through
  this module's ``Lock``, ``Condition``, ``Event``, ``Thread.join`` and ``sleep`` (the pools and the
  runtime take them through their ``threads``/``clock``/``sleep`` seams), and, with probability
  ``preemption``, around taking and releasing a lock and setting or clearing an event, so that
  races between a check and a wait are explored too;
* the driver picks the next runnable thread with the seeded ``rng``; when none can run, virtual
  time jumps to the earliest deadline (a sleep, a timed wait) or timer (``call_at``).

So a seed decides every interleaving, and the same seed replays the same run (given the same
``PYTHONHASHSEED``: set iteration order is part of the run). Virtual time makes a run of minutes of
pod time cost milliseconds, and a wait that would hang forever shows up as a thread still blocked
when the run ends.

A managed thread that blocks on something the simulation does not know (a real lock held by a
thread that waits for the baton, real I/O) would stop the run: the driver waits ``STUCK_AFTER``
real seconds for the baton, then raises ``SimulationStuck`` with that thread's stack.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import random
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

STUCK_AFTER = 60.0
"""Real seconds one step of a managed thread may take before the run is declared stuck."""

_RUNNABLE, _RUNNING, _BLOCKED, _FROZEN, _DONE = "runnable", "running", "blocked", "frozen", "done"


class Terminated(BaseException):
    """Raised inside a managed thread that ``Simulation.close`` ends while it is still blocked."""


class SimulationStuck(RuntimeError):
    """A managed thread blocked outside the simulation (a real lock, real I/O): the run cannot go on."""


class _Managed:
    """One managed thread: its baton, its state and what it waits for."""

    def __init__(self, identity: int, name: str) -> None:
        self.id = identity
        self.name = name
        self.baton = threading.Semaphore(0)
        self.state = _RUNNABLE
        self.woken = False
        self.waitlist: list[_Managed] | None = None
        self.generation = 0
        """Bumped at every wake-up: a deadline entry of an earlier wait is stale."""
        self.terminate = False
        self.joiners: list[_Managed] = []
        self.ident: int | None = None
        self.error: BaseException | None = None


class Simulation:
    """The driver: runs managed threads one at a time, in an order the seed decides, on virtual time."""

    def __init__(self, seed: int, preemption: float = 0.2) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        """The run's one source of randomness (derive others from it, never from the global one)."""
        self.preemption = preemption
        self.now = 0.0
        self.steps = 0
        """Times a managed thread was given the baton."""
        self.errors: list[tuple[str, BaseException]] = []
        """Exceptions that escaped a managed thread's target (name, error)."""
        self._threads: list[_Managed] = []
        self._runnable: list[_Managed] = []
        self._deadlines: list[tuple[float, int, int, _Managed]] = []
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._current: _Managed | None = None
        self._driver_baton = threading.Semaphore(0)
        self._closing = False
        # the Threads kit (keyorder.engine.worker_pools.Threads): pass ``threads=simulation`` to pools and Completions
        self.Thread = functools.partial(SimThread, self)
        self.Lock = functools.partial(SimLock, self)
        self.Condition = functools.partial(SimCondition, self)
        self.Event = functools.partial(SimEvent, self)

    # -- time -----------------------------------------------------------------------------------------
    def clock(self) -> float:
        """Virtual seconds since the start of the run."""
        return self.now

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of virtual time (a managed thread only); ``sleep(0)`` still yields."""
        self._block(None, self.now + max(seconds, 0.0))

    def call_at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the driver at virtual time ``when`` (between two steps, nothing running)."""
        heapq.heappush(self._timers, (when, next(self._sequence), callback))

    # -- threads --------------------------------------------------------------------------------------
    def spawn(self, target: Callable[..., Any], *args: Any, name: str) -> SimThread:
        """Start a managed thread running ``target(*args)``."""
        thread = SimThread(self, target=target, args=args, name=name)
        thread.start()
        return thread

    def alive(self) -> list[str]:
        """Names of the managed threads that have not finished (frozen ones count as gone)."""
        return [managed.name for managed in self._threads if managed.state not in (_DONE, _FROZEN)]

    def freeze(self, thread: SimThread) -> None:
        """Stop a thread where it is, for good, without running another line of it: what SIGKILL does
        to a process (the simulated worker processes' threads). ``close`` unwinds it at the end."""
        managed = thread._managed
        if managed is None or managed.state in (_DONE, _FROZEN):
            return
        if managed.state is _RUNNING:
            raise RuntimeError("a thread cannot freeze itself")
        if managed.waitlist is not None and managed in managed.waitlist:
            managed.waitlist.remove(managed)
        managed.waitlist = None
        if managed in self._runnable:
            self._runnable.remove(managed)
        managed.state = _FROZEN
        managed.generation += 1
        self._wake_all(managed.joiners)

    def blocked(self) -> list[str]:
        """Names of the managed threads blocked right now (for a report)."""
        return [managed.name for managed in self._threads if managed.state is _BLOCKED]

    # -- the driver -----------------------------------------------------------------------------------
    def run(self, until: Callable[[], bool] = lambda: False, limit: float = math.inf) -> None:
        """Drive the managed threads until ``until()`` holds, virtual time would pass ``limit``, or
        nothing can ever run again (every thread finished, or blocked without a deadline, no timer)."""
        if self._current is not None or self._is_managed_caller():
            raise RuntimeError("Simulation.run is called by the driver, not by a managed thread")
        while not until():
            if self._fire_due_timers():
                continue
            if self._runnable:
                self._step(self._runnable.pop(self.rng.randrange(len(self._runnable))))
                continue
            upcoming = self._next_event_time()
            if upcoming is None:
                return
            if upcoming > limit:
                self.now = max(self.now, limit)
                return
            self.now = max(self.now, upcoming)
            self._expire_deadlines()

    def close(self) -> None:
        """End every managed thread still alive: each one's blocking call raises ``Terminated``."""
        self._closing = True
        for managed in self._threads:
            if managed.state is _DONE:
                continue
            managed.terminate = True
            if managed.waitlist is not None and managed in managed.waitlist:
                managed.waitlist.remove(managed)
            if managed in self._runnable:
                self._runnable.remove(managed)
            managed.state = _RUNNABLE
            self._step(managed)
        self._runnable.clear()

    def _step(self, managed: _Managed) -> None:
        managed.state = _RUNNING
        self._current = managed
        self.steps += 1
        managed.baton.release()
        if not self._driver_baton.acquire(timeout=STUCK_AFTER):
            frame = sys._current_frames().get(managed.ident or -1)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
            raise SimulationStuck(
                f"seed {self.seed}: managed thread {managed.name!r} did not yield for {STUCK_AFTER:.0f}s of real "
                f"time (blocked outside the simulation?):\n{stack}"
            )
        self._current = None

    def _fire_due_timers(self) -> bool:
        timers = self._timers
        fired = False
        while timers and timers[0][0] <= self.now:
            _when, _sequence, callback = heapq.heappop(timers)
            callback()
            fired = True
        return fired

    def _next_event_time(self) -> float | None:
        deadlines = self._deadlines
        while deadlines and self._stale(deadlines[0]):
            heapq.heappop(deadlines)
        candidates = [entry[0] for entry in (deadlines[:1] + self._timers[:1])]
        return min(candidates) if candidates else None

    def _expire_deadlines(self) -> None:
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= self.now:
            entry = heapq.heappop(deadlines)
            if self._stale(entry):
                continue
            self._unblock(entry[3], woken=False)

    @staticmethod
    def _stale(entry: tuple[float, int, int, _Managed]) -> bool:
        _deadline, _sequence, generation, managed = entry
        return managed.state is not _BLOCKED or managed.generation != generation

    # -- called by managed threads (and, for wake-ups only, by the driver) ------------------------------
    def _is_managed_caller(self) -> bool:
        current = self._current
        return current is not None and current.ident == threading.get_ident()

    def _me(self) -> _Managed:
        current = self._current
        if current is None or current.ident != threading.get_ident():
            raise RuntimeError("a simulated primitive blocked outside a managed thread (the driver must not block)")
        return current

    def _block(self, waitlist: list[_Managed] | None, deadline: float | None) -> bool:
        """Give the baton back until woken (True) or ``deadline`` passes (False)."""
        me = self._me()
        if me.terminate:
            raise Terminated
        me.woken = False
        me.waitlist = waitlist
        if waitlist is not None:
            waitlist.append(me)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, next(self._sequence), me.generation, me))
        me.state = _BLOCKED
        self._yield(me)
        return me.woken

    def _preempt(self) -> None:
        """A seeded chance for another runnable thread to go first (managed callers only)."""
        if self._closing or not self._is_managed_caller():
            return
        if self._runnable and self.rng.random() < self.preemption:
            me = self._me()
            me.state = _RUNNABLE
            self._runnable.append(me)
            self._yield(me)

    def _yield(self, me: _Managed) -> None:
        self._driver_baton.release()
        me.baton.acquire()
        if me.terminate:
            raise Terminated

    def _wake(self, managed: _Managed) -> None:
        """Make a blocked thread runnable: its wait returns True."""
        if managed.state is _BLOCKED:
            self._unblock(managed, woken=True)

    def _unblock(self, managed: _Managed, woken: bool) -> None:
        """A blocked thread leaves its wait list and becomes runnable; its wait returns ``woken``."""
        if managed.waitlist is not None and managed in managed.waitlist:
            managed.waitlist.remove(managed)
        managed.waitlist = None
        managed.woken = woken
        managed.state = _RUNNABLE
        managed.generation += 1
        self._runnable.append(managed)

    def _wake_all(self, waitlist: list[_Managed]) -> None:
        for managed in list(waitlist):
            self._wake(managed)

    def _register(self, name: str) -> _Managed:
        managed = _Managed(len(self._threads), name)
        self._threads.append(managed)
        self._runnable.append(managed)
        return managed

    def _finished(self, managed: _Managed) -> None:
        managed.state = _DONE
        self._wake_all(managed.joiners)
        self._driver_baton.release()


class SimThread:
    """``threading.Thread``'s interface over a managed thread."""

    def __init__(
        self,
        simulation: Simulation,
        target: Callable[..., Any] | None = None,
        name: str | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        daemon: bool | None = None,
    ) -> None:
        self._simulation = simulation
        self._target = target
        self._args, self._kwargs = args, kwargs or {}
        self.name = name or f"sim-thread-{len(simulation._threads)}"
        self.daemon = bool(daemon)
        self._managed: _Managed | None = None

    def start(self) -> None:
        if self._managed is not None:
            raise RuntimeError("threads can only be started once")
        simulation = self._simulation
        managed = self._managed = simulation._register(self.name)

        def main() -> None:
            managed.ident = threading.get_ident()
            managed.baton.acquire()  # the first turn
            try:
                if not managed.terminate and self._target is not None:
                    self._target(*self._args, **self._kwargs)
            except Terminated:
                pass
            except BaseException as error:  # an escaped error is the run's finding, reported by the driver
                if not simulation._closing:
                    managed.error = error
                    simulation.errors.append((self.name, error))
            finally:
                simulation._finished(managed)

        real = threading.Thread(target=main, name=f"sim:{self.name}", daemon=True)
        real.start()
        simulation._preempt()

    @property
    def ident(self) -> int | None:
        return self._managed.ident if self._managed is not None else None

    def is_alive(self) -> bool:
        return self._managed is not None and self._managed.state not in (_DONE, _FROZEN)

    def join(self, timeout: float | None = None) -> None:
        managed = self._managed
        if managed is None:
            raise RuntimeError("cannot join a thread before it is started")
        simulation = self._simulation
        deadline = None if timeout is None else simulation.now + max(timeout, 0.0)
        while managed.state not in (_DONE, _FROZEN):
            if not simulation._block(managed.joiners, deadline) and deadline is not None:
                return


class SimLock:
    """``threading.Lock`` over the simulation: a contended acquire blocks the managed thread."""

    def __init__(self, simulation: Simulation) -> None:
        self._simulation = simulation
        self._owner: int | None = None
        self._waiters: list[_Managed] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        simulation = self._simulation
        simulation._preempt()
        deadline = None if timeout is None or timeout < 0 else simulation.now + timeout
        while self._owner is not None:
            if not blocking:
                return False
            if not simulation._block(self._waiters, deadline) and deadline is not None and simulation.now >= deadline:
                return False
        self._owner = threading.get_ident()
        return True

    def release(self) -> None:
        self._release_quietly()
        self._simulation._preempt()

    def _release_quietly(self) -> None:
        """Release without a preemption point (a condition's wait: threading.Condition enlists the
        waiter before it releases, so no notify can fall in between)."""
        if self._owner is None:
            raise RuntimeError("release unlocked lock")
        self._owner = None
        if self._waiters:
            self._simulation._wake(self._waiters[0])

    def locked(self) -> bool:
        return self._owner is not None

    def _owned(self) -> bool:
        return self._owner == threading.get_ident()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_exc: object) -> None:
        self.release()


class SimCondition:
    """``threading.Condition`` over a ``SimLock``."""

    def __init__(self, simulation: Simulation, lock: SimLock | None = None) -> None:
        self._simulation = simulation
        self._lock = lock if lock is not None else SimLock(simulation)
        self._waiters: list[_Managed] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *_exc: object) -> None:
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._lock._owned():
            raise RuntimeError("cannot wait on un-acquired lock")
        simulation = self._simulation
        deadline = None if timeout is None else simulation.now + max(timeout, 0.0)
        self._lock._release_quietly()
        try:
            return simulation._block(self._waiters, deadline)
        finally:
            if not simulation._me().terminate:
                self._lock.acquire()

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None) -> Any:
        simulation = self._simulation
        deadline = None if timeout is None else simulation.now + timeout
        result = predicate()
        while not result:
            remaining = None if deadline is None else deadline - simulation.now
            if remaining is not None and remaining <= 0:
                break
            self.wait(remaining)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        if not self._lock._owned():
            raise RuntimeError("cannot notify on un-acquired lock")
        for managed in self._waiters[:n]:
            self._simulation._wake(managed)

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class SimEvent:
    """``threading.Event`` over the simulation; ``set`` may be called by the driver (a timer) too."""

    def __init__(self, simulation: Simulation) -> None:
        self._simulation = simulation
        self._flag = False
        self._waiters: list[_Managed] = []

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        self._simulation._wake_all(self._waiters)
        self._simulation._preempt()

    def clear(self) -> None:
        self._simulation._preempt()
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        simulation = self._simulation
        deadline = None if timeout is None else simulation.now + max(timeout, 0.0)
        simulation._block(self._waiters, deadline)
        return self._flag
