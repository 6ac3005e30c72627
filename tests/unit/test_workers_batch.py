"""A thread worker's batch settles at once what someone waits for: a revoke, a retry's due time.

A thread worker takes several lanes a turn when its handler is fast (``_take_limit``) and settles
their outcomes on its next turn. A revoke waits for its partition's running deliveries to come
back, and a parked lane is retried only once its due time is registered: neither may wait for the
other lanes of the batch, whose handlers are fast on average but may take long once. The pool is
the real ``ThreadWorkerPool`` under the pod simulation (``tests/simulation``): its threads, lock
and clock are the simulation's, so the run is deterministic on virtual time.
"""

from __future__ import annotations

from typing import Any

import pytest

from keyorder.core.lanes import Delivery
from keyorder.core.retry import RetryPolicy
from keyorder.engine.worker_pools import Completions, ThreadWorkerPool, _Worker
from keyorder.message import Message
from tests.simulation.scheduler import Simulation


class Partition:
    def __init__(self) -> None:
        self.revoked = self.dropped = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:  # no truncation here: only a revoke
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


class ThreeLanesATurn(ThreadWorkerPool):
    """Takes three lanes a turn, as a thread worker does once its handler is fast."""

    def _take_limit(self, worker: _Worker, ready: int) -> int:
        return 3


def delivery(simulation: Simulation, name: str, offset: int, partition: Partition) -> Delivery:
    key = name[0].encode()
    return Delivery(Message("t", 0, offset, key, name.encode(), (), 0), key, partition, simulation.now)


def start(simulation: Simulation, workers: int, handler: Any, retry: RetryPolicy, completions: Completions) -> Any:
    pool = ThreeLanesATurn(handler, workers, retry, None, completions, clock=simulation.clock, threads=simulation)
    pool.start()
    return pool


@pytest.mark.parametrize("seed", range(5))
def test_a_revoke_waits_for_no_other_partitions_handler_of_the_same_batch(seed: int) -> None:
    simulation = Simulation(seed)
    revoked, kept = Partition(), Partition()
    ran: list[tuple[str, float]] = []
    seconds = {"a1": 1.0, "b1": 10.0, "c1": 0.001}

    def handler(message: Message) -> None:
        name = message.value.decode()
        ran.append((name, simulation.now))
        simulation.sleep(seconds[name])

    completions = Completions(threads=simulation)
    pool = start(simulation, 1, handler, RetryPolicy(3, 0.1), completions)
    back: dict[str, tuple[bool, float]] = {}

    def main() -> None:
        # one turn takes a1 (revoked partition), b1 (another, slow this once), c1 (revoked partition)
        pool.submit([delivery(simulation, "a1", 1, revoked), delivery(simulation, "b1", 2, kept),
                     delivery(simulation, "c1", 3, revoked)])  # fmt: skip
        simulation.sleep(0.5)  # a1 runs: the revoke comes now
        revoked.revoked = True
        assert pool.withdraw(lambda queued: queued.partition.revoked) == [], "all three were taken"
        completions.wait(2, 30.0)  # what the runtime's revoke waits for
        while completions:
            item, handled = completions.popleft()
            back[item.message.value.decode()] = (handled, simulation.now)
        pool.stop(30.0)

    simulation.spawn(main, name="main")
    simulation.run(limit=100)
    simulation.close()
    assert simulation.errors == []
    assert back == {"a1": (True, 1.0), "c1": (False, 1.0)}, "the revoked partition's deliveries were back at once"
    assert ran == [("a1", 0.0), ("b1", 1.0)], "c1 never started: its partition was revoked before"


