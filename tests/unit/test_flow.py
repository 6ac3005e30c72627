"""FlowControl: per-partition holds and pauses with hysteresis, the size of a read, and FlowLimits
validation (partitions that cannot drain: test_flow_blocked.py; the pod's ceiling: test_flow_ceiling.py).

Most tests use ``pause_after=0`` (a full partition is paused at once) to pin the hysteresis; the
hold tests at the end give it time."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyorder.core.flow import FlowControl, FlowLimits, Load

# Per partition: pause at >= 10, resume at <= 5. Pod: reads up to 100 (its ceiling, 300, is not reached here).
# The uncommitted bound is set far away here, so these tests exercise the in-flight bounds.
LIMITS = FlowLimits(
    max_inflight=100, max_inflight_per_partition=10, max_uncommitted=10_000, resume_ratio=0.5, pause_after=0
)


def decide(flow: FlowControl, counts: dict[str, int], pod_inflight: int, now: float = 0.0):
    """In-flight counts only (uncommitted = in flight: nothing finished behind an unfinished offset)."""
    decision = flow.decide({p: Load(n, n) for p, n in counts.items()}, Load(pod_inflight, pod_inflight), now)
    return decision.to_pause, decision.to_resume


# One partition's in-flight count over time -> paused afterwards, and the change reported.
HYSTERESIS_STEPS = [
    (0, False, None),
    (5, False, None),
    (9, False, None),
    (10, True, "pause"),  # reached the bound
    (11, True, None),
    (9, True, None),  # below the bound but above low-water: stays paused (no flapping)
    (6, True, None),
    (5, False, "resume"),  # low-water reached
    (4, False, None),
    (9, False, None),  # rising again below the bound: stays running
    (10, True, "pause"),
    (3, False, "resume"),
]


def test_partition_hysteresis_sequence() -> None:
    flow = FlowControl(LIMITS)
    for step, (inflight, paused, change) in enumerate(HYSTERESIS_STEPS):
        to_pause, to_resume = decide(flow, {"p0": inflight}, pod_inflight=inflight)
        where = f"step {step}: inflight {inflight}"
        assert flow.paused == ({"p0"} if paused else set()), where
        assert to_pause == (["p0"] if change == "pause" else []), where
        assert to_resume == (["p0"] if change == "resume" else []), where


def test_partitions_are_paused_independently() -> None:
    flow = FlowControl(LIMITS)
    to_pause, to_resume = decide(flow, {"p0": 12, "p1": 3, "p2": 10}, pod_inflight=25)
    assert sorted(to_pause) == ["p0", "p2"]
    assert to_resume == []
    to_pause, to_resume = decide(flow, {"p0": 4, "p1": 9, "p2": 7}, pod_inflight=20)
    assert (to_pause, to_resume) == ([], ["p0"])
    assert flow.paused == {"p2"}


def test_a_pod_at_its_bound_pauses_no_partition_under_its_own_bounds() -> None:
    """The pod bound limits the read (capacity); only a partition's own bounds pause it."""
    flow = FlowControl(LIMITS)  # 10 partitions: bound 10 each, pod bound 100
    counts = {f"p{index}": 10 for index in range(9)} | {"p9": 4}
    to_pause, _ = decide(flow, counts, pod_inflight=100)
    assert sorted(to_pause) == [f"p{index}" for index in range(9)], "p9 is under its bound: not paused"
    assert flow.capacity(Load(100, 100)) >= 1, "and it may be read"


def test_revoked_partition_is_forgotten() -> None:
    flow = FlowControl(LIMITS)
    decide(flow, {"p0": 10}, pod_inflight=10)
    assert flow.paused == {"p0"}
    decide(flow, {}, pod_inflight=0)  # p0 revoked
    assert flow.paused == set()
    to_pause, _ = decide(flow, {"p0": 7}, pod_inflight=7)  # re-assigned, between the marks
    assert to_pause == []
    assert flow.paused == set()


