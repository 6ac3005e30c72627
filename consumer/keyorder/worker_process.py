"""Inside one worker process of the process executor: run the handler on the batches the pod sends.

The pod (``process_workers``) starts ``main(SOCKET_FD, PROGRESS_FD)`` in a fresh interpreter.
This process imports the handler once, runs its set-up hook, then answers batches until told to
stop, and runs the tear-down hook. It never decides anything about order: the pod's lane
scheduler sends a lane's next message only after this process reported the previous one, and a
batch holds the heads of distinct lanes.

The wire protocol (``multiprocessing.connection`` frames over a socket pair):

* pod -> process: first ``Init`` (the loader of the handler and its hooks), then batches (lists of
  message fields, ``message_fields``), then ``None`` to stop;
* process -> pod: ``("ready", pid, False)`` or ``("failed", description, bad_input)`` once, then one result list per
  batch: per message a float (the handler's seconds: it returned) or ``(seconds, error type name,
  error text)`` (it raised), or ``None`` (not started: the pod asked to stop mid-batch).

The progress block (``Progress``, a few shared bytes) says which message of the batch is running
and since when, and what happened to the ones before it. The pod reads it only to attribute a
crash (the process died: the block survives it) and to enforce the handler timeout; it is written
only here. Any other way for the pod to learn this would cost a round trip per message.
"""

from __future__ import annotations

import asyncio
import mmap
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

from keyorder.message import Message
from keyorder.workers import Lifecycle, call_sync_handler, is_async_callable, run_async_hook, run_sync_hook

MAX_BATCH = 64
"""Most messages in one batch (the progress block has one slot per message)."""

NOT_STARTED, RUNNING, SUCCEEDED, FAILED = 0, 1, 2, 3
_HEADER = struct.Struct("=dii")  # started_at (monotonic seconds), running index (-1: none), stop requested
_SLOT = struct.Struct("=bd")  # status, handler seconds
PROGRESS_BYTES = _HEADER.size + MAX_BATCH * _SLOT.size
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


def message_fields(message: Message) -> tuple[Any, ...]:
    """A ``Message`` as plain fields: a tuple pickles in a fraction of a dataclass's time."""
    return (
        message.topic,
        message.partition,
        message.offset,
        message.key,
        message.value,
        message.headers,
        message.timestamp,
    )


class Progress:
    """The shared progress block of one worker process (a memory map of ``fd``)."""

    def __init__(self, fd: int, fresh: bool = False) -> None:
        self.map = mmap.mmap(fd, PROGRESS_BYTES)
        if fresh:  # the pod, on a zeroed block: nothing runs yet (index 0 would be a message started at 0.0)
            _HEADER.pack_into(self.map, 0, 0.0, -1, 0)

    # -- written by the worker process ---------------------------------------------------------------
    def begin_batch(self, size: int) -> None:
        for index in range(size):
            _SLOT.pack_into(self.map, _HEADER.size + index * _SLOT.size, NOT_STARTED, 0.0)

    def start(self, index: int, now: float) -> None:
        _SLOT.pack_into(self.map, _HEADER.size + index * _SLOT.size, RUNNING, 0.0)
        struct.pack_into("=di", self.map, 0, now, index)

    def finish(self, index: int, status: int, seconds: float) -> None:
        _SLOT.pack_into(self.map, _HEADER.size + index * _SLOT.size, status, seconds)
        struct.pack_into("=i", self.map, 8, -1)

    def stop_requested(self) -> bool:
        return bool(_HEADER.unpack_from(self.map)[2])

    # -- read by the pod -------------------------------------------------------------------------------
    def request_stop(self) -> None:
        struct.pack_into("=i", self.map, 12, 1)

    def running(self) -> tuple[int, float]:
        """``(index, started_at)`` of the running message, read twice to rule out a torn read;
        ``(-1, 0.0)`` when none is running (or the reads disagreed)."""
        started_at, index, _stop = _HEADER.unpack_from(self.map)
        again, index_again, _stop = _HEADER.unpack_from(self.map)
        if index < 0 or index != index_again or started_at != again:
            return -1, 0.0
        return index, started_at

    def slot(self, index: int) -> tuple[int, float]:
        """``(status, handler seconds)`` of message ``index`` of the current batch."""
        status, seconds = _SLOT.unpack_from(self.map, _HEADER.size + index * _SLOT.size)
        return status, seconds

    def close(self) -> None:
        self.map.close()


def describe(error: BaseException) -> tuple[str, str]:
    return type(error).__name__, str(error)


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


def run_batch(runner: _Runner, progress: Progress, batch: list[tuple[Any, ...]]) -> list[Any]:
    """Run every message of ``batch`` in order; the result list the pod expects (see the module doc)."""
    progress.begin_batch(len(batch))
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
                batch = connection.recv()
            except EOFError:  # the pod closed its end (it stopped, or died)
                break
            if batch is None:
                break
            connection.send(run_batch(runner, progress, batch))
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
