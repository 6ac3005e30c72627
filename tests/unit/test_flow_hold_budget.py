"""FlowControl's hold budget (issue 36, finding F4 of the simulation): the holds of one partition add
up to at most ``pause_after`` while another partition could be read (neither full nor paused), until
a fill of it ends while it is paused; and each hold still ends by ``pause_after`` after its fill began.

Each hold used to be bounded on its own. A partition that refilled at the read after each hold (a
slow handler behind a backlog, or a per-partition bound of one message) then held the reading again
and again, and the other partitions were not read for much longer than ``pause_after`` (simulation
seeds 1200, 1551 and 3015). The first budget was spent by every hold, so a fast partition that
starved nobody (the only one assigned, or beside full or paused ones) was paused about once per
``pause_after`` of holds, which drops its prefetch for nothing (issue 36 F4 follow-up).

Pure: explicit loads and an injected ``now``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyorder.core.flow import SPENT_WITHIN, FlowControl, FlowDecision, FlowLimits, Load

# Per partition: full at 10 in flight, low water at 5; holds of up to 0.5 s.
HOLDING = FlowLimits(
    max_inflight=100, max_inflight_per_partition=10, max_uncommitted=10_000, resume_ratio=0.5, pause_after=0.5
)


def step(flow: FlowControl[str], counts: dict[str, int], now: float) -> FlowDecision[str]:
    loads = {partition: Load(count, count) for partition, count in counts.items()}
    return flow.decide(loads, Load(sum(counts.values()), sum(counts.values())), now)


def test_holds_that_follow_each_other_add_up_to_pause_after_then_the_partition_is_paused() -> None:
    flow = FlowControl[str](HOLDING)
    assert step(flow, {"p0": 10, "p1": 0}, now=0.0).hold == pytest.approx(0.5)
    decision = step(flow, {"p0": 5, "p1": 0}, now=0.4)  # drained within its hold: the loop reads
    assert (decision.hold, decision.to_pause) == (None, [])
    decision = step(flow, {"p0": 10, "p1": 0}, now=0.4)  # the read went to p0, full again
    assert decision.to_pause == [] and decision.hold == pytest.approx(0.1), "0.4 s of the budget spent"
    decision = step(flow, {"p0": 9, "p1": 0}, now=0.5)
    assert decision.to_pause == ["p0"] and decision.hold is None, "budget spent: paused, p1 is read past it"


def hold_and_refill(flow: FlowControl[str], others: dict[str, Load], fills: int) -> tuple[float, list[float]]:
    """p0 fills to its bound of 10, its handlers take 0.2 s to bring it back to the low-water mark (the
    loop waits for them, at most the hold), and the read then fills it again, ``fills`` times; the
    other partitions keep ``others``. Returns the time held and when p0 was paused."""
    now, held, pauses = 0.0, 0.0, []
    for _ in range(fills):
        loads = {"p0": Load(10, 10), **others}
        decision = flow.decide(loads, Load(sum(load.inflight for load in loads.values()), 10), now)
        if "p0" in decision.to_pause:
            pauses.append(now)
        wait = 0.2 if decision.hold is None else min(decision.hold, 0.2)
        held += 0.0 if decision.hold is None else wait
        now += wait
        loads = {"p0": Load(5, 10), **others}
        flow.decide(loads, Load(sum(load.inflight for load in loads.values()), 10), now)
    return held, pauses


def test_a_single_fast_partition_held_again_and_again_is_never_paused() -> None:
    """The only partition assigned starves nobody: pausing it would drop its prefetch for nothing.
    On the first budget (spent by every hold) p0 was paused at 0.5 s, and then once per 0.5 s of holds."""
    flow = FlowControl[str](HOLDING)
    held, pauses = hold_and_refill(flow, {}, fills=50)
    assert pauses == [], f"p0 paused at {pauses} though no other partition was assigned"
    assert held == pytest.approx(10.0), "every fill held the reading"


def test_holds_beside_partitions_that_are_full_or_paused_cost_no_budget() -> None:
    """p1 is paused on its uncommitted bound, p2 stays full in flight (it holds too, and is paused once
    full for 0.5 s): neither could be read, so p0's holds keep nothing from being read. On the first
    budget p0 was paused at 0.5 s."""
    flow = FlowControl[str](HOLDING)  # 3 assigned: 10 in flight, 3,333 uncommitted per partition
    held, pauses = hold_and_refill(flow, {"p1": Load(0, 3_333), "p2": Load(10, 10)}, fills=50)
    assert pauses == [] and flow.paused == {"p1", "p2"}, f"p0 paused at {pauses}"
    assert held > 9.5, "p0's fills held the reading (but for one shortened by p2's)"


def test_a_refilling_partition_beside_a_readable_one_holds_the_reading_at_most_pause_after_in_all() -> None:
    """p1 could be read all along: p0's 0.2 s holds add up to its budget of 0.5 s, then it is paused."""
    flow = FlowControl[str](HOLDING)
    held, pauses = hold_and_refill(flow, {"p1": Load(0, 0)}, fills=4)
    assert pauses and pauses[0] == pytest.approx(0.5), f"p0 paused at {pauses}"
    assert held == pytest.approx(0.5), f"p0 held the reading {held:.2f} s beside a readable p1"


