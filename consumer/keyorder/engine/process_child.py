"""Inside one worker process of the process executor: run the handler on the batches the pod sends.

The pod (``process_pool``) starts ``main(SOCKET_FD, PROGRESS_FD)`` in a fresh interpreter.
This process imports the handler once, runs its set-up hook, then answers batches until told to
stop, and runs the tear-down hook. It never decides anything about order: the pod's lane
scheduler sends a lane's next message only after this process reported the previous one, and a
batch holds the heads of distinct lanes.

The wire protocol (``multiprocessing.connection`` frames over a socket pair):

* pod -> process: first ``Init`` (the loader of the handler and its hooks), then batches
  (``(number, fields, as_batch)``: the batch's number, counting from 1, a list of message fields,
  ``message_fields``, and whether the handler is a batch handler, called once with all of them,
  ``run_batch_call``, or a per-message one, called for each in turn, ``run_batch``), then ``None`` to stop;
* process -> pod: ``("ready", pid, False)`` or ``("failed", description, bad_input)`` once, then one result list per
  batch: per message a float (the handler's seconds: it returned) or ``(seconds, error type name,
  error text)`` (it raised), or ``None`` (not started: the pod asked to stop mid-batch).

The progress block (``Progress``, a few shared bytes) says which message of the batch is running
and since when, and what happened to the ones before it. The pod reads it only to attribute a
crash (the process died: the block survives it) and to enforce the handler timeout; only the stop
flag is written by the pod, the rest only here. Any other way for the pod to learn this would cost
a round trip per message. The block names the batch it describes (``begin_batch`` writes the
batch's number after clearing the slots): a process that dies before it began a batch (killed
while idle, or while unpickling the batch) leaves the previous batch's slots, and the pod must not
read those as the new batch's outcomes.
"""

from __future__ import annotations

import asyncio
import mmap
import operator
import os
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from keyorder.batch import BATCH_MAX_MESSAGES_LIMIT, Outcomes, all_none, call_async_batch, call_sync_batch
from keyorder.core.errors import error_text
from keyorder.engine.worker_pools import Lifecycle, call_sync_handler, is_async_callable, run_async_hook, run_sync_hook
from keyorder.message import Message

MAX_BATCH = 64
"""Most messages in one batch of a per-message handler."""
SLOTS = max(MAX_BATCH, BATCH_MAX_MESSAGES_LIMIT)
"""Slots of the progress block: one per message of a batch (a batch handler's may hold more)."""

NOT_STARTED, RUNNING, SUCCEEDED, FAILED = 0, 1, 2, 3
# started_at (monotonic seconds), running index (-1: none), stop requested, number of the batch the slots describe
_HEADER = struct.Struct("=diiq")
_RUNNING = struct.Struct("=di")  # started_at and running index, at offset 0
_INDEX_AT, _STOP_AT, _BATCH_AT = 8, 12, 16
_SLOT = struct.Struct("=bd")  # status, handler seconds
_NOT_STARTED_SLOT, _RUNNING_SLOT = _SLOT.pack(NOT_STARTED, 0.0), _SLOT.pack(RUNNING, 0.0)
PROGRESS_BYTES = _HEADER.size + SLOTS * _SLOT.size
PARENT_CHECK_SECONDS = 1.0
"""How often the process checks that the pod still exists (it exits when the pod died)."""

Loader = Callable[[], tuple[Callable[[Any], Any], Lifecycle]]
"""Imports the handler and its hooks (a picklable reference, so it crosses the process boundary)."""


@dataclass(frozen=True)
class Init:
    """The first frame: what to run."""

    load: Loader
    worker: int
    """The pod's worker id (for log lines)."""


message_fields: Callable[[Message], tuple[Any, ...]] = operator.attrgetter(
    "topic", "partition", "offset", "key", "value", "headers", "timestamp", "leader_epoch"
)
"""A ``Message`` as plain fields, in ``Message(*fields)``'s order: a tuple pickles in a fraction of a dataclass's
time, and an ``attrgetter`` builds it in C (the pod builds one per message it sends)."""


