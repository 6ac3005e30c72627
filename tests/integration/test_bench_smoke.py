"""`keyorder bench --quick` as CI runs it: zero order violations, every run handled messages, and the
four scenarios (few keys, live resize, hot key, raw ceiling) ran and were reported (the hot key's
others in two groups: on other partitions, and on the hot key's partition). No figure is asserted,
not even key mode against the baseline: a shared 2-core machine is too noisy for a timing floor to
mean a defect. The figures live in docs/performance.md, from `make bench`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(300)]


def test_quick_bench_smoke(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "keyorder.cli", "bench", "--quick", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    runs = {run["name"]: run for run in report["runs"]}
    assert all(run["order_violations"] == 0 for run in report["runs"])
    assert all(run["messages"] > 0 for run in report["runs"]), "a run handled nothing"
    assert {"key W=64", "partition baseline"} <= runs.keys()  # the ratio is the benchmark's figure, not asserted
    assert (tmp_path / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "table.md").read_text()
    assert "| key W=64 |" in table

    scenarios = report["scenarios"]
    few, resize, hot, raw = (scenarios[name] for name in ("few_keys", "resize", "hot_key", "raw_ceiling"))
    assert few["run"]["messages"] > 0 and few["run"]["ideal_rate"] == 6_400
    assert resize["series_rates"] and resize["workers_before"] == 4 and resize["workers_after"] == 32
    assert hot["other_messages"] > 0 and hot["hot_messages"] > 0
    # the others split by the hot key's partition: both groups reported, the bound that applied named
    assert hot["hot_partition"] is not None and hot["partition_inflight_bound"] > 0
    for group in ("other_partitions", "hot_partition"):
        assert hot[f"{group}_keys"] > 0 and hot[f"{group}_messages"] > 0, group
        assert f"{group}_seconds" in hot
    assert hot["other_partitions_messages"] + hot["hot_partition_messages"] == hot["other_messages"]
    assert hot["other_partitions_ideal_seconds"] > 0 and "other_partitions_ratio_to_ideal" in hot
    assert raw["messages"] > 0 and raw["compared_run"] == "key W=16 no-op"
    for name, scenario in (("few keys", few["run"]), ("resize", resize), ("hot key", hot), ("raw ceiling", raw)):
        assert scenario["order_violations"] == 0, f"{name}: per-key order violated"
    assert report["targets"]["zero per-key order violations (ordered modes and scenarios)"]["ok"]
    assert any(name.startswith("hot key") and "other partitions" in name for name in report["targets"])
    assert (tmp_path / "resize.png").read_bytes()[:4] == b"\x89PNG"
    for row in (
        "| few keys:",
        "| live resize",
        "| hot key:",
        "| hot key: others on other partitions",
        "| hot key: others on the hot key's partition",
        "| raw ceiling:",
    ):
        assert row in table
    assert "look-ahead window" in table
