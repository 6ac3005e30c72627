"""A failed handler call leaves no reference cycle holding its messages (``keyorder.collector``).

The pod raises the garbage collector's first threshold, so cyclic garbage waits longer for a collection.
A handler's error, kept with its traceback, led through the frames back to the frame that caught it,
whose locals held the error: every failed message's delivery and message stayed in memory until a
collection. Here real worker pools run failing handlers with the collector off, and the collection
afterwards must find none of their deliveries or messages among the garbage.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from keyorder.batch import BatchLimits
from keyorder.core.lanes import Delivery
from keyorder.core.retry import RetryPolicy
from keyorder.engine.worker_pools import AsyncWorkerPool, Completions, ThreadWorkerPool
from keyorder.message import Message
from tests.unit.test_workers import FakeDeadLetters, Partition

MESSAGES = 300


def fails(message: Message) -> None:
    raise ValueError(f"rejected {message.offset}")


async def fails_async(message: Message) -> None:
    raise ValueError(f"rejected {message.offset}")


def batch_fails(messages: list[Message]) -> None:
    raise ValueError(f"rejected {len(messages)}")


def batch_fails_one(messages: list[Message]) -> list[BaseException | None]:
    outcomes: list[BaseException | None] = []
    for message in messages:
        try:
            raise KeyError(message.offset)  # a caught error, returned with its traceback
        except KeyError as error:
            outcomes.append(error)
    return outcomes


async def batch_fails_async(messages: list[Message]) -> None:
    raise ValueError(f"rejected {len(messages)}")


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    yield
    gc.set_debug(0)
    gc.garbage.clear()
    gc.enable()


def garbage_of_failed_calls(pool_type: type, handler: Callable[..., Any], batch: int) -> list[str]:
    completions = Completions()
    limits = {"batch": BatchLimits(batch)} if batch > 1 else {}
    retry = RetryPolicy(max_attempts=1, initial_backoff=0.0, max_backoff=0.0)
    pool = pool_type(handler, 4, retry, FakeDeadLetters(), completions, **limits)
    pool.start()
    partition = Partition()
    now = time.monotonic()
    pool.submit([Delivery(Message("t", 0, n, b"k%d" % n, b"v"), b"k%d" % n, partition, now) for n in range(MESSAGES)])
    deadline = time.monotonic() + 30
    while len(completions) < MESSAGES and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(completions) == MESSAGES, "every failed message came back (dead-lettered)"
    pool.stop(5)
    completions.clear()
    del pool, completions
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    return [type(thing).__name__ for thing in gc.garbage if isinstance(thing, (Delivery, Message))]


@pytest.mark.parametrize(
    ("pool_type", "handler", "batch"),
    [
        (ThreadWorkerPool, fails, 1),
        (AsyncWorkerPool, fails_async, 1),
        (ThreadWorkerPool, batch_fails, 50),
        (ThreadWorkerPool, batch_fails_one, 50),
        (AsyncWorkerPool, batch_fails_async, 50),
    ],
)
def test_a_failed_call_leaves_no_cycle_holding_its_messages(collector_off, pool_type, handler, batch) -> None:
    assert garbage_of_failed_calls(pool_type, handler, batch) == []
