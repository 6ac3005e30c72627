"""Revoke and shutdown with a FAKE clock: what a rebalance waits for, and for how long.

The pool and its worker threads are real; the source is a FAKE recording one (no broker needed to
see which deliveries are handed back and what is committed) and time is a FAKE clock whose
``sleep`` advances it, so a 10 s drain timeout takes milliseconds and is measured exactly.
"""

from __future__ import annotations

import threading
import time

import pytest

from keyorder.core import offset_metadata
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.core.routing import Ordering
from keyorder.engine.poll_loop import ConsumerRuntime, RuntimeSettings
from keyorder.engine.worker_pools import Completions, ThreadWorkerPool
from keyorder.message import Message
from tests.conftest import wait_until
from tests.fakes import FakeClock, RecordingSource

PID = ("t", 0)


PARKED_FOR_A_RETRY = RetryPolicy(
    max_attempts=5, initial_backoff=60.0, max_backoff=60.0, exhausted=ExhaustedPolicy.BLOCK
)
BLOCKED_AT_ONCE = RetryPolicy(max_attempts=1, initial_backoff=60.0, max_backoff=60.0, exhausted=ExhaustedPolicy.BLOCK)
RETRIED_IN_A_SECOND = RetryPolicy(max_attempts=5, initial_backoff=1.0, max_backoff=1.0, exhausted=ExhaustedPolicy.DLQ)
BLOCKED_RETRIED_EVERY_SECOND = RetryPolicy(
    max_attempts=1, initial_backoff=1.0, max_backoff=1.0, exhausted=ExhaustedPolicy.BLOCK
)


class Scenario:
    """Offsets 0..5 on one partition: key ``slow`` (0) is inside its handler until released, key
    ``failing`` (1) is parked for a 60 s retry (or blocked, retried every 60 s), and keys ``a``/``b``
    (2..5) are queued behind W=2.

    ``release_after``: the slow handler returns once the runtime has slept that many (fake) seconds
    from then on; the runtime's sleep that reaches it waits (in real time) until the handler's
    completion is queued, so the fake time it took is exact.

    ``failures``: how many attempts of the failing key raise (None: all). With fewer, the runtime's
    sleep that reaches the retry's due time waits (in real time) until the retry's completion is
    queued: an idle worker waits for a due time in real seconds, the runtime's sleep is fake."""

    def __init__(
        self,
        revoke_drain_timeout: float = 10.0,
        shutdown_grace: float = 25.0,
        retry: RetryPolicy = PARKED_FOR_A_RETRY,
        failures: int | None = None,
    ) -> None:
        self.release = threading.Event()
        self.release_at: float | None = None
        self.failures = failures
        self.retry_due: float | None = None
        self.started: list[int] = []
        self.clock = FakeClock()
        self.source = RecordingSource({PID: 0})
        self.completions = completions = Completions()
        self.pool = ThreadWorkerPool(self.handle, 2, retry, None, completions, clock=self.clock)
        settings = RuntimeSettings(
            topics=("t",), revoke_drain_timeout=revoke_drain_timeout, shutdown_grace=shutdown_grace
        )
        self.runtime = ConsumerRuntime(
            settings, self.source, self.pool, Ordering.KEY, completions, clock=self.clock, sleep=self.sleep
        )
        self.runtime._on_assign([PID])
        self.pool.start()

    def release_after(self, seconds: float) -> None:
        self.release_at = self.clock() + seconds

    def sleep(self, seconds: float) -> None:
        self.clock.sleep(seconds)
        if self.release_at is not None and self.clock() >= self.release_at and not self.release.is_set():
            self.release.set()
            wait_until(lambda: len(self.completions) > 0, 5, "the released handler's completion")
        if self.retry_due is not None and self.clock() >= self.retry_due:
            self.retry_due = None
            wait_until(lambda: len(self.completions) > 0, 5, "the retry's completion")

    def wait_for_the_queued_keys(self) -> None:
        """Until keys a and b (2..5) are done: what is left is the slow handler (if held) and the failing key."""
        wait_until(
            lambda: len(self.started) >= 6 and self.pool.lane_summary().ready == 0, 5, "the queued keys to finish"
        )

    def handle(self, message: Message) -> None:
        self.started.append(message.offset)
        if message.key == b"slow":
            self.release.wait(30)
        elif message.key == b"failing" and (
            self.failures is None or self.started.count(message.offset) <= self.failures
        ):
            raise RuntimeError("downstream refused")
        else:
            time.sleep(0.05)

    def dispatch(self) -> None:
        keys = [b"slow", b"failing", b"a", b"b", b"a", b"b"]
        messages = [Message("t", 0, offset, key, b"{}") for offset, key in enumerate(keys)]
        self.runtime._dispatch(messages, self.clock())
        wait_until(lambda: self.pool.lane_summary().parked == 1, 5, "the failing key to be parked")

    def stop(self) -> None:
        self.release.set()
        self.pool.stop(5)


def test_revoke_hands_back_queued_and_parked_at_once_and_waits_only_for_the_running_handler() -> None:
    scenario = Scenario(revoke_drain_timeout=10.0)
    try:
        scenario.dispatch()
        before = scenario.clock()
        # the idle worker may go on with the queued keys (a, b) until the revoke withdraws them: what it
        # started before the revoke is legitimate, nothing queued may start after it
        started_before = len(scenario.started)
        scenario.runtime._on_revoke([PID])
        waited = scenario.clock() - before
        assert 10.0 <= waited < 10.1, f"waited {waited:.3f}s of fake time for the running handler"
        assert scenario.started.count(1) == 1, "the parked key was not retried during the revoke"
        started_after = set(scenario.started[started_before:])
        assert not {2, 3, 4, 5} & started_after, f"queued deliveries ran after the revoke: {started_after}"
        assert scenario.runtime.inflight == 1, "only the running handler is still in flight"
        assert scenario.pool.lane_summary().parked == 0, "the parked delivery was handed back"
        (offsets, asynchronous), *_ = scenario.source.commits
        assert offsets[PID][0] == 0 and not asynchronous, "a synchronous commit at the running min-offset"
        assert PID not in scenario.runtime.partitions
    finally:
        scenario.stop()


