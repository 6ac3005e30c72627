"""ThreadLimit: how many handler threads are worth running, from the process's CPU per wall second."""

from __future__ import annotations

from keyorder.core.concurrency import ThreadLimit


def drive(limit: ThreadLimit, usage_for, seconds: float, waiting: int = 100, start: float = 0.0) -> list[int]:
    """Run ``limit`` for ``seconds`` of simulated time in steps of 0.05 s; ``usage_for(threads)`` is the CPU
    per wall second the process shows while that many threads run. Returns the limit after each step."""
    now, cpu, seen = start, 0.0, []
    while now < start + seconds:
        now += 0.05
        cpu += 0.05 * usage_for(limit.limit)
        seen.append(limit.update(now, cpu, waiting))
    return seen


def test_a_cpu_bound_handler_ends_at_one_thread_within_about_a_second() -> None:
    limit = ThreadLimit(16)
    seen = drive(limit, lambda threads: 1.0, seconds=1.5)
    assert seen[-1] == 1
    assert seen.index(1) * 0.05 <= 1.25  # 16 -> 8 -> 4 -> 2 -> 1, one window (0.25 s) each


def test_an_io_bound_handler_keeps_every_thread() -> None:
    limit = ThreadLimit(16)
    seen = drive(limit, lambda threads: 0.03 * threads, seconds=10)
    assert set(seen) == {16}


def test_a_step_down_that_cuts_useful_work_is_undone_and_held() -> None:
    """A handler that waits 1 ms and computes 0.1 ms: 16 threads saturate the GIL (u capped at 1), 8 do
    not (u = 8 x 0.1 / 1.1 = 0.73): the step to 8 is undone, and not tried again for ``hold`` seconds."""
    limit = ThreadLimit(16, hold=30.0)
    seen = drive(limit, lambda threads: min(1.0, threads * 0.1 / 1.1), seconds=20)
    assert seen[-1] == 16
    assert seen.count(8) <= 6  # one window (0.25 s) at 8, then back to 16 for the rest of the hold
    later = drive(limit, lambda threads: min(1.0, threads * 0.1 / 1.1), seconds=20, start=20.0)
    assert 8 in later  # after the hold it probes again


def test_a_handler_computing_outside_the_gil_keeps_the_threads_that_use_the_cores() -> None:
    """numpy-like work on 2 cores: u is 2 with 2 or more threads and 1 with one: it ends at 2."""
    limit = ThreadLimit(16)
    seen = drive(limit, lambda threads: float(min(threads, 2)), seconds=5)
    assert seen[-1] == 2


def test_threads_come_back_when_work_waits_and_the_process_is_idle() -> None:
    limit = ThreadLimit(16)
    drive(limit, lambda threads: 1.0, seconds=2)
    assert limit.limit == 1
    seen = drive(limit, lambda threads: 0.03 * threads, seconds=2, start=2.0)  # the handler now waits
    assert seen[-1] == 16


def test_no_threads_are_added_without_waiting_work() -> None:
    limit = ThreadLimit(16)
    drive(limit, lambda threads: 1.0, seconds=2)
    seen = drive(limit, lambda threads: 0.1, seconds=2, waiting=0, start=2.0)
    assert set(seen) == {1}