def test_a_single_partition_full_for_pause_after_is_still_paused() -> None:
    """A hold still ends by ``pause_after`` after its fill began, budget or not: the loop calls the client
    (rebalance callbacks, ``max.poll.interval.ms``) at least that often, and a slow partition is paused."""
    flow = FlowControl[str](HOLDING)
    assert step(flow, {"p0": 10}, now=0.0).hold == pytest.approx(0.5)
    assert step(flow, {"p0": 8}, now=0.3).hold == pytest.approx(0.2), "the fill's time counts, not the budget's"
    decision = step(flow, {"p0": 8}, now=0.5)
    assert decision.to_pause == ["p0"] and decision.hold is None


def test_a_partition_bound_of_one_message_holds_the_reading_at_most_pause_after_in_all() -> None:
    """Seeds 1551 and 3015: one message in flight fills the partition; each takes 1 s, under
    ``pause_after`` (2 s), so every hold ended in time and the next read filled it again."""
    flow = FlowControl[str](
        FlowLimits(max_inflight=8, max_inflight_per_partition=1, max_uncommitted=64, resume_ratio=0.8, pause_after=2.0)
    )
    held, now, paused_at = 0.0, 0.0, None
    while paused_at is None and now < 10.0:
        decision = step(flow, {"p0": 1, "p1": 0}, now)  # read one message of p0's backlog
        if "p0" in decision.to_pause:
            paused_at = now
        if decision.hold is not None:
            held += min(decision.hold, 1.0)
            now += min(decision.hold, 1.0)  # the loop waits for the completion, at most the hold
        step(flow, {"p0": 0, "p1": 0}, now)  # its handler returned
    assert paused_at is not None, f"p0 held the reading for {held:.1f} s in 1 s holds and was never paused"
    assert held == pytest.approx(2.0) and paused_at == pytest.approx(2.0)


def test_a_fill_that_ends_while_paused_renews_the_budget() -> None:
    flow = FlowControl[str](HOLDING)
    step(flow, {"p0": 10}, now=0.0)
    step(flow, {"p0": 10}, now=0.5)  # budget spent: paused
    decision = step(flow, {"p0": 5}, now=0.7)  # that fill ended while paused
    assert decision.to_resume == ["p0"]
    step(flow, {"p0": 10}, now=1.0)  # still slow (its last fill took 0.7 s): paused at once
    step(flow, {"p0": 4}, now=1.2)  # drained within pause_after: fast again
    decision = step(flow, {"p0": 10}, now=2.0)
    assert decision.to_pause == [] and decision.hold == pytest.approx(0.5), "a whole budget again"


def test_a_budget_is_not_renewed_by_a_pause_that_ends_with_the_partition_still_full() -> None:
    """Paused on its uncommitted bound while full in flight too: that time counts, as it used to
    (the partition did not drain), so it is paused at once when its uncommitted count is released."""
    flow = FlowControl[str](HOLDING)  # uncommitted bound 5,000 per partition with 2 assigned
    decision = flow.decide({"p0": Load(10, 5_000), "p1": Load(0, 0)}, Load(10, 5_000), 0.0)
    assert decision.to_pause == ["p0"] and decision.hold is None
    decision = flow.decide({"p0": Load(10, 100), "p1": Load(0, 0)}, Load(10, 100), 1.0)
    assert "p0" in flow.paused and decision.hold is None, "full in flight for 1 s: its budget is gone"


