"""LaneScheduler: FIFO, parked lanes step aside, retries first, lane order preserved."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyorder.core.scheduling import Delivery, LaneScheduler


def delivery(name: str, lane: Hashable | None) -> Delivery:
    """A delivery whose message is just a name, e.g. ``"A1"`` (lane A, first of its lane)."""
    return Delivery(message=name, lane=lane, slot=0, partition=None, received_at=0.0)


def lane_deliveries(*names: str) -> list[Delivery]:
    """``"A1"`` -> lane ``b"A"``; names starting with ``"U"`` are unordered (lane ``None``)."""
    return [delivery(name, None if name.startswith("U") else name[0].encode()) for name in names]


def run_until_idle_or_waiting(scheduler: LaneScheduler, now: float) -> tuple[list[str], float | None]:
    """Take every runnable delivery (all succeed); return their names and what ``next`` said last."""
    taken = []
    while True:
        item = scheduler.next(now)
        if not isinstance(item, Delivery):
            return taken, item
        taken.append(item.message)
        scheduler.finished(item)


def test_fifo_order_across_lanes() -> None:
    scheduler = LaneScheduler()
    scheduler.push_all(lane_deliveries("A1", "B1", "A2", "C1", "B2"))
    assert len(scheduler) == 5
    assert run_until_idle_or_waiting(scheduler, now=0.0) == (["A1", "B1", "A2", "C1", "B2"], None)
    assert len(scheduler) == 0


def test_idle_scheduler_returns_none() -> None:
    assert LaneScheduler().next(now=123.0) is None


def test_parked_lane_waits_while_other_lanes_flow() -> None:
    scheduler = LaneScheduler()
    scheduler.push_all(lane_deliveries("A1", "B1", "A2", "B2", "A3"))
    a1 = scheduler.next(now=0.0)
    assert isinstance(a1, Delivery) and a1.message == "A1"
    scheduler.park(a1, due=10.0)  # A1 failed: lane A waits until t=10
    assert scheduler.parked_lanes == 1

    taken, waiting = run_until_idle_or_waiting(scheduler, now=1.0)
    assert taken == ["B1", "B2"], "lane B must not wait for lane A's retry"
    assert waiting == pytest.approx(9.0)  # seconds until A1 is due
    assert len(scheduler) == 3  # A1, A2, A3 held in lane A's queue


def test_due_head_is_retried_first_and_lane_order_resumes_ahead_of_later_arrivals() -> None:
    scheduler = LaneScheduler()
    scheduler.push_all(lane_deliveries("A1", "A2", "B1", "A3"))
    a1 = scheduler.next(now=0.0)
    assert isinstance(a1, Delivery)
    scheduler.park(a1, due=5.0)
    assert run_until_idle_or_waiting(scheduler, now=0.0) == (["B1"], 5.0)
    scheduler.push_all(lane_deliveries("C1", "B2"))  # arrive while A is parked

    retry = scheduler.next(now=5.0)
    assert retry is a1, "the parked head runs first once due"
    scheduler.finished(a1)
    assert scheduler.parked_lanes == 0
    taken, waiting = run_until_idle_or_waiting(scheduler, now=5.0)
    assert taken == ["A2", "A3", "C1", "B2"]
    assert waiting is None


def test_not_yet_due_head_is_not_returned() -> None:
    scheduler = LaneScheduler()
    scheduler.push_all(lane_deliveries("A1"))
    a1 = scheduler.next(now=0.0)
    assert isinstance(a1, Delivery)
    scheduler.park(a1, due=2.5)
    assert scheduler.next(now=2.4999) == pytest.approx(0.0001)
    assert scheduler.next(now=2.5) is a1  # due exactly now counts as due


def test_a_retry_that_fails_again_parks_the_lane_again() -> None:
    scheduler = LaneScheduler()
    scheduler.push_all(lane_deliveries("A1", "A2", "B1"))
    a1 = scheduler.next(now=0.0)
    assert isinstance(a1, Delivery)
    scheduler.park(a1, due=1.0)
    assert scheduler.next(now=1.0) is a1
    scheduler.park(a1, due=3.0)  # failed again
    assert run_until_idle_or_waiting(scheduler, now=1.0) == (["B1"], 2.0)
    assert scheduler.next(now=3.0) is a1
    scheduler.finished(a1)
    assert run_until_idle_or_waiting(scheduler, now=3.0) == (["A2"], None)


def test_earliest_due_lane_is_retried_first() -> None:
    scheduler = LaneScheduler()
    scheduler.push_all(lane_deliveries("A1", "B1"))
    a1, b1 = scheduler.next(0.0), scheduler.next(0.0)
    assert isinstance(a1, Delivery) and isinstance(b1, Delivery)
    scheduler.park(a1, due=8.0)
    scheduler.park(b1, due=4.0)
    assert scheduler.parked_lanes == 2
    assert scheduler.next(now=3.0) == pytest.approx(1.0)
    assert scheduler.next(now=9.0) is b1
    assert scheduler.next(now=9.0) is a1


def test_unordered_failure_parks_only_that_delivery() -> None:
    scheduler = LaneScheduler()
    scheduler.push_all(lane_deliveries("U1", "U2", "U3"))
    u1 = scheduler.next(now=0.0)
    assert isinstance(u1, Delivery) and u1.lane is None
    scheduler.park(u1, due=5.0)
    assert run_until_idle_or_waiting(scheduler, now=0.0) == (["U2", "U3"], 5.0)
    assert scheduler.next(now=5.0) is u1


def test_parking_a_delivery_other_than_the_lane_head_is_an_error() -> None:
    scheduler = LaneScheduler()
    a1, a2 = lane_deliveries("A1", "A2")
    scheduler.push_all([a1, a2])
    assert scheduler.next(now=0.0) is a1
    scheduler.park(a1, due=1.0)
    assert scheduler.next(now=0.0) == pytest.approx(1.0)  # A2 now waits behind A1
    with pytest.raises(RuntimeError, match="other than its head"):
        scheduler.park(a2, due=2.0)


def test_finished_of_an_unparked_delivery_changes_nothing() -> None:
    scheduler = LaneScheduler()
    scheduler.push_all(lane_deliveries("A1", "A2"))
    a1 = scheduler.next(now=0.0)
    assert isinstance(a1, Delivery)
    scheduler.finished(a1)
    assert run_until_idle_or_waiting(scheduler, now=0.0) == (["A2"], None)


def test_finished_unblocks_a_blocked_lane() -> None:
    scheduler = LaneScheduler()
    scheduler.push_all(lane_deliveries("A1"))
    a1 = scheduler.next(now=0.0)
    assert isinstance(a1, Delivery)
    scheduler.park(a1, due=30.0)
    scheduler.blocked.add(a1.park_key)  # what the worker does under the block policy
    assert scheduler.next(now=30.0) is a1
    scheduler.finished(a1)
    assert scheduler.blocked == set()


def test_drain_returns_everything_queued_and_parked() -> None:
    scheduler = LaneScheduler()
    deliveries = lane_deliveries("A1", "B1", "A2", "U1", "C1")
    scheduler.push_all(deliveries)
    a1 = scheduler.next(now=0.0)
    assert isinstance(a1, Delivery)
    scheduler.park(a1, due=10.0)
    scheduler.blocked.add(a1.park_key)
    b1 = scheduler.next(now=0.0)  # B1 is running: not the scheduler's any more
    assert isinstance(b1, Delivery) and b1.message == "B1"
    scheduler.next(now=0.0)  # moves A2 behind A1, returns U1
    drained = scheduler.drain()
    assert sorted(d.message for d in drained) == ["A1", "A2", "C1"]
    assert len(scheduler) == 0
    assert scheduler.parked_lanes == 0
    assert scheduler.blocked == set()
    assert scheduler.next(now=100.0) is None, "no stale due time may survive a drain"


def test_park_key_is_the_lane_or_the_delivery_itself() -> None:
    keyed, first, second = delivery("A1", b"A"), delivery("U1", None), delivery("U2", None)
    assert keyed.park_key == b"A"
    assert first.park_key != second.park_key
    assert keyed.attempts == 0


@settings(deadline=None, database=None, max_examples=200)
@given(data=st.data())
def test_random_failures_keep_every_lane_in_arrival_order(data: st.DataObject) -> None:
    """Simulated worker: random arrivals, failures and backoffs; each lane completes in order."""
    scheduler = LaneScheduler()
    lanes = [b"A", b"B", b"C", None]
    arrived: dict[Hashable, list[str]] = {}
    completed: dict[Hashable, list[str]] = {}
    parked_heads: dict[Hashable, Delivery] = {}
    pending_batches = data.draw(st.lists(st.lists(st.sampled_from(lanes), max_size=5), min_size=1, max_size=6))
    counter, now = 0, 0.0
    for _ in range(500):
        idle = len(scheduler) == 0
        if pending_batches and (idle or data.draw(st.booleans())):
            batch = []
            for lane in pending_batches.pop(0):
                counter += 1
                item = delivery(f"m{counter}", lane)
                arrived.setdefault(item.park_key, []).append(item.message)
                batch.append(item)
            scheduler.push_all(batch)
        item = scheduler.next(now)
        if item is None:
            if not pending_batches:
                break
            continue  # the next batch is pushed on the next turn (the scheduler is idle)
        if isinstance(item, float):
            assert item > 0
            now += item
            continue
        if item.park_key in parked_heads:
            assert item is parked_heads[item.park_key], "a parked lane ran something other than its head"
        if item.attempts < 3 and data.draw(st.booleans()):
            item.attempts += 1
            parked_heads[item.park_key] = item
            scheduler.park(item, due=now + data.draw(st.floats(0.01, 5.0)))
        else:
            completed.setdefault(item.park_key, []).append(item.message)
            parked_heads.pop(item.park_key, None)
            scheduler.finished(item)
    assert not pending_batches and len(scheduler) == 0, "simulation did not finish"
    assert completed == arrived
