"""``BackingOffLagSource``: an unreachable cluster is asked once per back-off period, not every poll."""

from __future__ import annotations

import pytest

from keyorder_operator.observe import BackingOffLagSource, LagSample, LagUnavailable

SAMPLE = LagSample(at=0.0, partitions=1, end_total=10, committed_total=5)


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
    source = BackingOffLagSource(inner, first_seconds=5, longest_seconds=20, jitter=0.0)
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
    early = BackingOffLagSource(inner, first_seconds=10, jitter=0.25, random=lambda: next(draws))
    with pytest.raises(LagUnavailable):
        early.sample(["t"], "g", 0.0)
    with pytest.raises(LagUnavailable, match="not asked again for 8 s"):  # 10 s x 0.75
        early.sample(["t"], "g", 0.0)
    late = BackingOffLagSource(ScriptedSource(), first_seconds=10, jitter=0.25, random=lambda: next(draws))
    with pytest.raises(LagUnavailable):
        late.sample(["t"], "g", 0.0)
    with pytest.raises(LagUnavailable, match="not asked again for 12 s"):  # 10 s x 1.25
        late.sample(["t"], "g", 0.0)
