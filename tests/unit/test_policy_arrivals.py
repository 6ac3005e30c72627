"""The arrival rate the policy keeps up with, and a scale-in while pods do not report (issue 39, defects
in ``keyorder_operator.policy``: a step up after a burst had ended, and a silent pod holding the group at
its peak). The scenarios ``burst-ends`` and ``silent-pod-idle`` judge them over a whole run; these tables
pin the rules themselves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from keyorder_operator.policy import (
    Observation,
    ScalingState,
    Size,
    growth_unknown,
    kept_up,
    quiet_scale_in,
    smoothed_arrivals,
)
from tests.unit.policy_fixtures import LIMITS

LEVEL = (800.0, 820.0, 790.0, 810.0)


@pytest.mark.parametrize(
    ("earlier", "latest", "expected"),
    [
        (LEVEL, 805.0, 805.0),  # one level with noise: the median of the last three
        ((800.0, 800.0, 800.0, 40_000.0), 40_000.0, 800.0),  # a 30 s step up has not lasted
        ((800.0, 40_000.0, 40_000.0, 40_000.0), 800.0, 800.0),  # the burst ended: at once
        ((40_000.0,) * 4, 40_000.0, 40_000.0),  # a rise that held for five intervals counts
        ((4_000.0, 2_000.0, 4_000.0, 2_000.0), 4_000.0, 4_000.0),  # a periodic producer: the level it reaches
        ((6_000.0, 0.0, 6_000.0, 0.0), 6_000.0, 6_000.0),  # on/off: never the silent half
        ((0.0, 6_000.0, 0.0, 6_000.0), 0.0, 6_000.0),
        ((4_000.0, 4_100.0, 3_900.0, 4_000.0), 2_500.0, 2_500.0),  # a fall counts at once
        ((1_215.0, 1_702.0, 2_190.0, 2_678.0), 3_165.0, 2_678.0),  # a ramp: followed, not held as a burst
        ((), 40_000.0, 40_000.0),  # nothing to compare with (a new resource): the interval's rate
    ],
)
def test_the_arrival_rate_is_the_rate_that_has_lasted(earlier, latest, expected):
    """Issue 39 and its review (finding 1): a step up counts once it lasted, a fall at once, a periodic
    producer at the level it reaches, a ramp as it goes (the rule before the review took the lowest of the
    five whenever they varied: 2,000 for the periodic producer, 0 for on/off, 1,215 for the ramp)."""
    observation = Observation(lag=0, partitions=12, drain_rate=1_000.0, arrival_rate=latest)
    rate, samples = smoothed_arrivals(observation, ScalingState(Size(1, 16), arrival_samples=earlier))
    assert rate == pytest.approx(expected)
    assert samples[-1] == latest and len(samples) <= 5


def test_no_scale_down_on_a_poll_that_cannot_tell_whether_the_lag_grows():
    """The first poll after a restart has no last lag (``MEASURED_EACH_POLL``): an on/off producer's
    on-half (lag 0 -> 6,000) took a worker per pod off there (review of issue 39; the on-off-producer
    scenario through restarts)."""
    on_half = Observation(lag=6_000, partitions=12, drain_rate=None, arrival_rate=6_000.0)
    assert growth_unknown(on_half, ScalingState(Size(4, 20)), LIMITS)
    assert not growth_unknown(on_half, ScalingState(Size(4, 20), drainable_lag=0), LIMITS)
    quiet = Observation(lag=10, partitions=12, drain_rate=None, arrival_rate=0.0)
    assert not growth_unknown(quiet, ScalingState(Size(4, 20)), LIMITS), "below the activation lag: no backlog"


def test_a_scale_in_while_a_pod_is_silent_waits_for_the_lag_to_be_only_what_is_in_flight():
    state = ScalingState(Size(12, 16), drainable_lag=900)
    quiet = Observation(lag=1_000, partitions=12, drain_rate=1_000.0, arrival_rate=1_000.0)
    backlog = Observation(lag=60_000, partitions=12, drain_rate=1_000.0, arrival_rate=1_000.0)
    assert kept_up(quiet, state, 1_000.0, LIMITS)
    assert not kept_up(backlog, state, 1_000.0, LIMITS)
    assert not kept_up(quiet, ScalingState(Size(12, 16), drainable_lag=80_000), 1_000.0, LIMITS), "last poll too"
    assert not kept_up(quiet, ScalingState(Size(12, 16)), 1_000.0, LIMITS), "no last poll: no evidence"
    assert quiet_scale_in(Size(6, 16), Size(12, 16), quiet, state, 1_000.0, LIMITS)
    # fewer pods with more workers each: the silent pod would not get its push
    assert not quiet_scale_in(Size(6, 30), Size(12, 16), quiet, state, 1_000.0, LIMITS)


def test_the_last_polls_lag_is_judged_by_the_arrivals_measured_then():
    """A backlog of 8,000 left while 1,000/s arrived (8 s of them) is no lag in flight, even when 2,000/s
    arrive now (4 s of those): the group did not keep up over the interval (``kept_up``; it would
    otherwise let ``measured_efficiency`` learn from a saturated interval, review of issue 39)."""
    rising = ScalingState(Size(12, 16), drainable_lag=8_000, arrival_samples=(1_000.0,), arrivals_at=0.0, polled_at=0.0)
    now = Observation(lag=8_000, partitions=12, drain_rate=2_000.0, arrival_rate=2_000.0)
    assert not kept_up(now, rising, 2_000.0, LIMITS), "a backlog at the old rate passed for what is in flight"
    steady = replace(rising, arrival_samples=(2_000.0,))
    assert kept_up(now, steady, 2_000.0, LIMITS)
    unknown = replace(rising, arrivals_at=-15.0)  # the newest rate is older than the last poll: judged by today's
    assert kept_up(now, unknown, 2_000.0, LIMITS)
