"""``live``: running Spark tasks' handled counts reach the driver while the tasks run."""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any

import pytest

from keyorder.catchup.apply import ApplyHandler, TaskRunner
from keyorder.catchup.datasource import PROGRESS_SCALE, lane_hash
from keyorder.catchup.live import (
    QUIET,
    LiveCounts,
    ProgressListener,
    TaskReporter,
    WaveAttempt,
    parse_report,
    report_datagram,
)
from keyorder.core.retry import RetryPolicy
from tests.fakes import FakeClock
from tests.support import wait_for
from tests.unit.test_catchup_apply import batch

WAVE = WaveAttempt("run-1", 0, 1)


def test_the_latest_count_of_each_task_of_the_wave_attempt_under_way_is_summed() -> None:
    counts = LiveCounts()
    counts.expect(WAVE)
    assert counts.update(report_datagram(WAVE, task=0, task_attempt=0, handled=10))
    assert counts.update(report_datagram(WAVE, task=1, task_attempt=0, handled=5))
    assert counts.update(report_datagram(WAVE, task=0, task_attempt=0, handled=30))
    assert counts.update(report_datagram(WaveAttempt("run-0", 0, 1), 0, 0, 999))  # another run: answered, not counted
    assert counts.update(report_datagram(WaveAttempt("run-1", 0, 2), 0, 0, 999))  # a later attempt: not yet
    assert not counts.update(b"{not json") and not counts.update(b'{"run": "run-1"}')
    assert counts.update(report_datagram(WAVE, task=0, task_attempt=0, handled=20))  # late, out of order
    assert counts.total() == 35  # task 0's highest (30) plus task 1's 5
    counts.expect(WaveAttempt("run-1", 0, 2))  # the wave runs again: its tasks start from 0
    assert counts.total() == 0
    late = counts.update(report_datagram(WAVE, task=0, task_attempt=0, handled=30))  # the failed attempt's
    assert late is not None and not counts.go_on(late) and counts.total() == 0


def test_a_task_reports_over_udp_to_the_drivers_listener() -> None:
    listener = ProgressListener("127.0.0.1")
    try:
        listener.expect(WAVE)
        report = TaskReporter(("127.0.0.1", listener.port), WAVE, task=3, task_attempt=0)
        report(7)
        report(12)
        wait_for(lambda: listener.total() == 12, 5, "the count at the listener")
        report.close()
    finally:
        listener.close()


def test_a_reporter_that_cannot_send_never_fails_its_task(caplog) -> None:
    report = TaskReporter(("256.0.0.1", 9), WAVE, task=0, task_attempt=0)  # not an address
    report(1)
    report(2)
    assert sum("cannot report progress" in record.message for record in caplog.records) == 1  # said once
    report.close()


def test_a_running_task_reports_its_handled_count_before_it_ends() -> None:
    """The handler holds its 50th message until the driver would have seen a partial count: the task
    reports while it runs (not only at its end, as Spark's accumulators do), then its final count."""
    reports: list[int] = []
    seen_partial = threading.Event()

    def report(handled: int) -> None:
        reports.append(handled)
        if 0 < handled < 100:
            seen_partial.set()

    def call(message) -> None:
        if message.offset == 50:
            assert seen_partial.wait(10), "no report while the task ran"

    rows = [(lane_hash(b"k"), 0, n, n, b"k", b"v", [], None, None, None) for n in range(100)]  # one key: in order
    rows.append((0, 0, PROGRESS_SCALE, 100, None, None, [], None, 100, 0))
    runner = TaskRunner(call, RetryPolicy(), None, [("t", 0)], "key", 2, 1000, report=report, report_interval=0.02)
    runner.run(iter([batch(rows)]))  # the handler's wait is the hang guard: without a report it fails
    assert any(0 < handled < 100 for handled in reports) and reports[-1] == 100  # partial counts, then the final one
    assert reports == sorted(reports)


HOSTILE = [
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": Infinity}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": -Infinity}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": NaN}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": 1e400}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": 1.5}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": 99999999999999999999}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": -1}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": true}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": "7"}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": [0], "task_attempt": 0, "handled": 7}',
    b'{"run": "run-1", "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": 7, "ended": 1}',
    b'{"run": 1, "wave": 0, "attempt": 1, "task": 0, "task_attempt": 0, "handled": 7}',
    b'{"run": "run-1", "wave": 0, "attempt": 1}',
    b"[1, 2, 3]",
    b"null",
    b"\xff\xfe garbage",
    b"[" * 400 + b"]" * 400,
    b"",
    b"{" + b" " * 600 + b"}",
]


