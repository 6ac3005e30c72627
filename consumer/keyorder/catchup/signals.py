"""SIGTERM and SIGINT stop ``keyorder catchup`` cleanly: the running wave is cancelled, nothing more commits.

Kubernetes stops a Job's pod (``kubectl delete``, ``activeDeadlineSeconds``, a node drain) with
SIGTERM and, a grace period later, SIGKILL. A driver that ignores the first signal goes on handling
(and committing) until the second one kills it without ``SparkContext.stop``: the executor pods are
left behind and no report is written. With ``StopSignals`` around the run, the first SIGTERM or SIGINT
makes ``CatchupJob.cancel`` cancel the running wave's Spark job group, the run commits no other wave
(the cancelled one included), and the command stops Spark, writes its report and exits with 128 + the
signal's number (143 for SIGTERM, 130 for SIGINT). A second signal exits at once with that status.

Threads: Python runs signal handlers on the main thread only, between bytecodes, and during a wave
that thread is blocked in py4j inside ``collect()``, waiting for the JVM's answer on its connection.
A py4j call from the handler would go out on that same connection (PySpark pins one connection to
each Python thread) and break it: tried, the call failed with ``Py4JNetworkError`` and nothing was
cancelled. So the handler only records the signal and sets an Event; a thread of its own, which py4j
gives its own connection, calls ``cancel``, and calls it again every ``interval`` seconds until the
``with`` block ends, because a wave can submit its Spark job just after a cancel. The handler starts
no thread and takes no lock the main thread may hold (an Event's lock is only taken by that thread
and the handler).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_exit_status(signum: int) -> int:
    """The shell's status for a process ended by ``signum`` (128 + n): 143 for SIGTERM, 130 for SIGINT."""
    return 128 + signum


def stop_reason(signum: int) -> str:
    """``stopped by SIGTERM``: the reason ``CatchupJob.cancel`` records and the report shows."""
    return f"stopped by {signal.Signals(signum).name}"


class StopSignals:
    """``with StopSignals(job.cancel) as stop: job.run(plan)``; then ``stop.signum`` is the first signal
    received (``None`` if none was).

    ``cancel(reason)`` is called from this object's own thread, never from the signal handler, first as
    soon as a signal arrives, then every ``interval`` seconds until the block ends (the thread is joined,
    for at most 10 s, before ``__exit__`` returns, so nothing calls ``cancel`` after it). The previous handlers are
    restored on exit. Outside the main thread (where Python cannot install handlers) it does nothing.
    """

    def __init__(
        self,
        cancel: Callable[[str], None],
        signals: Iterable[int] = STOP_SIGNALS,
        interval: float = 0.5,
        exit: Callable[[int], Any] = os._exit,
    ) -> None:
        self._cancel = cancel
        self._signals = tuple(signals)
        self._interval = interval
        self._exit = exit
        self.signum: int | None = None
        """The first signal received; written by the handler (main thread), read by any thread."""
        self._received = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: dict[int, Any] = {}

    @property
    def reason(self) -> str | None:
        return None if self.signum is None else stop_reason(self.signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:  # the second signal: do not wait for the clean stop
            self._exit(signal_exit_status(signum))
            return
        self.signum = signum
        self._received.set()

    def _watch(self) -> None:
        self._received.wait()
        if self.signum is None:  # the block ended without a signal
            return
        reason = stop_reason(self.signum)
        log.warning("%s: cancelling the running wave, committing nothing more (a second signal exits at once)", reason)
        while True:
            try:
                self._cancel(reason)
            except Exception as error:  # Spark not started yet, or already stopping: the run checks the flag
                log.debug("cancel after %s failed: %s", reason, error)
            if self._done.wait(self._interval):
                return

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in self._signals:
            self._previous[signum] = signal.signal(signum, self._handle)
        self._thread = threading.Thread(target=self._watch, name="catchup-stop-signals", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        self._done.set()
        self._received.set()  # wakes the thread if no signal came
        if self._thread is not None:
            self._thread.join(timeout=10)
            if self._thread.is_alive():  # a cancel call hangs (a JVM gone bad): stopping Spark comes next anyway
                log.warning("the cancel after %s did not return within 10 s", self.reason)
            self._thread = None
