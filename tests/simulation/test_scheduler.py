"""The simulation's scheduler: one seed, one interleaving; virtual time; races found, hangs seen."""

from __future__ import annotations

from keyorder.core.lanes import Delivery
from keyorder.core.retry import RetryPolicy
from keyorder.engine.worker_pools import Completions, ThreadWorkerPool
from keyorder.message import Message
from tests.simulation.scheduler import Simulation


class _Partition:
    revoked = dropped = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:  # no truncation here: only a revoke
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


def _pool_run(seed: int) -> list[tuple[str, bytes, int, float]]:
    """A real ThreadWorkerPool of 3 workers running 40 messages of 4 keys under the simulation."""
    simulation = Simulation(seed)
    calls: list[tuple[str, bytes, int, float]] = []

    def handler(message: Message) -> None:
        calls.append(("start", message.key, message.offset, simulation.now))
        simulation.sleep(0.01 * (1 + message.offset % 3))
        calls.append(("end", message.key, message.offset, simulation.now))

    completions = Completions(threads=simulation)
    pool = ThreadWorkerPool(handler, 3, RetryPolicy(), None, completions, clock=simulation.clock, threads=simulation)

    def main() -> None:
        pool.start()
        messages = [Message("t", 0, offset, f"k{offset % 4}".encode(), b"", (), 0) for offset in range(40)]
        pool.submit([Delivery(message, message.key, _Partition(), simulation.now) for message in messages])
        while len(completions) < 40:
            completions.wait(40, 1.0)
        pool.stop(1.0)

    simulation.spawn(main, name="main")
    simulation.run(limit=100)
    assert simulation.alive() == [] and simulation.errors == []
    assert len(completions) == 40
    return calls


def test_a_seed_replays_the_same_interleaving_and_other_seeds_differ() -> None:
    first = _pool_run(1)
    assert _pool_run(1) == first
    assert any(_pool_run(seed) != first for seed in (2, 3, 4))


def test_the_pool_keeps_each_keys_order_and_virtual_time_counts_the_handlers_only() -> None:
    calls = _pool_run(5)
    for key in {key for _kind, key, _offset, _time in calls}:
        ends = [offset for kind, k, offset, _time in calls if kind == "end" and k == key]
        assert ends == sorted(ends)
    # 40 messages of 10-30 ms on 3 workers: about 0.27 s of virtual time, whatever the real time
    assert 0.2 < calls[-1][3] < 0.5


def test_a_check_then_wait_race_is_found_by_some_seed() -> None:
    """A waiter that checks a flag, then waits on an event without a timeout, misses a set that lands
    between the two if the setter clears first: a lost wake-up. Some seeds must interleave it."""

    def lost(seed: int) -> bool:
        simulation = Simulation(seed, preemption=0.5)
        event = simulation.Event()
        state = {"ready": False}
        lock = simulation.Lock()

        def waiter() -> None:
            with lock:
                ready = state["ready"]
            if not ready:
                event.clear()  # the bug: clearing after the check loses a set made in between
                event.wait()

        def setter() -> None:
            with lock:
                state["ready"] = True
            event.set()

        simulation.spawn(waiter, name="waiter")
        simulation.spawn(setter, name="setter")
        simulation.run(limit=10)
        stuck = simulation.alive() == ["waiter"]
        simulation.close()
        return stuck

    outcomes = {lost(seed) for seed in range(60)}
    assert outcomes == {True, False}


def test_close_ends_threads_blocked_forever() -> None:
    simulation = Simulation(0)
    event = simulation.Event()
    simulation.spawn(event.wait, name="forever")
    simulation.run(limit=5)
    assert simulation.alive() == ["forever"]
    simulation.close()
    assert simulation.alive() == []
