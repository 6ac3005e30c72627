"""A parked lane is retried at its due time even when the worker that parked it is busy elsewhere.

Issue 36 defect 7: idle workers wait for the earliest due time they saw on their own turn, or for
nothing when nothing was parked. A worker that settled a failure (parking its lane) and went on to
run another lane in the same turn woke nobody, so the retry waited for that other lane to finish:
forever, for a blocked handler. A worker settles several outcomes in one turn when it took several
lanes (fast thread handlers, the process pool's batches); the pools here take two lanes a turn to
get there deterministically. Everything else (threads, tasks, lock, conditions, clock) is real.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from keyorder.core.lanes import Delivery
from keyorder.core.retry import RetryPolicy
from keyorder.engine.worker_pools import AsyncWorkerPool, Completions, ThreadWorkerPool, _Worker
from keyorder.message import Message
from tests.conftest import wait_until

RETRY_SOON = RetryPolicy(max_attempts=3, initial_backoff=0.05, max_backoff=0.05)


class Partition:
    revoked = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:  # no truncation here: only a revoke
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


class TwoLanesATurnThreads(ThreadWorkerPool):
    """Takes two lanes a turn, as a thread worker does once its handler is fast (``_take_limit``)."""

    def _take_limit(self, worker: _Worker, ready: int) -> int:
        return 2


class TwoLanesATurnAsync(AsyncWorkerPool):
    """The asyncio pool taking two lanes a turn, the same shape."""

    def _take_limit(self, worker: _Worker, ready: int) -> int:
        return 2


def idle_workers(pool: Any) -> int:
    return pool._idle if isinstance(pool, ThreadWorkerPool) else len(pool._idle)


class Script:
    """``x0`` fails on its first attempt; ``l0`` returns; ``l1`` holds its worker until released.

    Records ``(event, worker)`` in order, the worker being the thread or the asyncio task."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.release = threading.Event()
        self._attempts: dict[str, int] = {}

    def step(self, message: Message, worker: int) -> bool:
        """Record the attempt (raising for x0's first); True when the caller must hold until released."""
        name = message.value.decode()
        attempt = self._attempts[name] = self._attempts.get(name, 0) + 1
        if name == "x0" and attempt == 1:
            self.events.append(("x0 failed", worker))
            raise ValueError("x0 fails once")
        self.events.append((f"{name} ran" if attempt == 1 else f"{name} retried", worker))
        return name == "l1"

    def who(self, event: str) -> int:
        return next(worker for name, worker in self.events if name == event)

    def names(self) -> list[str]:
        return [name for name, _worker in self.events]


def start_pool(pool_type: type, script: Script, completions: Completions) -> Any:
    if pool_type is TwoLanesATurnAsync:

        async def run(message: Message) -> None:
            if script.step(message, id(asyncio.current_task())):
                deadline = time.monotonic() + 30  # hang guard, past the test's own waits: the test releases it
                while not script.release.is_set() and time.monotonic() < deadline:
                    await asyncio.sleep(0.002)

        pool = TwoLanesATurnAsync(run, 2, RETRY_SOON, None, completions)
    else:

        def handle(message: Message) -> None:
            if script.step(message, threading.get_ident()):
                script.release.wait(30)  # hang guard, past the test's own waits: the test releases it

        pool = TwoLanesATurnThreads(handle, 2, RETRY_SOON, None, completions)
    pool.start()
    return pool


def delivery(name: str, key: bytes, offset: int, partition: Partition) -> Delivery:
    return Delivery(Message("t", 0, offset, key, name.encode()), key, partition, time.monotonic())


@pytest.mark.parametrize("pool_type", [TwoLanesATurnThreads, TwoLanesATurnAsync])
def test_a_lane_parked_by_a_worker_that_went_on_to_a_long_lane_is_retried_by_an_idle_one(pool_type: type) -> None:
    script, completions, partition = Script(), Completions(), Partition()
    pool = start_pool(pool_type, script, completions)
    try:
        wait_until(lambda: idle_workers(pool) == 2, 10, "both workers idle, waiting for no due time")  # hang guard
        # one worker takes x0 and l0 in one turn; on its next it parks lane X and goes on with l1
        pool.submit([delivery("x0", b"X", 0, partition), delivery("l0", b"L", 1, partition),
                     delivery("l1", b"L", 2, partition)])  # fmt: skip
        wait_until(lambda: "x0 retried" in script.names(), 10, "the retry while l1 holds a worker")  # hang guard
        assert not script.release.is_set() and "l1 ran" in script.names()
        assert script.names()[:3] == ["x0 failed", "l0 ran", "l1 ran"], "lane X parked before l1 was taken"
        busy = script.who("x0 failed")
        assert script.who("l1 ran") == busy, "the worker that parked lane X went on with l1"
        assert script.who("x0 retried") != busy, "the idle worker ran the retry"
        script.release.set()
        wait_until(lambda: len(completions) == 3, 10, "all three back")  # hang guard
        assert sorted((item.message.offset, handled) for item, handled in completions) == [
            (0, True), (1, True), (2, True)
        ]  # fmt: skip
        assert pool.health.crashed is None
    finally:
        script.release.set()
        pool.stop(5)