@pytest.mark.parametrize("seed", range(5))
def test_a_lane_parked_in_a_batch_is_retried_at_its_due_time_while_the_batch_runs_on(seed: int) -> None:
    simulation = Simulation(seed)
    partition = Partition()
    ran: list[tuple[str, float]] = []
    attempts: dict[str, int] = {}

    def handler(message: Message) -> None:
        name = message.value.decode()
        ran.append((name, simulation.now))
        attempts[name] = attempts.get(name, 0) + 1
        if name == "x1" and attempts[name] == 1:
            raise ValueError("x1 fails once")
        simulation.sleep(10.0 if name == "l1" else 0.001)

    completions = Completions(threads=simulation)
    pool = start(simulation, 2, handler, RetryPolicy(3, 0.1, max_backoff=0.1), completions)

    def main() -> None:
        simulation.sleep(0.01)  # both workers idle, waiting for no due time
        pool.submit([delivery(simulation, "x1", 1, partition), delivery(simulation, "l1", 2, partition)])
        while len(completions) < 2:
            completions.wait(2, 30.0)
        pool.stop(30.0)

    simulation.spawn(main, name="main")
    simulation.run(limit=100)
    simulation.close()
    assert simulation.errors == []
    retried_at = [when for name, when in ran if name == "x1"][1]
    assert retried_at < 1.0, f"x1 was retried at {retried_at:g}s, its due time 0.1s after it failed at 0.01s"
    assert sorted((item.message.offset, handled) for item, handled in completions) == [(1, True), (2, True)]


@pytest.mark.parametrize(
    "arrival",
    [lambda offset: offset * 0.004, lambda offset: (offset // 10) * 0.1, lambda offset: (offset % 3) * 0.1],
    ids=["each its own", "in runs", "interleaved"],
)
def test_a_batch_that_succeeded_whole_counts_as_each_of_its_messages_would(arrival) -> None:
    """``_batch_succeeded`` (one pass for a batch call that succeeded) leaves a worker's statistics as
    ``_succeeded_in`` for each message does: processed, the handler-seconds and latency histograms, and the
    recent handler time a fast handler's turns are sized by; whether the messages arrived each at its own time,
    in runs of one time (a few poll batches), or with the times interleaved (heads taken from both ready queues)."""
    pool = ThreadWorkerPool(lambda _messages: None, 1, RetryPolicy(), None, Completions())
    partition = Partition()
    batch = [
        Delivery(Message("t", 0, offset, b"k%d" % offset, b"", (), 0), b"k%d" % offset, partition, arrival(offset))
        for offset in range(40)
    ]
    one_by_one, at_once = _Worker(0), _Worker(1)
    share, now = 0.00007, 0.5
    for item in batch:
        pool._succeeded_in(one_by_one, item, share, now)
    settled = pool._batch_succeeded(at_once, batch, share, now)
    assert settled.deliveries is batch
    for name in ("handler_seconds", "latency"):
        expected, got = getattr(one_by_one.stats, name), getattr(at_once.stats, name)
        assert got.buckets == expected.buckets and got.count == expected.count == 40, name
        assert got.total == pytest.approx(expected.total), name
    assert at_once.stats.processed == 40
    assert at_once.handler_seconds_ewma == pytest.approx(one_by_one.handler_seconds_ewma)


def test_a_batch_with_a_revoked_partitions_head_hands_that_head_back_and_runs_the_rest() -> None:
    """The heads of a batch are asked per partition whether the pod let them go (``may_let_go``): a revoked
    partition's head taken into a batch goes back unrun, the other partition's run."""
    pool = ThreadWorkerPool(lambda _messages: None, 1, RetryPolicy(), None, Completions())
    revoked, kept = Partition(), Partition()
    taken = [
        Delivery(Message("t", 0, 1, b"a", b"", (), 0), b"a", kept, 0.0),
        Delivery(Message("t", 1, 1, b"b", b"", (), 0), b"b", revoked, 0.0),
        Delivery(Message("t", 0, 2, b"c", b"", (), 0), b"c", kept, 0.0),
    ]
    known, dead_letters, batch = pool._runnable(taken)
    assert (known, dead_letters, batch) == ([], [], taken)
    revoked.revoked = True
    known, dead_letters, batch = pool._runnable(taken)
    assert [outcome.delivery for outcome in known] == [taken[1]] and dead_letters == []
    assert batch == [taken[0], taken[2]]
