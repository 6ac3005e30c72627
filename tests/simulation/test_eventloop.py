"""The async executor under the simulation: the real AsyncWorkerPool on a virtual-time event loop."""

from __future__ import annotations

from keyorder.core.lanes import Delivery
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.engine.worker_pools import AsyncWorkerPool, Completions
from keyorder.message import Message
from tests.simulation.eventloop import event_loop_factory
from tests.simulation.scheduler import Simulation


class _Partition:
    revoked = dropped = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:  # no truncation here: only a revoke
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


def _run(seed: int) -> tuple[list, list, Simulation]:
    simulation = Simulation(seed)
    calls: list = []
    failed: set[int] = set()

    async def handler(message: Message) -> None:
        import asyncio

        calls.append(("start", message.key, message.offset, message.value, simulation.now))
        await asyncio.sleep(0.01 * (1 + message.offset % 3))
        if message.offset % 7 == 0 and message.offset not in failed:  # fails once: retried after 0.2 s
            failed.add(message.offset)
            raise RuntimeError("first attempt fails")
        calls.append(("end", message.key, message.offset, message.value, simulation.now))

    completions = Completions(threads=simulation)
    pool = AsyncWorkerPool(
        handler,
        3,
        RetryPolicy(3, 0.2, exhausted=ExhaustedPolicy.BLOCK, random=lambda: 0.5),
        None,
        completions,
        clock=simulation.clock,
        threads=simulation,
        event_loop=event_loop_factory(simulation),
    )

    def main() -> None:
        pool.start()
        messages = [Message("t", 0, offset, f"k{offset % 4}".encode(), b"", (), 0) for offset in range(30)]
        pool.submit([Delivery(message, message.key, _Partition(), simulation.now) for message in messages])
        while len(completions) < 30:
            completions.wait(30, 1.0)
        pool.stop(1.0)

    simulation.spawn(main, name="main")
    simulation.run(limit=100)
    return calls, list(completions), simulation


def test_the_async_pool_runs_on_virtual_time_in_key_order_and_replays_by_seed() -> None:
    calls, completions, simulation = _run(2)
    assert simulation.errors == [] and simulation.alive() == []
    assert len(completions) == 30 and all(handled for _delivery, handled in completions)
    for key in {call[1] for call in calls}:
        ends = [call[2] for call in calls if call[0] == "end" and call[1] == key]
        assert ends == sorted(ends) and len(ends) == len(set(ends))
    # the retries wait 0.2 s of virtual time: the run takes under a virtual second
    assert 0.2 < calls[-1][4] < 1.0
    assert _run(2)[0] == calls
