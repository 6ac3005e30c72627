"""An asyncio event loop on the simulation's clock, for the async executor's workers.

``AsyncWorkerPool`` runs its workers as tasks of one event loop on one thread. In the pod
simulation that thread is a managed one, so the loop must block only where the scheduler can
see it, and tell time by the virtual clock. This is the real ``asyncio.SelectorEventLoop``
(CPython ``Lib/asyncio/selector_events.py`` and ``base_events.py``) with three parts replaced:

* ``time()`` reads the simulation's clock, so ``call_later`` and ``asyncio.wait_for`` (the idle
  workers' waits for a parked lane's due time) run on virtual time (``BaseEventLoop.time`` is the
  one clock ``_run_once`` and the timer heap use);
* the selector's ``select(timeout)`` — the only place ``_run_once`` blocks — is a managed wait,
  ended early by ``_write_to_self``, which ``call_soon_threadsafe`` calls to wake the loop
  (in CPython it writes a byte to the self-pipe, which ``select`` then reports readable);
* the default executor (``asyncio.to_thread``: the dead-letter writes) runs each call in a managed
  thread, and its result reaches the loop through ``call_soon_threadsafe`` as in CPython's
  ``futures._chain_future``.

A fake of the operating system's side only: no file descriptor is ever reported ready, because
the pool's loop does no I/O of its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
from collections.abc import Callable, Mapping
from typing import Any

from tests.simulation.scheduler import Simulation, _Managed


class SimulatedSelector(selectors.BaseSelector):
    """Keeps registrations (the loop's self-pipe) and turns ``select`` into a managed wait."""

    def __init__(self, simulation: Simulation) -> None:
        self._simulation = simulation
        self._keys: dict[Any, selectors.SelectorKey] = {}
        self._waiters: list[_Managed] = []
        self._woken = False

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        simulation = self._simulation
        if not self._woken and (timeout is None or timeout > 0):
            simulation._block(self._waiters, None if timeout is None else simulation.now + timeout)
        self._woken = False
        return []

    def wake(self) -> None:
        self._woken = True
        self._simulation._wake_all(self._waiters)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class SimulatedExecutor(concurrent.futures.ThreadPoolExecutor):
    """``run_in_executor``'s default: each call in its own managed thread (a ThreadPoolExecutor by
    type only, as ``set_default_executor`` requires; it never starts a thread of its own)."""

    def __init__(self, simulation: Simulation) -> None:
        super().__init__(max_workers=1)
        self._simulation = simulation

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as error:
                future.set_exception(error)
            else:
                future.set_result(result)

        self._simulation.spawn(call, name=f"executor-{getattr(fn, '__name__', 'call')}")
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        return None


class SimulatedEventLoop(asyncio.SelectorEventLoop):  # type: ignore[misc,valid-type]
    """``asyncio.SelectorEventLoop`` on virtual time, blocking only through the simulation."""

    def __init__(self, simulation: Simulation) -> None:
        self._simulation = simulation
        self._simulated_selector = SimulatedSelector(simulation)
        super().__init__(selector=self._simulated_selector)
        self.set_default_executor(SimulatedExecutor(simulation))

    def time(self) -> float:
        return self._simulation.now

    def _write_to_self(self) -> None:
        self._simulated_selector.wake()


def event_loop_factory(simulation: Simulation) -> Callable[[], asyncio.AbstractEventLoop]:
    """``AsyncWorkerPool(event_loop=...)`` for a pool under the simulation."""
    return lambda: SimulatedEventLoop(simulation)