class Progress:
    """The shared progress block of one worker process (a memory map of ``fd``)."""

    def __init__(self, fd: int, fresh: bool = False) -> None:
        self.map = mmap.mmap(fd, PROGRESS_BYTES)
        if fresh:  # the pod, on a zeroed block: nothing runs yet (index 0 would be a message started at 0.0)
            _HEADER.pack_into(self.map, 0, 0.0, -1, 0, 0)

    # -- written by the worker process ---------------------------------------------------------------
    def begin_batch(self, number: int, size: int) -> None:
        """Clear the slots, then name the batch: a process that dies in between leaves the previous
        batch's number, so the pod reads every message of this one as not started."""
        self._fill_slots(size, _NOT_STARTED_SLOT)
        struct.pack_into("=q", self.map, _BATCH_AT, number)

    def start(self, index: int, now: float) -> None:
        _SLOT.pack_into(self.map, _HEADER.size + index * _SLOT.size, RUNNING, 0.0)
        _RUNNING.pack_into(self.map, 0, now, index)

    def start_all(self, size: int, now: float) -> None:
        """A batch handler's call begins: every message of the batch is running (index 0 names the call)."""
        self._fill_slots(size, _RUNNING_SLOT)
        _RUNNING.pack_into(self.map, 0, now, 0)

    def finish(self, index: int, status: int, seconds: float) -> None:
        _SLOT.pack_into(self.map, _HEADER.size + index * _SLOT.size, status, seconds)
        struct.pack_into("=i", self.map, _INDEX_AT, -1)

    def finish_all(self, size: int, status: int, seconds: float) -> None:
        """``finish`` for the first ``size`` slots at once, each with ``status`` and ``seconds`` (a batch call
        whose messages all succeeded)."""
        self._fill_slots(size, _SLOT.pack(status, seconds))
        struct.pack_into("=i", self.map, _INDEX_AT, -1)

    def _fill_slots(self, size: int, slot: bytes) -> None:
        """The first ``size`` slots set to the packed ``slot``, in one copy (not a ``pack_into`` per message)."""
        self.map[_HEADER.size : _HEADER.size + size * _SLOT.size] = slot * size

    def stop_requested(self) -> bool:
        return bool(_HEADER.unpack_from(self.map)[2])

    # -- read by the pod -------------------------------------------------------------------------------
    def request_stop(self) -> None:
        struct.pack_into("=i", self.map, _STOP_AT, 1)

    def batch(self) -> int:
        """The number of the batch the slots describe (0: none began yet)."""
        number: int = _HEADER.unpack_from(self.map)[3]
        return number

    def running(self) -> tuple[int, float]:
        """``(index, started_at)`` of the running message, read twice to rule out a torn read;
        ``(-1, 0.0)`` when none is running (or the reads disagreed)."""
        started_at, index = _RUNNING.unpack_from(self.map)
        again, index_again = _RUNNING.unpack_from(self.map)
        if index < 0 or index != index_again or started_at != again:
            return -1, 0.0
        return index, started_at

    def slot(self, index: int) -> tuple[int, float]:
        """``(status, handler seconds)`` of message ``index`` of batch ``batch()``."""
        status, seconds = _SLOT.unpack_from(self.map, _HEADER.size + index * _SLOT.size)
        return status, seconds

    def close(self) -> None:
        self.map.close()


def describe(error: BaseException) -> tuple[str, str]:
    """A failed message's error as the pod gets it: its type's name and its text (``error_text``: never raises, or
    the process would die after the call answered, and the call's other messages be charged the death)."""
    return type(error).__name__, error_text(error)


