"""Handlers for ApplyHandler's tests (loaded by path, as Spark's workers load the user's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from keyorder import Message
from tests.guarantees import SerialPerKey

RECORDS: list[tuple[str, int]] = []
SERIAL = SerialPerKey()
_LOCK = threading.Lock()


def reset() -> None:
    RECORDS.clear()
    global SERIAL
    SERIAL = SerialPerKey()


def slow(message: Message) -> None:
    key, sequence = message.key.decode(), int(message.value)
    SERIAL.enter(key)
    try:
        time.sleep(0.002)
        with _LOCK:
            RECORDS.append((key, sequence))
    finally:
        SERIAL.leave(key)


async def slow_async(message: Message) -> None:
    import asyncio

    key, sequence = message.key.decode(), int(message.value)
    SERIAL.enter(key)
    try:
        await asyncio.sleep(0.002)
        with _LOCK:
            RECORDS.append((key, sequence))
    finally:
        SERIAL.leave(key)


FAKE_TOKEN = "f" * 32


def fails_with_many_lines(message: Message) -> None:
    """A handler whose error message spans lines, some of which look like a passing error, one like the
    task's own failure marker (with another wave attempt's token)."""
    raise ValueError(
        "order 17 rejected by the ledger:\n"
        "ConnectionError: upstream said so earlier\n"
        f"keyorder-catchup-task-failed {FAKE_TOKEN} other: ConnectionError: retry me\n"
        "TimeoutError: also quoted from a log"
    )


REACHED = threading.Event()
RELEASE = threading.Event()
HANDLED_OFFSETS: list[int] = []


def gated(message: Message) -> None:
    """Holds offset 5 until the test releases it (10 s hang guard); every later message takes 20 ms."""
    if message.offset == 5:
        REACHED.set()
        assert RELEASE.wait(10), "not released"  # hang guard
    elif message.offset > 5:
        time.sleep(0.02)
    with _LOCK:
        HANDLED_OFFSETS.append(message.offset)


HOOK_CALLS: list[str] = []
"""What the hooks and ``needs_setup`` saw, in order (one Spark task's hooks run around its messages)."""
_CONNECTION: dict[str, bool] = {}


def open_connection() -> None:
    """A set-up hook: what a handler that needs a client opens once (``--handler-setup``)."""
    HOOK_CALLS.append("setup")
    _CONNECTION["open"] = True


def close_connection() -> None:
    HOOK_CALLS.append("teardown")
    _CONNECTION.pop("open", None)


def needs_setup(message: Message) -> None:
    """Fails unless ``open_connection`` ran first, as a handler whose client the set-up hook makes."""
    if not _CONNECTION.get("open"):
        raise RuntimeError("no connection: the set-up hook did not run")
    HOOK_CALLS.append(f"message {int(message.value)}")


def fails_setup() -> None:
    raise ConnectionError("the database is not there")


def fails_teardown() -> None:
    HOOK_CALLS.append("teardown")
    _CONNECTION.pop("open", None)
    raise ConnectionError("the connection was already gone")


def open_once() -> None:
    """A plain set-up hook beside an async handler: once per task, as on a pod (not once per thread)."""
    HOOK_CALLS.append("setup")


def close_once() -> None:
    HOOK_CALLS.append("teardown")


_LOOP_CONNECTIONS: dict[int, bool] = {}


async def open_async() -> None:
    """An async set-up hook: its resource belongs to the running loop (a client session, say)."""
    import asyncio

    HOOK_CALLS.append("async setup")
    _LOOP_CONNECTIONS[id(asyncio.get_running_loop())] = True


async def close_async() -> None:
    import asyncio

    HOOK_CALLS.append("async teardown")
    _LOOP_CONNECTIONS.pop(id(asyncio.get_running_loop()), None)


async def needs_loop_setup(message: Message) -> None:
    """Fails unless ``open_async`` ran on the loop this call runs on."""
    import asyncio

    if not _LOOP_CONNECTIONS.get(id(asyncio.get_running_loop())):
        raise RuntimeError("no connection on this event loop")
    HOOK_CALLS.append(f"message {int(message.value)}")


async def fails_async_setup() -> None:
    raise ConnectionError("the database is not there")


def batch_of(messages: Sequence[Message]) -> None:
    """A batch handler, by its annotation: catch-up, which calls one per message, refuses it."""


async def cancelled_teardown() -> None:
    """An async tear-down that cancels its own task's work: ``CancelledError`` is a BaseException."""
    import asyncio

    HOOK_CALLS.append("async teardown")
    raise asyncio.CancelledError()
