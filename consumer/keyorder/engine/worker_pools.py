"""The key workers: W workers that run the user's handler on whichever lane is ready.

Both pools share one ``LaneScheduler`` (``core.lanes``) per pod, guarded by one lock, and one
failure-handling core (``_Execution``):

* ``ThreadWorkerPool`` for plain handlers: one OS thread per worker, idle ones wait on a condition.
* ``AsyncWorkerPool`` for ``async def`` handlers: one asyncio task per worker, all on one event
  loop thread, so thousands of workers cost little for IO-bound work.
* ``process_pool.ProcessWorkerPool`` (a ``ThreadWorkerPool`` whose workers each drive one
  worker process) for CPU-bound handlers.

The handler's optional set-up and tear-down hooks (``Lifecycle``) run once per pool: before the
first message and after the last one (the asyncio pool runs them on its event loop, so an
``async def`` set-up can open a connection pool bound to the loop the handler runs on).

A worker loops: under the lock, settle the outcomes of its previous deliveries (finished, or
their lane parked for a retry) and take the head of the next ready lane; outside the lock, run
the handler. One lock acquisition per turn; a thread worker takes a few lanes per turn when the
handler is fast and ready lanes outnumber the workers (``_take_limit``), each lane still one
message at a time; it settles a parked lane at once, and everything so far once a revoke came, so
neither a retry's due time nor a revoke waits for the rest of the batch (``_run_taken``). An idle
worker waits until woken or until the earliest parked lane is due; a turn that parks a lane and
does not wait itself (it runs another lane, or retires) wakes one idle worker to recompute that
wait. Lanes are never bound to workers, so a resize only starts or
retires workers (a retiring worker finishes its current message first) and takes effect on the
next message.

With a batch handler (``--batch-max-messages`` above 1, ``keyorder.batch``) a turn takes up to that many
heads of distinct ready lanes, a worker may wait up to ``--batch-max-wait-ms`` for more lanes to become
ready (``_fill``: it counts as idle meanwhile, so ``submit`` wakes it; a revoke, a shutdown or a shrink
ends the wait), and the handler is called once with their messages (``_run_batch``). Heads that do not go
into the call (let go, or only a dead-letter write to retry) are settled before it. Each message's outcome
is then settled on its own lane, exactly as a per-message outcome: a failed one parks its lane alone.

A lane never moves past a head handed back unprocessed: the partition's commit stays below that
head, so its next owner runs it again, and must not find later messages of its key marked done.
A head is handed back only when its partition was let go (the revoke takes the rest) or the pool
stops (no worker takes a lane again). A worker process that died is replaced after its call's
messages went back to their lanes (``ProcessWorkerPool._replace_dead``), so a replacement that
cannot start hands back nothing: the pod exits, and the other workers may run those lanes meanwhile.

Threading contract: the poll-loop thread calls ``submit``/``withdraw``/``resize``/``stop``; the
scheduler is touched only under ``_lock``; each worker writes only its own ``WorkerStats`` (metrics
read them under the lock). Finished deliveries are handed back to the poll loop through the
shared ``Completions`` deque (``append`` and ``popleft`` are atomic), which wakes a poll loop
that waits for them.

Why one room of over 600 lines: the thread and asyncio pools are two loops over one core, ``_PoolBase``
(the lock, the one ``LaneScheduler``, settling outcomes, retries, parking, dead letters, resize and
revoke), which ``process_pool`` extends too; the invariants above (a lane never moves past a head
handed back; the scheduler touched only under ``_lock``) hold across all three, and are read here in one
place. The pieces that stand alone, ``WorkerStats``, ``LatencyHistogram``, ``PoolHealth`` and
``Lifecycle``, are the seam for a later split; it waits for the batch handlers of issue 40, being added
here this session, and for the move into ``engine/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import operator
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from keyorder.batch import (
    BATCH_REASONS,
    PER_MESSAGE,
    BatchLimits,
    Outcomes,
    all_none,
    call_async_batch,
    call_sync_batch,
    is_unawaited,
)
from keyorder.contracts import DeadLetterSink
from keyorder.core.errors import error_text
from keyorder.core.lanes import Delivery, LaneScheduler, LaneSummary
from keyorder.core.retry import RetryPolicy, Verdict
from keyorder.core.stop_overruns import ASYNC_LOOP_STOP_SECONDS

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
"""Histogram bucket bounds (seconds) for handler duration and end-to-end processing latency."""
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000)
"""Histogram bucket bounds (messages) for the size of a batch handler's calls."""
BATCH_FILL_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Histogram bucket bounds (seconds) for the time a batch took to fill (its first head taken to its call)."""


class Completions(deque[tuple["Delivery", bool]]):
    """Finished deliveries on their way from the workers to the poll loop, and the loop's wake-up.

    Workers append ``(Delivery, handled)`` (``handled=False``: handed back unprocessed) and then
    ``signal``; the poll loop pops them. When the loop has nothing to read (every partition paused
    by flow control) it ``wait``s here for the completions that could lift a pause, rather than
    inside the Kafka client for a fixed timeout: the workers must not idle while the loop sleeps.
    """

    def __init__(self, threads: Threads = threading) -> None:
        super().__init__()
        self._wanted = 0  # completions the waiting loop asked for; 0 while it does not wait
        self._arrived = threads.Event()

    def signal(self) -> None:
        """After appending: wake the poll loop if it waits for this many."""
        wanted = self._wanted
        if wanted and len(self) >= wanted:
            self._arrived.set()

    def wait(self, at_least: int, timeout: float) -> bool:
        """Block until ``at_least`` completions are queued or ``timeout`` seconds passed; True if they are."""
        if len(self) >= at_least:
            return True
        self._arrived.clear()
        self._wanted = max(at_least, 1)
        # a worker appending after this check reads _wanted after its append, so it signals
        if len(self) < at_least:
            self._arrived.wait(timeout)
        self._wanted = 0
        return len(self) >= at_least


class Threads(Protocol):
    """Where a pool gets its threads, locks and conditions: the ``threading`` module itself, or the
    pod simulation's deterministic scheduler (``tests/simulation``), which runs one thread at a time
    on a virtual clock so that a seed decides every interleaving."""

    # read-only, so that a module (``threading``), whose attributes are classes, matches
    @property
    def Thread(self) -> Callable[..., threading.Thread]: ...
    @property
    def Lock(self) -> Callable[[], Any]: ...
    @property
    def Condition(self) -> Callable[..., threading.Condition]: ...
    @property
    def Event(self) -> Callable[[], threading.Event]: ...


class WorkerCrashed(RuntimeError):
    """A worker loop died from an unexpected error: the pod must exit rather than stall its keys."""


class HandlerSetupError(WorkerCrashed):
    """The handler's set-up hook failed (or a worker process could not start): the pod cannot run it."""

    def __init__(self, text: str, bad_input: bool = False) -> None:
        super().__init__(text)
        self.bad_input = bad_input
        """The handler or a hook path was wrong (a worker process imported it): exit 2, like the pod's own check."""


@dataclass(frozen=True)
class Lifecycle:
    """The handler's optional per-pod hooks, each a callable without arguments, plain or ``async def``."""

    setup: Callable[[], Any] | None = None
    """Runs once before the first message (in each worker process, for the process executor)."""
    teardown: Callable[[], Any] | None = None
    """Runs once after the last message, on shutdown (not when the set-up itself failed)."""


