"""`keyorder dev --quick --no-ui`: the spike is absorbed by the operator's policy driving real processes."""

from __future__ import annotations

import json
import re
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
    reached_cap = re.compile(rf"replicas \d+\u2192{partitions}\b")
    assert any(reached_cap.search(reason) for reason in reasons[: first_worker_change + 1]), (
        f"workers grew before the pods reached the partition count: {reasons}"
    )
    assert report["spike_drained_seconds"] is not None
    # the demo notes the scale-in on the first poll that both sees the spike committed and the size at most a
    # quarter of the peak: the same poll when the group shrank while the last commits were on their way
    assert report["scaled_in_seconds"] is not None, "no scale-in after the drain"
    assert report["scaled_in_seconds"] >= report["spike_drained_seconds"]
    assert report["audit"]["order_violations"] == 0 and report["audit"]["lost_events"] == 0
    assert report["audit"]["events"] >= report["spike_events"]
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    keda = report["keda_comparison"]  # the KEDA-scaled partition-ordered group, beside the autoscaled one
    assert keda["error"] is None and keda["spike_drained_seconds"] > 0, keda
    assert 1 < keda["peak_replicas"] <= partitions, "KEDA's metric is capped at the partition count"
    assert keda["timeline"][0]["t"] < report["spike_drained_seconds"], "not run beside the autoscaled group"
    assert "could not push" not in result.stdout + result.stderr, "workers pushed to a pod a scale-in stopped"
    simulated = report["simulated_drain_seconds"]  # the simulator's replay, printed beside the measured times
    assert simulated["keyorder"] > 0 and simulated["keda"] > 0, simulated
    assert f"KEDA {simulated['keda']:,.1f} s (this run" in result.stdout
    right_sized = report["right_sized_comparison"]
    peak = report["peak"]
    assert (right_sized["pods"], right_sized["workers_per_pod"]) == (peak["replicas"], peak["workers_per_pod"])
    assert right_sized["spike_drained_seconds"] > 0


def test_hot_key_and_poison_key_scenarios_report_the_limit_and_the_dead_letters(tmp_path):
    """`keyorder dev --hot-key-share --poison-key`: the run says which limit it hit, dead-letters
    exactly the poison events after their retries, and every other order stays in sequence."""
    command = [sys.executable, "-m", "keyorder.cli", "dev", "--quick", "--no-ui", "--no-compare"]
    command += ["--spike", "6000", "--latency-min-ms", "1", "--latency-max-ms", "2", "--keys", "300"]
    command += ["--hot-key-share", "0.6", "--poison-key", "--target-drain-seconds", "2", "--output-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=380)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    kinds = {limit["kind"] for limit in report["limits"]}
    assert "hot_key" in kinds, report["limits"]
    assert any("key 'order-hot'" in limit["message"] for limit in report["limits"])
    assert "limit at" in result.stdout and "key 'order-hot' holds" in result.stdout
    assert report["poison_events"] > 0 and report["dead_letters"] == report["poison_events"]
    assert report["audit"]["order_violations"] == 0 and report["audit"]["lost_events"] == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--hot-key-share", "1.5"], "--hot-key-share must be between 0 and 0.95, got 1.5"),
        (["--keys", "0"], "--keys must be at least 1, got 0"),
        (["--handler", "no-colon"], "--handler must look like package.module:function, got 'no-colon'"),
    ],
)
def test_bad_flags_are_refused_in_one_line(flags, message):
    result = subprocess.run(
        [sys.executable, "-m", "keyorder.cli", "dev", "--no-ui", *flags], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stdout.strip() == f"keyorder dev: error: {message}"
