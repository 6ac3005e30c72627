"""Handlers and hooks that tests load by path, as ``keyorder run --handler`` does (in worker processes too).

They report to the file named by ``KEYORDER_TEST_RECORD_FILE``, one ``os.write`` per line on an
O_APPEND descriptor, so lines from several processes never interleave and a process killed with
SIGKILL leaves only whole lines. A message's value is its key's sequence number.

* ``record``: ``run KEY SEQ PID START END`` (monotonic seconds) after sleeping ``KEYORDER_TEST_SLEEP``;
* ``stall_once``: like ``record``, but the message ``KEYORDER_TEST_STALL_KEY``/0 first writes
  ``stalled KEY SEQ PID`` and sleeps a minute, once (a marker file remembers it): a test kills the
  process, or the handler timeout does;
* ``fail_value_error``: raises ``ValueError``;
* ``setup``/``teardown``: ``setup PID`` / ``teardown PID``; ``failing_setup`` raises;
* ``async_record`` with ``async_setup``/``async_teardown``: the handler fails unless it runs on the
  event loop the set-up ran on;
* ``record_gc_threshold`` and the set-up hook ``record_gc_threshold_setup``: ``gc PID THRESHOLD``, the
  garbage collector's first threshold in the process they run in.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any


def _write(line: str) -> None:
    fd = os.open(os.environ["KEYORDER_TEST_RECORD_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def record(message: Any) -> None:
    started = time.monotonic()
    pause = float(os.environ.get("KEYORDER_TEST_SLEEP", "0"))
    if pause:
        time.sleep(pause)
    _write(f"run {message.key.decode()} {int(message.value)} {os.getpid()} {started!r} {time.monotonic()!r}")


def stall_once(message: Any) -> None:
    if message.key.decode() == os.environ.get("KEYORDER_TEST_STALL_KEY") and int(message.value) == 0:
        marker = os.environ["KEYORDER_TEST_RECORD_FILE"] + ".stalled"
        if not os.path.exists(marker):
            open(marker, "w").close()
            _write(f"stalled {message.key.decode()} 0 {os.getpid()}")
            time.sleep(60)
    record(message)


def fail_value_error(message: Any) -> None:
    raise ValueError(f"cannot parse {message.value!r}")


def setup() -> None:
    _write(f"setup {os.getpid()}")


def teardown() -> None:
    _write(f"teardown {os.getpid()}")


def failing_setup() -> None:
    raise RuntimeError("database unreachable")


_LOOP: list[asyncio.AbstractEventLoop] = []


async def async_setup() -> None:
    _LOOP.append(asyncio.get_running_loop())
    _write(f"setup {os.getpid()}")


async def async_teardown() -> None:
    _write(f"teardown {os.getpid()}")


async def async_record(message: Any) -> None:
    if [asyncio.get_running_loop()] != _LOOP:
        raise RuntimeError("the handler does not run on the event loop its set-up ran on")
    await asyncio.sleep(0)
    record(message)


def read(path: str) -> list[list[str]]:
    """The lines written so far, split into fields."""
    try:
        with open(path) as file:
            return [line.split() for line in file.read().splitlines()]
    except FileNotFoundError:
        return []


def runs(path: str) -> list[tuple[str, int, int, float, float]]:
    """``(key, seq, pid, start, end)`` of every completed run."""
    return [
        (key, int(seq), int(pid), float(start), float(end))
        for kind, key, seq, pid, start, end in (fields for fields in read(path) if fields[0] == "run")
    ]


def batch_stall_once(messages: list[Any]) -> list[BaseException | None]:
    """A batch handler: ``stall_once`` for a whole batch (``stalled`` line, a minute's sleep, once, when the
    batch holds ``KEYORDER_TEST_STALL_KEY``/0), then a ``run`` line per message; a message whose value is
    ``KEYORDER_TEST_FAIL_SEQ`` of key ``KEYORDER_TEST_FAIL_KEY`` fails once (its outcome is an exception)."""
    stall = os.environ.get("KEYORDER_TEST_STALL_KEY")
    if any(message.key.decode() == stall and int(message.value) == 0 for message in messages):
        marker = os.environ["KEYORDER_TEST_RECORD_FILE"] + ".stalled"
        if not os.path.exists(marker):
            open(marker, "w").close()
            _write(f"stalled {stall} 0 {os.getpid()} {len(messages)}")
            time.sleep(60)
    outcomes: list[BaseException | None] = []
    for message in messages:
        failing = (os.environ.get("KEYORDER_TEST_FAIL_KEY"), os.environ.get("KEYORDER_TEST_FAIL_SEQ"))
        marker = os.environ["KEYORDER_TEST_RECORD_FILE"] + ".failed"
        if (message.key.decode(), message.value.decode()) == failing and not os.path.exists(marker):
            open(marker, "w").close()
            outcomes.append(ValueError("rejected once"))
            continue
        record(message)
        outcomes.append(None)
    return outcomes


def batch_drains(messages: list[Any]) -> None:
    """A batch handler that consumes its list in place (``pop`` until empty), then records each message."""
    while messages:
        record(messages.pop())


def batch_poison(messages: list[Any]) -> None:
    """A batch handler whose process dies (``os._exit``, as a segfault) whenever its call holds a message of key
    ``KEYORDER_TEST_POISON_KEY``; otherwise it records each message."""
    poison = os.environ["KEYORDER_TEST_POISON_KEY"]
    if any(message.key.decode() == poison for message in messages):
        os._exit(139)
    for message in messages:
        record(message)


def record_gc_threshold_setup() -> None:
    """A set-up hook: ``gc PID THRESHOLD``, the young generation's threshold of the process it runs in (the pod's,
    on threads)."""
    import gc

    _write(f"gc {os.getpid()} {gc.get_threshold()[0]}")


def record_gc_threshold(message: Any) -> None:
    """The same line from a handler (in a worker process, with the process executor)."""
    record_gc_threshold_setup()