class _Runner:
    """Calls the handler: directly, or on this process's one event loop when it is ``async def``."""

    def __init__(self, handler: Callable[[Any], Any], lifecycle: Lifecycle) -> None:
        self.handler, self.lifecycle = handler, lifecycle
        self.is_async = is_async_callable(handler)
        self.loop = asyncio.new_event_loop() if self.is_async else None

    def setup(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(run_async_hook(self.lifecycle.setup))
        else:
            run_sync_hook(self.lifecycle.setup)

    def teardown(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(run_async_hook(self.lifecycle.teardown))
            self.loop.close()
        else:
            run_sync_hook(self.lifecycle.teardown)

    def call(self, message: Message) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.handler(message))
        else:
            call_sync_handler(self.handler, message)

    def call_batch(self, messages: list[Message]) -> Outcomes:
        if self.loop is not None:
            return self.loop.run_until_complete(call_async_batch(self.handler, messages))
        return call_sync_batch(self.handler, messages)


def run_batch(runner: _Runner, progress: Progress, number: int, batch: list[tuple[Any, ...]]) -> list[Any]:
    """Run every message of batch ``number`` in order; the result list the pod expects (see the module doc)."""
    progress.begin_batch(number, len(batch))
    results: list[Any] = []
    clock = time.monotonic
    for index, fields in enumerate(batch):
        if progress.stop_requested():
            results.extend([None] * (len(batch) - index))
            break
        started = clock()
        progress.start(index, started)
        try:
            runner.call(Message(*fields))
        except BaseException as error:  # SystemExit from a handler is a failed message, as on threads
            seconds = clock() - started
            progress.finish(index, FAILED, seconds)
            results.append((seconds, *describe(error)))
            continue
        seconds = clock() - started
        progress.finish(index, SUCCEEDED, seconds)
        results.append(seconds)
    return results


def run_batch_call(runner: _Runner, progress: Progress, number: int, batch: list[tuple[Any, ...]]) -> list[Any]:
    """Run batch ``number`` as one call of a batch handler; the result list the pod expects, as ``run_batch``'s
    (each message's seconds are the call's split evenly over them). A process that dies inside the call
    leaves every message running in the progress block: the pod retries each under the retry policy."""
    progress.begin_batch(number, len(batch))
    if progress.stop_requested():
        return [None] * len(batch)
    clock = time.monotonic
    started = clock()
    progress.start_all(len(batch), started)
    outcomes: Outcomes
    try:
        outcomes = runner.call_batch([Message(*fields) for fields in batch])
    except BaseException as raised:  # every message of the batch failed (SystemExit too, as on threads)
        outcomes = [raised] * len(batch)
    share = (clock() - started) / len(batch)
    if all_none(outcomes):  # all succeeded: the common case, in one step
        progress.finish_all(len(outcomes), SUCCEEDED, share)
        return [share] * len(outcomes)
    results: list[Any] = []
    for index, error in enumerate(outcomes):
        if error is None:
            progress.finish(index, SUCCEEDED, share)
            results.append(share)
        else:
            progress.finish(index, FAILED, share)
            results.append((share, *describe(error)))
            error.__traceback__ = None  # its frames lead back to this one, which holds it: no reference cycle
    return results


def _exit_when_the_pod_is_gone(parent: int) -> None:
    """A pod killed with SIGKILL cannot stop its workers: each notices it is orphaned and exits."""
    while True:
        time.sleep(PARENT_CHECK_SECONDS)
        if os.getppid() != parent:
            os._exit(3)


def serve(connection: Connection, progress: Progress) -> int:
    """The worker process's life: load, set up, answer batches, tear down. Returns the exit status."""
    init: Init = connection.recv()
    try:
        handler, lifecycle = init.load()
    except BaseException as error:  # a bad path or hook: bad input, as when the pod itself imports it
        connection.send(("failed", str(error), True))
        return 1
    try:
        runner = _Runner(handler, lifecycle)
        runner.setup()
    except BaseException as error:
        connection.send(("failed", "the handler's set-up hook failed: {}: {}".format(*describe(error)), False))
        return 1
    connection.send(("ready", os.getpid(), False))
    try:
        while True:
            try:
                frame = connection.recv()
            except EOFError:  # the pod closed its end (it stopped, or died)
                break
            if frame is None:
                break
            number, batch, as_batch = frame
            connection.send((run_batch_call if as_batch else run_batch)(runner, progress, number, batch))
    finally:
        try:
            runner.teardown()
        except Exception as error:
            print(
                f"keyorder worker process {init.worker}: the handler's tear-down hook failed: "
                f"{type(error).__name__}: {error}",
                file=sys.stderr,
            )
    return 0


def main(argv: list[str]) -> int:
    # The pod owns the shutdown: a Ctrl-C sent to the terminal's process group, or a stray SIGTERM,
    # must not interrupt a handler midway; the pod asks this process to stop (or kills it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    socket_fd, progress_fd = int(argv[0]), int(argv[1])
    threading.Thread(target=_exit_when_the_pod_is_gone, args=(os.getppid(),), daemon=True).start()
    progress = Progress(progress_fd)
    return serve(Connection(socket_fd), progress)
