"""``live``: running Spark tasks' handled counts reach the driver while the tasks run."""

from __future__ import annotations

import threading

from keyorder.catchup.apply import TaskRunner
from keyorder.catchup.datasource import PROGRESS_SCALE, lane_hash
from keyorder.catchup.live import LiveCounts, ProgressListener, TaskReporter, WaveAttempt, report_datagram
from keyorder.core.retry import RetryPolicy
from tests.support import wait_for
from tests.unit.test_catchup_apply import batch

WAVE = WaveAttempt("run-1", 0, 1)


def test_the_latest_count_of_each_task_of_the_wave_attempt_under_way_is_summed() -> None:
    counts = LiveCounts()
    counts.expect(WAVE)
    assert counts.update(report_datagram(WAVE, task=0, task_attempt=0, handled=10))
    assert counts.update(report_datagram(WAVE, task=1, task_attempt=0, handled=5))
    assert counts.update(report_datagram(WAVE, task=0, task_attempt=0, handled=30))
    assert not counts.update(report_datagram(WaveAttempt("run-0", 0, 1), 0, 0, 999))  # another run
    assert not counts.update(report_datagram(WaveAttempt("run-1", 0, 2), 0, 0, 999))  # a later attempt: not yet
    assert not counts.update(b"{not json") and not counts.update(b'{"run": "run-1"}')
    assert counts.update(report_datagram(WAVE, task=0, task_attempt=0, handled=20))  # late, out of order
    assert counts.total() == 35  # task 0's highest (30) plus task 1's 5
    counts.expect(WaveAttempt("run-1", 0, 2))  # the wave runs again: its tasks start from 0
    assert counts.total() == 0
    assert not counts.update(report_datagram(WAVE, task=0, task_attempt=0, handled=30))  # the failed attempt's


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
