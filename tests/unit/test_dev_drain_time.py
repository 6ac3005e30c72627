"""``keyorder dev`` reads both groups' drain moments between samples, not at their sampling intervals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from keyorder.devtools.demo import crossing_seconds_before


def sample(at: float, committed: int) -> SimpleNamespace:
    return SimpleNamespace(at=at, committed_total=committed)


def test_the_crossing_is_interpolated_between_two_samples():
    # 1,000 committed per second from 100.0 s: 1,500 was crossed at 101.5 s, 0.5 s before the sample at 102.0 s
    assert crossing_seconds_before(sample(100.0, 0), sample(102.0, 2_000), 1_500) == pytest.approx(0.5)


def test_a_sample_exactly_at_the_threshold_crossed_it_then():
    assert crossing_seconds_before(sample(100.0, 0), sample(102.0, 1_500), 1_500) == 0.0


@pytest.mark.parametrize("previous", [None, sample(100.0, 2_000), sample(100.0, 5_000)])
def test_without_progress_since_the_previous_sample_nothing_is_moved(previous):
    assert crossing_seconds_before(previous, sample(102.0, 2_000), 1_500) == 0.0


def test_a_previous_sample_already_past_the_threshold_moves_it_at_most_to_that_sample():
    assert crossing_seconds_before(sample(100.0, 1_800), sample(102.0, 2_000), 1_500) == pytest.approx(2.0)
