"""What rebalances cost one pod, as the runtime counts it: partitions taken, seconds held without any.

The pool is real (no handler runs: nothing is dispatched); the source is a FAKE recording one and
the clock a FAKE one, so the idle seconds are exact. Eager and cooperative rebalances are the same
callbacks with different partition lists, so both are driven here by calling them as librdkafka does.
"""

from __future__ import annotations

from keyorder.core.retry import RetryPolicy
from keyorder.core.routing import Ordering
from keyorder.engine.poll_loop import ConsumerRuntime, RuntimeSettings
from keyorder.engine.worker_pools import Completions, ThreadWorkerPool
from tests.fakes import FakeClock, RecordingSource

P0, P1 = ("t", 0), ("t", 1)


def runtime_and_clock() -> tuple[ConsumerRuntime, FakeClock]:
    clock = FakeClock()
    completions = Completions()
    pool = ThreadWorkerPool(lambda message: None, 2, RetryPolicy(), None, completions, clock=clock)
    runtime = ConsumerRuntime(
        RuntimeSettings(topics=("t",)),
        RecordingSource({P0: 0, P1: 0}),
        pool,
        Ordering.KEY,
        completions,
        clock,
        clock.sleep,
    )
    return runtime, clock


def published(runtime: ConsumerRuntime, clock: FakeClock):
    runtime._publish_snapshot(clock())
    return runtime.snapshot


def test_a_cooperative_revoke_takes_only_the_moving_partition_and_the_pod_is_never_idle() -> None:
    runtime, clock = runtime_and_clock()
    runtime._on_assign([P0, P1])
    runtime._on_revoke([P1])  # a newcomer takes P1; P0 stays and keeps running
    clock.sleep(5)
    runtime._on_assign([])  # the second round of an incremental rebalance gives this pod nothing new
    snapshot = published(runtime, clock)
    assert (snapshot.partitions_revoked, snapshot.rebalance_idle_seconds, snapshot.assigned_partitions) == (1, 0.0, 1)


def test_an_eager_rebalance_takes_every_partition_and_counts_the_seconds_until_the_next_assignment() -> None:
    runtime, clock = runtime_and_clock()
    runtime._on_assign([P0, P1])
    runtime._on_revoke([P0, P1])
    clock.sleep(3)
    runtime._on_assign([])  # an empty assignment ends nothing: the pod still holds no partition
    clock.sleep(1.5)
    runtime._on_assign([P0])
    clock.sleep(10)  # time with a partition is not idle
    snapshot = published(runtime, clock)
    assert (snapshot.partitions_revoked, snapshot.rebalance_idle_seconds) == (2, 4.5)


def test_lost_partitions_count_as_taken_and_an_unassigned_pod_is_idle_only_after_a_rebalance() -> None:
    runtime, clock = runtime_and_clock()
    clock.sleep(30)  # waiting for the first assignment is start-up, not a rebalance's cost
    runtime._on_assign([P0])
    runtime._on_lost([P0])
    clock.sleep(2)
    runtime._on_assign([P0])
    snapshot = published(runtime, clock)
    assert (snapshot.partitions_revoked, snapshot.rebalance_idle_seconds) == (1, 2.0)


def test_the_age_of_the_last_change_of_partitions_counts_assigns_and_revokes_but_not_empty_rounds() -> None:
    runtime, clock = runtime_and_clock()
    assert published(runtime, clock).assignment_age is None  # no partition yet: nothing to time
    runtime._on_assign([P0, P1])
    clock.sleep(4)
    assert published(runtime, clock).assignment_age == 4.0
    runtime._on_revoke([P1])
    clock.sleep(2)
    runtime._on_assign([])  # the incremental second round that gives this pod nothing
    clock.sleep(1)
    assert published(runtime, clock).assignment_age == 3.0
