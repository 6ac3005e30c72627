"""Handled counts from running Spark tasks to the driver while the tasks run, and the driver's answer:
whether the task's wave attempt is still the current one (the fence).

Spark merges accumulators only when a task ends, and a catch-up task handles its keys for a whole
wave (in the by-partition layout, its partitions' whole range), so the driver's progress line used to
say "0 handled" for as long as a wave ran: minutes to hours on a real backlog. So each task sends its
handled count to the driver in a UDP datagram about once a second (``TaskReporter``), and the driver
keeps the latest count per task (``LiveCounts``, pure) and shows their sum (``ProgressListener``).

The driver answers every report with whether the task copy may go on calling the handler: only while
its wave attempt is the one under way and no later copy of the same task (Spark's re-run after a lost
executor) has reported. A wave attempt is closed when its Spark job ends (done, failed or
cancelled); from then on every answer says stop. A task copy that was answered once and hears nothing
for ``FENCE_LEASE`` seconds stops as well: the driver may have given it up; so does one that heard no
answer in the ``FENCE_LEASE`` seconds since it started. A task reports once before its first handler call,
and checks before every handler call (``TaskReporter.fenced``), and the driver starts no other wave attempt and
commits nothing until the closed attempt's copies that reported have ended or gone quiet
(``LiveCounts.running``; ``CatchupJob._settle``). docs/catchup.md "Guarantees, precisely" says what
is left: a copy whose datagrams never reach the driver is not fenced.

Counts are best effort: a lost datagram only makes the line lag; nothing decides on them (the audit
and the commit use the tasks' summaries). Every field of a datagram is checked (``parse_report``):
the socket may be reached by anything on the driver's network, and no datagram may stop the
receiver. IPv4 and IPv6: addresses are resolved with ``getaddrinfo``, once per listener and reporter.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

REPORT_INTERVAL = 1.0
"""Seconds between two reports of a running task."""
MAX_DATAGRAM = 512
MAX_COUNT = 2**63 - 1
"""The largest number a report may carry (a Spark long)."""
MAX_RUN_ID = 64
FENCE_LEASE = 30.0
"""Seconds a task copy goes on without an answer from the driver, after its first answer, before it stops
calling the handler. Well below ``spark.network.timeout`` (120 s), after which Spark declares a silent
executor lost and runs its tasks again."""
LISTENER_POLL = 0.5
"""Seconds the driver's receiving thread waits for a datagram before it looks whether it was closed: a
fallback, ``ProgressListener.close`` wakes it at once."""
ANSWER_WAIT = 0.25
"""Seconds a reporter waits for the driver's answer to a report (on the task's report thread)."""
QUIET = 3 * REPORT_INTERVAL
"""A task copy that has not reported for this long is taken as ended (a Python worker Spark killed sends
no last report)."""


@dataclass(frozen=True)
class WaveAttempt:
    """Which wave attempt a report belongs to."""

    run_id: str
    wave: int
    attempt: int


@dataclass(frozen=True)
class Report:
    """One task copy's report, checked (``parse_report``)."""

    attempt: WaveAttempt
    task: int
    task_attempt: int
    handled: int
    ended: bool = False
    """The task copy's last report: it calls the handler no more."""

    @property
    def copy(self) -> tuple[int, int]:
        """(Spark partition, attempt number): one copy of a task."""
        return self.task, self.task_attempt


def report_datagram(attempt: WaveAttempt, task: int, task_attempt: int, handled: int, ended: bool = False) -> bytes:
    return json.dumps(
        {
            "run": attempt.run_id,
            "wave": attempt.wave,
            "attempt": attempt.attempt,
            "task": task,
            "task_attempt": task_attempt,
            "handled": handled,
            "ended": ended,
        }
    ).encode()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a report may carry")


def _count(value: Any) -> int:
    """A JSON integer in 0..MAX_COUNT (never a bool, a float, NaN or Infinity), else ValueError."""
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise ValueError(f"not a count: {value!r}")
    return value


def _decode(datagram: bytes) -> dict[str, Any] | None:
    """A datagram's JSON object, or None; never raises. NaN, Infinity and -Infinity are refused
    (``json`` takes them by default, and ``int(float('inf'))`` raises OverflowError)."""
    if len(datagram) > MAX_DATAGRAM:
        return None
    try:
        value = json.loads(datagram, parse_constant=_reject_constant)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return value if isinstance(value, dict) else None