def test_revoke_with_no_running_handler_does_not_wait_for_a_parked_retry() -> None:
    scenario = Scenario(revoke_drain_timeout=10.0)
    try:
        scenario.release.set()  # the slow key finishes at once
        scenario.dispatch()
        wait_until(
            lambda: scenario.pool.lane_summary().running == 0 and len(scenario.started) >= 6, 5, "the others to finish"
        )
        before = scenario.clock()
        scenario.runtime._on_revoke([PID])
        assert scenario.clock() - before < 0.1, "nothing was running: the 60 s backoff must not hold the rebalance"
        (offsets, _asynchronous), *_ = scenario.source.commits
        assert offsets[PID][0] == 1, "committed up to the parked (unfinished) offset 1"
    finally:
        scenario.stop()


def test_shutdown_waits_up_to_the_grace_period_then_commits_the_min_offset() -> None:
    scenario = Scenario(shutdown_grace=25.0)
    try:
        scenario.dispatch()
        before = scenario.clock()
        scenario.runtime._shutdown()
        waited = scenario.clock() - before
        assert 25.0 <= waited < 25.1, f"waited {waited:.3f}s of fake time"
        offsets, asynchronous = scenario.source.commits[-1]
        assert offsets[PID][0] == 0 and not asynchronous, "the final synchronous commit at the stuck min-offset"
    finally:
        scenario.stop()


def committed_with_done_above(source: RecordingSource) -> tuple[int, set[int]]:
    offsets, asynchronous = source.commits[-1]
    assert not asynchronous, "the last commit is the synchronous one of the shutdown"
    position, metadata = offsets[PID]
    return position, offset_metadata.decode(metadata, position)


def test_shutdown_waits_for_a_running_handler_but_not_for_a_parked_retry() -> None:
    scenario = Scenario(shutdown_grace=25.0)
    try:
        scenario.dispatch()
        scenario.wait_for_the_queued_keys()
        before = scenario.clock()
        scenario.release_after(3.0)
        scenario.runtime._shutdown()
        waited = scenario.clock() - before
        assert 3.0 <= waited < 3.1, f"waited {waited:.3f}s of fake time: the handler took 3 s, the retry is due in 60"
        assert committed_with_done_above(scenario.source) == (1, {2, 3, 4, 5}), (
            "committed below the parked offset 1, with everything finished above it (0 included) done"
        )
        assert scenario.started.count(1) == 1, "the parked key was not retried"
        assert scenario.runtime.inflight == 0, "the parked delivery was handed back"
    finally:
        scenario.stop()


def test_shutdown_waits_for_a_retry_due_within_the_grace_and_commits_it() -> None:
    """No handler running and no lane ready, but the failing key's retry is due in 1 s of a 25 s
    grace: it runs (and succeeds) before the pod stops, and its offset is committed."""
    scenario = Scenario(shutdown_grace=25.0, retry=RETRIED_IN_A_SECOND, failures=1)
    try:
        scenario.release.set()  # the slow key finishes at once
        scenario.dispatch()
        scenario.wait_for_the_queued_keys()
        wait_until(lambda: scenario.pool.lane_summary().running == 0, 5, "every handler to return")
        scenario.retry_due = scenario.pool.lane_summary().next_retry_due
        assert scenario.retry_due is not None and scenario.retry_due - scenario.clock() <= 1.0
        before = scenario.clock()
        scenario.runtime._shutdown()
        waited = scenario.clock() - before
        assert scenario.started.count(1) == 2, f"offset 1 ran {scenario.started.count(1)} times (waited {waited:.3f}s)"
        assert waited <= 1.1, f"waited {waited:.3f}s of fake time: the retry was due within 1 s"
        assert committed_with_done_above(scenario.source) == (6, set()), "everything handled and committed"
        assert scenario.runtime.inflight == 0
    finally:
        scenario.stop()


@pytest.mark.parametrize(
    "retry",
    [PARKED_FOR_A_RETRY, BLOCKED_AT_ONCE, BLOCKED_RETRIED_EVERY_SECOND],
    ids=["parked past the grace", "blocked", "blocked, retried within the grace"],
)
def test_shutdown_with_no_handler_running_ends_at_once_and_leaves_the_stuck_offset_uncommitted(
    retry: RetryPolicy,
) -> None:
    scenario = Scenario(shutdown_grace=25.0, retry=retry)
    try:
        scenario.release.set()  # the slow key finishes at once
        scenario.dispatch()
        scenario.wait_for_the_queued_keys()
        wait_until(lambda: scenario.pool.lane_summary().running == 0, 5, "every handler to return")
        assert scenario.pool.lane_summary().blocked == (0 if retry is PARKED_FOR_A_RETRY else 1)
        before = scenario.clock()
        scenario.runtime._shutdown()
        waited = scenario.clock() - before
        assert waited < 0.1, f"waited {waited:.3f}s of fake time with nothing that could finish (grace 25 s)"
        position, done = committed_with_done_above(scenario.source)
        assert (position, done) == (1, {2, 3, 4, 5}), "offset 1 is re-delivered after the restart, nothing else"
        assert scenario.runtime.inflight == 0
    finally:
        scenario.stop()
