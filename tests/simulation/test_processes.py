"""The simulated worker processes run the real child code, and die where a seed says."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from keyorder.core.lanes import Delivery
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.engine.process_pool import DiedWhileLoading, ProcessWorkerPool
from keyorder.engine.worker_pools import NO_HOOKS, Completions, Lifecycle
from keyorder.message import Message
from tests.simulation.processes import SimulatedChild, child_factory, live_processes, loading_for
from tests.simulation.scheduler import Simulation


class _Partition:
    revoked = dropped = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:  # no truncation here: only a revoke
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


def _load(handler: Any) -> tuple[Any, Lifecycle]:
    return handler, NO_HOOKS


def _pool(simulation: Simulation, calls: list, children: list[SimulatedChild], workers: int = 1) -> tuple:
    def handler(message: Message) -> None:
        calls.append((message.key, message.offset))
        simulation.sleep(0.01)

    completions = Completions(threads=simulation)
    pool = ProcessWorkerPool(
        functools.partial(_load, handler),
        workers,
        RetryPolicy(3, 0.05, exhausted=ExhaustedPolicy.BLOCK, random=simulation.rng.random),
        None,
        completions,
        clock=simulation.clock,
        threads=simulation,
        start_child=child_factory(simulation, children),
    )
    return pool, completions


def _messages(first: int, count: int) -> list[Message]:
    return [Message("t", 0, offset, f"k{offset}".encode(), b"", (), 0) for offset in range(first, first + count)]


def test_the_pool_runs_messages_through_the_real_child_code_and_stops_it() -> None:
    simulation = Simulation(3)
    calls: list = []
    children: list[SimulatedChild] = []
    pool, completions = _pool(simulation, calls, children, workers=2)

    def main() -> None:
        pool.start()
        pool.submit([Delivery(message, message.key, _Partition(), simulation.now) for message in _messages(0, 20)])
        while len(completions) < 20:
            completions.wait(20, 1.0)
        pool.stop(1.0)

    simulation.spawn(main, name="main")
    simulation.run(limit=60)
    assert simulation.errors == []
    assert sorted(offset for _key, offset in calls) == list(range(20))
    assert all(handled for _delivery, handled in completions)
    assert live_processes(children) == [] and simulation.alive() == []
    assert {child.process.returncode for child in children} == {0}


def test_a_process_killed_while_idle_does_not_make_the_next_batch_count_as_handled() -> None:
    """Issue 36, defect 1: the next batch after an idle death must run (or be retried), never be
    taken as handled from the previous batch's progress slots."""
    simulation = Simulation(4)
    calls: list = []
    children: list[SimulatedChild] = []
    pool, completions = _pool(simulation, calls, children)
    killed: list[str] = []

    def main() -> None:
        pool.start()
        pool.submit([Delivery(message, message.key, _Partition(), simulation.now) for message in _messages(0, 1)])
        while len(completions) < 1:
            completions.wait(1, 1.0)
        simulation.sleep(1.0)  # idle: the kill lands now
        pool.submit([Delivery(message, message.key, _Partition(), simulation.now) for message in _messages(1, 1)])
        while len(completions) < 2:
            completions.wait(2, 1.0)
        pool.stop(1.0)

    def kill() -> None:
        (process,) = live_processes(children)
        process.kill()
        killed.append(process.killed_while or "")

    simulation.call_at(0.5, kill)
    simulation.spawn(main, name="main")
    simulation.run(limit=60)
    assert killed == ["idle"]
    ran = {offset for _key, offset in calls}
    handled = [delivery.message.offset for delivery, ok in completions if ok]
    assert [offset for offset in handled if offset not in ran] == [], "counted as handled without running"
    assert sorted(ran) == [0, 1]


def test_a_worker_process_is_ready_once_its_load_time_passed_and_a_kill_meanwhile_is_a_death_while_loading() -> None:
    """Fidelity of ``loading_for``: the pod's real ``_Child.await_ready`` returns once the load's virtual seconds
    passed (the fake loaded at once before, so no fault could land in a load), and a SIGKILL during the load reads
    as the real process's end of file: ``DiedWhileLoading``."""
    simulation = Simulation(6)
    children: list[SimulatedChild] = []
    start = child_factory(simulation, children)
    seen: dict[str, Any] = {}

    def handler(message: Message) -> None: ...

    def main() -> None:
        loads = functools.partial(loading_for, handler, simulation, 0.3)
        ready = start(loads, 1)
        ready.await_ready(60)
        seen["ready at"] = simulation.now
        ready.close(1)
        dying = start(loads, 2)
        simulation.call_at(simulation.now + 0.1, dying.process.kill)
        try:
            dying.await_ready(60)
        except DiedWhileLoading as error:
            seen["died at"], seen["error"] = simulation.now, str(error)

    simulation.spawn(main, name="main")
    simulation.run(limit=60)
    assert simulation.errors == []
    assert seen["ready at"] == pytest.approx(0.3)
    assert seen["died at"] == pytest.approx(0.4) and "killed by SIGKILL while loading the handler" in seen["error"]
