"""`keyorder bench --quick` as CI runs it: zero order violations, key mode well above the baseline."""

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
    ratio = runs["key W=64"]["rate"] / runs["partition baseline"]["rate"]
    assert ratio > 4, f"key mode at W=64 is only {ratio:.1f}x the partition-ordered baseline"
    assert (tmp_path / "throughput.png").read_bytes()[:4] == b"\x89PNG"
    assert "| key W=64 |" in (tmp_path / "table.md").read_text()
