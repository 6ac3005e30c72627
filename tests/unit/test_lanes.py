"""LaneScheduler: per-lane FIFOs, one ready queue, parked lanes hold no worker, nothing lost."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyorder.core import lanes as lanes_module
from keyorder.core.lanes import Delivery, LaneScheduler


class Partition:
    """Stands in for the runtime's partition state (the scheduler treats it as opaque)."""

    def __init__(self, name: str = "p0") -> None:
        self.name = name


class Named:
    """A message that is just a name and an offset."""

    def __init__(self, name: str, offset: int) -> None:
        self.name, self.offset = name, offset


P0 = Partition("p0")


def delivery(name: str, lane: Hashable | None, partition: Partition = P0, offset: int = 0) -> Delivery:
    return Delivery(message=Named(name, offset), lane=lane, partition=partition, received_at=0.0)


def lane_deliveries(*names: str, partition: Partition = P0) -> list[Delivery]:
    """``"A1"`` -> lane ``b"A"``; names starting with ``"U"`` are unordered (lane ``None``)."""
    return [
        delivery(name, None if name.startswith("U") else name[0].encode(), partition, offset)
        for offset, name in enumerate(names)
    ]


def names(deliveries: list[Delivery]) -> list[str]:
    return [item.message.name for item in deliveries]


def take_one(scheduler: LaneScheduler, now: float) -> Delivery | None:
    taken = scheduler.take(now)
    assert len(taken) <= 1
    return taken[0] if taken else None


def take_all(scheduler: LaneScheduler, now: float = 0.0) -> list[str]:
    """One worker: take and finish until nothing is ready."""
    taken = []
    while (item := take_one(scheduler, now)) is not None:
        taken.append(item.message.name)
        scheduler.finished(item)
    return taken


def test_one_worker_runs_the_deliveries_in_arrival_order_across_lanes() -> None:
    """Oldest head first: with one worker that is arrival order, each lane in its own order."""
    scheduler = LaneScheduler()
    assert scheduler.add(lane_deliveries("A1", "A2", "A3", "B1", "C1", "B2")) == 3, "three lanes became ready"
    assert len(scheduler) == 6
    assert take_all(scheduler) == ["A1", "A2", "A3", "B1", "C1", "B2"]
    assert len(scheduler) == 0
    assert scheduler.summary().active == 0


def test_the_head_that_came_first_runs_first_so_the_lowest_offset_is_not_held_back() -> None:
    """A lane with more after its head finished is queued by its next head, not behind every other lane:
    the pod commits a partition's lowest unfinished offset, and under a round-robin over lanes (the old
    scheduler) A2, the oldest delivery left, waited for B1..E1 while they ran above it."""
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries("A1", "A2", "B1", "C1", "D1", "E1"))
    first, second = take_one(scheduler, 0.0), take_one(scheduler, 0.0)  # two workers: A1 and B1 run
    assert first is not None and second is not None
    assert (first.message.name, second.message.name) == ("A1", "B1")
    scheduler.finished(first)  # A2 is now the oldest ready head
    third = take_one(scheduler, 0.0)
    assert third is not None and third.message.name == "A2"
    scheduler.finished(second)
    scheduler.finished(third)
    assert take_all(scheduler) == ["C1", "D1", "E1"]


def test_a_due_retry_and_a_withdraw_keep_the_oldest_head_first() -> None:
    """A parked head that falls due is older than the heads that arrived after it, and after a withdraw the
    lanes left are ordered by their new heads."""
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries("A1", "B1", "C1", "B2"))
    failed = take_one(scheduler, 0.0)
    assert failed is not None and failed.message.name == "A1"
    scheduler.park(failed, due=1.0)
    b1 = take_one(scheduler, 0.0)
    assert b1 is not None and b1.message.name == "B1"
    scheduler.finished(b1)
    assert [item.message.name for item in scheduler.withdraw(lambda item: item.message.name == "C1")] == ["C1"]
    assert take_all(scheduler, now=2.0) == ["A1", "B2"], "A1, due again, came before B2"