def test_no_datagram_is_counted_unless_every_field_is_a_count_and_none_stops_the_listener() -> None:
    """``int(Infinity)`` raised OverflowError, which the receiver did not catch: one datagram ended live
    progress for the rest of the run."""
    counts = LiveCounts()
    counts.expect(WAVE)
    for datagram in HOSTILE:
        assert parse_report(datagram) is None, datagram
        assert counts.update(datagram) is None, datagram
    assert counts.total() == 0
    listener = ProgressListener("127.0.0.1")
    try:
        listener.expect(WAVE)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
            for datagram in HOSTILE:
                sender.sendto(datagram, ("127.0.0.1", listener.port))
            sender.sendto(report_datagram(WAVE, task=1, task_attempt=0, handled=7), ("127.0.0.1", listener.port))
        wait_for(lambda: listener.total() == 7, 5, "the valid report after the hostile ones")
    finally:
        listener.close()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_reports_travel_over_ipv6() -> None:
    listener = ProgressListener("::1")
    try:
        listener.expect(WAVE)
        report = TaskReporter(("::1", listener.port), WAVE, task=0, task_attempt=0)
        report(4)
        wait_for(lambda: listener.total() == 4, 5, "the count over IPv6")
        assert report.fenced() is None  # answered: go on
        report.close()
    finally:
        listener.close()


def test_a_reporter_resolves_the_drivers_name_once(monkeypatch) -> None:
    listener = ProgressListener("127.0.0.1")
    calls: list[str] = []
    real = socket.getaddrinfo

    def counting(host, *args, **kwargs):
        calls.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", counting)
    try:
        listener.expect(WAVE)
        report = TaskReporter(("localhost", listener.port), WAVE, task=0, task_attempt=0)
        for handled in (1, 2, 3):
            report(handled)
        wait_for(lambda: listener.total() == 3, 5, "the counts")
        assert calls == ["localhost"]
        report.close()
    finally:
        listener.close()


class FakeConf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.values.get(name, default)


