"""The process executor: key workers that each drive one worker process, for CPU-bound handlers.

Threads and asyncio tasks share one interpreter, so the GIL serialises CPU-bound handlers and a
pod uses one core whatever W is. Here each of the W workers is still a thread of the pod, taking
lanes from the one ``LaneScheduler`` exactly as ``ThreadWorkerPool`` does, but it sends the
messages it took to its own worker process (``process_child``) and waits for the answer. So the
lane scheduler stays the single authority on order: a lane's next message is taken only after the
process reported the previous one, and a batch holds the heads of distinct lanes. Retries, the
dead-letter writes, min-offset commits, revoke and live resize are the thread pool's own code;
a resize starts or stops processes.

The hop costs a pickle of the message fields and a socket round trip. When the handler is fast and
ready lanes outnumber the workers, one round trip carries the heads of several lanes
(``_take_limit``): they run one after the other in the process, each lane still one message at a
time. Their outcomes come back together, so a revoke of one of the batch's partitions, and a retry's
due time, wait for the whole batch (a thread worker settles those at once): ``MAX_BATCH`` times
``FAST_PROCESS_HANDLER_SECONDS`` (0.128 s) for handlers as fast as batching requires on average, and
longer by whatever one call of the batch takes beyond that.

A batch handler (``--batch-max-messages``) takes its heads the same way and sends them in one frame
marked ``as_batch``: the process calls the handler once for all of them (``process_child.run_batch_call``),
every message counts as running during the call, and ``--handler-timeout`` bounds the whole call.

Faults: a process that dies (segfault, OOM kill, ``os._exit``) is replaced on the next batch; the
message it was running fails with ``WorkerProcessDied`` and is retried under the retry policy (or
dead-lettered), the messages after it in the batch run again as if never taken, and the ones
before it keep the outcome the progress block recorded. A process that died while idle, or before
it began the batch, ran none of it: the whole batch runs again as if never taken (the progress
block still describes the previous batch; ``_Child.slot`` tells by the batch number). A message
running longer than ``handler_timeout`` has its process killed and replaced, and fails with
``HandlerTimedOut``.
Both are counted (``WorkerStats.process_restarts``, ``WorkerStats.interrupted``). A batch handler's
call of several messages that dies or times out charges none of them an attempt, as any one of them
may be the cause: each is retried at once in a call of its own (``Delivery.run_alone``, ``_run_batch``),
so only a message that kills or hangs its process alone fails and exhausts its attempts (with
``maxAttempts`` 1 and a dead-letter topic, one poison message no longer dead-letters its batch); its
retries stay alone, or each would kill a full call again. A worker makes one such lone call per turn and
puts the other heads it took back, due at once, so a revoke, the shutdown or a retirement is seen
before the next call (and no replacement process starts after shutdown began).

Threading: each worker thread owns its ``_Child`` (process, socket and progress block); ``stop``
only sets the child's stop flag and, after the grace period, kills it.

Why one room of over 600 lines (a few over): what a call's outcomes mean depends on how the child reports them
(its answer, its progress block, its death), so the pool and ``_Child`` are read together; ``_Child`` (the
process, its socket and progress block) is the seam if it grows further.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from keyorder.core.lanes import Delivery
from keyorder.core.retry import ExhaustedPolicy
from keyorder.core.stop_overruns import PROCESS_TEARDOWN_SECONDS
from keyorder.engine.process_child import (
    FAILED,
    MAX_BATCH,
    NOT_STARTED,
    PROGRESS_BYTES,
    RUNNING,
    SUCCEEDED,
    Init,
    Loader,
    Progress,
    message_fields,
)
from keyorder.engine.worker_pools import (
    HANDED_BACK,
    PARKED,
    HandlerSetupError,
    Settlement,
    ThreadWorkerPool,
    _Outcome,
    _Worker,
)

log = logging.getLogger(__name__)

FAST_PROCESS_HANDLER_SECONDS = 0.002
"""Below this recent handler time a round trip per message is a real cost: send several lanes' heads
at once (a batch delays the lanes behind its first message by at most ``MAX_BATCH`` times this)."""
START_TIMEOUT = 300.0
"""Seconds a worker process may take to import the handler and run its set-up hook."""
TEARDOWN_TIMEOUT = PROCESS_TEARDOWN_SECONDS
"""Seconds a stopping worker process may take for its tear-down hook before it is killed."""
_CHILD_MAIN = "import sys; from keyorder.engine.process_child import main; sys.exit(main(sys.argv[1:]))"


class WorkerProcessDied(RuntimeError):
    """The worker process running the message exited (crash, OOM kill, ``os._exit``)."""


class HandlerTimedOut(RuntimeError):
    """The message ran longer than the handler timeout: its worker process was killed."""


class HandlerFailedInProcess(Exception):
    """A handler failure reported by a worker process. The subclass raised is named after the
    original exception's class, so logs and the dead-letter header read as with thread workers."""