@pytest.mark.parametrize(("pod_inflight", "capacity"), [(0, 100), (40, 60), (95, 5), (99, 1), (100, 1), (150, 1)])
def test_capacity_is_the_pod_headroom_and_at_least_one(pod_inflight: int, capacity: int) -> None:
    """Nothing paused: the headroom. At least 1: a read happens only with no hold and a partition
    under its bounds, which leaves room unless there are more partitions than the pod bound."""
    assert FlowControl(LIMITS).capacity(Load(pod_inflight, pod_inflight)) == capacity


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_inflight": 0},
        {"max_inflight": -1},
        {"max_inflight_per_partition": 0},
        {"max_uncommitted": 0},
        {"max_inflight": 100, "max_uncommitted": 99},
        {"resume_ratio": 0.0},
        {"resume_ratio": 1.0},
        {"resume_ratio": -0.5},
        {"resume_ratio": 1.5},
        {"pause_after": -0.1},
        {"pause_after": float("inf")},
        {"pause_after": float("nan")},
    ],
)
def test_invalid_limits_raise(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FlowLimits(**kwargs)  # type: ignore[arg-type]


def test_default_limits() -> None:
    limits = FlowLimits()
    assert (
        limits.max_inflight,
        limits.max_inflight_per_partition,
        limits.max_uncommitted,
        limits.resume_ratio,
        limits.pause_after,
    ) == (10_000, 5_000, 50_000, 0.5, 0.5)


@settings(max_examples=200)
@given(steps=st.lists(st.dictionaries(st.sampled_from(["p0", "p1", "p2"]), st.integers(0, 40)), max_size=40))
def test_decide_invariants(steps: list[dict[str, int]]) -> None:
    """Whatever the counts: at the bound -> paused; at low water -> running, however full the pod;
    between the marks the previous state holds; the returned lists describe the state change."""
    flow = FlowControl(
        FlowLimits(
            max_inflight=60, max_inflight_per_partition=20, max_uncommitted=6_000, resume_ratio=0.5, pause_after=0
        )
    )
    for counts in steps:
        pod = sum(counts.values())
        before = set(flow.paused)
        to_pause, to_resume = decide(flow, counts, pod)
        assert len(set(to_pause)) == len(to_pause) and len(set(to_resume)) == len(to_resume)
        before &= set(counts)  # a partition that left is forgotten, not resumed
        assert flow.paused == (before | set(to_pause)) - set(to_resume)
        assert not set(to_pause) & before and set(to_resume) <= before
        assert flow.paused <= set(counts)
        for partition, inflight in counts.items():
            if inflight >= 20:
                assert partition in flow.paused
            elif inflight <= 10:
                assert partition not in flow.paused


def test_partition_bound_is_capped_at_a_fair_share_of_the_pod_bound() -> None:
    control = FlowControl(
        FlowLimits(max_inflight=10_000, max_inflight_per_partition=5_000, resume_ratio=0.5, pause_after=0)
    )
    assert control.partition_bound(1) == Load(5_000, 50_000)
    assert control.partition_bound(4) == Load(2_500, 12_500)
    assert control.partition_bound(20_000) == Load(1, 2)
    # four partitions: the first two to fill up are paused at their share, before the pod is at its bound
    to_pause, _ = decide(control, {"p0": 2_500, "p1": 2_500, "p2": 0, "p3": 0}, pod_inflight=5_000)
    assert sorted(to_pause) == ["p0", "p1"]


UNCOMMITTED = FlowLimits(
    max_inflight=100, max_inflight_per_partition=100, max_uncommitted=400, resume_ratio=0.5, pause_after=5.0
)


def test_uncommitted_bound_pauses_a_partition_with_few_messages_in_flight() -> None:
    """A stuck head offset: 1 message in flight, 200 finished behind it but not committable."""
    flow = FlowControl(UNCOMMITTED)  # 2 partitions: uncommitted share 200 each
    decision = flow.decide({"p0": Load(1, 200), "p1": Load(1, 10)}, Load(2, 210), 0.0)
    assert decision.to_pause == ["p0"] and decision.hold is None, "an uncommitted bound pauses at once, never holds"
    decision = flow.decide({"p0": Load(1, 150), "p1": Load(1, 10)}, Load(2, 160), 1.0)
    assert decision.to_resume == [], "above the uncommitted low-water mark (100): stays paused"
    decision = flow.decide({"p0": Load(1, 100), "p1": Load(1, 10)}, Load(2, 110), 2.0)
    assert decision.to_resume == ["p0"]


def test_resume_needs_both_counts_at_low_water() -> None:
    flow = FlowControl(UNCOMMITTED)
    flow.decide({"p0": Load(100, 400)}, Load(100, 400), 0.0)
    assert flow.paused == {"p0"}
    decision = flow.decide({"p0": Load(10, 300)}, Load(10, 300), 1.0)
    assert decision.to_resume == [], "in flight is low but uncommitted is not"
    decision = flow.decide({"p0": Load(10, 150)}, Load(10, 150), 2.0)
    assert decision.to_resume == ["p0"]


@pytest.mark.parametrize(
    ("pod", "capacity"), [(Load(0, 0), 100), (Load(10, 350), 50), (Load(90, 100), 10), (Load(0, 400), 1)]
)
def test_capacity_is_limited_by_both_bounds(pod: Load, capacity: int) -> None:
    assert FlowControl(UNCOMMITTED).capacity(pod) == capacity


def test_commit_pressure_at_half_the_uncommitted_bound() -> None:
    flow = FlowControl(UNCOMMITTED)
    assert not flow.commit_pressure({"p0": Load(1, 99), "p1": Load(0, 0)}, Load(1, 99))
    assert flow.commit_pressure({"p0": Load(1, 100), "p1": Load(0, 0)}, Load(1, 100))


# -- holds: a full partition first stops the reading, and is paused only if it stays full ------------

HOLDING = FlowLimits(
    max_inflight=100, max_inflight_per_partition=10, max_uncommitted=10_000, resume_ratio=0.5, pause_after=0.5
)


def step(flow: FlowControl, counts: dict[str, int], now: float):
    return flow.decide(
        {p: Load(n, n) for p, n in counts.items()}, Load(sum(counts.values()), sum(counts.values())), now
    )


def test_a_full_partition_holds_the_reading_and_is_not_paused_when_it_drains_in_time() -> None:
    flow = FlowControl(HOLDING)
    decision = step(flow, {"p0": 10, "p1": 2}, now=0.0)
    assert decision.to_pause == [] and decision.hold == pytest.approx(0.5)
    decision = step(flow, {"p0": 7, "p1": 2}, now=0.2)
    assert decision.to_pause == [] and decision.hold == pytest.approx(0.3), "above low water: still holding"
    decision = step(flow, {"p0": 5, "p1": 2}, now=0.3)
    assert (decision.to_pause, decision.to_resume, decision.hold) == ([], [], None)
    assert flow.paused == set()


def test_a_partition_still_full_after_the_hold_is_paused_and_the_others_are_read() -> None:
    flow = FlowControl(HOLDING)
    step(flow, {"p0": 10, "p1": 2}, now=0.0)
    decision = step(flow, {"p0": 9, "p1": 0}, now=0.5)
    assert decision.to_pause == ["p0"] and decision.hold is None, "paused; p1 is read past it"
    decision = step(flow, {"p0": 5, "p1": 3}, now=2.0)
    assert decision.to_resume == ["p0"] and decision.hold is None


def test_a_partition_that_outlasted_a_hold_is_paused_at_once_until_it_drains_in_time_again() -> None:
    flow = FlowControl(HOLDING)
    step(flow, {"p0": 10}, now=0.0)
    step(flow, {"p0": 10}, now=0.6)  # outlasted the hold: paused, remembered as slow
    step(flow, {"p0": 4}, now=3.0)  # resumed
    decision = step(flow, {"p0": 10}, now=4.0)
    assert decision.to_pause == ["p0"] and decision.hold is None, "slow: no hold this time"
    step(flow, {"p0": 5}, now=4.2)  # drained within pause_after: fast again
    decision = step(flow, {"p0": 10}, now=5.0)
    assert decision.to_pause == [] and decision.hold == pytest.approx(0.5)


def test_partitions_full_at_their_fair_shares_hold_then_pause() -> None:
    flow = FlowControl(
        FlowLimits(max_inflight=30, max_inflight_per_partition=30, max_uncommitted=10_000, pause_after=0.5)
    )
    decision = step(flow, {"p0": 10, "p1": 10, "p2": 10}, now=0.0)  # fair share 10 each
    assert decision.to_pause == [] and decision.hold == pytest.approx(0.5)
    decision = step(flow, {"p0": 10, "p1": 10, "p2": 9}, now=0.5)
    assert sorted(decision.to_pause) == ["p0", "p1", "p2"] and decision.hold is None
    decision = step(flow, {"p0": 5, "p1": 5, "p2": 5}, now=0.7)
    assert sorted(decision.to_resume) == ["p0", "p1", "p2"]


def test_a_partition_paused_on_its_uncommitted_bound_holds_up_no_other_partition() -> None:
    """Issue 36, defect 6: full in flight too, it used to add a hold of pause_after."""
    flow = FlowControl(UNCOMMITTED)  # 2 partitions: bounds 50 in flight, 200 uncommitted
    decision = flow.decide({"p0": Load(50, 200), "p1": Load(1, 10)}, Load(51, 210), 0.0)
    assert decision.to_pause == ["p0"]
    assert decision.hold is None, "p1 is read past the paused p0"
    decision = flow.decide({"p0": Load(50, 200), "p1": Load(3, 12)}, Load(53, 212), 1.0)
    assert decision.hold is None and flow.paused == {"p0"}


def test_release_after_is_what_brings_the_fullest_hold_to_its_low_water_mark() -> None:
    flow = FlowControl(HOLDING)
    loads = {"p0": Load(10, 10), "p1": Load(12, 12), "p2": Load(1, 1)}
    decision = flow.decide(loads, Load(23, 23), 0.0)
    assert decision.release_after == 5, "p0 needs 5 to reach 5; p1 needs 7"
    assert FlowControl(HOLDING).decide({}, Load(0, 0), 0.0).release_after == 1


def test_forgetting_a_partition_clears_its_hold_and_slowness() -> None:
    flow = FlowControl(HOLDING)
    step(flow, {"p0": 10}, now=0.0)
    step(flow, {"p0": 10}, now=1.0)
    assert flow.paused == {"p0"}
    flow.forget(["p0"])
    assert flow.paused == set()
    decision = step(flow, {"p0": 10}, now=2.0)
    assert decision.to_pause == [] and decision.hold == pytest.approx(0.5), "re-assigned: a fresh hold"