def job_on_a_stand_in_session(conf: dict[str, str], tracker: Any = None) -> Any:
    """A ``CatchupJob`` whose Spark session is a stand-in with only what the live listener's set-up and
    ``_settle`` read: the driver's ``conf`` and a status tracker (``tracker``; by default one that knows no
    job)."""
    from keyorder.catchup.job import CatchupJob
    from keyorder.catchup.settings import CatchupConfig

    class Tracker:
        def getJobIdsForGroup(self, group: str) -> list[int]:
            return []

    class Context:
        def statusTracker(self) -> Any:
            return tracker if tracker is not None else Tracker()

        def getConf(self) -> FakeConf:
            return FakeConf(conf)

    class Session:
        sparkContext = Context()

    config = CatchupConfig(bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g", handler="m:f")
    job = CatchupJob(config, spark=Session())
    job._checked = True
    return job


class _NeverTimesOut(socket.socket):
    """A socket whose ``settimeout`` leaves it blocking: a thread in its ``recvfrom`` wakes only for a datagram."""

    def settimeout(self, value: float | None) -> None:
        super().settimeout(None)


def _blocked_in_receive(thread: threading.Thread) -> bool:
    """Whether ``thread`` sleeps in the kernel inside the listener's receive loop (Linux: /proc)."""
    frame = sys._current_frames().get(thread.ident or 0)
    if frame is None or frame.f_code.co_name != "_receive":
        return False
    with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"


@pytest.mark.parametrize("bound", ["127.0.0.1", "every interface"])
def test_closing_the_listener_ends_its_thread_without_waiting_for_a_poll(monkeypatch, bound: str) -> None:
    """Before: close() closed the socket and joined the thread, which stayed blocked in recvfrom (closing a
    socket does not wake it) until its 0.5 s poll timed out: half a second at every job's end and in every
    test with a listener. With no poll at all the old thread never ended."""
    from keyorder.catchup import live

    real = live._bound_socket

    def bound_socket(host: str) -> socket.socket:
        plain = real(host) if bound != "every interface" else live._every_interface_socket()
        return _NeverTimesOut(plain.family, plain.type, fileno=plain.detach())

    monkeypatch.setattr(live, "_bound_socket", bound_socket)
    listener = ProgressListener("127.0.0.1")
    wait_for(lambda: _blocked_in_receive(listener._thread), 5, "the listener's thread to wait for a datagram")
    listener.close()  # joins the thread for at most 2 s (hang guard)

    assert not listener._thread.is_alive()


def test_the_drivers_listener_is_bound_to_the_drivers_address_not_every_interface() -> None:

    job = job_on_a_stand_in_session({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "0.0.0.0"})
    try:
        assert job._live_address(WAVE) == ("127.0.0.1", job.live.port)  # type: ignore[union-attr]
        assert job.live._socket.getsockname()[0] == "127.0.0.1"  # type: ignore[union-attr]
    finally:
        job.close()


def test_tasks_reach_the_listener_when_the_drivers_name_resolves_to_the_other_family_first(monkeypatch) -> None:
    """Review of issue 38, finding 7. Before: the listener bound the first of spark.driver.host's addresses
    (IPv4 here) while the tasks got the name and resolved it themselves, IPv6 first: their reports went to
    an address nobody listened on (no live progress, no fence). getaddrinfo's order may differ between two
    calls (RFC 6724 rules, /etc/gai.conf, a DNS answer): here the real one, the order flipped on each call."""

    real = socket.getaddrinfo
    flipped = {"calls": 0}

    def both_families(host, port, *args, **kwargs):
        if host != "driver.example":
            return real(host, port, *args, **kwargs)
        flipped["calls"] += 1
        v4 = real("127.0.0.1", port, socket.AF_INET, socket.SOCK_DGRAM)
        v6 = real("::1", port, socket.AF_INET6, socket.SOCK_DGRAM)
        return v4 + v6 if flipped["calls"] % 2 else v6 + v4

    monkeypatch.setattr(socket, "getaddrinfo", both_families)

    job = job_on_a_stand_in_session({"spark.driver.host": "driver.example"})
    try:
        address = job._live_address(WAVE)
        assert address is not None and job.live is not None
        report = TaskReporter(address, WAVE, task=0, task_attempt=0)
        report(7)
        wait_for(lambda: job.live.total() == 7, 5, "the task's count at the driver")  # type: ignore[union-attr]
        assert report.fenced() is None  # answered
        report.close()
    finally:
        job.close()


def test_the_fence_says_stop_to_a_closed_attempt_and_to_a_superseded_copy() -> None:
    counts = LiveCounts()
    counts.expect(WAVE)
    first = counts.update(report_datagram(WAVE, task=0, task_attempt=0, handled=1), now=10.0)
    assert first is not None and counts.go_on(first)
    rerun = counts.update(report_datagram(WAVE, task=0, task_attempt=1, handled=0), now=11.0)  # executor lost
    assert rerun is not None and counts.go_on(rerun)
    assert not counts.go_on(first)  # the lost executor's copy, still running: stop
    other = counts.update(report_datagram(WAVE, task=1, task_attempt=0, handled=1), now=11.0)
    assert other is not None and counts.go_on(other)
    counts.close()  # the wave's Spark job ended
    assert not counts.go_on(rerun) and not counts.go_on(other)
    # which copies still run: reported within QUIET and not their last report
    assert counts.running(now=12.0) == [(0, 0), (0, 1), (1, 0)]
    counts.update(report_datagram(WAVE, task=1, task_attempt=0, handled=2, ended=True), now=12.5)
    assert counts.running(now=12.5) == [(0, 0), (0, 1)]
    assert counts.running(now=10.0 + QUIET + 0.5) == [(0, 1)]  # (0, 0) went quiet: Spark killed its worker
    assert counts.running(now=11.0 + QUIET) == []


def test_a_reporter_stops_its_copy_when_the_driver_says_so_or_goes_quiet_for_the_lease() -> None:
    clock = FakeClock()
    listener = ProgressListener("127.0.0.1")
    try:
        listener.expect(WAVE)
        report = TaskReporter(("127.0.0.1", listener.port), WAVE, 0, 0, clock=clock, lease=30.0)
        report(1)
        assert report.fenced() is None
        clock.sleep(31.0)  # no answer since: the driver may have given this copy up
        assert "not answered" in (report.fenced() or "")
        report(2)  # answered again: go on
        assert report.fenced() is None
        listener.close_attempt()
        report(3)
        assert "closed" in (report.fenced() or "")
        report.close()
    finally:
        listener.close()


def test_a_task_of_a_closed_wave_attempt_stops_calling_the_handler() -> None:
    """The driver moved on to the wave's next attempt while a copy of the failed one still ran (an executor
    given up, or a worker not yet killed): the old task went on handling its keys beside the retry."""
    from tests.unit import catchup_handlers
    from tests.unit.test_catchup_apply import sorted_partition

    catchup_handlers.REACHED.clear()
    catchup_handlers.RELEASE.clear()
    catchup_handlers.HANDLED_OFFSETS.clear()
    listener = ProgressListener("127.0.0.1")
    outcome: dict[str, BaseException] = {}
    task = ApplyHandler(
        handler="tests.unit.catchup_handlers:gated",
        policy=RetryPolicy(max_attempts=1),
        dlq_topic="unused",
        sources=[("t", 0)],
        run_id=WAVE.run_id,
        wave=WAVE.wave,
        wave_attempt=WAVE.attempt,
        live_address=("127.0.0.1", listener.port),
    )

    def run() -> None:
        try:
            list(task(iter(sorted_partition([b"k"] * 200, batch_rows=50))))
        except Exception as error:
            outcome["error"] = error

    try:
        listener.expect(WAVE)
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        assert catchup_handlers.REACHED.wait(10)  # hang guard
        listener.expect(WaveAttempt(WAVE.run_id, WAVE.wave, WAVE.attempt + 1))  # the retry starts
        catchup_handlers.RELEASE.set()
        thread.join(30)  # hang guard
        assert not thread.is_alive()
    finally:
        catchup_handlers.RELEASE.set()
        listener.close()
    assert "error" in outcome, "the task handled its whole input beside the next attempt"
    assert "closed its wave attempt" in str(outcome["error"])
    # 20 ms a message: the copy learns at its next report (every second) and stops well before the end
    assert len(catchup_handlers.HANDLED_OFFSETS) < 150


def test_the_next_attempt_waits_until_the_closed_attempts_copies_ended() -> None:
    """``--wave-retry-pause 0`` started the retry while the failed attempt's tasks still ran (Spark kills
    them, and their Python workers after spark.python.task.killTimeout). Now ``_settle`` returns only
    once Spark runs none of them and every copy that reported sent its last report."""

    spark_running = [2, 1, 0]  # what Spark's status tracker says, one reading after the other
    ended_sent = threading.Event()

    class Tracker:
        def getJobIdsForGroup(self, group: str) -> list[int]:
            return [7] if group == "g-wave" else []

        def getJobInfo(self, job: int):
            return type("JobInfo", (), {"stageIds": [3]})()

        def getStageInfo(self, stage: int):
            count = spark_running.pop(0) if len(spark_running) > 1 else spark_running[0]
            return type("StageInfo", (), {"numActiveTasks": count})()

    job = job_on_a_stand_in_session({"spark.driver.host": "127.0.0.1"}, Tracker())
    try:
        address = job._live_address(WAVE)
        assert address is not None and job.live is not None
        copy = TaskReporter(address, WAVE, task=0, task_attempt=0)
        copy(5)
        wait_for(lambda: job.live.running() == [(0, 0)], 5, "the copy reported")  # type: ignore[union-attr]

        def end_later() -> None:
            wait_for(lambda: copy.fenced() is not None or copy(6) or False, 5, "told to stop")
            ended_sent.set()
            copy(6, ended=True)

        ender = threading.Thread(target=end_later, daemon=True)
        ender.start()
        assert job._settle("g-wave") == []
        assert ended_sent.is_set()  # event order: settled only after the copy's last report
        assert spark_running == [0]
        ender.join(5)  # hang guard
        copy.close()
    finally:
        job.close()


def test_a_copy_that_never_hears_the_driver_is_fenced_after_the_lease_since_it_started() -> None:
    """Review of issue 38, finding 8. Before: the lease counted only from a first answer, so a copy cut off
    from the driver from its start (on an executor Spark gave up on) was never fenced."""
    clock = FakeClock()
    silent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # receives, never answers: a driver out of reach
    silent.bind(("127.0.0.1", 0))
    try:
        report = TaskReporter(silent.getsockname(), WAVE, 0, 0, clock=clock, lease=30.0, answer_wait=0.01)
        report(0)
        assert report.fenced() is None  # within the lease
        clock.sleep(29.0)
        report(5)
        assert report.fenced() is None
        clock.sleep(2.0)
        assert "has not answered any report in the 30 s since the task started" in (report.fenced() or "")
        report.close()
    finally:
        silent.close()


def test_a_task_reports_before_its_first_handler_call() -> None:
    """Review of issue 38, finding 8. Before: the first report came a report interval after the task started,
    while its handler calls went on unfenced; a task shorter than the interval was never fenced at all."""
    events: list[str] = []

    def report(handled: int) -> None:
        events.append(f"report {handled}")

    def call(message) -> None:
        events.append("call")

    rows = [(lane_hash(b"k"), 0, n, n, b"k", b"v", [], None, None, None) for n in range(3)]
    rows.append((0, 0, PROGRESS_SCALE, 3, None, None, [], None, 3, 0))
    runner = TaskRunner(call, RetryPolicy(), None, [("t", 0)], "key", 2, 1000, report=report, report_interval=60.0)
    runner.run(iter([batch(rows)]))
    assert events[0] == "report 0" and events.index("call") > 0, events  # event order
    assert events[-1] == "report 3"


def test_the_driver_warns_once_when_no_task_of_an_attempt_reported(caplog) -> None:
    """Review of issue 38, finding 8: executors that cannot send UDP to the driver left no trace at the driver."""

    job = job_on_a_stand_in_session({"spark.driver.host": "127.0.0.1"})
    try:
        assert job._live_address(WAVE) is not None
        assert job._settle("g-wave") == []
        job._live_address(WaveAttempt(WAVE.run_id, 1, 1))
        job._settle("g-wave")
    finally:
        job.close()
    warnings = [r.message for r in caplog.records if "reported to the driver's live progress" in r.message]
    assert len(warnings) == 1 and "cannot send UDP to the driver" in warnings[0]
