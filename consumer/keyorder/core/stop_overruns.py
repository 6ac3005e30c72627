"""How long each executor's stop may run past the shutdown grace: one number each, in one place.

The pools wait this long (``process_pool``, ``worker_pools``), and the configuration check that keeps a
whole shutdown inside ``max.poll.interval.ms`` (``config.shutdown_overrun``, which the operator runs
too) counts it. The check may not import the engine (the operator must not load it), so the numbers
live here, in the pure core both may read.
"""

from __future__ import annotations

PROCESS_TEARDOWN_SECONDS = 10.0
"""Seconds a stopping worker process may take for its tear-down hook before it is killed; its worker
thread is then joined for one more second (``ProcessWorkerPool.stop``)."""

ASYNC_LOOP_STOP_SECONDS = 5.0
"""Seconds ``AsyncWorkerPool.stop`` waits, past its timeout, for the event loop's shutdown (the handlers'
cancellation, the tear-down hook), then again for the loop's thread."""
