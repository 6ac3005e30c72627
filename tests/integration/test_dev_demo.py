"""`keyorder dev --quick --no-ui`: the spike is absorbed by the operator's policy driving real processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(400)]


def test_quick_demo_scales_out_then_workers_then_in_with_every_order_in_sequence(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "keyorder.cli", "dev", "--quick", "--no-ui", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    partitions, initial = report["options"]["partitions"], report["options"]["initial_workers"]
    assert report["peak"]["replicas"] == partitions, "did not scale out to the partition cap"
    assert report["peak"]["workers_per_pod"] > initial, "did not raise workers at the cap"
    reasons = [decision["reason"] for decision in report["decisions"]]
    first_worker_change = next(i for i, reason in enumerate(reasons) if "workers/pod" in reason)
    assert any(f"\u2192{partitions}" in reason for reason in reasons[:first_worker_change]), (
        f"workers grew before the pods reached the partition count: {reasons}"
    )
    assert report["spike_drained_seconds"] is not None
    assert report["scaled_in_seconds"] > report["spike_drained_seconds"], "no scale-in after the drain"
    assert report["audit"]["order_violations"] == 0 and report["audit"]["lost_events"] == 0
    assert report["audit"]["events"] >= report["spike_events"]
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    comparison = report["static_comparison"]
    assert comparison and comparison["rate"] > 0