NO_HOOKS = Lifecycle()


def run_sync_hook(hook: Callable[[], Any] | None) -> None:
    """Call a hook outside an event loop; an ``async def`` one here is a configuration mistake."""
    if hook is None:
        return
    if is_unawaited(hook()):
        raise TypeError(
            f"the hook {getattr(hook, '__qualname__', hook)!r} is async, but the handler is a plain function: "
            "its resources would belong to no running event loop; make the hook a plain function"
        )


async def run_async_hook(hook: Callable[[], Any] | None) -> None:
    """Call a hook on the running event loop, awaiting it when it is ``async def``."""
    if hook is None:
        return
    result = hook()
    if inspect.isawaitable(result):
        await result


MIN_WAIT_SECONDS = 1e-6
"""The shortest wait for a parked lane's due time (a rounding error must not make a wait of nothing)."""


class PoolHealth:
    """Shared between a pool's workers and the poll loop: set once, read every poll."""

    __slots__ = ("crashed",)

    def __init__(self) -> None:
        self.crashed: str | None = None


def call_sync_handler(handler: Callable[[Any], Any], message: Any) -> None:
    """Call a plain handler; a handler that returns a coroutine was meant to be ``async def``."""
    result = handler(message)
    if result is not None and is_unawaited(result):  # per message: the usual None costs no call
        raise TypeError(
            "the handler returned an awaitable without awaiting it: declare it 'async def' "
            "so keyorder runs it on asyncio workers"
        )


def is_async_callable(function: Callable[..., Any]) -> bool:
    """True for ``async def`` functions and objects whose ``__call__`` is ``async def``."""
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - we want the attribute, not callable()
    return call is not None and inspect.iscoroutinefunction(call)