def parse_report(datagram: bytes) -> Report | None:
    """A task copy's report, every field checked, or None (pure; never raises): the run a string of at
    most ``MAX_RUN_ID`` characters, every number an integer in 0..``MAX_COUNT``."""
    value = _decode(datagram)
    if value is None:
        return None
    try:
        run, ended = value["run"], value.get("ended", False)
        if not isinstance(run, str) or len(run) > MAX_RUN_ID or not isinstance(ended, bool):
            return None
        return Report(
            WaveAttempt(run, _count(value["wave"]), _count(value["attempt"])),
            _count(value["task"]),
            _count(value["task_attempt"]),
            _count(value["handled"]),
            ended,
        )
    except (KeyError, ValueError):
        return None


def answer_datagram(report: Report, go_on: bool) -> bytes:
    """The driver's answer to ``report``: whether its task copy may go on calling the handler."""
    return json.dumps(
        {
            "run": report.attempt.run_id,
            "wave": report.attempt.wave,
            "attempt": report.attempt.attempt,
            "task": report.task,
            "task_attempt": report.task_attempt,
            "go_on": go_on,
        }
    ).encode()


def parse_answer(datagram: bytes, attempt: WaveAttempt, task: int, task_attempt: int) -> bool | None:
    """The ``go_on`` of an answer to this task copy, or None when the datagram is not one (pure)."""
    value = _decode(datagram)
    if value is None:
        return None
    expected = {
        "run": attempt.run_id,
        "wave": attempt.wave,
        "attempt": attempt.attempt,
        "task": task,
        "task_attempt": task_attempt,
    }
    if any(value.get(name) != wanted or type(value.get(name)) is not type(wanted) for name, wanted in expected.items()):
        return None
    go_on = value.get("go_on")
    return go_on if isinstance(go_on, bool) else None


@dataclass
class LiveCounts:
    """The task copies of the wave attempt under way: their latest handled counts, whether each may go on,
    and which still run (pure: time is a parameter)."""

    current: WaveAttempt | None = None
    closed: bool = False
    """The current attempt's Spark job ended: every copy is told to stop."""
    by_task: dict[tuple[int, int], int] = field(default_factory=dict)
    newest: dict[int, int] = field(default_factory=dict)
    """Per task (Spark partition), the latest attempt number that reported: earlier copies are superseded."""
    heard: dict[tuple[int, int], tuple[float, bool]] = field(default_factory=dict)
    """Per task copy: when it last reported, and whether that report was its last (``ended``)."""

    def expect(self, attempt: WaveAttempt) -> None:
        """A new wave attempt starts: forget the copies of the one before."""
        self.current, self.closed = attempt, False
        self.by_task, self.newest, self.heard = {}, {}, {}

    def close(self) -> None:
        """The current attempt's Spark job ended: from now on every answer says stop."""
        self.closed = True

    def update(self, datagram: bytes, now: float = 0.0) -> Report | None:
        """Take one datagram: its report, counted when it is of the current attempt (one of another is only
        answered: stop); None when it is not a report or no attempt is under way."""
        report = parse_report(datagram)
        if report is None:
            return None
        if report.attempt != self.current:
            return report if self.current is not None else None  # answered (stop), not counted
        copy = report.copy
        self.by_task[copy] = max(self.by_task.get(copy, 0), report.handled)  # datagrams may arrive out of order
        self.newest[report.task] = max(self.newest.get(report.task, 0), report.task_attempt)
        _, ended = self.heard.get(copy, (now, False))
        self.heard[copy] = (now, ended or report.ended)
        return report

    def go_on(self, report: Report) -> bool:
        """Whether the copy that sent ``report`` may go on calling the handler."""
        return (
            report.attempt == self.current
            and not self.closed
            and report.task_attempt >= self.newest.get(report.task, 0)
        )

    def running(self, now: float, quiet: float = QUIET) -> list[tuple[int, int]]:
        """The copies that reported within ``quiet`` seconds before ``now`` and not their last report."""
        return sorted(copy for copy, (last, ended) in self.heard.items() if not ended and now - last < quiet)

    def total(self) -> int:
        return sum(self.by_task.values())

    def reported(self) -> bool:
        """Whether any copy of the current attempt has reported."""
        return bool(self.heard)


