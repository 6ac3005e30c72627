"""SIGTERM and SIGINT stop ``keyorder catchup`` (``keyorder.catchup.signals``): the pure parts and the plumbing.

Real signals to this process: the handler records the first one and a thread of its own calls
``cancel`` (never the main thread, which is busy in py4j during a wave), again and again until the
block ends; a second signal exits at once. The status and the report of a stopped run are pure.
The real stop of a running job, on a real Spark cluster, is ``tests/spark/test_standalone_cluster.py``.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from keyorder.catchup.command import EXIT_FAILED, exit_status
from keyorder.catchup.job import Outcome, Plan, WaveOutcome, stopped_error
from keyorder.catchup.plan import Audit, OffsetRange
from keyorder.catchup.signals import StopSignals, signal_exit_status, stop_reason
from tests.support import wait_for


class Exited(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _exit(status: int) -> None:
    raise Exited(status)


def test_the_first_signal_is_handed_to_cancel_on_another_thread_until_the_block_ends() -> None:
    calls: list[tuple[str, str]] = []
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(lambda reason: calls.append((reason, threading.current_thread().name)), interval=0.01) as stop:
        assert signal.getsignal(signal.SIGTERM) != before
        signal.raise_signal(signal.SIGTERM)
        wait_for(lambda: len(calls) >= 3, 10, "cancel called again and again")
    assert stop.signum == signal.SIGTERM and stop.reason == "stopped by SIGTERM"
    assert {reason for reason, _ in calls} == {"stopped by SIGTERM"}
    assert threading.main_thread().name not in {thread for _, thread in calls}
    count = len(calls)
    time.sleep(0.05)
    assert len(calls) == count  # nothing calls cancel once the block has ended
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handlers are back


def test_sigint_stops_the_same_way_instead_of_raising_keyboard_interrupt() -> None:
    reasons: list[str] = []
    with StopSignals(reasons.append, interval=0.01) as stop:
        signal.raise_signal(signal.SIGINT)
        wait_for(lambda: reasons, 10, "cancel called")
    assert stop.signum == signal.SIGINT and reasons[0] == "stopped by SIGINT"


def test_a_second_signal_exits_at_once_with_128_plus_its_number() -> None:
    with pytest.raises(Exited) as exited, StopSignals(lambda reason: None, exit=_exit) as stop:
        signal.raise_signal(signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        signal.raise_signal(signal.SIGTERM)
    assert exited.value.status == 143


def test_without_a_signal_nothing_is_cancelled() -> None:
    calls: list[str] = []
    with StopSignals(calls.append, interval=0.01) as stop:
        time.sleep(0.05)
    assert stop.signum is None and stop.reason is None and calls == []


def test_a_cancel_that_fails_does_not_end_the_watch() -> None:
    calls: list[str] = []

    def cancel(reason: str) -> None:
        calls.append(reason)
        raise RuntimeError("Spark is not started yet")

    with StopSignals(cancel, interval=0.01):
        signal.raise_signal(signal.SIGTERM)
        wait_for(lambda: len(calls) >= 2, 10, "cancel called again after a failure")


def test_outside_the_main_thread_it_installs_nothing() -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def body() -> None:
        with StopSignals(lambda reason: None):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before]


@pytest.mark.parametrize(
    ("signum", "status", "reason"),
    [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "stopped by SIGINT")],
)
def test_the_status_of_a_stopped_run_is_128_plus_the_signal(signum: int, status: int, reason: str) -> None:
    assert signal_exit_status(signum) == status
    assert stop_reason(signum) == reason


RANGES = [OffsetRange("t", 0, 0, 300), OffsetRange("t", 1, 0, 300)]
WAVES = [[OffsetRange("t", p, 100 * i, 100 * (i + 1)) for p in (0, 1)] for i in range(3)]


def wave(index: int, committed: bool = False, error: str | None = None) -> WaveOutcome:
    return WaveOutcome(index, WAVES[index], 1.0, audit=Audit(), committed=committed, error=error)


def stopped_outcome(waves: list[WaveOutcome]) -> Outcome:
    plan = Plan(RANGES, [r for w in WAVES for r in w], [], {}, True, WAVES)
    reason = stop_reason(signal.SIGTERM)
    return Outcome(plan, Audit(), 9.0, error=stopped_error(reason, waves, 3), waves=waves, stopped=reason)


@pytest.mark.parametrize(
    ("waves", "expected"),
    [
        (
            [wave(0, committed=True), wave(1, error="stopped by SIGTERM: the wave was cancelled")],
            "stopped by SIGTERM during wave 2 of 3 (cancelled, not committed); committed waves: 1; "
            "a rerun starts at the first uncommitted wave",
        ),
        (
            [wave(0, committed=True), wave(1, committed=True)],
            "stopped by SIGTERM after wave 2 of 3; committed waves: 1, 2; a rerun starts at the first uncommitted wave",
        ),
        (
            [],
            "stopped by SIGTERM before the first of 3 waves; no wave committed; "
            "a rerun starts at the first uncommitted wave",
        ),
        (
            [wave(0, error="stopped by SIGTERM: the wave was cancelled")],
            "stopped by SIGTERM during wave 1 of 3 (cancelled, not committed); no wave committed; "
            "a rerun starts at the first uncommitted wave",
        ),
    ],
)
def test_the_error_of_a_stopped_run_says_where_it_stopped_and_what_stays_committed(
    waves: list[WaveOutcome], expected: str
) -> None:
    assert stopped_error("stopped by SIGTERM", waves, 3) == expected


def test_a_stopped_run_reports_the_signal_and_exits_with_its_status() -> None:
    outcome = stopped_outcome([wave(0, committed=True), wave(1, error="stopped by SIGTERM: the wave was cancelled")])
    report = outcome.report()
    assert report["ok"] is False and report["committed"] is False
    assert report["stopped"] == "stopped by SIGTERM"
    assert report["error"].startswith("stopped by SIGTERM during wave 2 of 3")
    assert report["waves_planned"] == 3 and report["waves_committed"] == 1
    assert [w["committed"] for w in report["waves"]] == [True, False]
    assert exit_status(outcome, signal.SIGTERM) == 143
    assert exit_status(outcome, signal.SIGINT) == 130


def test_a_run_that_was_not_stopped_exits_0_or_1_whatever_signal_came_after_it() -> None:
    plan = Plan(RANGES, [], [], {}, True, WAVES)
    done = Outcome(plan, Audit(), 1.0, waves=[wave(i, committed=True) for i in range(3)])
    failed = Outcome(plan, Audit(), 1.0, error="KeyBlocked: k", waves=[wave(0, error="KeyBlocked: k")])
    assert done.report()["stopped"] is None
    assert exit_status(done, None) == 0 and exit_status(done, signal.SIGTERM) == 0
    assert exit_status(failed, None) == EXIT_FAILED