class LatencyHistogram:
    """A single-writer histogram: plain integer buckets, no lock on the hot path.

    prometheus_client's Histogram takes a lock per observation; with W workers writing their own
    instance and the collector summing at scrape time, the hot path stays lock-free. ``bounds`` are
    the buckets' upper bounds (``LATENCY_BUCKETS`` unless given; one more bucket holds the rest).
    """

    __slots__ = ("bounds", "buckets", "count", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.buckets[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def observe_many(self, value: float, times: int) -> None:
        """``observe(value)`` ``times`` times (a batch's messages, each charged the same share of its call)."""
        self.buckets[bisect_left(self.bounds, value)] += times
        self.count += times
        self.total += value * times

    def absorb(self, other: LatencyHistogram) -> None:
        """Add another histogram's counts (same bounds)."""
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]
        self.count += other.count
        self.total += other.total


class WorkerStats:
    """Counters of one worker, written only by that worker (read under the pool's lock)."""

    __slots__ = (
        "batch_fill",
        "batch_sizes",
        "batches",
        "busy",
        "dead_lettered",
        "failed",
        "handler_seconds",
        "interrupted",
        "latency",
        "process_restarts",
        "processed",
        "retried",
    )

    def __init__(self) -> None:
        self.processed = 0
        """Messages handled successfully."""
        self.failed = 0
        """Messages whose handler attempt failed (each of a batch call that raised, or whose outcome is an error)."""
        self.retried = 0
        """Failures that scheduled a retry."""
        self.dead_lettered = 0
        """Messages published to the DLQ."""
        self.busy = False
        """True while the handler runs."""
        self.process_restarts = {"crashed": 0, "timeout": 0}
        """Worker processes replaced, by reason (the process executor only)."""
        self.interrupted = {"crashed": 0, "timeout": 0}
        """Messages whose attempt a dying or killed worker process cut short (each one then retried)."""
        self.handler_seconds = LatencyHistogram()
        """Seconds inside the handler per successful message. A batch call's seconds are split evenly over
        its messages, so the count stays messages and the total stays busy seconds: a worker's rate
        (messages per busy second, what the operator learns) reads the same for both kinds of handler."""
        self.latency = LatencyHistogram()
        self.batch_sizes = LatencyHistogram(BATCH_SIZE_BUCKETS)
        """Messages per batch handler call (batch handlers only)."""
        self.batch_fill = LatencyHistogram(BATCH_FILL_BUCKETS)
        """Seconds from a batch's first head taken to its call (batch handlers only)."""
        self.batches = dict.fromkeys(BATCH_REASONS, 0)
        """Batch handler calls by why the batch was sent (``batch.BATCH_REASONS``)."""

    def absorb(self, other: WorkerStats) -> None:
        """Add a retired worker's totals, so pod counters never go backwards after a shrink."""
        self.processed += other.processed
        self.failed += other.failed
        self.retried += other.retried
        self.dead_lettered += other.dead_lettered
        for reason, count in other.process_restarts.items():
            self.process_restarts[reason] += count
        for reason, count in other.interrupted.items():
            self.interrupted[reason] += count
        for reason, count in other.batches.items():
            self.batches[reason] += count
        self.handler_seconds.absorb(other.handler_seconds)
        self.latency.absorb(other.latency)
        self.batch_sizes.absorb(other.batch_sizes)
        self.batch_fill.absorb(other.batch_fill)


class WorkerPool(Protocol):
    """What the poll loop needs from a pool of key workers."""

    health: PoolHealth
    executor: ClassVar[str]

    @property
    def size(self) -> int: ...
    def start(self) -> None: ...
    def submit(self, deliveries: list[Delivery]) -> None: ...
    def withdraw(self, should_withdraw: Callable[[Delivery], bool]) -> list[Delivery]: ...
    def resize(self, workers: int) -> None: ...
    def begin_shutdown(self) -> None: ...
    def stop(self, timeout: float) -> None: ...
    def stats(self) -> list[WorkerStats]: ...
    def lane_summary(self) -> LaneSummary: ...
    def worker_pids(self) -> list[int]: ...


FINISHED, HANDED_BACK, PARKED = "finished", "handed back", "parked"


class _Outcome:
    """What happened to a delivery outside the lock; settled under it by the worker's next turn."""

    __slots__ = ("blocked", "delivery", "due", "kind")

    def __init__(self, kind: str, delivery: Delivery, due: float = 0.0, blocked: bool = False) -> None:
        self.kind, self.delivery, self.due, self.blocked = kind, delivery, due, blocked


class _BatchFinished:
    """Every message of a batch call succeeded: settled in one step (``_settle_outcomes``), not one ``_Outcome``
    each, so that a batch of N costs its worker N list items, not N objects and N scheduler calls."""

    __slots__ = ("deliveries",)

    def __init__(self, deliveries: list[Delivery]) -> None:
        self.deliveries = deliveries


Settlement = _Outcome | _BatchFinished
"""What a worker's turn settles under the lock: one delivery's outcome, or a whole batch that succeeded."""


class _Worker:
    __slots__ = ("handler_seconds_ewma", "id", "retiring", "stats", "task", "thread", "withdrawals")

    def __init__(self, worker_id: int) -> None:
        self.id = worker_id
        self.stats = WorkerStats()
        self.handler_seconds_ewma = 1.0
        """Recent handler time (each call weighs 1/8); starts slow, so nothing is batched unmeasured."""
        self.retiring = False
        """Set by a shrink (or stop): the worker exits before taking its next delivery."""
        self.thread: threading.Thread | None = None
        self.task: asyncio.Task[None] | None = None
        self.withdrawals = 0
        """The pool's ``withdraw`` count when this worker's turn took its deliveries, read under the lock of
        that turn: a revoke after it, even before the worker looks, ends its fill (``_fill_step``) and
        settles its turn's outcomes early (``_run_taken``)."""


class _PoolBase:
    """The scheduler, its lock, the workers and the failure handling shared by all pools."""

    executor: ClassVar[str] = ""
    """The executor's name (``--executor``), exported as ``keyorder_pod_executor``."""

    def __init__(
        self,
        handler: Callable[[Any], Any],
        workers: int,
        retry: RetryPolicy,
        dead_letters: DeadLetterSink | None,
        completions: Completions,
        clock: Callable[[], float] = time.monotonic,
        lifecycle: Lifecycle = NO_HOOKS,
        threads: Threads = threading,
        batch: BatchLimits = PER_MESSAGE,
    ) -> None:
        self._handler = handler
        self.batch = batch
        """With ``batch.enabled`` the handler is a batch handler (``keyorder.batch``): each worker turn takes
        up to ``batch.max_messages`` heads of distinct ready lanes, waits up to ``batch.max_wait`` for more
        (``_fill_step``), and calls the handler once with their messages."""
        self._threads = threads
        self.lifecycle = lifecycle
        self.retry = retry
        self.dead_letters = dead_letters
        self.completions = completions
        self.clock = clock
        self.health = PoolHealth()
        self._scheduler = LaneScheduler()
        self._inbox: deque[list[Delivery]] = deque()
        """Batches from the poll loop not yet in the scheduler. ``submit`` only appends, without the
        lock (``deque.append`` is atomic), so the poll thread never waits for a worker's turn; workers
        fold them in under the lock on their next turn."""
        self._lock = threads.Lock()
        self._workers: dict[int, _Worker] = {}
        self._ids = itertools.count()
        self._retired = WorkerStats()
        self._target = workers
        self.stopping = False
        self.shutting_down = False
        """The pod's shutdown began (``begin_shutdown``): no batch waits to fill any more."""
        self._withdrawals = 0
        """Calls of ``withdraw`` (revokes), so a worker running a batch sees one came since its turn
        (``_Worker.withdrawals``; ``_run_taken``, ``_fill_step``)."""

    # -- the poll loop's side --------------------------------------------------------------------
    @property
    def size(self) -> int:
        """The target worker count (retiring workers excluded)."""
        return self._target

    def withdraw(self, should_withdraw: Callable[[Delivery], bool]) -> list[Delivery]:
        """Remove the matching deliveries that are not running (revoke); the caller accounts for them."""
        with self._lock:
            self._withdrawals += 1
            self._fold_inbox()
            withdrawn = self._scheduler.withdraw(should_withdraw)
        if self.batch.max_wait > 0 and not self.stopping:
            self._wake_all()  # a worker filling a batch sends it now: the revoke waits for the heads it holds
        elif withdrawn:
            self._wake(len(withdrawn))  # a parked lane whose head left may have become ready
        return withdrawn

    def begin_shutdown(self) -> None:
        """The pod began its shutdown: its grace is for what can still finish, so from now on a batch goes with
        the heads that are ready (``_sent_unfilled``, ``_fill_step``), and a worker filling one sends it now. A
        retry that falls due within the grace, which the shutdown waits for, runs when it is due, not a fill
        wait later (simulation seed 53737: the wait outlasted the grace, and the retry never ran)."""
        self.shutting_down = True
        if self.batch.max_wait > 0:
            self._wake_all()

    def stats(self) -> list[WorkerStats]:
        """The retired workers' totals (a copy: a worker that exits while a scrape sums this list folds its totals
        into ``_retired``, and the original would count it twice) and each live worker's."""
        with self._lock:
            retired = WorkerStats()
            retired.absorb(self._retired)
            return [retired, *(worker.stats for worker in self._workers.values())]

    def lane_summary(self) -> LaneSummary:
        with self._lock:
            self._fold_inbox()
            return self._scheduler.summary()

    def worker_pids(self) -> list[int]:
        """Process ids of the live worker processes (none: the handler runs in this process)."""
        return []

    def resize(self, workers: int) -> None:
        with self._lock:
            self._target = workers
            active = [worker for worker in self._workers.values() if not worker.retiring]
            for worker in active[workers:]:  # the newest retire after their current message
                worker.retiring = True
            missing = workers - min(len(active), workers)
        for _ in range(missing):
            self._spawn()
        self._wake_all()

    def _spawn(self) -> None:
        raise NotImplementedError

    def _wake(self, lanes: int) -> None:
        raise NotImplementedError

    def _wake_all(self) -> None:
        raise NotImplementedError

    def _wake_others(self, lanes: int) -> None:
        """Caller holds ``_lock`` on a worker's turn: wake up to ``lanes`` idle workers (for ready
        lanes, or one to recompute its wait for a lane parked meanwhile)."""
        raise NotImplementedError

    def _fold_inbox(self) -> None:
        """Caller holds ``_lock``: move submitted batches into the scheduler (the next worker turn
        wakes idle workers for the lanes that became ready)."""
        inbox = self._inbox
        while inbox:
            self._scheduler.add(inbox.popleft())

    # -- under the lock, on a worker's turn ------------------------------------------------------------
    def _turn(self, worker: _Worker, outcomes: list[Settlement]) -> list[Delivery] | float | None:
        """Settle ``outcomes``; then the next deliveries (heads of distinct ready lanes), or seconds to
        wait (``None``: until woken), or ``EXIT``. Caller holds ``_lock``.

        Idle workers wait for the earliest due time they saw on their own turn. A lane parked here
        may be due sooner (or be the only one parked while they wait for nothing): unless this worker
        goes on to wait itself, it wakes one idle worker to recompute its wait. Idle workers count
        themselves under the lock of the turn that chose their wait, so this turn sees them."""
        scheduler = self._scheduler
        parked = self._settle_outcomes(outcomes)
        if self._inbox:
            self._fold_inbox()
        if worker.retiring or self.stopping:
            self._wake_others(scheduler.ready + parked)
            return EXIT
        now = self.clock()
        deliveries = scheduler.take(now, self._take_limit(worker, scheduler.ready))
        self._wake_others(self._takers_for(scheduler.ready))  # whoever folded the batches in, idle workers get the rest
        if deliveries:
            worker.withdrawals = self._withdrawals
            if parked:
                self._wake_others(1)  # this worker runs, so one idle worker watches the new due time
            return deliveries
        due = scheduler.seconds_until_due(now)
        # at least a microsecond: a due time a rounding error past now (0.01 + 0.05 against 0.06) is a wait of
        # 7e-18 s, which a virtual clock's timer fires without time moving: the async pool spun on it (a review)
        return due if due is None else max(due, MIN_WAIT_SECONDS)

    def _settle_outcomes(self, outcomes: list[Settlement]) -> bool:
        """Caller holds ``_lock``: finish or park each outcome's lane; True if one was parked."""
        scheduler = self._scheduler
        parked = False
        for outcome in outcomes:
            if type(outcome) is _BatchFinished:
                finished = outcome.deliveries
                scheduler.finished_all(finished)
                self.completions.extend(zip(finished, itertools.repeat(True)))
                continue
            assert type(outcome) is _Outcome
            delivery = outcome.delivery
            # A revoke withdraws what is parked and waits only for what runs: a delivery whose partition
            # was revoked while it ran (or whose log was truncated below it) goes back now, never parked.
            if outcome.kind is PARKED:
                if not delivery.let_go:
                    scheduler.park(delivery, outcome.due, outcome.blocked)
                    parked = True
                    continue
                message = delivery.message  # revoked after its retry was logged: say what happens instead
                log.info(
                    "%s[%d]@%d: its partition was revoked (or its log truncated below it) before its retry "
                    "was scheduled; handed back, not retried here", message.topic, message.partition, message.offset,
                )  # fmt: skip
            scheduler.finished(delivery)
            self.completions.append((delivery, outcome.kind is FINISHED))
        if outcomes:
            self.completions.signal()
        return parked

    def _take_limit(self, worker: _Worker, ready: int) -> int:
        """Lanes one worker takes per turn (the async pool: one, or a batch handler's most)."""
        return self.batch.max_messages

    def _takers_for(self, ready: int) -> int:
        """Idle workers to wake for ``ready`` lanes: one each, or for a batch handler one per full batch of them.
        Woken one per lane, every idle worker of a batch handler took a few lanes each: many small calls, each
        paying the call's cost, and as many thread switches."""
        if not self.batch.enabled:
            return ready
        return -(-ready // self.batch.max_messages)

    def _sent_unfilled(self, taken: list[Delivery]) -> str | None:
        """Why a batch whose first heads were just taken goes without a fill wait (``BATCH_REASONS``): it is
        full, or no wait is set, or the pod's shutdown began (``begin_shutdown``); ``None``: fill it
        (``_fill_step``)."""
        if len(taken) >= self.batch.max_messages:
            return "full"
        if self.batch.max_wait <= 0 or self.shutting_down:
            return "nothing_more_ready"
        return None

    def _fill_step(self, worker: _Worker, taken: list[Delivery], deadline: float) -> str | float:
        """Caller holds ``_lock``: add the heads of lanes that became ready to a batch being filled; the
        reason to send it now (``keyorder.batch.BATCH_REASONS``), or seconds to wait for more lanes.

        The wait ends at ``deadline`` (``waited``), and at once when a revoke (``withdraw``) came since the
        turn that took the first heads (``_Worker.withdrawals``, read under that turn's lock), a head taken
        was let go, the pod's shutdown began, the pool stops, or the worker retires (``nothing_more_ready``):
        the heads it holds count as running, and a revoke does not wait for a fill (nor do the shutdown's grace
        and ``stop``). A parked lane that falls
        due within the wait ends it early, to be taken."""
        limit = self.batch.max_messages
        if (
            self.stopping
            or self.shutting_down
            or worker.retiring
            or self._withdrawals != worker.withdrawals
            or any(delivery.let_go for delivery in taken)
        ):
            return "nothing_more_ready"
        if self._inbox:
            self._fold_inbox()
        scheduler = self._scheduler
        now = self.clock()
        if len(taken) < limit:
            taken += scheduler.take(now, limit - len(taken))
            self._wake_others(self._takers_for(scheduler.ready))
        unfilled = self._sent_unfilled(taken)
        if unfilled is not None:
            return unfilled
        remaining = deadline - now
        if remaining <= 0:
            return "waited"
        due = scheduler.seconds_until_due(now)
        return remaining if due is None else min(remaining, max(due, MIN_WAIT_SECONDS))

    def _fill_ended(self, waited: bool) -> None:
        """Caller holds ``_lock``: a fill ended. A filler waits among the idle workers, so the wake-up a turn
        sends for one of them to watch a newly parked lane's due time (``_turn``) may have reached it, and it
        watched only until its own deadline: pass that watch on to an idle worker (or another filler, which
        passes it on in turn when its fill ends), or a retry could wait for the next submit while a worker
        idles."""
        if waited and self._scheduler.seconds_until_due(self.clock()) is not None:
            self._wake_others(1)

    def _runnable(self, taken: list[Delivery]) -> tuple[list[Settlement], list[Delivery], list[Delivery]]:
        """Split the heads taken for a batch: outcomes already known (handed back: the pool stops or the pod
        let the delivery go), deliveries whose dead-letter write is to be retried (the handler is not run
        again), and the batch for the handler.

        The common case, none of those, is told per partition (a few), not per message: a partition neither
        revoked nor ever truncated lets none of its messages go (``PartitionState.may_let_go``)."""
        if (
            not self.stopping
            and all_none(map(_PENDING_DEAD_LETTER, taken))
            and not any(partition.may_let_go for partition in set(map(_PARTITION, taken)))
        ):
            return [], [], taken
        known: list[Settlement] = []
        dead_letters: list[Delivery] = []
        batch: list[Delivery] = []
        for delivery in taken:
            if self.stopping:  # on shutdown, lanes taken but not started go back unprocessed
                known.append(_Outcome(HANDED_BACK, delivery))
                continue
            handed_back = self._handed_back_if_let_go(delivery)
            if handed_back is not None:
                known.append(handed_back)
            elif delivery.pending_dead_letter is not None:
                dead_letters.append(delivery)
            else:
                batch.append(delivery)
        return known, dead_letters, batch

    def _runnable_after_wait(
        self, outcomes: list[Settlement], batch: list[Delivery]
    ) -> tuple[list[Settlement], list[Delivery]]:
        """``_runnable`` again for a batch whose call waited for something slow (dead-letter writes, a round trip
        to the broker each; a replacement worker process's set-up): a revoke or the shutdown that came meanwhile
        lets its heads go, and a revoke waits only for the handlers running when it came, not for a call that
        starts after it (simulation seed 60457; a review found the replacement's case)."""
        known, _dead_letters, batch = self._runnable(batch)
        return outcomes + known, batch

    def _settle_now(self, outcomes: list[Settlement]) -> list[Settlement]:
        """Settle, before a batch's call, the outcomes of the heads that do not go into it (handed back, or
        dead-lettered): a revoke waits for its partitions' heads, not for other partitions' batch call.
        Returns what is left to settle (nothing)."""
        if outcomes:
            with self._lock:
                parked = self._settle_outcomes(outcomes)
                self._wake_others(self._takers_for(self._scheduler.ready) + parked)
        return []

    def _before_dead_letter(self, delivery: Delivery, settled: list[Settlement]) -> tuple[list[Settlement], bool]:
        """Before one of a call's dead-letter writes (a round trip to the broker each): what is known is settled
        first, for a revoke waits for its own partitions' messages and a shutdown's grace for every finished one,
        not for the writes of other messages of the same call (simulation seed 80443: a revoke waited out ten
        writes of the other partition; a review found a shutdown missing the call's successes); a failed message
        its partition let go meanwhile is handed back unwritten, as ``_failed`` does for one let go before the
        call ended (its new owner runs it again). Returns what is left to settle (nothing) and whether to write."""
        settled = self._settle_now(settled)
        if delivery.let_go:
            return self._settle_now([_Outcome(HANDED_BACK, delivery)]), False
        return settled, True

    def _before_pending_write(
        self, delivery: Delivery, settled: list[Settlement], batch: list[Delivery]
    ) -> tuple[list[Settlement], list[Delivery], bool]:
        """``_before_dead_letter`` for a dead-letter write retried before a call (a head whose last write failed),
        ``batch`` the heads waiting for the call behind these writes: those a revoke let go meanwhile go back at
        once too (a review found the revoked head written after the revoke, or kept waiting for another
        partition's write). Returns what is left to settle, the heads still waiting, and whether to write."""
        settled, batch = self._runnable_after_wait(settled, batch)
        settled, write = self._before_dead_letter(delivery, settled)
        return settled, batch, write

    def _count_batch(self, worker: _Worker, size: int, reason: str, fill_seconds: float) -> None:
        stats = worker.stats
        stats.batch_sizes.observe(size)
        stats.batch_fill.observe(fill_seconds)
        stats.batches[reason] += 1

    def _start_batch(self, worker: _Worker, batch: list[Delivery], reason: str, fill_seconds: float) -> float:
        """A batch call begins: count it, charge each message an attempt, mark the worker busy; its start."""
        self._count_batch(worker, len(batch), reason, fill_seconds)
        for delivery in batch:
            delivery.attempts += 1
        worker.stats.busy = True
        return self.clock()

    def _batch_outcomes(
        self, worker: _Worker, batch: list[Delivery], results: Outcomes, started: float
    ) -> tuple[list[Settlement], list[tuple[Delivery, BaseException]]]:
        """A batch call ended with ``results``: what to settle (the messages that succeeded as one
        ``_BatchFinished``, each failure's outcome), and the failed messages the caller must dead-letter, with
        their errors. The call's seconds are split evenly over its messages."""
        worker.stats.busy = False
        now = self.clock()
        share = (now - started) / len(batch)
        if all_none(results):  # the common case: all succeeded
            return [self._batch_succeeded(worker, batch, share, now)], []
        settled: list[Settlement] = []
        succeeded: list[Delivery] = []
        to_dead_letter: list[tuple[Delivery, BaseException]] = []
        for delivery, error in zip(batch, results, strict=True):
            if error is None:
                succeeded.append(delivery)
                continue
            outcome = self._failed(worker, delivery, error)
            if outcome is None:
                to_dead_letter.append((delivery, error))
            else:
                settled.append(outcome)
        if succeeded:
            settled.append(self._batch_succeeded(worker, succeeded, share, now))
        return settled, to_dead_letter

    def _batch_succeeded(self, worker: _Worker, deliveries: list[Delivery], share: float, now: float) -> _BatchFinished:
        """``_succeeded_in`` for each of a batch call's messages that succeeded, each charged ``share`` of the
        call, counted in one pass: the same counts, histograms and recent handler time."""
        stats = worker.stats
        size = len(deliveries)
        stats.processed += size
        stats.handler_seconds.observe_many(share, size)
        # ``size`` steps of the 1/8 average towards the same value, in one
        worker.handler_seconds_ewma = share + (worker.handler_seconds_ewma - share) * (7 / 8) ** size
        # a batch's messages arrived in a few poll batches, taken in arrival order: one bucket lookup per run of one
        # arrival time, not per message (``groupby``: a Counter cost about twice as much at a batch's size)
        for received_at, run in itertools.groupby(map(_RECEIVED_AT, deliveries)):
            stats.latency.observe_many(now - received_at, operator.countOf(run, received_at))
        return _BatchFinished(deliveries)

    def _exit(self, worker: _Worker) -> None:
        """Caller holds ``_lock``: fold the worker's totals in, so pod counters never go backwards."""
        if self._workers.pop(worker.id, None) is not None:
            self._retired.absorb(worker.stats)

    # -- outside the lock: what a delivery's run means ---------------------------------------------------
    def _handed_back_if_let_go(self, delivery: Delivery) -> _Outcome | None:
        """Never start work the pod let go (a partition being revoked: the new owner runs it; a truncated
        log: the new record at its offset runs): hand it back unprocessed."""
        return _Outcome(HANDED_BACK, delivery) if delivery.let_go else None

    def _succeeded(self, worker: _Worker, delivery: Delivery, started: float) -> _Outcome:
        now = self.clock()
        return self._succeeded_in(worker, delivery, now - started, now)

    def _succeeded_in(self, worker: _Worker, delivery: Delivery, handler_seconds: float, now: float) -> _Outcome:
        """The handler returned after ``handler_seconds`` (measured where it ran)."""
        stats = worker.stats
        stats.processed += 1
        stats.handler_seconds.observe(handler_seconds)
        worker.handler_seconds_ewma += (handler_seconds - worker.handler_seconds_ewma) / 8
        stats.latency.observe(now - delivery.received_at)
        return _Outcome(FINISHED, delivery)

    def _failed(self, worker: _Worker, delivery: Delivery, error: BaseException) -> _Outcome | None:
        """Record a handler failure; the lane's outcome, or ``None`` when the caller must dead-letter.

        A failure in a partition revoked meanwhile is handed back, neither retried nor dead-lettered: the
        new owner runs it again under its own retry policy, and the revoke waits for no backoff. (A
        revoke landing after this check is caught by ``_turn``, which never parks a revoked delivery.) So
        is a failure of a message whose log was truncated below it meanwhile: that record is gone from the
        partition, and retrying it would block its key (in this partition and any other) for nothing.

        The error's traceback is dropped here: nothing of keyorder reads it (logs and dead letters carry the type
        and text), and through its frames it led back to the frame that caught it, whose locals hold the error:
        a reference cycle that kept every failed message's delivery and message until the cyclic garbage
        collector ran (``keyorder.collector``)."""
        error.__traceback__ = None
        stats = worker.stats
        stats.failed += 1
        message = delivery.message
        if delivery.let_go:
            log.info(
                "handler failed on %s[%d]@%d after its partition was revoked (or its log truncated below it); "
                "handed back, not retried here: %s: %s",
                message.topic, message.partition, message.offset, type(error).__name__, error,
            )  # fmt: skip
            return _Outcome(HANDED_BACK, delivery)
        verdict, delay = self.retry.after_failure(delivery.attempts)
        if verdict is Verdict.DEAD_LETTER:
            return None
        blocked = verdict is Verdict.BLOCK
        if blocked:
            if delivery.attempts == self.retry.max_attempts:  # once, when the key becomes blocked
                log.error(
                    "handler failed on %s[%d]@%d %d times; its key is BLOCKED (retrying every %.0fs, "
                    "the partition's commit waits): %s: %s",
                    message.topic, message.partition, message.offset, delivery.attempts, delay,
                    type(error).__name__, error,
                )  # fmt: skip
        else:
            stats.retried += 1
            log.warning(
                "handler failed on %s[%d]@%d (attempt %d/%d), retrying its key in %.2fs: %s: %s",
                message.topic, message.partition, message.offset, delivery.attempts, self.retry.max_attempts,
                delay, type(error).__name__, error,
            )  # fmt: skip
        return _Outcome(PARKED, delivery, self.clock() + delay, blocked)

    def _dead_lettered(
        self, worker: _Worker, delivery: Delivery, error: BaseException, publish_error: Exception | None
    ) -> _Outcome:
        if publish_error is not None:
            message = delivery.message
            if delivery.let_go:  # revoked (or truncated) during the write: nothing to keep it for here
                log.error(
                    "could not dead-letter %s[%d]@%d, and its partition was revoked meanwhile: handed back, "
                    "its new owner runs it again: %s",
                    message.topic, message.partition, message.offset, publish_error,
                )  # fmt: skip
                return _Outcome(HANDED_BACK, delivery)
            log.error(
                "could not dead-letter %s[%d]@%d, keeping it in flight and retrying the DLQ write in %.0fs: %s",
                message.topic, message.partition, message.offset, self.retry.max_backoff, publish_error,
            )  # fmt: skip
            delivery.pending_dead_letter = error  # the handler is not run again, only the write
            return _Outcome(PARKED, delivery, self.clock() + self.retry.max_backoff)
        delivery.pending_dead_letter = None
        worker.stats.dead_lettered += 1
        return _Outcome(FINISHED, delivery)

    def _crashed(self, worker: _Worker, error: BaseException) -> None:
        text = error_text(error)
        log.critical(
            "key worker %d crashed; the pod stops: %s: %s", worker.id, type(error).__name__, text, exc_info=error
        )
        self.health.crashed = f"worker {worker.id}: {type(error).__name__}: {text}"

    def _abandon_queued(self) -> None:
        """After the workers stopped: hand back everything not running, so the poll loop can release it."""
        with self._lock:
            self._fold_inbox()
            for delivery in self._scheduler.drain():
                self.completions.append((delivery, False))
            self.completions.signal()


_PENDING_DEAD_LETTER = operator.attrgetter("pending_dead_letter")
_PARTITION = operator.attrgetter("partition")
_MESSAGE = operator.attrgetter("message")
_RECEIVED_AT = operator.attrgetter("received_at")

EXIT = -1.0
"""``_turn``'s answer to a retiring or stopping worker."""

MAX_LANES_PER_TURN = 64
"""Most lanes a thread worker takes in one lock round trip (only when ready lanes outnumber workers)."""
FAST_HANDLER_SECONDS = 0.0005
"""Below this recent handler time, a lock round trip per message is a real cost: batch the turns.
A batch then delays the lanes behind its first message by at most ``MAX_LANES_PER_TURN`` times this."""


class ThreadWorkerPool(_PoolBase):
    """Key workers as OS threads, for plain (synchronous) handlers."""

    executor = "thread"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._condition = self._threads.Condition(self._lock)
        self._idle = 0

    def start(self) -> None:
        """Run the set-up hook (on the calling thread), then start the workers."""
        try:
            run_sync_hook(self.lifecycle.setup)
        except Exception as error:
            raise HandlerSetupError(f"the handler's set-up hook failed: {type(error).__name__}: {error}") from error
        for _ in range(self._target):
            self._spawn()

    def _new_worker(self) -> _Worker:
        return _Worker(next(self._ids))

    def _spawn(self) -> None:
        self._start_thread(self._new_worker())

    def _start_thread(self, worker: _Worker) -> None:
        worker.thread = self._threads.Thread(target=self._run, args=(worker,), name=f"keyorder-worker-{worker.id}",
                                         daemon=True)  # fmt: skip
        with self._lock:
            self._workers[worker.id] = worker
        worker.thread.start()

    def submit(self, deliveries: list[Delivery]) -> None:
        self._inbox.append(deliveries)
        # A worker counts itself idle *before* it re-checks the inbox and sleeps (both under the lock),
        # so either it sees this batch or this read sees it idle: no wake-up is lost. When every worker
        # is busy, the poll thread does not touch the lock at all.
        if self._idle:
            with self._condition:
                self._condition.notify()  # it folds the batch in and wakes more if more lanes are ready

    def _wake_others(self, lanes: int) -> None:
        if lanes > 0 and self._idle:
            self._condition.notify(min(lanes, self._idle))

    def _wake(self, lanes: int) -> None:
        with self._condition:
            self._condition.notify(lanes)

    def _wake_all(self) -> None:
        with self._condition:
            self._condition.notify_all()

    def _run(self, worker: _Worker) -> None:
        try:
            self._loop(worker)
        except BaseException as error:  # a bug, not a handler failure (those are caught per message)
            self._crashed(worker, error)
        finally:
            with self._lock:
                self._exit(worker)

    def _take_limit(self, worker: _Worker, ready: int) -> int:
        """One lane per turn, unless the handler is fast and ready lanes outnumber the workers.

        Each turn costs a lock round trip, which matters next to a handler of a few microseconds.
        Then a worker takes a fair share of the ready lanes (at most ``MAX_LANES_PER_TURN``), each
        still one message at a time and in order; every other worker still finds a ready lane. With a
        slow handler a batch would make the lanes behind it wait, so it is never batched. A batch handler
        takes up to its most messages per call.
        """
        if self.batch.enabled:
            return self.batch.max_messages
        if worker.handler_seconds_ewma > FAST_HANDLER_SECONDS:
            return 1
        return max(1, min(MAX_LANES_PER_TURN, ready // max(self._target, 1)))

    def _loop(self, worker: _Worker) -> None:
        condition = self._condition
        outcomes: list[Settlement] = []
        while True:
            with condition:
                while True:
                    turn = self._turn(worker, outcomes)
                    outcomes = []
                    if isinstance(turn, list):
                        break
                    if turn is EXIT:
                        return
                    self._idle += 1
                    if not self._inbox:  # a batch appended after this turn's fold must not wait
                        condition.wait(turn)
                    self._idle -= 1
            if self.batch.enabled:
                reason, fill_seconds = self._fill(worker, turn)
                outcomes = self._run_batch(worker, turn, reason, fill_seconds)
            else:
                outcomes = self._run_taken(worker, turn)

    def _fill(self, worker: _Worker, taken: list[Delivery]) -> tuple[str, float]:
        """Complete a batch whose first heads were just taken (``_fill_step``); why it is sent, and the
        seconds it took to fill. A filling worker counts as idle, so ``submit`` wakes it for new lanes."""
        condition = self._condition
        unfilled = self._sent_unfilled(taken)
        if unfilled is not None:
            return unfilled, 0.0
        started = self.clock()
        deadline = started + self.batch.max_wait
        waited = False
        with condition:
            while True:
                step = self._fill_step(worker, taken, deadline)
                if isinstance(step, str):
                    self._fill_ended(waited)
                    return step, self.clock() - started
                self._idle += 1
                if not self._inbox:
                    condition.wait(step)
                    waited = True
                self._idle -= 1

    def _run_batch(self, worker: _Worker, taken: list[Delivery], reason: str, fill_seconds: float) -> list[Settlement]:
        """Call the batch handler once for the heads taken (distinct lanes); the outcomes, settled on the
        next turn. Failed messages go through the retry policy one by one, each on its own lane."""
        outcomes, batch = self._split_for_call(worker, taken)
        if not batch:
            return outcomes
        outcomes = self._settle_now(outcomes)
        started = self._start_batch(worker, batch, reason, fill_seconds)
        results: Outcomes
        try:
            results = call_sync_batch(self._handler, list(map(_MESSAGE, batch)))
        except BaseException as raised:  # the whole batch failed (SystemExit too, as per message)
            results = [raised] * len(batch)
        settled, to_dead_letter = self._batch_outcomes(worker, batch, results, started)
        return self._dead_letter_each(worker, to_dead_letter, settled + outcomes)

    def _split_for_call(self, worker: _Worker, taken: list[Delivery]) -> tuple[list[Settlement], list[Delivery]]:
        """``_runnable`` with the pending dead-letter writes done: the outcomes known before the call, and the
        batch for the handler (asked again after the writes, ``_runnable_after_wait``)."""
        outcomes, dead_letters, batch = self._runnable(taken)
        for delivery in dead_letters:
            outcomes, batch, write = self._before_pending_write(delivery, outcomes, batch)
            if write:
                outcomes.append(self._publish_dead_letter(worker, delivery, delivery.pending_dead_letter))  # type: ignore[arg-type]
        if dead_letters:
            outcomes, batch = self._runnable_after_wait(outcomes, batch)
        return outcomes, batch

    def _run_taken(self, worker: _Worker, deliveries: list[Delivery]) -> list[Settlement]:
        """Run the heads taken in one turn (distinct lanes), one after the other; the outcomes left
        for the next turn to settle.

        Outcomes wait for that turn (one lock round trip per batch), except where someone waits for
        them. A parked lane is settled at once, with the outcomes before it, so that its due time is
        watched while the batch runs on. After a revoke (``withdraw``) came during the batch, what ran
        so far is settled at once and the revoked partitions' lanes not yet started go back unrun:
        a revoke waits for no handler of the batch but the one running when it came.
        """
        outcomes: list[Settlement] = []
        withdrawals = worker.withdrawals  # as this turn's lock saw it: a revoke since then counts
        remaining = deque(deliveries)
        while remaining:
            delivery = remaining.popleft()
            if self.stopping:  # on shutdown, lanes taken but not started go back unprocessed (committed below)
                outcomes.append(_Outcome(HANDED_BACK, delivery))
                continue
            outcome = self._execute(worker, delivery)
            outcomes.append(outcome)
            if remaining and (outcome.kind is PARKED or self._withdrawals != withdrawals):
                withdrawals = self._withdrawals
                outcomes += [_Outcome(HANDED_BACK, taken) for taken in remaining if taken.let_go]
                remaining = deque(taken for taken in remaining if not taken.let_go)
                with self._condition:
                    parked = self._settle_outcomes(outcomes)
                    self._wake_others(self._scheduler.ready + parked)  # this worker runs on
                outcomes = []
        return outcomes

    def _execute(self, worker: _Worker, delivery: Delivery) -> _Outcome:
        handed_back = self._handed_back_if_let_go(delivery)
        if handed_back is not None:
            return handed_back
        if delivery.pending_dead_letter is not None:
            return self._publish_dead_letter(worker, delivery, delivery.pending_dead_letter)
        delivery.attempts += 1
        stats = worker.stats
        stats.busy = True
        started = self.clock()
        try:
            call_sync_handler(self._handler, delivery.message)
        except BaseException as error:  # SystemExit from a handler is a failed message, not a dead worker
            stats.busy = False
            return self._failed(worker, delivery, error) or self._publish_dead_letter(worker, delivery, error)
        stats.busy = False
        return self._succeeded(worker, delivery, started)

    def _dead_letter_each(
        self, worker: _Worker, failed: list[tuple[Delivery, BaseException]], settled: list[Settlement]
    ) -> list[Settlement]:
        """Dead-letter a call's failed messages, one write at a time, what is known settled before each
        (``_before_dead_letter``); what is left to settle."""
        for delivery, error in failed:
            settled, write = self._before_dead_letter(delivery, settled)
            if write:
                settled.append(self._publish_dead_letter(worker, delivery, error))
        return settled

    def _publish_dead_letter(self, worker: _Worker, delivery: Delivery, error: BaseException) -> _Outcome:
        publish_error = None
        try:
            assert self.dead_letters is not None, "dlq policy without a dead-letter sink"
            self.dead_letters.publish(delivery.message, error, delivery.attempts)
        except Exception as failure:  # DeadLetterError, or anything a custom sink raises
            publish_error = failure
        return self._dead_lettered(worker, delivery, error, publish_error)

    def stop(self, timeout: float) -> None:
        """Let running handlers finish (up to ``timeout``), then hand back everything not started."""
        deadline = self.clock() + timeout
        with self._condition:
            self.stopping = True
            workers = list(self._workers.values())
            self._condition.notify_all()
        for worker in workers:
            assert worker.thread is not None
            worker.thread.join(max(deadline - self.clock(), 0.0))
            if worker.thread.is_alive():
                log.warning("worker %d still inside the handler after the shutdown grace period", worker.id)
        self._abandon_queued()
        self._teardown()

    def _teardown(self) -> None:
        try:
            run_sync_hook(self.lifecycle.teardown)
        except Exception as error:  # the pod is stopping anyway: say so, do not hide the rest of the shutdown
            log.error("the handler's tear-down hook failed: %s: %s", type(error).__name__, error)


def _stops_the_worker(error: BaseException) -> bool:
    """Whether ``error``, out of an awaited handler, stops the async worker rather than failing its messages: the
    pool cancelling the worker's task (shutdown), or the worker's coroutine closed while it awaited (``GeneratorExit``:
    its loop went away, or it was collected), when no loop runs to ask about a task at all."""
    if isinstance(error, GeneratorExit):
        return True
    if not isinstance(error, asyncio.CancelledError):
        return False
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class AsyncWorkerPool(_PoolBase):
    """Key workers as asyncio tasks on one event-loop thread, for ``async def`` handlers.

    Threading: the tasks and ``_idle`` live on the loop thread; the poll thread reaches them through
    ``call_soon_threadsafe``. An idle worker parks a future in ``_idle`` right after seeing no ready
    lane (no ``await`` in between), so neither a wake-up scheduled by ``submit`` nor one from another
    worker's turn that parked a lane (both run on the loop thread) can be missed.
    """

    executor = "async"

    def __init__(
        self,
        *args: Any,
        event_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._loop = event_loop()
        """The workers' loop (the pod simulation passes one on its virtual clock)."""
        self._thread = self._threads.Thread(target=self._loop.run_forever, name="keyorder-async-workers", daemon=True)
        self._idle: deque[asyncio.Future[None]] = deque()

    def _run_on_loop(self, coroutine: Any, timeout: float | None) -> Any:
        """Run ``coroutine`` on the workers' loop and wait here for its result (``TimeoutError`` after
        ``timeout``). The wait is an Event of the pool's ``Threads`` kit, so the simulation schedules it."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        done = self._threads.Event()
        future.add_done_callback(lambda _future: done.set())
        if not done.wait(timeout):
            raise TimeoutError(f"the workers' event loop did not answer within {timeout}s")
        return future.result()

    def start(self) -> None:
        """Start the event loop, run the set-up hook on it, then start the workers."""
        self._thread.start()
        try:
            self._run_on_loop(run_async_hook(self.lifecycle.setup), None)
        except Exception as error:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(ASYNC_LOOP_STOP_SECONDS)
            if not self._thread.is_alive():
                self._loop.close()
            raise HandlerSetupError(f"the handler's set-up hook failed: {type(error).__name__}: {error}") from error
        for _ in range(self._target):
            self._spawn()

    def _spawn(self) -> None:
        worker = _Worker(next(self._ids))
        with self._lock:
            self._workers[worker.id] = worker
        self._loop.call_soon_threadsafe(self._start_task, worker)

    def _start_task(self, worker: _Worker) -> None:  # on the loop thread
        worker.task = self._loop.create_task(self._run(worker))

    def submit(self, deliveries: list[Delivery]) -> None:
        self._inbox.append(deliveries)  # atomic; folded in by a worker's turn, under the lock
        self._loop.call_soon_threadsafe(self._wake_idle, 1)  # that worker wakes more if more lanes are ready

    def _wake_others(self, lanes: int) -> None:  # on the loop thread, inside a worker's turn
        if lanes > 0:
            self._wake_idle(lanes)

    def _wake(self, lanes: int) -> None:
        self._loop.call_soon_threadsafe(self._wake_idle, lanes)

    def _wake_all(self) -> None:
        if not self._loop.is_closed():  # a closed loop has no worker to wake (a shutdown must not fail on it)
            self._loop.call_soon_threadsafe(self._wake_idle, None)

    def _wake_idle(self, count: int | None) -> None:  # on the loop thread
        idle = self._idle
        woken = 0
        while idle and (count is None or woken < count):
            future = idle.popleft()
            if not future.done():
                future.set_result(None)
                woken += 1

    async def _run(self, worker: _Worker) -> None:
        try:
            await self._work(worker)
        except (asyncio.CancelledError, GeneratorExit):
            raise  # stopped (the pool cancelled it, or its coroutine was closed), not crashed
        except BaseException as error:
            self._crashed(worker, error)
        finally:
            with self._lock:
                self._exit(worker)

    async def _work(self, worker: _Worker) -> None:
        outcomes: list[Settlement] = []
        while True:
            with self._lock:
                turn = self._turn(worker, outcomes)
            outcomes = []
            if isinstance(turn, list):
                if self.batch.enabled:
                    reason, fill_seconds = await self._fill(worker, turn)
                    outcomes = await self._run_batch(worker, turn, reason, fill_seconds)
                else:
                    outcomes = [await self._execute(worker, delivery) for delivery in turn]
                continue
            if turn is EXIT:
                return
            future = self._loop.create_future()
            self._idle.append(future)
            try:
                await asyncio.wait_for(future, turn)
            except TimeoutError:  # a parked lane is due; the cancelled future must not pile up in _idle
                with contextlib.suppress(ValueError):
                    self._idle.remove(future)

    async def _fill(self, worker: _Worker, taken: list[Delivery]) -> tuple[str, float]:
        """As the thread pool's ``_fill``: a filling task waits as an idle one, so ``submit`` wakes it."""
        unfilled = self._sent_unfilled(taken)
        if unfilled is not None:
            return unfilled, 0.0
        started = self.clock()
        deadline = started + self.batch.max_wait
        waited = False
        while True:
            with self._lock:
                step = self._fill_step(worker, taken, deadline)
                if isinstance(step, str):
                    self._fill_ended(waited)
            if isinstance(step, str):
                return step, self.clock() - started
            waited = True
            future = self._loop.create_future()
            self._idle.append(future)
            try:
                await asyncio.wait_for(future, step)
            except TimeoutError:
                with contextlib.suppress(ValueError):
                    self._idle.remove(future)

    async def _run_batch(
        self, worker: _Worker, taken: list[Delivery], reason: str, fill_seconds: float
    ) -> list[Settlement]:
        """As the thread pool's ``_run_batch``, awaiting an ``async def`` batch handler."""
        outcomes, dead_letters, batch = self._runnable(taken)
        for delivery in dead_letters:  # as the thread pool's _split_for_call, awaiting each write
            outcomes, batch, write = self._before_pending_write(delivery, outcomes, batch)
            if write:
                outcomes.append(await self._publish_dead_letter(worker, delivery, delivery.pending_dead_letter))  # type: ignore[arg-type]
        if dead_letters:
            outcomes, batch = self._runnable_after_wait(outcomes, batch)
        if not batch:
            return outcomes
        outcomes = self._settle_now(outcomes)
        started = self._start_batch(worker, batch, reason, fill_seconds)
        results: Outcomes
        try:
            results = await call_async_batch(self._handler, list(map(_MESSAGE, batch)))
        except BaseException as raised:
            if _stops_the_worker(raised):
                worker.stats.busy = False
                raise  # the pool is cancelling this worker (shutdown), not a failing batch
            results = [raised] * len(batch)
        settled, to_dead_letter = self._batch_outcomes(worker, batch, results, started)
        settled += outcomes
        for delivery, error in to_dead_letter:  # as the thread pool's _dead_letter_each, awaiting each write
            settled, write = self._before_dead_letter(delivery, settled)
            if write:
                settled.append(await self._publish_dead_letter(worker, delivery, error))
        return settled

    async def _execute(self, worker: _Worker, delivery: Delivery) -> _Outcome:
        handed_back = self._handed_back_if_let_go(delivery)
        if handed_back is not None:
            return handed_back
        if delivery.pending_dead_letter is not None:
            return await self._publish_dead_letter(worker, delivery, delivery.pending_dead_letter)
        delivery.attempts += 1
        stats = worker.stats
        stats.busy = True
        started = self.clock()
        try:
            await self._handler(delivery.message)
        except BaseException as error:
            stats.busy = False
            if _stops_the_worker(error):
                raise  # the pool is cancelling this worker (shutdown), not a failing message
            outcome = self._failed(worker, delivery, error)
            return outcome or await self._publish_dead_letter(worker, delivery, error)
        stats.busy = False
        return self._succeeded(worker, delivery, started)

    async def _publish_dead_letter(self, worker: _Worker, delivery: Delivery, error: BaseException) -> _Outcome:
        publish_error = None
        try:
            assert self.dead_letters is not None, "dlq policy without a dead-letter sink"
            await asyncio.to_thread(self.dead_letters.publish, delivery.message, error, delivery.attempts)
        except Exception as failure:  # DeadLetterError, or anything a custom sink raises
            publish_error = failure
        return self._dead_lettered(worker, delivery, error, publish_error)

    def stop(self, timeout: float) -> None:
        """Let running handlers finish (up to ``timeout``), cancel the rest, hand back everything queued."""

        async def shutdown() -> None:
            with self._lock:
                self.stopping = True
                tasks = [worker.task for worker in self._workers.values() if worker.task]
            self._wake_idle(None)
            _done, still_running = await asyncio.wait(tasks, timeout=timeout) if tasks else (set(), set())
            for task in still_running:
                task.cancel()
            if still_running:
                log.warning(
                    "%d async workers still inside the handler after the shutdown grace period", len(still_running)
                )
            try:
                await run_async_hook(self.lifecycle.teardown)
            except Exception as error:  # the pod is stopping anyway: say so, do not hide the rest of the shutdown
                log.error("the handler's tear-down hook failed: %s: %s", type(error).__name__, error)

        if self._thread.is_alive():
            try:
                self._run_on_loop(shutdown(), timeout + ASYNC_LOOP_STOP_SECONDS)
            except TimeoutError:  # a handler blocks the event loop (a sync call inside async def)
                log.error(
                    "async workers did not stop within %.0fs: the event loop is blocked by a handler",
                    timeout + ASYNC_LOOP_STOP_SECONDS,
                )
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(ASYNC_LOOP_STOP_SECONDS)
        if not self._thread.is_alive():
            self._loop.close()
        self._abandon_queued()