def resolve(host: str, port: int) -> tuple[socket.AddressFamily, Any]:
    """The first UDP address of ``host`` (a name, an IPv4 or an IPv6 address, bracketed or not) and its
    family; OSError (``socket.gaierror``) when it has none."""
    infos = socket.getaddrinfo(host.strip().strip("[]"), port, socket.AF_UNSPEC, socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"no address for {host}")
    family, _, _, _, address = infos[0]
    return family, address


def _bound_socket(host: str) -> socket.socket:
    """A UDP socket bound to ``host``'s own address (the driver's, as the executors reach it), else, when
    that address is not one of this machine's (a Service's name), to every interface of its family."""
    infos = socket.getaddrinfo(host.strip().strip("[]"), 0, socket.AF_UNSPEC, socket.SOCK_DGRAM)
    last: OSError | None = None
    for family, kind, _, _, address in infos:
        sock = socket.socket(family, kind)
        try:
            sock.bind(address)
        except OSError as error:
            sock.close()
            last = error
            continue
        return sock
    if not infos:
        raise OSError(f"no address for {host}")
    log.warning("live progress: %s is not an address of this machine (%s): listening on every interface", host, last)
    return _every_interface_socket()


def _every_interface_socket() -> socket.socket:
    """A UDP socket on every interface of both families when the machine has IPv6 (``::`` with
    ``IPV6_V6ONLY`` off takes IPv4 too), else of IPv4: tasks resolve the driver's name on their own and may
    get either family."""
    if socket.has_ipv6:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
            return sock
        except OSError:  # no IPv6 on this machine after all
            sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", 0))
    return sock


def _own_address(bound: Any) -> Any:
    """Where a datagram reaches a socket bound to ``bound`` from this machine: its address, or loopback when it
    is bound to every interface."""
    host, port = bound[0], bound[1]
    return ({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host), port, *bound[2:])


class ProgressListener:
    """The driver's end: a UDP socket bound to the driver's address and a thread that feeds ``LiveCounts``
    and answers each report. No datagram ends the thread; only ``close`` does."""

    def __init__(self, host: str = "127.0.0.1", clock: Callable[[], float] = time.monotonic) -> None:
        self.counts = LiveCounts()
        self.clock = clock
        self._lock = threading.Lock()
        self._socket = _bound_socket(host)
        self._socket.settimeout(LISTENER_POLL)
        bound = self._socket.getsockname()
        self.port = bound[1]
        self.task_host = host if bound[0] in ("0.0.0.0", "::") else bound[0]
        """What the tasks send to: the numeric address the socket is bound to, so a name with addresses of both
        families cannot lead them to one it does not listen on; ``host`` itself when bound to every interface
        (of both families: ``_every_interface_socket``)."""
        self._stopped = threading.Event()
        self._complained = False
        self._thread = threading.Thread(target=self._receive, name="catchup-live-progress", daemon=True)
        self._thread.start()

    def expect(self, attempt: WaveAttempt) -> None:
        with self._lock:
            self.counts.expect(attempt)

    def close_attempt(self) -> None:
        """The current wave attempt's Spark job ended: tell its copies to stop (``LiveCounts.close``)."""
        with self._lock:
            self.counts.close()

    def running(self) -> list[tuple[int, int]]:
        """The current attempt's copies that still report (``LiveCounts.running``)."""
        with self._lock:
            return self.counts.running(self.clock())

    def total(self) -> int:
        with self._lock:
            return self.counts.total()

    def reported(self) -> bool:
        """Whether any copy of the current attempt has reported (``LiveCounts.reported``)."""
        with self._lock:
            return self.counts.reported()

    def _receive(self) -> None:
        while not self._stopped.is_set():
            try:
                datagram, sender = self._socket.recvfrom(MAX_DATAGRAM + 1)
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            try:
                self._take(datagram, sender)
            except Exception as error:  # never: one datagram must not end live progress and the fence
                if not self._complained:
                    self._complained = True
                    log.warning("live progress: a datagram from %s was not taken: %r", sender, error)

    def _take(self, datagram: bytes, sender: Any) -> None:
        with self._lock:
            report = self.counts.update(datagram, self.clock())
            go_on = self.counts.go_on(report) if report is not None else False
        if report is not None and not report.ended:
            try:
                self._socket.sendto(answer_datagram(report, go_on), sender)
            except OSError as error:  # the task then goes on until its lease ends: said once
                if not self._complained:
                    self._complained = True
                    log.warning("live progress: cannot answer the task at %s: %s", sender, error)

    def close(self) -> None:
        """End the receiving thread at once, then close the socket. Closing a socket does not wake a thread
        blocked in ``recvfrom`` on it (Linux), so an empty datagram to the socket's own address does; without it
        every close waited out ``LISTENER_POLL`` (half a second at each job's end and in each test)."""
        self._stopped.set()
        try:
            with socket.socket(self._socket.family, socket.SOCK_DGRAM) as waker:
                waker.sendto(b"", _own_address(self._socket.getsockname()))
        except OSError as error:  # the thread then ends at its next poll
            log.debug("live progress: could not wake the listener's thread: %s", error)
        self._thread.join(2)
        self._socket.close()