def test_idle_scheduler_has_nothing_ready_and_nothing_due() -> None:
    scheduler = LaneScheduler()
    assert take_one(scheduler, now=123.0) is None
    assert scheduler.seconds_until_due(now=123.0) is None


def test_a_running_lane_is_not_taken_twice_but_other_lanes_are() -> None:
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries("A1", "A2", "B1"))
    first = take_one(scheduler, 0.0)
    second = take_one(scheduler, 0.0)
    assert first is not None and second is not None
    assert (first.message.name, second.message.name) == ("A1", "B1")
    assert take_one(scheduler, 0.0) is None, "A2 must wait until A1 finished: one message of a lane at a time"
    scheduler.finished(first)
    third = take_one(scheduler, 0.0)
    assert third is not None and third.message.name == "A2"


def test_take_with_a_limit_returns_heads_of_distinct_lanes_in_ready_order() -> None:
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries("A1", "A2", "B1", "C1", "D1"))
    assert names(scheduler.take(0.0, limit=3)) == ["A1", "B1", "C1"], "never two heads of one lane"
    assert scheduler.ready == 1
    assert names(scheduler.take(0.0, limit=3)) == ["D1"]
    assert scheduler.take(0.0, limit=3) == [], "A2 waits for A1"
    assert scheduler.summary().running == 4


def test_a_hot_lane_holds_one_worker_and_never_delays_other_lanes() -> None:
    """Head-of-line blocking is what slot hashing had: here the cold lanes are all ready at once."""
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries(*[f"H{i}" for i in range(1000)]))
    scheduler.add([delivery(f"k{i}", f"cold-{i}".encode()) for i in range(50)])
    hot = take_one(scheduler, 0.0)
    assert hot is not None and hot.message.name == "H0"
    cold = [take_one(scheduler, 0.0) for _ in range(50)]
    assert all(item is not None for item in cold), "every cold lane is ready while the hot lane runs"
    assert take_one(scheduler, 0.0) is None
    summary = scheduler.summary()
    assert summary.running == 51
    assert summary.longest_backlog == 1000
    assert summary.longest_backlog_share == pytest.approx(1000 / 1050)


def test_a_parked_lane_holds_no_worker_and_other_lanes_flow() -> None:
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries("A1", "B1", "A2", "B2", "A3"))
    a1 = take_one(scheduler, 0.0)
    assert a1 is not None and a1.message.name == "A1"
    scheduler.park(a1, due=10.0)
    summary = scheduler.summary()
    assert (summary.parked, summary.running, summary.blocked) == (1, 0, 0)
    assert summary.parked_heads == frozenset({(P0, 0, False)})
    assert take_all(scheduler, now=1.0) == ["B1", "B2"], "lane B must not wait for lane A's retry"
    assert scheduler.seconds_until_due(now=1.0) == pytest.approx(9.0)
    assert take_all(scheduler, now=9.99) == []
    assert take_all(scheduler, now=10.0) == ["A1", "A2", "A3"], "the retried head first, then the lane's order"


def test_a_retry_that_fails_again_parks_again_and_blocked_is_reported() -> None:
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries("A1", "A2"))
    a1 = take_one(scheduler, 0.0)
    assert a1 is not None
    scheduler.park(a1, due=1.0)
    again = take_one(scheduler, 1.0)
    assert again is a1
    scheduler.park(a1, due=5.0, blocked=True)
    assert scheduler.summary().blocked == 1
    assert take_one(scheduler, 4.0) is None
    assert take_one(scheduler, 5.0) is a1
    retried = scheduler.summary()
    assert retried.blocked == 1, "a blocked head being retried is still blocked (only success clears it)"
    assert (a1.partition, a1.message.offset, True) in retried.parked_heads, "and still holds its partition"
    scheduler.finished(a1)
    assert scheduler.summary().blocked == 0
    assert take_all(scheduler, 5.0) == ["A2"]


