"""A hot key under a batch handler: each of its messages takes a whole call, so the key alone needs its backlog x
a *call's* seconds. The pods count handler time per message (a call's seconds split over its messages), and the
operator took that for the key's time per message: its hot-key horizon came out short by the mean batch size, the
limit never fired, and it sized the group for a target the key could not meet (a review found it). The report's
``handlerBatchesTotal`` now gives the calls, and the hot-key limits count a call per message of the key. The real
report builder, parser and policy run here; the pod's state is built in memory."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from keyorder.adapters.scaling_report import build_report
from keyorder.core.lanes import LaneSummary
from keyorder.engine.poll_loop import PartitionSnapshot, RuntimeSnapshot
from keyorder.engine.worker_pools import WorkerStats
from keyorder_operator.pod_signals import combine, parse_report
from keyorder_operator.policy import Observation, ScalingLimits, hot_key_horizon

CALL_SECONDS = 0.1  # one bulk call costs 100 ms, whatever its size


def _pods(batch: int, calls: int, hot_backlog: int = 5_000):
    """One pod's report after ``calls`` full calls of ``batch`` messages (1: a per-message handler)."""
    stats = WorkerStats()
    for _ in range(calls):  # what the pools record for a call: its seconds split over its messages
        stats.handler_seconds.observe_many(CALL_SECONDS / batch, batch)
        if batch > 1:
            stats.batch_sizes.observe(batch)
            stats.batches["full"] += 1
    part = PartitionSnapshot("orders", 0, 0, 20_000, 0, 1.0, 10_000, 10_000, False, 0)
    snapshot = RuntimeSnapshot(partitions=(part,), inflight=10_000, workers=4, assigned_partitions=1)
    lanes = LaneSummary(
        ready=0,
        running=4,
        queued=10_000,
        longest_backlog=hot_backlog,
        active=400,
        longest_lane=b"acct-1",
        longest_lane_partition=SimpleNamespace(id=("orders", 0)),
    )
    report = build_report(
        snapshot, lanes, [stats], ordering="key", executor="thread", workers=4, cpu_cores=1.0, cpu_seconds=1.0,
        worker_processes=0,
    )  # fmt: skip
    return combine([parse_report(report)])


def test_a_hot_keys_horizon_counts_a_call_for_each_of_its_messages_under_a_batch_handler() -> None:
    pods = _pods(batch=100, calls=50)
    assert pods.messages_per_call == 100
    handler_time = pods.handler_seconds_total / pods.handler_calls_total  # seconds per message, as rates learn it
    horizon = hot_key_horizon(Observation(lag=20_000, partitions=1, pods=pods), handler_time, ScalingLimits())
    assert pods.busiest is not None
    assert horizon == pytest.approx(pods.busiest.estimated_backlog * CALL_SECONDS)  # a call per message of the key


def test_a_per_message_handler_and_a_pod_that_does_not_report_calls_count_one_message_a_call() -> None:
    assert _pods(batch=1, calls=500).messages_per_call == 1.0
    older = _pods(batch=100, calls=50)
    assert type(older)(**{**older.__dict__, "handler_batches_total": 0}).messages_per_call == 1.0
