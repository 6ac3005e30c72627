"""The docs cannot drift from the code: config table and metric names are checked here."""

from __future__ import annotations

import re
from pathlib import Path

from keyorder.adapters.metrics import KeyorderCollector
from keyorder.runtime import PartitionSnapshot, RuntimeSnapshot
from keyorder.workers import WorkerStats
from tools.docs_tables import generated_tables, render_table

ROOT = Path(__file__).resolve().parents[2]


def test_settings_tables_match_the_models():
    for relative, model in generated_tables().items():
        text = (ROOT / relative).read_text()
        assert render_table(text, model) == text, f"{relative} is stale: run `make docs`"


class _Runtime:
    """Stand-in for ConsumerRuntime (only the two attributes the collector reads)."""

    workers = 4
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


class _Pool:
    def stats(self):
        return [WorkerStats(), WorkerStats()]


def exported_names() -> set[str]:
    names = set()
    for family in KeyorderCollector(_Runtime(), _Pool()).collect():
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
    families = {family.name: family for family in KeyorderCollector(_Runtime(), _Pool()).collect()}
    lag = families["keyorder_partition_lag_messages"].samples[0]
    assert lag.labels == {"topic": "t", "partition": "0"} and lag.value == 5
    assert families["keyorder_workers"].samples[0].value == 4
    assert families["keyorder_pod_queued_messages"].samples[0].value == 3