def test_earliest_due_lane_is_retried_first() -> None:
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries("A1", "B1"))
    a1, b1 = take_one(scheduler, 0.0), take_one(scheduler, 0.0)
    assert a1 is not None and b1 is not None
    scheduler.park(a1, due=5.0)
    scheduler.park(b1, due=2.0)
    assert scheduler.seconds_until_due(0.0) == pytest.approx(2.0)
    assert take_all(scheduler, 3.0) == ["B1"]
    assert take_all(scheduler, 6.0) == ["A1"]


def test_the_summary_names_the_earliest_retry_due_of_lanes_not_blocked() -> None:
    """What a shutdown waits for: a retry due within its grace. A blocked lane's next retry is not
    counted (it holds its partition for good), nor is a lane no longer parked."""
    scheduler = LaneScheduler()
    assert scheduler.summary().next_retry_due is None
    scheduler.add(lane_deliveries("A1", "B1", "C1"))
    a1, b1, c1 = (take_one(scheduler, 0.0) for _ in range(3))
    assert a1 is not None and b1 is not None and c1 is not None
    scheduler.park(a1, due=1.0, blocked=True)
    scheduler.park(b1, due=7.0)
    assert scheduler.summary().next_retry_due == 7.0, "A is blocked: not counted, though due first"
    scheduler.park(c1, due=3.0)
    assert scheduler.summary().next_retry_due == 3.0
    assert scheduler.summary().ready == 0, "parked lanes, due or not, are ready only once a take wakes them"
    retried = take_one(scheduler, 4.0)  # A (blocked, due at 1.0) is taken first, then C
    assert retried is a1 and take_one(scheduler, 4.0) is c1
    assert scheduler.summary().next_retry_due == 7.0, "C runs again: no longer parked"
    scheduler.finished(c1)
    assert scheduler.withdraw(lambda delivery: delivery is b1) == [b1]
    assert scheduler.summary().next_retry_due is None


def test_unordered_deliveries_are_lanes_of_their_own() -> None:
    scheduler = LaneScheduler()
    assert scheduler.add(lane_deliveries("U1", "U2", "U3")) == 3
    taken = [take_one(scheduler, 0.0) for _ in range(3)]
    assert all(item is not None for item in taken), "unordered messages all run at once"
    first = taken[0]
    assert first is not None
    scheduler.park(first, due=1.0)  # parks only itself
    assert scheduler.summary().parked == 1


def test_finishing_or_parking_anything_but_a_running_head_is_an_error() -> None:
    scheduler = LaneScheduler()
    a1, a2 = lane_deliveries("A1", "A2")
    scheduler.add([a1, a2])
    with pytest.raises(RuntimeError, match="running head"):
        scheduler.finished(a1)  # not taken yet
    taken = take_one(scheduler, 0.0)
    assert taken is a1
    with pytest.raises(RuntimeError, match="running head"):
        scheduler.park(a2, due=1.0)


def test_withdraw_hands_back_queued_and_parked_deliveries_of_revoked_partitions_at_once() -> None:
    revoked, kept = Partition("revoked"), Partition("kept")
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries("A1", "A2", "B1", partition=revoked))
    scheduler.add(lane_deliveries("C1", "C2", partition=kept))
    a1 = take_one(scheduler, 0.0)
    b1 = take_one(scheduler, 0.0)
    assert a1 is not None and b1 is not None
    scheduler.park(b1, due=100.0)  # parked with a long backoff: must not hold the revoke
    withdrawn = scheduler.withdraw(lambda item: item.partition is revoked)
    assert sorted(names(withdrawn)) == ["A2", "B1"], "the running A1 stays; queued A2 and parked B1 leave"
    summary = scheduler.summary()
    assert (summary.parked, summary.running, summary.queued) == (0, 1, 3)
    scheduler.finished(a1)
    assert take_all(scheduler) == ["C1", "C2"]
    assert len(scheduler) == 0


