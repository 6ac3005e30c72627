"""A worker process that died is replaced holding no heads: no revoke or shutdown waits for its start.

A replacement imports the handler and runs its set-up hook, which may take long (up to ``START_TIMEOUT``). The
pool once started it at the worker's next call, holding the heads taken for that call meanwhile: a revoke waited
for them, and they ran in the new process after the revoke or the shutdown that came while it loaded (a review
found it). Now the dead call's outcomes are settled first (its messages back in their lanes, or failed under the
retry policy), then the replacement starts. The real pool and scheduler drive one worker's turn directly; the
processes are FAKES (``FakeChild``), whose start runs what the test says came meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from keyorder.batch import BatchLimits
from keyorder.core.retry import RetryPolicy
from keyorder.engine.process_pool import REPLACEMENT_ATTEMPTS, DiedWhileLoading, ProcessWorkerPool, _ProcessWorker
from keyorder.engine.worker_pools import Completions, HandlerSetupError
from tests.unit.test_process_workers_alone import FakeChild, _taken
from tests.unit.test_workers import Partition


class StartingChild(FakeChild):
    """FAKE replacement process: while the pod waits for it to load (``await_ready``), ``meanwhile`` runs."""

    def __init__(self, meanwhile: Callable[[], None]) -> None:
        super().__init__(lambda batch: [0.001] * len(batch))
        self.meanwhile = meanwhile

    def run(self, batch: list[tuple[Any, ...]], timeout: float | None, as_batch: bool = False) -> Any:
        self.calls.append([fields[2] for fields in batch])  # the offsets, per message or as a batch
        return [0.001] * len(batch)

    def await_ready(self, timeout: float) -> None:
        self.meanwhile()


class DyingChild(FakeChild):
    """FAKE worker process that dies in its next call, per message or as a batch."""

    def __init__(self) -> None:
        super().__init__(lambda batch: "crashed")

    def run(self, batch: list[tuple[Any, ...]], timeout: float | None, as_batch: bool = False) -> Any:
        self.alive = False
        self.process.kill()
        return "crashed"


def _pool(batch: BatchLimits, start: Callable[[], StartingChild]) -> tuple[ProcessWorkerPool, list[StartingChild]]:
    """A pool of one worker whose every process start is ``start()``; the processes it started."""
    started: list[StartingChild] = []

    def start_child(load: Any, worker_id: int) -> StartingChild:
        started.append(start())
        return started[-1]

    pool = ProcessWorkerPool(
        lambda: None,  # type: ignore[arg-type]  # never loaded: start_child stands in
        1,
        RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.05),
        None,
        Completions(),
        batch=batch,
        start_child=start_child,  # type: ignore[arg-type]
    )
    return pool, started


@pytest.mark.parametrize("batch", [BatchLimits(8), BatchLimits(1)], ids=["batch-handler", "per-message"])
def test_a_revoke_while_the_replacement_starts_waits_for_none_of_the_dead_calls_messages(batch: BatchLimits) -> None:
    partition = Partition()
    seen: dict[str, Any] = {}
    pool: ProcessWorkerPool

    def revoke_meanwhile() -> None:  # what the poll loop's _on_revoke does: mark, withdraw, wait for what runs
        partition.revoked = True
        seen["running"] = pool._scheduler.summary().running
        seen["withdrawn"] = sorted(delivery.message.offset for delivery in pool.withdraw(lambda d: d.partition.revoked))

    pool, replacements = _pool(batch, lambda: StartingChild(revoke_meanwhile))
    taken = _taken(pool, partition, 3, alone=0) if batch.enabled else _taken(pool, partition, 1, alone=0)
    worker = _ProcessWorker(1)
    worker.child = DyingChild()  # type: ignore[assignment]

    outcomes = pool._run_batch(worker, taken, "full", 0.0) if batch.enabled else pool._run_taken(worker, taken)

    assert outcomes == [], "settled before the replacement started"
    assert seen == {"running": 0, "withdrawn": [d.message.offset for d in taken]}, "the revoke waits for nothing"
    assert worker.child is replacements[0] and replacements[0].calls == [], "replaced; nothing of it ran there"


def test_the_next_call_runs_in_the_replacement() -> None:
    pool, replacements = _pool(BatchLimits(8), lambda: StartingChild(lambda: None))
    taken = _taken(pool, Partition(), 3, alone=0)
    worker = _ProcessWorker(1)
    worker.child = FakeChild(lambda fields: "crashed")  # type: ignore[assignment]
    pool._run_batch(worker, taken, "full", 0.0)  # a shared death: each goes back to run alone, due at once
    lone = pool._scheduler.take(pool.clock(), 8)
    pool._run_batch(worker, lone, "full", 0.0)
    assert replacements[0].calls == [[0]], "one lone call in the replacement; the other heads wait their turn"


class DiesWhileLoading(StartingChild):
    """FAKE process killed while it loads (the kernel's OOM killer), as ``_Child.await_ready`` reports it."""

    def await_ready(self, timeout: float) -> None:
        self.alive = False
        raise DiedWhileLoading(f"worker process {self.pid} was killed by SIGKILL while loading the handler")


class FailsItsSetUp(StartingChild):
    """FAKE process whose handler's set-up hook raised: the handler's own error, the same on every start."""

    def await_ready(self, timeout: float) -> None:
        raise HandlerSetupError("worker process 4242: the handler's set-up hook failed: database unreachable")


def _starting(kinds: list[type[StartingChild]]) -> tuple[ProcessWorkerPool, list[StartingChild]]:
    """A pool of one worker whose process starts are ``kinds``, in turn."""
    following = iter(kinds)
    return _pool(BatchLimits(8), lambda: next(following)(lambda: None))


@pytest.mark.parametrize("dead", range(REPLACEMENT_ATTEMPTS + 1))
def test_a_replacement_killed_while_it_loads_is_started_again_up_to_a_limit(dead: int) -> None:
    """A seed of the simulation with worker processes that take time to load had one killed while loading, and
    the pod exited. A death while loading is now retried as a death in a call is, up to the limit."""
    pool, started = _starting([DiesWhileLoading] * dead + [StartingChild])
    worker = _ProcessWorker(1)
    worker.child = DyingChild()  # type: ignore[assignment]
    pool._run_batch(worker, _taken(pool, Partition(), 2, alone=0), "full", 0.0)
    if dead < REPLACEMENT_ATTEMPTS:
        assert worker.child is started[-1] and pool.health.crashed is None and not worker.retiring
    else:
        assert len(started) == REPLACEMENT_ATTEMPTS and worker.retiring
        assert pool.health.crashed is not None and "while loading the handler" in pool.health.crashed


def test_a_handlers_own_set_up_error_is_not_tried_again() -> None:
    pool, started = _starting([FailsItsSetUp, StartingChild])
    worker = _ProcessWorker(1)
    worker.child = DyingChild()  # type: ignore[assignment]
    pool._run_batch(worker, _taken(pool, Partition(), 2, alone=0), "full", 0.0)
    assert len(started) == 1 and worker.retiring and "database unreachable" in (pool.health.crashed or "")


def test_a_process_killed_while_the_pod_starts_is_started_again() -> None:
    pool, started = _starting([DiesWhileLoading, StartingChild])
    pool.start()
    try:
        assert [type(child) for child in started] == [DiesWhileLoading, StartingChild]
        assert pool.worker_pids() == [started[1].pid]
    finally:
        pool.stop(1.0)
