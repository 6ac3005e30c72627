"""A batch handler's messages that must run alone in the process executor (``Delivery.run_alone``).

A batch handler's call of several messages that dies or times out charges none of them: each is retried in
a call of its own (``ProcessWorkerPool._run_batch``). These tests drive one worker's turn directly, with a
FAKE worker process, so they take milliseconds: the real pool, the real ``LaneScheduler``, the real retry
policy; the process is what the fake decides it did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keyorder.batch import BatchLimits
from keyorder.core.lanes import Delivery
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.engine.process_child import NOT_STARTED, RUNNING
from keyorder.engine.process_pool import ProcessWorkerPool, _ProcessWorker
from keyorder.engine.worker_pools import HANDED_BACK, Completions
from keyorder.message import Message
from tests.unit.test_workers import Partition


class FakeProcess:
    """FAKE ``subprocess.Popen`` as ``_Child.kill`` and ``_interrupted`` use it: ``poll``, ``kill``, ``wait``
    and ``returncode`` (``-9`` once killed, as CPython's Lib/subprocess.py reports a SIGKILL)."""

    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class FakeChild:
    """FAKE ``process_pool._Child`` (its ``alive``, ``pid``, ``process``, ``run`` and ``slot``): ``run``
    records the batch and returns what ``answer`` says, ``"crashed"`` as the real one returns when the
    process died in the call (it kills and reaps it: ``alive`` False), each message then ``RUNNING`` in
    ``slot`` as the progress block of a call cut short says (``process_child.run_batch_call``)."""

    def __init__(self, answer: Callable[[list[tuple[Any, ...]]], list[Any] | str]) -> None:
        self.answer = answer
        self.calls: list[list[int]] = []
        self.alive = True
        self.pid = 4242
        self.process = FakeProcess()

    def run(self, batch: list[tuple[Any, ...]], timeout: float | None, as_batch: bool = False) -> list[Any] | str:
        assert self.alive and as_batch
        self.calls.append([fields[2] for fields in batch])  # the offsets
        results = self.answer(batch)
        if results == "crashed":
            self.alive = False
            self.process.kill()
        return results

    def slot(self, index: int) -> tuple[int, float]:
        return RUNNING, 0.0

    def await_ready(self, timeout: float) -> None:
        """Loaded at once."""

    def request_stop(self) -> None:
        """Nothing runs in it to stop."""

    def close(self, timeout: float = 0.0) -> None:
        self.alive = False

    def discard(self) -> None:
        self.alive = False


def _pool(started: list[str], retry: RetryPolicy | None = None) -> ProcessWorkerPool:
    def start_child(load: Any, worker_id: int) -> Any:
        started.append("a replacement process")
        return FakeChild(lambda batch: [0.001] * len(batch))

    return ProcessWorkerPool(
        lambda: None,  # type: ignore[arg-type]  # never loaded: start_child stands in
        1,
        retry or RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.05),
        None,
        Completions(),
        batch=BatchLimits(8),
        start_child=start_child,
    )


def _taken(pool: ProcessWorkerPool, partition: Partition, count: int, alone: int) -> list[Delivery]:
    """``count`` heads of distinct keys taken for one call; the first ``alone`` of them to run alone."""
    deliveries = [
        Delivery(Message("t", 0, offset, b"k%d" % offset, b""), b"k%d" % offset, partition, 0.0)
        for offset in range(count)
    ]
    pool._scheduler.add(deliveries)
    taken = pool._scheduler.take(pool.clock(), count)
    assert len(taken) == count
    for delivery in taken[:alone]:
        delivery.run_alone = True
    return taken


def test_a_turn_runs_one_lone_call_and_hands_the_other_heads_back_for_a_later_turn() -> None:
    """Three heads to run alone and one to run with others; the first lone call dies while the pod
    begins to stop and the partition is revoked. Before, the same turn ran the other two alone and then
    the fourth (a replacement process started after shutdown began, the revoked heads ran); now the turn
    makes one call and the rest go back to their lanes, unrun and uncharged, due at once."""
    started: list[str] = []
    pool = _pool(started)
    partition = Partition()
    taken = _taken(pool, partition, 4, alone=3)

    def dies_as_the_pod_stops(batch: list[tuple[Any, ...]]) -> str:
        partition.revoked = True
        pool.stopping = True
        return "crashed"

    worker = _ProcessWorker(1)
    worker.child = child = FakeChild(dies_as_the_pod_stops)  # type: ignore[assignment]
    outcomes = pool._run_batch(worker, taken, "full", 0.0)

    assert child.calls == [[0]], "one call in the turn, the first lone head's"
    assert started == [], "a replacement process started after shutdown began"
    assert [(o.kind, o.delivery.message.offset) for o in outcomes] == [(HANDED_BACK, 0)]
    assert [d.attempts for d in taken[1:]] == [0, 0, 0], "the heads that did not run were charged"
    back = pool._scheduler.take(pool.clock(), 8)
    assert [d.message.offset for d in back] == [1, 2, 3], "the heads that did not run are not due now"


