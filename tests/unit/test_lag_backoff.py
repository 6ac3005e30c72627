"""``BoundedLagSource``: an unreachable cluster is asked once per back-off period, not every poll, and
a poll never waits long on Kafka (the probes run on their own threads)."""

from __future__ import annotations

import threading
import time

import pytest

from keyorder_operator.observe import BoundedLagSource, LagSample, LagUnavailable
from tests.support import wait_for

SAMPLE = LagSample(at=0.0, partitions=1, end_total=10, committed_total=5)


def stopped_clock() -> float:  # never moves: the probes take no time in these schedules
    return 0.0


def inline(probe):  # stands in for the probe thread: the schedule stays deterministic
    probe()


class ScriptedSource:
    """A fake lag source (named as one): fails while ``down``, counts the calls it gets."""

    def __init__(self) -> None:
        self.down = True
        self.calls = 0
        self.closed = False

    def sample(self, topics, group, now):
        self.calls += 1
        if self.down:
            raise LagUnavailable("Kafka did not answer within 5.0s")
        return SAMPLE

    def close(self):
        self.closed = True


def test_failures_back_off_doubling_and_one_success_resets():
    inner = ScriptedSource()
    source = BoundedLagSource(
        inner, first_seconds=5, longest_seconds=20, jitter=0.0, start_probe=inline, monotonic=stopped_clock
    )
    asked_at = []
    reasons = set()
    for now in range(0, 60):
        try:
            source.sample(["t"], "g", float(now))
        except LagUnavailable as error:
            reasons.add(error.reason)
            if inner.calls > len(asked_at):
                asked_at.append(now)
            else:
                assert "not asked again for" in str(error) and "Kafka did not answer" in str(error)
    assert asked_at == [0, 5, 15, 35, 55], "asked again after 5, 10, 20 (the longest), 20 s"
    # the countdown is in the message (logs, the first Event), not in the reason the condition shows:
    # a cluster that stays down does not rewrite status on every poll
    assert len(reasons) == 1 and "not asked again" not in reasons.pop()
    inner.down = False
    assert source.sample(["t"], "g", 75.0) is SAMPLE
    inner.down = True
    with pytest.raises(LagUnavailable):
        source.sample(["t"], "g", 76.0)
    calls = inner.calls
    with pytest.raises(LagUnavailable, match="not asked again for 4 s"):
        source.sample(["t"], "g", 77.0)
    assert inner.calls == calls, "the back-off starts again at the first period after a success"
    source.close()
    assert inner.closed


def test_jitter_spreads_the_next_try_within_its_bounds():
    draws = iter([0.0, 1.0])
    inner = ScriptedSource()
    early = BoundedLagSource(
        inner, first_seconds=10, jitter=0.25, random=lambda: next(draws), start_probe=inline, monotonic=stopped_clock
    )
    with pytest.raises(LagUnavailable):
        early.sample(["t"], "g", 0.0)
    with pytest.raises(LagUnavailable, match="not asked again for 8 s"):  # 10 s x 0.75
        early.sample(["t"], "g", 0.0)
    late = BoundedLagSource(
        ScriptedSource(),
        first_seconds=10,
        jitter=0.25,
        random=lambda: next(draws),
        start_probe=inline,
        monotonic=stopped_clock,
    )
    with pytest.raises(LagUnavailable):
        late.sample(["t"], "g", 0.0)
    with pytest.raises(LagUnavailable, match="not asked again for 12 s"):  # 10 s x 1.25
        late.sample(["t"], "g", 0.0)


class BlockingSource:
    """A fake lag source (named as one) that answers only when the test releases it, like a cluster
    whose requests hang until the client's timeout."""

    def __init__(self, fail_first: bool = False) -> None:
        self.release = threading.Event()
        self.calls = 0
        self.fail_first = fail_first

    def sample(self, topics, group, now):
        self.calls += 1
        if self.fail_first and self.calls == 1:
            raise LagUnavailable("Kafka: all brokers are down")
        if not self.release.wait(30):
            raise LagUnavailable("never released")
        return LagSample(at=now, partitions=1, end_total=10, committed_total=5)

    def close(self):
        pass


class GatedSource:
    """A fake lag source (named as one): call ``i`` answers only once the test opens gate ``i``, like a
    cluster that takes longer than the poll waits; ``answered`` counts the calls that returned."""

    def __init__(self, calls: int) -> None:
        self.gates = [threading.Event() for _ in range(calls)]
        self.calls = 0
        self.answered = threading.Semaphore(0)

    def sample(self, topics, group, now):
        gate = self.gates[self.calls]
        self.calls += 1
        assert gate.wait(30), "never released"
        self.answered.release()
        return LagSample(at=now, partitions=len(topics), end_total=10, committed_total=5)

    def close(self):
        pass