class TaskReporter:
    """A task copy's end: sends its handled count to the driver, reads the answer, and says whether the
    copy may go on calling the handler (``fenced``). Never raises (a report may be lost)."""

    def __init__(
        self,
        address: tuple[str, int],
        attempt: WaveAttempt,
        task: int,
        task_attempt: int,
        clock: Callable[[], float] = time.monotonic,
        lease: float = FENCE_LEASE,
        answer_wait: float = ANSWER_WAIT,
    ) -> None:
        self.address, self.attempt, self.task, self.task_attempt = address, attempt, task, task_attempt
        self.clock, self.lease, self.answer_wait = clock, lease, answer_wait
        self._socket: socket.socket | None = None
        self._target: Any = None
        self._failed = False
        self._stopped = False
        """The driver answered that this copy's attempt is closed or superseded."""
        self._last_answer: float | None = None
        self._started = clock()
        """When the copy started (this reporter was made): the lease counts from here until a first answer."""

    def __call__(self, handled: int, ended: bool = False) -> None:
        try:
            if self._socket is None:
                family, self._target = resolve(*self.address)  # once per task copy, not once per report
                self._socket = socket.socket(family, socket.SOCK_DGRAM)
            datagram = report_datagram(self.attempt, self.task, self.task_attempt, handled, ended)
            self._socket.sendto(datagram, self._target)
            if not ended:
                self._read_answers()
        except OSError as error:
            if not self._failed:  # once per task: the progress line falls back to the task ends
                self._failed = True
                log.warning("cannot report progress to the driver at %s port %d: %s", *self.address, error)

    def _read_answers(self) -> None:
        """Wait (at most ``answer_wait``) for the driver's answer to this copy and keep what it says."""
        assert self._socket is not None
        deadline = self.clock() + self.answer_wait
        while (left := deadline - self.clock()) > 0:
            self._socket.settimeout(left)
            try:
                datagram = self._socket.recv(MAX_DATAGRAM + 1)
            except TimeoutError:
                return
            go_on = parse_answer(datagram, self.attempt, self.task, self.task_attempt)
            if go_on is not None:
                self._last_answer = self.clock()
                self._stopped = self._stopped or not go_on
                return

    def fenced(self) -> str | None:
        """Why this copy must not call the handler any more, or None: the driver said stop (its wave attempt
        ended, or a later copy of the task reported), or went quiet for the lease: since its last answer, or,
        before any, since the copy started (a copy cut off from the driver from the start, on an executor
        Spark gave up on, is fenced too)."""
        if self._stopped:
            return "the driver closed its wave attempt (it ended, or this task runs again elsewhere)"
        if self._last_answer is not None and self.clock() - self._last_answer > self.lease:
            return f"the driver has not answered for more than {self.lease:.0f} s"
        if self._last_answer is None and self.clock() - self._started > self.lease:
            return (
                f"the driver has not answered any report in the {self.lease:.0f} s since the task started: can "
                f"the executors send UDP to the driver at {self.address[0]} port {self.address[1]}? "
                "(docs/catchup.md, Wave attempts never overlap)"
            )
        return None

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
