"""A head handed back while its partition stays assigned: nothing of its key runs after it in this pod.

A replacement worker process that cannot start (``HandlerSetupError``) hands its batch back and the
pod begins to exit, but the other workers run on until the poll loop stops the pool (its shutdown
even waits for ready lanes). The handed-back head stays unhandled in the commit metadata: if the
key's next message ran and was marked done, the next owner would run the head after it.

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
def test_a_head_handed_back_by_a_replacement_that_cannot_start_takes_its_key_with_it(seed: int) -> None:
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
        # whichever worker takes k@1 cannot replace its process: k@1 is handed back, the pod begins to exit
        pool.submit([delivery(b"k", 1), delivery(b"k", 2)])
        while len(completions) < 2:
            completions.wait(2, 1.0)
        # what the poll loop reads before it sees the crash: k@3 must not run either; o@4 may
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
    assert outcomes == {(b"k", 1): False, (b"k", 2): False, (b"k", 3): False, (b"o", 4): True}
    assert [offset for key, offset in ran if key == b"k"] == [], "k ran after its head k@1 was handed back"
    assert ran == [(b"o", 4)]
