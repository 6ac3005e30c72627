"""Handled counts from running Spark tasks to the driver, while the tasks run.

Spark merges accumulators only when a task ends, and a catch-up task handles its keys for a whole
wave (in the by-partition layout, its partitions' whole range), so the driver's progress line used to
say "0 handled" for as long as a wave ran: minutes to hours on a real backlog. So each task sends its
handled count to the driver in a UDP datagram about once a second (``TaskReporter``), and the driver
keeps the latest count per task (``LiveCounts``, pure) and shows their sum (``ProgressListener``).

Best effort by design. A lost datagram only makes the line lag; a network that drops them all (a
NetworkPolicy in front of the driver pod) leaves the count the accumulator gives at each task's end,
as before. Nothing decides on these numbers: the audit and the commit use the tasks' summaries.
Datagrams name the run, the wave and the wave's attempt, so a late one from an earlier attempt is
ignored.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

REPORT_INTERVAL = 1.0
"""Seconds between two reports of a running task."""
MAX_DATAGRAM = 512


@dataclass(frozen=True)
class WaveAttempt:
    """Which wave attempt a report belongs to."""

    run_id: str
    wave: int
    attempt: int


def report_datagram(attempt: WaveAttempt, task: int, task_attempt: int, handled: int) -> bytes:
    return json.dumps(
        {
            "run": attempt.run_id,
            "wave": attempt.wave,
            "attempt": attempt.attempt,
            "task": task,
            "task_attempt": task_attempt,
            "handled": handled,
        }
    ).encode()


@dataclass
class LiveCounts:
    """The latest handled count of each task of the wave attempt under way (pure)."""

    current: WaveAttempt | None = None
    by_task: dict[tuple[int, int], int] = field(default_factory=dict)

    def expect(self, attempt: WaveAttempt) -> None:
        """A new wave attempt starts: forget the counts of the one before."""
        self.current, self.by_task = attempt, {}

    def update(self, datagram: bytes) -> bool:
        """Take one report; False (ignored) if it is malformed or of another run, wave or attempt."""
        try:
            report = json.loads(datagram)
            attempt = WaveAttempt(str(report["run"]), int(report["wave"]), int(report["attempt"]))
            task = (int(report["task"]), int(report["task_attempt"]))
            handled = int(report["handled"])
        except (ValueError, KeyError, TypeError):
            return False
        if attempt != self.current or handled < 0:
            return False
        self.by_task[task] = max(self.by_task.get(task, 0), handled)  # datagrams may arrive out of order
        return True

    def total(self) -> int:
        return sum(self.by_task.values())


class ProgressListener:
    """The driver's end: a UDP socket and a thread that feeds ``LiveCounts``."""

    def __init__(self, bind_host: str = "0.0.0.0") -> None:
        self.counts = LiveCounts()
        self._lock = threading.Lock()
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((bind_host, 0))
        self._socket.settimeout(0.5)
        self.port = self._socket.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._receive, name="catchup-live-progress", daemon=True)
        self._thread.start()

    def expect(self, attempt: WaveAttempt) -> None:
        with self._lock:
            self.counts.expect(attempt)

    def total(self) -> int:
        with self._lock:
            return self.counts.total()

    def _receive(self) -> None:
        while not self._stopped.is_set():
            try:
                datagram = self._socket.recv(MAX_DATAGRAM)
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            with self._lock:
                self.counts.update(datagram)

    def close(self) -> None:
        self._stopped.set()
        self._socket.close()
        self._thread.join(2)


class TaskReporter:
    """A task's end: sends its handled count to the driver; never raises (a report may be lost)."""

    def __init__(self, address: tuple[str, int], attempt: WaveAttempt, task: int, task_attempt: int) -> None:
        self.address, self.attempt, self.task, self.task_attempt = address, attempt, task, task_attempt
        self._socket: socket.socket | None = None
        self._failed = False

    def __call__(self, handled: int) -> None:
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._socket.sendto(report_datagram(self.attempt, self.task, self.task_attempt, handled), self.address)
        except OSError as error:
            if not self._failed:  # once per task: the progress line falls back to the task ends
                self._failed = True
                log.warning("cannot report progress to the driver at %s:%d: %s", *self.address, error)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