def test_withdraw_keeps_a_lane_shared_by_two_partitions_in_order() -> None:
    """One key on two topics: the revoked topic's messages leave, the other's keep their order."""
    revoked, kept = Partition("revoked"), Partition("kept")
    scheduler = LaneScheduler()
    scheduler.add(
        [delivery("x1", b"K", revoked), delivery("y1", b"K", kept), delivery("x2", b"K", revoked),
         delivery("y2", b"K", kept)]
    )  # fmt: skip
    head = take_one(scheduler, 0.0)
    assert head is not None and head.message.name == "x1"
    scheduler.park(head, due=50.0)
    assert names(scheduler.withdraw(lambda item: item.partition is revoked)) == ["x1", "x2"]
    assert take_all(scheduler, 0.0) == ["y1", "y2"], "the lane is ready again once its parked head left"


def test_withdrawing_a_blocked_parked_head_leaves_the_next_head_unblocked() -> None:
    """Issue 36 defect 9: blocked is the head's state; the head that follows it has not failed."""
    revoked, kept = Partition("revoked"), Partition("kept")
    scheduler = LaneScheduler()
    scheduler.add([delivery("x1", b"K", revoked, offset=5), delivery("y1", b"K", kept, offset=7)])
    head = take_one(scheduler, 0.0)
    assert head is not None and head.message.name == "x1"
    scheduler.park(head, due=50.0, blocked=True)
    assert scheduler.summary().blocked == 1
    assert names(scheduler.withdraw(lambda item: item.partition is revoked)) == ["x1"]
    after = scheduler.summary()
    assert (after.blocked, after.parked, after.parked_heads) == (0, 0, frozenset()), "y1 never failed"
    y1 = take_one(scheduler, 0.0)
    assert y1 is not None and y1.message.name == "y1"
    running = scheduler.summary()
    assert (running.blocked, running.parked_heads) == (0, frozenset()), "y1 runs for the first time, not blocked"
    scheduler.park(y1, due=1.0)
    assert scheduler.summary().parked_heads == {(kept, 7, False)}, "a plain retry of y1, not a blocked one"


def test_drain_returns_everything_not_running() -> None:
    scheduler = LaneScheduler()
    scheduler.add(lane_deliveries("A1", "A2", "B1", "U1"))
    running = take_one(scheduler, 0.0)
    parked = take_one(scheduler, 0.0)
    assert running is not None and parked is not None
    scheduler.park(parked, due=9.0)
    assert sorted(names(scheduler.drain())) == ["A2", "B1", "U1"]
    assert len(scheduler) == 1
    scheduler.finished(running)
    assert len(scheduler) == 0 and take_one(scheduler, 100.0) is None


@pytest.mark.slow
@pytest.mark.parametrize("long_lane", [2, 64], ids=["lanes-become-deques-at-2", "lanes-become-deques-at-64"])
@settings(max_examples=60)  # per switch point: 120 examples in all, about the time 100 took
@given(data=st.data())
def test_random_workers_failures_and_revokes_keep_lanes_serial_in_order_and_lose_nothing(
    long_lane: int, data: st.DataObject
) -> None:
    """W simulated workers interleave take/finish/park; random arrivals and withdrawals.

    Oracles: a lane never has two deliveries running; every lane's deliveries finish in arrival
    order; every delivery added is finished or withdrawn exactly once. With the lists' switch to deques
    (``LONG_LANE``) at 2 deliveries too, so that both shapes of a lane's FIFO, and the switches between
    them, meet every step.
    """
    with mock.patch.object(lanes_module, "LONG_LANE", long_lane):
        _random_workers_failures_and_revokes(data)