@functools.lru_cache(maxsize=256)
def _remote_error_type(name: str) -> type[HandlerFailedInProcess]:
    return type(name, (HandlerFailedInProcess,), {"__module__": __name__})


def remote_error(name: str, text: str) -> HandlerFailedInProcess:
    return _remote_error_type(name)(text)


def _exit_reason(returncode: int | None) -> str:
    if returncode is None:
        return "lost its connection"
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _progress_file() -> int:
    """A file descriptor of ``PROGRESS_BYTES`` zeroed bytes to share with a worker process."""
    if hasattr(os, "memfd_create"):  # Linux: anonymous memory, nothing on any filesystem
        fd = os.memfd_create("keyorder-progress")
    else:  # elsewhere: an unlinked temporary file
        handle, path = tempfile.mkstemp(prefix="keyorder-progress-")
        os.unlink(path)
        fd = handle
    os.ftruncate(fd, PROGRESS_BYTES)
    return fd


REPLACEMENT_ATTEMPTS = 3
"""Starts of a replacement worker process that dies while it loads, in a row, before the pod gives up."""


class DiedWhileLoading(HandlerSetupError):
    """A worker process died while it loaded the handler or ran its set-up hook, without saying why: killed, or a
    crash in an import. A replacement is started again (``REPLACEMENT_ATTEMPTS``); a handler's own error is not."""