def test_forgetting_a_partition_forgets_its_spent_budget() -> None:
    flow = FlowControl[str](HOLDING)
    step(flow, {"p0": 10}, now=0.0)
    step(flow, {"p0": 5}, now=0.4)
    flow.forget(["p0"])
    assert step(flow, {"p0": 10}, now=1.0).hold == pytest.approx(0.5), "re-assigned: a whole budget"


def test_a_budget_spent_up_to_rounding_is_spent() -> None:
    """The budget is a sum of intervals: ten decisions 0.1 s apart add up to 0.9999999999999999 s.
    A hold of the 1e-16 s left is one no clock waits out (the simulation's loop spun on it)."""
    flow = FlowControl[str](
        FlowLimits(max_inflight=100, max_inflight_per_partition=10, max_uncommitted=10_000, pause_after=1.0)
    )
    now = 0.0
    for _ in range(12):
        decision = step(flow, {"p0": 10}, now)
        assert decision.hold is None or decision.hold >= SPENT_WITHIN, f"a hold of {decision.hold!r} s at {now!r}"
        now += 0.1
    assert flow.paused == {"p0"}


@settings(max_examples=200, deadline=None)
@given(
    pause_after=st.sampled_from([0.0, 0.25, 0.5, 2.0]),
    steps=st.lists(
        st.tuples(st.integers(0, 12), st.sampled_from([0.0, 0.05, 0.125, 0.3, 1.0])), min_size=1, max_size=80
    ),
)
def test_one_partition_holds_the_reading_at_most_pause_after_between_its_pauses(
    pause_after: float, steps: list[tuple[int, float]]
) -> None:
    """p0's in-flight count goes anywhere, p1 stays empty, so every hold is p0's. A hold stands until
    the next decision, made at most the hold later (the loop waits no longer): the time held since
    p0 was last paused never exceeds ``pause_after``."""
    flow = FlowControl[str](
        FlowLimits(max_inflight=100, max_inflight_per_partition=10, max_uncommitted=10_000, pause_after=pause_after)
    )
    now, held = 0.0, 0.0
    for inflight, wait in steps:
        decision = step(flow, {"p0": inflight, "p1": 0}, now)
        if "p0" in decision.to_pause:
            held = 0.0
        if decision.hold is not None:
            assert "p0" not in flow.paused
            wait = min(wait, decision.hold)
            held += wait
            assert held <= pause_after + 1e-9, f"p0 held the reading {held:.3f} s since its last pause"
        now += wait


@settings(max_examples=200, deadline=None)
@given(
    pause_after=st.sampled_from([0.0, 0.25, 0.5, 2.0]),
    steps=st.lists(
        st.tuples(st.integers(0, 12), st.integers(0, 12), st.sampled_from([0.0, 0.05, 0.125, 0.3, 1.0])),
        min_size=1,
        max_size=80,
    ),
)
def test_holds_keep_a_readable_partition_waiting_at_most_pause_after_between_pauses(
    pause_after: float, steps: list[tuple[int, int, float]]
) -> None:
    """Both counts go anywhere. p1 could be read while it is not full (it is full from 10 until it is
    back at 5; a partition that is not full is never paused): p0's holds while p1 could be read add up
    to at most ``pause_after`` between p0's pauses, and a hold never outlasts ``pause_after`` after the fill
    of a partition holding the reading began."""
    flow = FlowControl[str](
        FlowLimits(max_inflight=100, max_inflight_per_partition=10, max_uncommitted=10_000, pause_after=pause_after)
    )
    now, held_beside_readable = 0.0, 0.0
    filled_at: dict[str, float] = {}
    for p0, p1, wait in steps:
        for partition, count in (("p0", p0), ("p1", p1)):
            if count >= 10:
                filled_at.setdefault(partition, now)
            elif count <= 5:
                filled_at.pop(partition, None)
        decision = step(flow, {"p0": p0, "p1": p1}, now)
        if "p0" in decision.to_pause:
            held_beside_readable = 0.0
        if decision.hold is not None:
            wait = min(wait, decision.hold)
            first_filled = min(filled_at[partition] for partition in filled_at if partition not in flow.paused)
            assert now + decision.hold <= first_filled + pause_after + 1e-9, "a hold outlasts its fill's limit"
            if "p1" not in filled_at and "p0" not in flow.paused:
                held_beside_readable += wait
                assert held_beside_readable <= pause_after + 1e-9, (
                    f"p0 held the reading {held_beside_readable:.3f} s beside a readable p1 since its last pause"
                )
        now += wait