def _random_workers_failures_and_revokes(data: st.DataObject) -> None:
    scheduler = LaneScheduler()
    partitions = [Partition("p0"), Partition("p1")]
    lanes: list[Hashable | None] = [b"A", b"B", b"C", None]
    workers = data.draw(st.integers(1, 4))
    running: list[Delivery] = []
    running_lanes: set[Hashable] = set()
    arrived: dict[Hashable, list[int]] = {}
    finished: dict[Hashable, list[int]] = {}
    withdrawn: list[int] = []
    counter, now = 0, 0.0
    for _ in range(400):
        action = data.draw(st.sampled_from(["add", "take", "finish", "park", "withdraw", "tick"]))
        if action == "add" and counter < 60:
            batch = []
            for lane in data.draw(st.lists(st.sampled_from(lanes), max_size=4)):
                counter += 1
                item = delivery(f"m{counter}", lane, data.draw(st.sampled_from(partitions)), counter)
                arrived.setdefault(item.lane_id, []).append(counter)
                batch.append(item)
            scheduler.add(batch)
        elif action == "take" and len(running) < workers:
            for item in scheduler.take(now, limit=data.draw(st.integers(1, 3))):
                assert item.lane_id not in running_lanes, "two deliveries of one lane ran at once"
                running_lanes.add(item.lane_id)
                running.append(item)
        elif action in ("finish", "park") and running:
            item = running.pop(data.draw(st.integers(0, len(running) - 1)))
            running_lanes.discard(item.lane_id)
            if action == "park":
                scheduler.park(item, due=now + data.draw(st.floats(0.0, 3.0)), blocked=data.draw(st.booleans()))
            else:
                finished.setdefault(item.lane_id, []).append(item.message.offset)
                scheduler.finished(item)
        elif action == "withdraw":
            gone = data.draw(st.sampled_from(partitions))
            for item in scheduler.withdraw(lambda candidate, gone=gone: candidate.partition is gone):
                assert item not in running
                withdrawn.append(item.message.offset)
        elif action == "tick":
            now += data.draw(st.floats(0.0, 2.0))
        summary = scheduler.summary()
        assert summary.running == len(running)
        assert summary.active == summary.ready + summary.running + summary.parked
    for _ in range(10_000):  # drain: one worker finishes everything, waiting out the backoffs
        for item in running:
            finished.setdefault(item.lane_id, []).append(item.message.offset)
            scheduler.finished(item)
        running = []
        if not len(scheduler):
            break
        item = take_one(scheduler, now)
        if item is None:
            wait = scheduler.seconds_until_due(now)
            assert wait is not None, "deliveries held but none ready and none parked: lost"
            now += wait + 1e-6  # past the due time despite float rounding
            continue
        running.append(item)
    assert not len(scheduler), f"drain did not finish: {scheduler.summary()}"
    for lane, offsets in finished.items():
        assert offsets == sorted(offsets), f"lane {lane!r} finished out of arrival order"
    every = sorted([offset for offsets in finished.values() for offset in offsets] + withdrawn)
    assert every == sorted(offset for offsets in arrived.values() for offset in offsets), "lost or duplicated"


@pytest.mark.parametrize(
    ("continue_first", "expected"), [(False, ["b1", "a1", "c1", "a2"]), (True, ["b1", "a1", "a2", "c1"])]
)
def test_continue_first_lets_a_lane_with_more_go_on_before_the_others(
    continue_first: bool, expected: list[str]
) -> None:
    """The pods queue a finished lane by its next head (c1 came before a2); a batch's scheduler
    (continue_first) puts it at the head, so its longest lane never queues behind light ones. Lane order is
    the same."""
    scheduler = LaneScheduler(continue_first=continue_first)
    scheduler.add([delivery("b1", "b"), delivery("a1", "a"), delivery("c1", "c"), delivery("a2", "a")])
    ran = []
    while taken := scheduler.take(0.0):
        ran.append(taken[0].message.name)
        scheduler.finished(taken[0])
    assert ran == expected


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(st.lists(st.sampled_from("ABCDEFU"), min_size=1, max_size=12), min_size=1, max_size=6),
    limit=st.integers(1, 5),
    continue_first=st.booleans(),
)
def test_finishing_a_taken_batch_at_once_is_finishing_each_of_it(
    arrivals: list[list[str]], limit: int, continue_first: bool
) -> None:
    """``finished_all`` (a batch call that succeeded whole) leaves the scheduler as ``finished`` one by one
    does: the same heads taken next, in the same order, and the same counts; emptied lanes are reused."""
    one_by_one, at_once = LaneScheduler(continue_first), LaneScheduler(continue_first)
    order: dict[str, list[str]] = {"one_by_one": [], "at_once": []}
    for number, names_arriving in enumerate(arrivals):
        arriving = [f"{name}{number}.{index}" for index, name in enumerate(names_arriving)]
        for label, scheduler in (("one_by_one", one_by_one), ("at_once", at_once)):
            scheduler.add(lane_deliveries(*arriving))
            taken = scheduler.take(0.0, limit)
            order[label] += names(taken)
            if label == "one_by_one":
                for item in taken:
                    scheduler.finished(item)
            else:
                scheduler.finished_all(taken)
        assert order["one_by_one"] == order["at_once"]
        # an unordered delivery's lane is the delivery itself: its id differs between the two
        assert len(one_by_one) == len(at_once)
        assert replace(one_by_one.summary(), longest_lane=None) == replace(at_once.summary(), longest_lane=None)
    for label, scheduler in (("one_by_one", one_by_one), ("at_once", at_once)):
        while taken := scheduler.take(0.0, limit):
            order[label] += names(taken)
            scheduler.finished_all(taken)
    assert order["one_by_one"] == order["at_once"]
    assert len(at_once) == 0 and at_once.summary().active == 0


