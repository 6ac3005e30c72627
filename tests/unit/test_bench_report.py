"""The benchmark's arithmetic: ideal, ratios, percentiles from histogram buckets, report round-trip."""

from __future__ import annotations

import pytest

from keyorder.devtools.bench_report import (
    BenchReport,
    RunResult,
    fill_ratios,
    histogram_percentile,
    ideal_rate,
    markdown_table,
    plot,
)
from keyorder.workers import LATENCY_BUCKETS


def run(name: str, mode: str, handler: str, workers: int, rate: float) -> RunResult:
    return RunResult(
        name=name,
        mode=mode,
        handler=handler,
        workers=workers,
        messages=1000,
        seconds=1.0,
        rate=rate,
        cpu_us_per_message=10.0,
        p50_ms=1.0,
        p99_ms=2.0,
        peak_rss_mb=50.0,
        peak_inflight=10,
        order_violations=0,
    )


@pytest.mark.parametrize(
    ("workers", "keys", "latency", "expected"),
    [(64, 10_000, 0.01, 6_400.0), (1024, 10_000, 0.01, 102_400.0), (64, 10, 0.01, 1_000.0), (4, 10, 0.0, None)],
)
def test_ideal_rate_is_min_of_workers_and_keys_over_latency(workers, keys, latency, expected):
    assert ideal_rate(workers, keys, latency) == expected


def test_percentile_interpolates_inside_the_bucket():
    buckets = [0] * (len(LATENCY_BUCKETS) + 1)
    first, second = LATENCY_BUCKETS.index(0.005), LATENCY_BUCKETS.index(0.01)
    buckets[first] = 50  # (0.0025, 0.005]
    buckets[second] = 50  # (0.005, 0.01]
    assert histogram_percentile(buckets, 0.5) == pytest.approx(0.005)
    assert histogram_percentile(buckets, 0.75) == pytest.approx(0.0075)
    assert histogram_percentile(buckets, 1.0) == pytest.approx(0.01)
    assert histogram_percentile([0] * len(buckets), 0.5) is None


def test_ratios_are_against_the_baseline_of_the_same_handler_family():
    runs = [
        run("partition baseline", "partition", "sleep", 4, 400),
        run("key W=64", "key", "sleep", 64, 5_120),
        run("key async W=256", "key", "async-sleep", 256, 12_800),
        run("partition baseline no-op", "partition", "noop", 4, 50_000),
        run("no-op", "key", "noop", 16, 75_000),
    ]
    fill_ratios(runs, active_keys=10_000, latency=0.01)
    assert runs[1].ratio_to_baseline == pytest.approx(12.8)
    assert runs[1].ratio_to_ideal == pytest.approx(0.8)
    assert runs[2].ratio_to_baseline == pytest.approx(32.0)
    assert runs[2].ratio_to_ideal == pytest.approx(0.5)
    assert runs[4].ratio_to_baseline == pytest.approx(1.5) and runs[4].ratio_to_ideal is None


def test_report_round_trips_through_json_and_renders(tmp_path):
    runs = [run("partition baseline", "partition", "sleep", 4, 400), run("key W=64", "key", "sleep", 64, 5_000)]
    report = BenchReport(
        machine={"cpus": 2},
        parameters={"latency_ms": 10, "keys": 10_000, "partitions": 4},
        runs=runs,
        commit_metadata_bytes=30,
    )
    again = BenchReport.from_json(report.to_json())
    assert again == report
    table = markdown_table(again.runs)
    assert "| key W=64 | sleep | 64 | 5,000 |" in table
    image = plot(again, tmp_path / "plot.png")
    assert image is not None and image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