class _Child:
    """One worker process, its socket and its progress block; owned by one worker thread."""

    def __init__(self, load: Loader, worker_id: int) -> None:
        self.worker_id = worker_id
        progress_fd = _progress_file()
        try:
            self.process, self.connection = self._start_process(progress_fd)
            self.progress = Progress(progress_fd, fresh=True)
        finally:
            os.close(progress_fd)  # the map keeps the memory
        self.connection.send(Init(load=load, worker=worker_id))
        self.alive = True
        self.batches = 0
        """The number of the batch last sent (they count from 1)."""

    def _start_process(self, progress_fd: int) -> tuple[subprocess.Popen[bytes], Connection]:
        """Start the worker process, handing it one end of a socket pair and the progress block;
        the pod's end of the socket. (The pod simulation starts a simulated process here.)"""
        ours, theirs = socket.socketpair()
        try:
            environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
            process = subprocess.Popen(
                [sys.executable, "-c", _CHILD_MAIN, str(theirs.fileno()), str(progress_fd)],
                pass_fds=(theirs.fileno(), progress_fd),
                stdin=subprocess.DEVNULL,
                env=environment,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return process, Connection(ours.detach())

    @property
    def pid(self) -> int:
        return self.process.pid

    def await_ready(self, timeout: float) -> None:
        """Wait for the handshake; ``HandlerSetupError`` if the process could not load or set up."""
        try:
            if not self.connection.poll(timeout):
                raise HandlerSetupError(f"worker process {self.pid} did not load the handler within {timeout:.0f}s")
            status, detail, bad_input = self.connection.recv()
        except (EOFError, OSError):
            self.kill()  # reaps it (it exited: its end of the socket closed)
            raise DiedWhileLoading(
                f"worker process {self.pid} {_exit_reason(self.process.returncode)} while loading the handler"
            ) from None
        if status != "ready":
            self.kill()
            raise HandlerSetupError(f"worker process {self.pid}: {detail}", bad_input=bad_input)

    def run(self, batch: list[tuple[Any, ...]], timeout: float | None, as_batch: bool = False) -> list[Any] | str:
        """Send a batch and wait for its results; ``"crashed"`` or ``"timeout"`` when the process died
        (before the batch too: the send fails) or was killed for running a message longer than
        ``timeout``. ``slot`` then tells what became of each message. ``as_batch``: one call of a batch
        handler for all of them (every message counts as running during it)."""
        self.batches += 1
        try:
            self.connection.send((self.batches, batch, as_batch))
            if timeout:  # without one, recv alone: a poll per batch would cost another system call
                while not self.connection.poll(min(timeout / 4, 1.0)):
                    if self._overran(timeout):
                        self.kill()
                        return "timeout"
            results: list[Any] = self.connection.recv()
            return results
        except (EOFError, OSError):
            self.kill()  # reaps it (it exited: its end of the socket closed)
            return "crashed"

    def slot(self, index: int) -> tuple[int, float]:
        """``(status, handler seconds)`` of message ``index`` of the batch last sent. ``NOT_STARTED``
        when the process did not begin that batch: its progress block still holds the one before."""
        if self.progress.batch() != self.batches:
            return NOT_STARTED, 0.0
        return self.progress.slot(index)

    def _overran(self, timeout: float) -> bool:
        index, started_at = self.progress.running()
        return index >= 0 and time.monotonic() - started_at > timeout

    def request_stop(self) -> None:
        """Skip the rest of this and every later batch (shutdown): the messages not started come back as such.

        Nothing to ask once the progress block is closed: the worker's own thread left its loop (woken by
        the same stop, or retiring after a shrink) and is stopping the process itself. It may close the
        block between the look and the write, hence both."""
        if self.progress.map.closed:
            return
        try:
            self.progress.request_stop()
        except (TypeError, ValueError):  # a closed mmap: "argument must be read-write bytes-like object"
            return

    def kill(self) -> None:
        self.alive = False
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def discard(self) -> None:
        """Kill the process and release the socket and the progress block (it never became a worker)."""
        self.kill()
        self.connection.close()
        self.progress.close()

    def close(self, timeout: float = TEARDOWN_TIMEOUT) -> None:
        """Ask the process to tear down and exit; kill it when it does not within ``timeout``."""
        if self.alive and self.process.poll() is None:
            try:
                self.connection.send(None)
                self.process.wait(timeout)
            except (OSError, subprocess.TimeoutExpired):
                log.warning("worker process %d did not exit within %.0fs; killing it", self.pid, timeout)
        self.discard()


class _ProcessWorker(_Worker):
    __slots__ = ("child", "closing")

    def __init__(self, worker_id: int) -> None:
        super().__init__(worker_id)
        self.child: _Child | None = None
        self.closing = False
        """Set by the worker's thread once it left its loop and tears its process down (no handler runs)."""


class ProcessWorkerPool(ThreadWorkerPool):
    """Key workers whose handler runs in one worker process each (the process executor).

    ``handler`` is not called here: each process loads its own with ``load`` (a picklable reference,
    e.g. ``functools.partial(adapters.handlers.load_for_worker_process, path, setup, teardown)``),
    and runs the set-up and tear-down hooks itself. ``handler_timeout`` (seconds, real time) kills a
    process whose message runs longer.
    """

    executor = "process"

    def __init__(
        self,
        load: Loader,
        *args: Any,
        handler_timeout: float | None = None,
        start_child: Callable[[Loader, int], _Child] = _Child,
        **kwargs: Any,
    ) -> None:
        super().__init__(_never_called, *args, **kwargs)
        self._load = load
        self.handler_timeout = handler_timeout or None
        self._new_child = start_child
        """Starts one worker process (the pod simulation passes one whose process is simulated)."""

    # -- life cycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker processes together, wait until each loaded the handler and ran its set-up,
        then the workers. Raises ``HandlerSetupError`` (nothing left running) if any could not."""
        workers = [self._new_worker() for _ in range(self._target)]
        children: list[_Child] = []
        try:
            for worker in workers:
                children.append(self._new_child(self._load, worker.id))
            for index, (worker, child) in enumerate(zip(workers, children, strict=True)):
                try:  # they load side by side: waiting for each in turn takes the slowest's time
                    child.await_ready(START_TIMEOUT)
                except DiedWhileLoading as error:
                    child.discard()
                    log.warning("worker %d: %s; starting another", worker.id, error)
                    children[index] = self._start_child(worker, attempts=REPLACEMENT_ATTEMPTS - 1)
        except BaseException:
            for child in children:
                child.discard()
            raise
        log.info("started %d worker processes: %s", len(children), ", ".join(str(child.pid) for child in children))
        for worker, child in zip(workers, children, strict=True):
            worker.child = child
            self._start_thread(worker)

    def worker_pids(self) -> list[int]:
        with self._lock:
            children = [worker.child for worker in self._workers.values() if isinstance(worker, _ProcessWorker)]
        return [child.pid for child in children if child is not None and child.alive]

    def _new_worker(self) -> _ProcessWorker:
        return _ProcessWorker(next(self._ids))

    def _run(self, worker: _Worker) -> None:
        assert isinstance(worker, _ProcessWorker)
        try:
            if worker.child is None:  # grown by a resize: start its process on this thread
                worker.child = self._start_child(worker)
            self._loop(worker)
        except BaseException as error:
            self._crashed(worker, error)
        finally:
            with self._lock:
                self._exit(worker)
            worker.closing = True
            if worker.child is not None:
                worker.child.close()

    def _start_child(self, worker: _ProcessWorker, attempts: int = REPLACEMENT_ATTEMPTS) -> _Child:
        """A worker process for ``worker``, loaded and set up. One that dies while it loads (killed: the kernel's OOM
        killer, a node under pressure) is started again, up to ``attempts`` starts in a row, as a death in a call
        is; raises ``HandlerSetupError`` (nothing left running) for the handler's own error, or every start dead."""
        for attempt in range(1, attempts + 1):
            child = self._new_child(self._load, worker.id)
            try:
                child.await_ready(START_TIMEOUT)
            except DiedWhileLoading as error:
                child.discard()
                if attempt == attempts or self.stopping:
                    raise
                log.warning("worker %d: %s; starting another (%d of %d)", worker.id, error, attempt + 1, attempts)
                continue
            except BaseException:
                child.discard()
                raise
            return child
        raise AssertionError("unreachable: attempts >= 1")

    def stop(self, timeout: float) -> None:
        """As the thread pool: running messages may finish within ``timeout`` (a batch stops after its
        running message), every process then runs its tear-down hook; a process still inside the
        handler after ``timeout`` is killed, and its message is re-delivered after the restart."""
        deadline = self.clock() + timeout
        with self._condition:
            self.stopping = True
            workers = [worker for worker in self._workers.values() if isinstance(worker, _ProcessWorker)]
            self._condition.notify_all()
        for worker in workers:
            if worker.child is not None:
                worker.child.request_stop()
        for worker in workers:
            assert worker.thread is not None
            worker.thread.join(max(deadline - self.clock(), 0.0))
        for worker in workers:
            assert worker.thread is not None
            if worker.thread.is_alive() and not worker.closing and worker.child is not None:
                log.warning(
                    "worker process %d still inside the handler after the shutdown grace period; killing it",
                    worker.child.pid,
                )
                worker.child.kill()
        for worker in workers:  # tearing down (bounded by TEARDOWN_TIMEOUT), or just killed
            assert worker.thread is not None
            worker.thread.join(TEARDOWN_TIMEOUT + 1)
        self._abandon_queued()

    # -- a worker's turn -------------------------------------------------------------------------------
    def _take_limit(self, worker: _Worker, ready: int) -> int:
        """One lane per round trip, unless the handler is fast and ready lanes outnumber the workers (a
        batch handler: up to its most messages, in one call)."""
        if self.batch.enabled:
            return self.batch.max_messages
        if worker.handler_seconds_ewma > FAST_PROCESS_HANDLER_SECONDS:
            return 1
        return max(1, min(MAX_BATCH, ready // max(self._target, 1)))

    def _run_taken(self, worker: _Worker, deliveries: list[Delivery]) -> list[Settlement]:
        assert isinstance(worker, _ProcessWorker)
        outcomes, batch = self._split_for_call(worker, deliveries)  # only a pending dead-letter write is retried
        if batch:
            outcomes = self._settle_now(outcomes) + self._run_in_process(worker, batch)
        return outcomes

    def _sent_unfilled(self, taken: list[Delivery]) -> str | None:
        """A head whose last call died or timed out with others runs in a call of its own (``_run_batch``): a batch
        holding one is sent at once, not after a fill wait that would only take heads to put back (a review)."""
        if any(delivery.run_alone for delivery in taken):
            return "nothing_more_ready"
        return super()._sent_unfilled(taken)

    def _run_batch(self, worker: _Worker, taken: list[Delivery], reason: str, fill_seconds: float) -> list[Settlement]:
        """A batch handler's call, in the worker process: the same frame as a batch of single calls, with
        ``as_batch`` set, so the process calls the handler once (``process_child.run_batch_call``)."""
        assert isinstance(worker, _ProcessWorker)
        outcomes, batch = self._split_for_call(worker, taken)
        if not batch:
            return outcomes
        alone = next((delivery for delivery in batch if delivery.run_alone), None)
        if alone is None:
            self._settle_now(outcomes)
            return self._run_in_process(worker, batch, (reason, fill_seconds))
        # A message whose last call died or timed out (with others in it, or alone) runs in a call of its
        # own: one such call per turn. The rest go back now, due at once and their attempts unchanged, for
        # any worker's next turn, which checks revokes, shutdown and retirement again (a call may take up to
        # the handler timeout, and a dead process's replacement must not start after shutdown began).
        now = self.clock()
        outcomes += [self._back_now(delivery, now) for delivery in batch if delivery is not alone]
        self._settle_now(outcomes)
        return self._run_in_process(worker, [alone], ("nothing_more_ready", 0.0))  # a call of one, sent unfilled

    def _back_now(self, delivery: Delivery, now: float) -> _Outcome:
        """``delivery`` goes back to its lane unrun, due ``now``; a blocked head stays blocked (a lane's
        ``blocked`` is its head's state: it failed its last allowed attempt and is retried every max backoff)."""
        blocked = delivery.attempts >= self.retry.max_attempts and self.retry.exhausted is ExhaustedPolicy.BLOCK
        return _Outcome(PARKED, delivery, now, blocked)

    def _run_in_process(
        self, worker: _ProcessWorker, batch: list[Delivery], batch_call: tuple[str, float] | None = None
    ) -> list[Settlement]:
        """Run ``batch`` in the worker's process, one call of a batch handler (counted with ``batch_call``: why it
        was sent and its fill seconds) or each message in turn; the outcomes. A process that died in the call (or
        before it, idle) is replaced before this returns, its outcomes settled first (``_replace_dead``)."""
        child = worker.child
        assert child is not None and child.alive, "a dead worker process is replaced as soon as its death is known"
        for delivery in batch:
            delivery.attempts += 1
        stats = worker.stats
        stats.busy = True
        fields = [message_fields(delivery.message) for delivery in batch]
        results = child.run(fields, self.handler_timeout, as_batch=self.batch.enabled)
        stats.busy = False
        if batch_call is not None and (
            any(result is not None for result in results)  # None: not started, the pool stops
            if not isinstance(results, str)
            else any(child.slot(index)[0] != NOT_STARTED for index in range(len(batch)))
        ):  # a call the process began (one it died before is taken and counted again)
            self._count_batch(worker, len(batch), *batch_call)
        if isinstance(results, str):
            outcomes = self._interrupted(worker, child, batch, results)
            if self.stopping or worker.retiring:
                return outcomes
            # Replaced now, holding no heads: the call's outcomes are settled first, so that no revoke or shutdown
            # waits for the new process to load the handler and run its set-up hook (a review found heads taken
            # for a call before the replacement started running after a revoke that came meanwhile).
            self._settle_now(outcomes)
            self._replace_dead(worker)
            return []
        for delivery in batch:  # an answer, not a death or a timeout: its next call may hold others
            delivery.run_alone = False
        if self.batch.enabled and all(type(result) is float for result in results):  # one call, all succeeded
            return [self._batch_succeeded(worker, batch, results[0], self.clock())]  # each its equal share
        settled: list[Settlement] = []
        failed: list[tuple[Delivery, BaseException]] = []
        for delivery, result in zip(batch, results, strict=True):
            if not isinstance(result, tuple):
                settled.append(self._settle(worker, delivery, result))
                continue
            _seconds, name, text = result  # it failed: retried, or dead-lettered below, after the others settle
            self._fail(worker, delivery, remote_error(name, text), settled, failed)
        return self._dead_letter_each(worker, failed, settled)

    def _fail(
        self,
        worker: _Worker,
        delivery: Delivery,
        error: BaseException,
        settled: list[Settlement],
        failed: list[tuple[Delivery, BaseException]],
    ) -> None:
        """The attempt failed: its outcome (its lane parked for a retry, or handed back) goes to ``settled``; a
        message to dead-letter goes to ``failed``, written after the others settle (``_dead_letter_each``)."""
        outcome = self._failed(worker, delivery, error)
        if outcome is None:
            failed.append((delivery, error))
        else:
            settled.append(outcome)

    def _settle(self, worker: _Worker, delivery: Delivery, result: float | None) -> _Outcome:
        """A message the process did not start (``None``: the pool is stopping) or ran in ``result`` seconds."""
        if result is None:
            delivery.attempts -= 1
            return _Outcome(HANDED_BACK, delivery)
        return self._succeeded_in(worker, delivery, result, self.clock())

    def _interrupted(self, worker: _Worker, child: _Child, batch: list[Delivery], reason: str) -> list[Settlement]:
        """The process died or was killed mid-batch: settle each message by what the progress block says.

        During shutdown the pool killed it (still inside the handler after the grace period): its
        unfinished messages go back unprocessed, re-delivered after the restart, as with threads."""
        stats = worker.stats
        if not self.stopping:
            stats.process_restarts[reason] += 1
        returncode = child.process.returncode
        statuses = [child.slot(index) for index in range(len(batch))]
        running = sum(status == RUNNING for status, _seconds in statuses)
        # A batch handler's call of several messages: any of them may be the cause (one that segfaults the
        # handler, exhausts its memory or hangs it), so none is charged; each runs next in a call of its own.
        shared = self.batch.enabled and running > 1 and not self.stopping
        if shared:
            log.error(
                "worker process %d %s during a batch handler's call of %d messages; it is replaced and each of "
                "them is retried at once in a call of its own (no attempt counted): only one that fails alone "
                "counts an attempt",
                child.pid, "was killed (handler timeout)" if reason == "timeout" else _exit_reason(returncode),
                running,
            )  # fmt: skip
        if not self.stopping and not running:
            log.warning(
                "worker process %d %s between messages (%d of a batch of %d not started); it is replaced "
                "and those run again",
                child.pid, _exit_reason(returncode),
                sum(status == NOT_STARTED for status, _seconds in statuses), len(batch),
            )  # fmt: skip
        outcomes: list[Settlement] = []
        failed: list[tuple[Delivery, BaseException]] = []  # to dead-letter, after the others settle
        for delivery, (status, seconds) in zip(batch, statuses, strict=True):
            if status in (SUCCEEDED, FAILED):
                delivery.run_alone = False
            if status == SUCCEEDED:
                outcomes.append(self._succeeded_in(worker, delivery, seconds, self.clock()))
            elif status == FAILED:  # its error text was in the lost reply
                error: BaseException = RuntimeError("the handler raised (details lost: its worker process died later)")
                self._fail(worker, delivery, error, outcomes, failed)
            elif status == RUNNING and shared:
                stats.interrupted[reason] += 1
                delivery.attempts -= 1
                delivery.run_alone = True  # _run_batch sends it by itself
                outcomes.append(self._back_now(delivery, self.clock()))
            elif status == RUNNING and not self.stopping:
                stats.interrupted[reason] += 1
                # it killed or hung its process alone (or as the only one running): its retries stay alone, or
                # each would kill a whole call again and send its other messages to run alone
                delivery.run_alone = self.batch.enabled
                message = delivery.message
                if reason == "timeout":
                    error = HandlerTimedOut(
                        f"still running after {self.handler_timeout:g}s: worker process {child.pid} was killed"
                    )
                else:
                    error = WorkerProcessDied(f"worker process {child.pid} {_exit_reason(returncode)}")
                log.error(
                    "worker process %d %s while handling %s[%d]@%d; it is replaced and the message retried "
                    "under the retry policy",
                    child.pid, "was killed (handler timeout)" if reason == "timeout" else _exit_reason(returncode),
                    message.topic, message.partition, message.offset,
                )  # fmt: skip
                self._fail(worker, delivery, error, outcomes, failed)
            else:  # never started: runs again as if never taken (its attempt does not count)
                delivery.attempts -= 1
                outcomes.append(
                    _Outcome(HANDED_BACK, delivery) if self.stopping else self._back_now(delivery, self.clock())
                )
        return self._dead_letter_each(worker, failed, outcomes)

    def _replace_dead(self, worker: _ProcessWorker) -> None:
        """Start a replacement for the worker's process, which died (in a call, or idle and found dead by the next
        one). One that cannot start (``_start_child``) stops the pod (``HandlerSetupError``): the worker retires,
        and the messages are re-delivered after the restart."""
        old = worker.child
        if old is not None:
            old.close(timeout=0)
        try:
            worker.child = self._start_child(worker)
        except HandlerSetupError as error:
            self._crashed(worker, error)
            worker.retiring = True
            return
        log.info("worker %d: replacement worker process %d started", worker.id, worker.child.pid)


def _never_called(_message: Any) -> None:
    raise AssertionError("the process executor runs the handler in its worker processes")
