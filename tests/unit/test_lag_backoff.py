"""``BoundedLagSource``: an unreachable cluster is asked once per back-off period, not every poll, and
a poll never waits long on Kafka (the probes run on their own threads)."""

from __future__ import annotations

import threading
import time

import pytest

from keyorder_operator.observe import BoundedLagSource, LagSample, LagUnavailable

SAMPLE = LagSample(at=0.0, partitions=1, end_total=10, committed_total=5)


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
    source = BoundedLagSource(inner, first_seconds=5, longest_seconds=20, jitter=0.0, start_probe=inline)
    asked_at = []
    for now in range(0, 60):
        try:
            source.sample(["t"], "g", float(now))
        except LagUnavailable as error:
            if inner.calls > len(asked_at):
                asked_at.append(now)
            else:
                assert "not asked again for" in str(error) and "Kafka did not answer" in str(error)
    assert asked_at == [0, 5, 15, 35, 55], "asked again after 5, 10, 20 (the longest), 20 s"
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
    early = BoundedLagSource(inner, first_seconds=10, jitter=0.25, random=lambda: next(draws), start_probe=inline)
    with pytest.raises(LagUnavailable):
        early.sample(["t"], "g", 0.0)
    with pytest.raises(LagUnavailable, match="not asked again for 8 s"):  # 10 s x 0.75
        early.sample(["t"], "g", 0.0)
    late = BoundedLagSource(
        ScriptedSource(), first_seconds=10, jitter=0.25, random=lambda: next(draws), start_probe=inline
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


def test_a_slow_answer_holds_the_poll_at_most_the_wait_and_comes_with_the_next_poll():
    inner = BlockingSource()
    source = BoundedLagSource(inner, wait_seconds=0.05)
    with pytest.raises(LagUnavailable, match=r"has not answered within 0\.05 s"):
        source.sample(["t"], "g", 100.0)
    with pytest.raises(LagUnavailable, match="asked 5 s ago"):
        source.sample(["t"], "g", 105.0)
    assert inner.calls == 1, "one request at a time per resource"
    inner.release.set()
    deadline = time.monotonic() + 10
    while True:  # the late answer is kept for the next poll
        try:
            answer = source.sample(["t"], "g", 110.0)
            break
        except LagUnavailable:
            assert time.monotonic() < deadline, "the late answer never came"
            time.sleep(0.01)
    assert answer.at == 100.0, "the answer to the request sent at 100 s"
    assert inner.calls == 1


def test_a_due_probe_while_backing_off_never_holds_the_poll():
    inner = BlockingSource(fail_first=True)
    source = BoundedLagSource(inner, first_seconds=10, jitter=0.0, wait_seconds=30)
    with pytest.raises(LagUnavailable, match="all brokers are down"):
        source.sample(["t"], "g", 0.0)
    started = time.monotonic()
    with pytest.raises(LagUnavailable, match="asked again in the background after: Kafka: all brokers are down"):
        source.sample(["t"], "g", 10.0)
    assert time.monotonic() - started < 10, "the poll waited for the background probe"
    assert inner.calls == 2
    inner.release.set()
    deadline = time.monotonic() + 10
    while True:  # its success ends the back-off and brings the lag
        try:
            assert source.sample(["t"], "g", 12.0).at == 10.0
            break
        except LagUnavailable:
            assert time.monotonic() < deadline, "the background answer never came"
            time.sleep(0.01)


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
