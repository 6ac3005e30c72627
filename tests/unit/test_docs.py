"""The docs cannot drift from the code: config table and metric names are checked here."""

from __future__ import annotations

import re
from pathlib import Path

from keyorder.adapters.metrics import KeyorderCollector
from keyorder.core.lanes import Delivery
from keyorder.core.retry import RetryPolicy
from keyorder.engine.poll_loop import PartitionSnapshot, RuntimeSnapshot
from keyorder.engine.worker_pools import Completions, ThreadWorkerPool, _Worker
from keyorder.message import Message
from tools.docs_tables import generated_tables, render_table

ROOT = Path(__file__).resolve().parents[2]


def test_settings_tables_match_the_models():
    for relative, model in generated_tables().items():
        text = (ROOT / relative).read_text()
        assert render_table(text, model) == text, f"{relative} is stale: run `make docs`"


class _Runtime:
    """Stand-in for ConsumerRuntime (only the snapshot the collector reads)."""

    snapshot = RuntimeSnapshot(
        partitions=(
            PartitionSnapshot(
                topic="t",
                partition=0,
                committed=10,
                high_watermark=15,
                min_inflight=10,
                oldest_inflight_age=1.5,
                inflight=3,
                uncommitted=5,
                paused=False,
                completed=10,
            ),
        ),
        inflight=3,
        workers=4,
    )


class _Partition:
    id = ("t", 0)
    revoked = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:  # no truncation here: only a revoke
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


def _pool() -> ThreadWorkerPool:
    """A real pool, never started (no threads): 3 messages of a hot key, 1 of another, the min-offset
    message 10 of the hot key parked for a retry, the other one ready."""
    pool = ThreadWorkerPool(lambda _message: None, 4, RetryPolicy(), None, Completions())
    partition = _Partition()
    scheduler = pool._scheduler  # the pool's own scheduler, filled and parked as a failing worker would
    scheduler.add(
        [Delivery(Message("t", 0, offset, key, b"{}"), key, partition, 0.0)
         for offset, key in ((10, b"hot"), (11, b"hot"), (12, b"hot"), (13, b"cold"))]
    )  # fmt: skip
    (head,) = scheduler.take(0.0)
    assert head.message.offset == 10
    scheduler.park(head, due=1e9)
    return pool


def exported_names() -> set[str]:
    names = set()
    for family in KeyorderCollector(_Runtime(), _pool()).collect():
        suffix = "_total" if family.type == "counter" else ""
        names.add(family.name + suffix)
    return names


def test_every_exported_metric_is_documented_and_nothing_else():
    documented = set(re.findall(r"^\| `(keyorder_[a-z_]+)` \|", (ROOT / "docs" / "metrics.md").read_text(), re.M))
    exported = exported_names()
    assert exported - documented == set(), "exported but not documented"
    assert documented - exported == set(), "documented but not exported"


def test_metric_names_follow_the_conventions():
    for name in exported_names():
        assert name.startswith("keyorder_")
        assert not name.endswith(("_ms", "_milliseconds", "_bytes_total")), name


def test_collector_values_come_from_the_snapshot():
    families = {family.name: family for family in KeyorderCollector(_Runtime(), _pool()).collect()}
    lag = families["keyorder_partition_lag_messages"].samples[0]
    assert lag.labels == {"topic": "t", "partition": "0"} and lag.value == 5
    assert families["keyorder_workers"].samples[0].value == 4
    assert families["keyorder_pod_queued_messages"].samples[0].value == 3


def test_lane_metrics_come_from_the_pods_lane_scheduler():
    families = {family.name: family for family in KeyorderCollector(_Runtime(), _pool()).collect()}

    def value(name: str) -> float:
        return families[name].samples[0].value

    assert value("keyorder_lanes_ready") == 1, "the cold lane waits for a worker"
    assert value("keyorder_lanes_running") == 0
    assert value("keyorder_keys_inflight") == 2
    assert value("keyorder_keys_retrying") == 1
    assert value("keyorder_keys_blocked") == 0
    assert value("keyorder_lane_backlog_max_messages") == 3
    assert value("keyorder_lane_backlog_max_ratio") == 0.75
    assert value("keyorder_partition_min_offset_parked") == 1, "offset 10 is the min-offset and it is parked"
    assert value("keyorder_partition_min_offset_blocked") == 0


def test_queued_messages_leave_out_every_message_inside_a_handler_call_not_one_per_busy_worker():
    """A batch handler's busy worker holds many messages: queued is in flight minus the running lanes (a review:
    it subtracted the busy workers, so one worker's call of 2 read as 1 message queued too many)."""
    pool = ThreadWorkerPool(lambda _messages: None, 4, RetryPolicy(), None, Completions())
    pool._scheduler.add([Delivery(Message("t", 0, offset, key, b"{}"), key, _Partition(), 0.0)
                         for offset, key in ((10, b"a"), (11, b"b"), (12, b"c"))])  # fmt: skip
    assert len(pool._scheduler.take(0.0, 2)) == 2  # one worker's batch call holds two lanes' heads
    pool._workers[0] = worker = _Worker(0)
    worker.stats.busy = True
    families = {family.name: family for family in KeyorderCollector(_Runtime(), pool).collect()}
    assert families["keyorder_workers_busy"].samples[0].value == 1
    assert families["keyorder_lanes_running"].samples[0].value == 2
    assert families["keyorder_pod_queued_messages"].samples[0].value == 3 - 2  # 3 in flight, 2 inside the call
