"""``keyorder catchup-bench --quick`` end to end: both runners drain the backlog, in order, and the
report and plot are written. Figures are not asserted (they live in docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(400)]
REPO = Path(__file__).resolve().parents[2]


def test_quick_catchup_bench_compares_spark_with_a_pod(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "keyorder.cli",
            "catchup-bench",
            "--quick",
            "--messages",
            "3000",
            "--output-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=380,
        cwd=REPO,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    runners = {(m["profile"], m["runner"]) for m in report["measurements"]}
    assert runners == {("cpu", "pod W=4"), ("cpu", "spark local[2]"), ("io", "pod W=64"), ("io", "spark local[2]")}
    assert all(m["messages"] == 3000 and m["violations"] == 0 for m in report["measurements"])
    assert report["spark_startup_seconds"] > 0
    assert set(report["crossover"]) == {"cpu", "io"}
    for profile in ("cpu", "io"):  # per core and per CPU-second, against the pod, from the same run
        spark = report["per_core"][profile]["spark local[2]"]
        assert spark["per_core"] > 0 and spark["per_core_ratio"] > 0 and spark["cpu_us_per_message"] > 0
        assert f"{profile}: spark local[2] " in result.stdout and "msg/s per core" in result.stdout
    hot = report["hot_keys"]
    assert [m["messages"] for m in hot["measurements"]] == [6_000, 6_000]  # uniform, then 4 hot keys
    assert all(m["violations"] == 0 for m in hot["measurements"]) and hot["ratios"]["W=16 auto"] > 0
    assert hot["hot_chain_seconds"] >= 0.5 and 0 < hot["ceilings"]["W=16 auto"] <= 1  # 500 x a 1 ms sleep at least
    assert hot["run_over_chain"]["W=16 auto"] >= 1.0, "the hot run cannot end before its hot key's chain"
    assert "the hot run took" in result.stdout and "its floor, one hot key's chain of" in result.stdout
    assert (tmp_path / "catchup.png").stat().st_size > 10_000
    for profile in ("cpu", "io"):  # the printed verdict is the one the report's own figures give
        found = report["crossover"][profile]
        verdict = (
            f"catch-up pays off above ~{found['crossover_messages']:,} messages"
            if found["crossover_messages"]
            else "Spark on this machine is not faster than the pod: no crossover here"
        )
        assert f"  {profile}: pod " in result.stdout and verdict in result.stdout, (profile, verdict)
