"""A replacement worker process that cannot start: the pod exits, and nothing of its key is handed back or reordered.

A worker process that dies is replaced once the messages of its call are back in their lanes
(``ProcessWorkerPool._replace_dead``). A replacement that cannot load the handler (``HandlerSetupError``)
then holds no head: the pod begins to exit, and the other workers, which run on until the poll loop stops the
pool, may run those lanes, in order. (It once held the heads it had taken for a call: they were handed back
while their partition stayed assigned, and the key of that partition had to be refused until the pod stopped.)

The process executor runs under the pod simulation (``tests/simulation``): the real pool and the
real child code, simulated processes, one seed deciding the interleaving, on virtual time.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from keyorder.core.lanes import Delivery
from keyorder.core.retry import RetryPolicy
from keyorder.engine.process_child import Loader
from keyorder.engine.process_pool import ProcessWorkerPool, _Child
from keyorder.engine.worker_pools import NO_HOOKS, Completions, HandlerSetupError, Lifecycle
from keyorder.message import Message
from tests.simulation.processes import SimulatedChild, live_processes
from tests.simulation.scheduler import Simulation


class Partition:
    revoked = dropped = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:  # no truncation here: only a revoke
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


def _load(handler: Any) -> tuple[Any, Lifecycle]:
    return handler, NO_HOOKS


class ChildThatCannotLoad(SimulatedChild):
    """A replacement process that fails while loading the handler (a broken volume, a full /tmp...)."""

    def await_ready(self, timeout: float) -> None:
        raise HandlerSetupError(f"worker process {self.pid} exited with status 1 while loading the handler")


def starts(simulation: Simulation, registry: list[SimulatedChild]) -> Any:
    """Two processes start; the first replacement cannot load the handler; later ones can."""

    def start(load: Loader, worker_id: int) -> _Child:
        kind = ChildThatCannotLoad if len(registry) == 2 else SimulatedChild
        return kind(load, worker_id, simulation, registry)

    return start


@pytest.mark.parametrize("seed", range(8))
def test_a_replacement_that_cannot_start_hands_back_nothing_and_the_key_runs_on_in_order(seed: int) -> None:
    simulation = Simulation(seed)
    ran: list[tuple[bytes, int]] = []
    children: list[SimulatedChild] = []

    def handler(message: Message) -> None:
        ran.append((message.key, message.offset))

    completions = Completions(threads=simulation)
    pool = ProcessWorkerPool(
        functools.partial(_load, handler), 2, RetryPolicy(3, 0.05), None, completions,
        clock=simulation.clock, threads=simulation, start_child=starts(simulation, children),
    )  # fmt: skip
    partition = Partition()

    def delivery(key: bytes, offset: int) -> Delivery:
        return Delivery(Message("t", 0, offset, key, b"", (), 0), key, partition, simulation.now)

    def kill_both_while_idle() -> None:
        for process in live_processes(children):
            process.kill()

    def main() -> None:
        pool.start()
        simulation.sleep(1.0)  # both processes die while idle now
        # the first worker to find its process dead cannot replace it: the pod begins to exit; the other can
        pool.submit([delivery(b"k", 1), delivery(b"k", 2)])
        pool.submit([delivery(b"k", 3), delivery(b"o", 4)])
        while len(completions) < 4:
            completions.wait(4, 1.0)
        pool.stop(1.0)

    simulation.call_at(0.5, kill_both_while_idle)
    simulation.spawn(main, name="main")
    simulation.run(limit=60)
    simulation.close()
    assert simulation.errors == []
    assert pool.health.crashed is not None and "while loading the handler" in pool.health.crashed
    outcomes = {(delivery.message.key, delivery.message.offset): handled for delivery, handled in completions}
    assert outcomes == {(b"k", 1): True, (b"k", 2): True, (b"k", 3): True, (b"o", 4): True}, "none handed back"
    assert [offset for key, offset in ran if key == b"k"] == [1, 2, 3], "k in order, each once"
    assert sorted(ran) == [(b"k", 1), (b"k", 2), (b"k", 3), (b"o", 4)]