def test_a_message_that_dies_alone_runs_alone_again() -> None:
    """Its lone call dies: it is charged, and its retry stays alone. Before, ``run_alone`` was cleared
    before the call, so the retry went into a full call, killed it, and sent every other message of it to
    run alone (a process restart each), every max backoff under BLOCK."""
    started: list[str] = []
    pool = _pool(started)
    (poison,) = _taken(pool, Partition(), 1, alone=1)
    worker = _ProcessWorker(1)
    worker.child = FakeChild(lambda batch: "crashed")  # type: ignore[assignment]

    assert pool._run_batch(worker, [poison], "full", 0.0) == [], "settled before the process is replaced"

    assert (pool._scheduler.summary().parked, poison.attempts) == (1, 1), "the lone death is charged and retried"
    assert poison.run_alone, "its retry would go back into a call with other messages"
    assert started == ["a replacement process"] and worker.child is not None and worker.child.alive


def test_a_lone_message_that_gets_an_answer_may_run_with_others_again() -> None:
    pool = _pool([])
    (delivery,) = _taken(pool, Partition(), 1, alone=1)
    worker = _ProcessWorker(1)
    worker.child = FakeChild(lambda batch: [0.001])  # type: ignore[assignment]
    pool._run_batch(worker, [delivery], "full", 0.0)
    assert not delivery.run_alone


def test_a_blocked_head_handed_back_unrun_stays_blocked() -> None:
    retry = RetryPolicy(max_attempts=1, initial_backoff=0.0, max_backoff=60.0, exhausted=ExhaustedPolicy.BLOCK)
    pool = _pool([], retry)
    lone, blocked = _taken(pool, Partition(), 2, alone=1)
    blocked.attempts = 1  # it failed its one attempt: its key is blocked, retried every max backoff
    worker = _ProcessWorker(1)
    worker.child = FakeChild(lambda batch: [0.001])  # type: ignore[assignment]
    pool._run_batch(worker, [lone, blocked], "full", 0.0)
    assert pool._scheduler.summary().blocked == 1


def test_a_blocked_head_stays_blocked_when_a_shared_call_with_it_dies() -> None:
    """A call of several messages died: none is charged, each goes back to run alone, and a blocked head stays
    blocked (its lane's ``blocked`` is what the metrics and the scaling report read), as when it goes back unrun
    (the test above). It read as an ordinary retry until its lone call failed again (a review found it)."""
    retry = RetryPolicy(max_attempts=1, initial_backoff=0.0, max_backoff=60.0, exhausted=ExhaustedPolicy.BLOCK)
    pool = _pool([], retry)
    taken = _taken(pool, Partition(), 2, alone=0)
    taken[0].attempts = 1  # it failed its one attempt: its key is blocked, retried every max backoff
    pool._scheduler._lanes[taken[0].lane_id].blocked = True
    worker = _ProcessWorker(1)
    worker.child = FakeChild(lambda batch: "crashed")  # type: ignore[assignment]
    assert pool._run_batch(worker, taken, "full", 0.0) == [], "settled before the process is replaced"
    summary = pool._scheduler.summary()
    assert (summary.parked, summary.blocked) == (2, 1), "both back, due at once; the blocked one still blocked"


def test_a_batch_holding_a_lone_head_is_sent_without_a_fill_wait_and_counted_as_a_call_of_one() -> None:
    """Before (a review), a turn that took a lone head with fewer heads ready than the batch's most waited the whole
    fill time, taking heads only to put them back, and counted the lone call as the original batch's reason."""
    started: list[str] = []
    pool = ProcessWorkerPool(
        lambda: None,  # type: ignore[arg-type]
        1,
        RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.05),
        None,
        Completions(),
        batch=BatchLimits(8, max_wait=30.0),  # a fill would wait 30 s
        start_child=lambda load, worker_id: started.append("a process") or FakeChild(lambda b: [0.001] * len(b)),
    )
    partition = Partition()
    taken = _taken(pool, partition, 2, alone=1)
    worker = _ProcessWorker(1)
    worker.child = child = FakeChild(lambda batch: [0.001] * len(batch))  # type: ignore[assignment]
    reason, fill_seconds = pool._fill(worker, taken)
    assert (reason, fill_seconds) == ("nothing_more_ready", 0.0)
    pool._run_batch(worker, taken, reason, fill_seconds)
    assert child.calls == [[0]]
    stats = worker.stats
    assert stats.batch_sizes.count == 1
    assert {reason: count for reason, count in stats.batches.items() if count} == {"nothing_more_ready": 1}


def test_a_call_the_process_died_before_beginning_is_not_counted() -> None:
    """Its heads go back not started and are taken and counted again in a later call: counted here too, the
    batch figures (and the operator's messages per call) read one call more per death (a review)."""
    started: list[str] = []
    pool = _pool(started)
    taken = _taken(pool, Partition(), 3, alone=0)

    class DiedIdle(FakeChild):
        def slot(self, index: int) -> tuple[int, float]:
            return NOT_STARTED, 0.0

    worker = _ProcessWorker(1)
    worker.child = DiedIdle(lambda batch: "crashed")  # type: ignore[assignment]
    pool._run_batch(worker, taken, "full", 0.0)
    assert worker.stats.batch_sizes.count == 0 and sum(worker.stats.batches.values()) == 0
    assert started == ["a replacement process"]
