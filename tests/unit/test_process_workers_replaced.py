"""A worker process replaced before a call: a revoke or the shutdown that comes while it starts.

A worker whose process died (in its last call, or while idle) replaces it at its next call: the new process
imports the handler and runs its set-up hook, which may take long (up to ``START_TIMEOUT``). The heads the
worker took count as running meanwhile, so a revoke waits for them; they must not run after it, nor after the
shutdown began (a review found both). The real pool and scheduler drive one worker's turn directly; the
processes are FAKES (``FakeChild``), whose set-up runs what the test says came meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from keyorder.batch import BatchLimits
from keyorder.core.retry import RetryPolicy
from keyorder.engine.process_pool import ProcessWorkerPool, _ProcessWorker
from keyorder.engine.worker_pools import Completions
from tests.unit.test_process_workers_alone import FakeChild, _taken
from tests.unit.test_workers import Partition


class DeadChild(FakeChild):
    """FAKE: the worker's process that died after its last call (``alive`` False, as ``_interrupted`` leaves it)."""

    def __init__(self) -> None:
        super().__init__(lambda batch: "crashed")
        self.alive = False


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


def _replaced(
    batch: BatchLimits, meanwhile: Callable[[ProcessWorkerPool, Partition], None]
) -> tuple[ProcessWorkerPool, _ProcessWorker, list[StartingChild], list[Any]]:
    """One worker's call of 3 heads (one call, or one at a time) after its process died; ``meanwhile`` comes
    while the replacement starts. The pool, the worker, the replacements, the call's outcomes."""
    partition, replacements = Partition(), []
    pool: ProcessWorkerPool

    def start_child(load: Any, worker_id: int) -> StartingChild:
        replacements.append(StartingChild(lambda: meanwhile(pool, partition)))
        return replacements[-1]

    pool = ProcessWorkerPool(
        lambda: None,  # type: ignore[arg-type]  # never loaded: start_child stands in
        1,
        RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.05),
        None,
        Completions(),
        batch=batch,
        start_child=start_child,  # type: ignore[arg-type]
    )
    taken = _taken(pool, partition, 3 if batch.enabled else 1, alone=0)
    worker = _ProcessWorker(1)
    worker.child = DeadChild()  # type: ignore[assignment]
    outcomes = pool._run_batch(worker, taken, "full", 0.0) if batch.enabled else pool._run_taken(worker, taken)
    return pool, worker, replacements, outcomes


def _revoke(_pool: ProcessWorkerPool, partition: Partition) -> None:
    partition.revoked = True  # what the poll loop's _on_revoke marks before it waits for the running heads


def _shut_down(pool: ProcessWorkerPool, _partition: Partition) -> None:
    pool.stopping = True


@pytest.mark.parametrize("batch", [BatchLimits(8), BatchLimits(1)], ids=["batch-handler", "per-message"])
@pytest.mark.parametrize("meanwhile", [_revoke, _shut_down], ids=["revoke", "shutdown"])
def test_heads_taken_before_a_replacement_started_run_not_after_a_revoke_or_shutdown_came_meanwhile(
    batch: BatchLimits, meanwhile: Callable[[ProcessWorkerPool, Partition], None]
) -> None:
    pool, worker, replacements, outcomes = _replaced(batch, meanwhile)
    assert replacements[0].calls == [], "the heads ran in the new process after the revoke or shutdown"
    assert pool._scheduler.summary().running == 0, "handed back at once: a revoke waits for none of them"
    assert outcomes == [] and worker.stats.batch_sizes.count == 0  # settled already; no call counted


def test_heads_run_in_the_replacement_when_nothing_came_meanwhile() -> None:
    _pool, worker, replacements, outcomes = _replaced(BatchLimits(8), lambda _pool, _partition: None)
    assert replacements[0].calls == [[0, 1, 2]]
    (finished,) = outcomes
    assert len(finished.deliveries) == 3 and worker.stats.batch_sizes.count == 1  # type: ignore[union-attr]