def test_a_slow_cluster_answers_every_poll_one_poll_late_and_a_fast_one_is_current_again():
    inner = GatedSource(calls=4)
    source = BoundedLagSource(inner, wait_seconds=0.05)
    with pytest.raises(LagUnavailable, match=r"has not answered within 0\.05 s"):
        source.sample(["t"], "g", 100.0)
    with pytest.raises(LagUnavailable, match="asked 5 s ago"):
        source.sample(["t"], "g", 105.0)
    assert inner.calls == 1, "one request at a time per resource"
    inner.gates[0].set()
    assert inner.answered.acquire(timeout=10)
    # still slow: each poll gets the previous poll's answer and starts the next request
    assert source.sample(["t"], "g", 110.0).at == 100.0
    inner.gates[1].set()
    assert inner.answered.acquire(timeout=10)
    assert source.sample(["t"], "g", 120.0).at == 110.0
    assert inner.calls == 3
    # fast again: the poll's own request answers within the wait, and the lag is current
    inner.gates[2].set()
    inner.gates[3].set()
    assert inner.answered.acquire(timeout=10)
    answer = source.sample(["t"], "g", 130.0)
    assert answer.at == 130.0 and inner.calls == 4


def test_a_request_that_hangs_gives_one_reason_on_every_poll_until_it_fails():
    """The reason is what the LagUnknown condition shows: the same state in other words on the next poll
    would be a status write for nothing (at 500 resources, the unreachable ones' only writes)."""
    inner = BlockingSource()
    source = BoundedLagSource(inner, wait_seconds=0.05)
    reasons = []
    for now in (100.0, 105.0, 110.0):
        with pytest.raises(LagUnavailable) as raised:
            source.sample(["t"], "g", now)
        reasons.append(raised.value.reason)
    assert reasons == ["Kafka has not answered within 0.05 s"] * 3
    assert "asked 10 s ago" in str(raised.value)  # the message still says how long it has waited
    inner.release.set()


def test_a_kept_answer_is_never_returned_for_other_topics_or_another_group():
    inner = GatedSource(calls=2)
    source = BoundedLagSource(inner, wait_seconds=0.05)
    with pytest.raises(LagUnavailable):
        source.sample(["a"], "g", 0.0)
    inner.gates[0].set()
    assert inner.answered.acquire(timeout=10)
    inner.gates[1].set()
    answer = source.sample(["a", "b", "c"], "other", 10.0)  # the spec changed meanwhile
    assert (answer.at, answer.partitions) == (10.0, 3), "an answer about the old topics was returned"


def test_a_request_that_cannot_start_is_reported_and_never_leaves_the_source_stuck():
    attempts = []

    def no_thread(probe):
        attempts.append(probe)
        if len(attempts) == 1:
            raise RuntimeError("can't start new thread")
        probe()

    source = BoundedLagSource(ScriptedSource(), start_probe=no_thread)
    with pytest.raises(LagUnavailable, match="could not be started: can't start new thread"):
        source.sample(["t"], "g", 0.0)
    source.inner.down = False
    assert source.sample(["t"], "g", 1.0) is SAMPLE, "still 'in flight' after a request that never started"


def test_the_back_off_counts_from_the_failure_not_from_the_request():
    clock = [0.0]

    class TimesOut(ScriptedSource):
        def sample(self, topics, group, now):
            clock[0] += 5.0  # the client's timeout passes on the probe thread
            return super().sample(topics, group, now)

    source = BoundedLagSource(TimesOut(), first_seconds=15, jitter=0.0, start_probe=inline, monotonic=lambda: clock[0])
    with pytest.raises(LagUnavailable, match="did not answer"):
        source.sample(["t"], "g", 100.0)
    with pytest.raises(LagUnavailable, match="not asked again for 5 s"):
        source.sample(["t"], "g", 115.0)  # failed at 105: asked again at 120


def test_a_due_probe_while_backing_off_never_holds_the_poll():
    inner = BlockingSource(fail_first=True)
    source = BoundedLagSource(inner, first_seconds=10, jitter=0.0, wait_seconds=30)
    with pytest.raises(LagUnavailable, match="all brokers are down"):
        source.sample(["t"], "g", 0.0)
    started = time.monotonic()
    with pytest.raises(LagUnavailable, match="asked again in the background after: Kafka: all brokers are down"):
        source.sample(["t"], "g", 10.5)  # due: the failure took a moment, the back-off counts from its end
    # hang guard: the probe blocks until released, so waiting for it would take the whole wait_seconds (30)
    assert time.monotonic() - started < 10, "the poll waited for the background probe"
    assert inner.calls == 2
    inner.release.set()

    def answered() -> bool:  # its success ends the back-off; the next poll's own request answers at once
        try:
            return source.sample(["t"], "g", 12.0).at == 12.0
        except LagUnavailable:
            return False

    wait_for(answered, 10, "the background answer", interval=0.01)


def test_an_unexpected_error_on_the_probe_thread_is_a_failure_that_backs_off():
    class Broken:
        def sample(self, topics, group, now):
            raise RuntimeError("librdkafka said something new")

        def close(self):
            pass

    source = BoundedLagSource(Broken(), first_seconds=10, jitter=0.0)
    with pytest.raises(LagUnavailable, match="reading the lag failed: RuntimeError"):
        source.sample(["t"], "g", 0.0)
    with pytest.raises(LagUnavailable, match="not asked again for 5 s"):
        source.sample(["t"], "g", 5.0)