def test_finishing_at_once_anything_but_running_heads_is_an_error() -> None:
    scheduler = LaneScheduler()
    first, second = lane_deliveries("A1", "A2")
    scheduler.add([first, second])
    with pytest.raises(RuntimeError, match="not its running head"):
        scheduler.finished_all([first])
    scheduler.take(0.0)
    with pytest.raises(RuntimeError, match="not its running head"):
        scheduler.finished_all([second])


def test_emptied_lanes_are_kept_for_reuse_up_to_a_bound() -> None:
    """A pod with many keys empties a lane per message: its object is reused, but a spike of keys must not
    keep them all (``SPARE_LANES``)."""
    from keyorder.core.lanes import SPARE_LANES

    scheduler = LaneScheduler()
    many = [delivery(f"K{index}", f"K{index}".encode(), offset=index) for index in range(SPARE_LANES + 100)]
    scheduler.add(many)
    scheduler.finished_all(scheduler.take(0.0, len(many)))
    assert len(scheduler._spare) == SPARE_LANES
    reused = scheduler._spare[-1]
    scheduler.add([delivery("again", b"again", offset=0)])
    assert scheduler._lanes[b"again"] is reused and not reused.running and len(reused.deliveries) == 1


def test_a_long_lane_keeps_its_order_through_the_switch_to_a_deque_and_back() -> None:
    """A lane's FIFO is a list while short and a deque from ``LONG_LANE`` deliveries on (``_Lane.deliveries``):
    across the switch, through a withdraw that shortens it and a reuse of the emptied lane, its deliveries run
    in arrival order, and a reused lane starts short again."""
    from collections import deque

    from keyorder.core.lanes import LONG_LANE

    scheduler = LaneScheduler()
    hot = [delivery(f"H{index}", b"H", offset=index) for index in range(LONG_LANE + 10)]
    scheduler.add(hot[: LONG_LANE - 1])
    assert type(scheduler._lanes[b"H"].deliveries) is list
    scheduler.add(hot[LONG_LANE - 1 :])
    assert type(scheduler._lanes[b"H"].deliveries) is deque
    first = take_one(scheduler, 0.0)
    assert first is hot[0]
    scheduler.finished(first)
    odd = scheduler.withdraw(lambda queued: queued.message.offset % 2 == 1)  # keeps the even half, a list again
    assert names(odd) == [f"H{index}" for index in range(1, LONG_LANE + 10, 2)]
    assert type(scheduler._lanes[b"H"].deliveries) is list
    assert take_all(scheduler) == [f"H{index}" for index in range(2, LONG_LANE + 10, 2)]
    lane = scheduler._spare[-1]
    assert type(lane.deliveries) is list and not lane.deliveries
    scheduler.add(hot[:LONG_LANE])  # the same lane object, long again, then emptied at once by finished_all
    assert scheduler._lanes[b"H"] is lane and type(lane.deliveries) is deque
    for _ in range(LONG_LANE):
        scheduler.finished_all(scheduler.take(0.0, 1))
    assert scheduler._spare[-1] is lane and type(lane.deliveries) is list
