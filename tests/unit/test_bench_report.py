"""The benchmark's arithmetic: ideal, ratios, percentiles from histogram buckets, the resize
scenario's windowed rates, report round-trip (scenarios included)."""

from __future__ import annotations

import json

import pytest

from keyorder.devtools.bench_report import (
    BenchReport,
    FewKeysResult,
    HotKeyResult,
    RawCeilingResult,
    ResizeResult,
    RunResult,
    Scenarios,
    fill_ratios,
    histogram_percentile,
    ideal_rate,
    markdown_table,
    plot,
    plot_resize,
    resize_figures,
    scenarios_table,
    trailing_rates,
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


def test_trailing_rates_start_once_a_full_window_lies_behind():
    times = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    counts = [0, 10, 20, 30, 40, 50, 70]
    rates = trailing_rates(times, counts, window=0.5)
    assert [now for now, _ in rates] == [0.5, 0.6]
    assert rates[0][1] == pytest.approx(100.0)
    assert rates[1][1] == pytest.approx(120.0)  # 60 messages over (0.1, 0.6]


def test_resize_figures_before_time_to_target_and_after():
    # 400 msg/s for 2 s, resize at t=2, then 3,200 msg/s from t=2.5 on; sampled every 0.1 s
    times = [round(0.1 * step, 1) for step in range(0, 81)]
    counts = []
    for now in times:
        if now <= 2.5:
            counts.append(round(400 * now))
        else:
            counts.append(round(400 * 2.5 + 3_200 * (now - 2.5)))
    before, reached, after, series = resize_figures(times, counts, 2.0, threshold=2_560, window=0.5, settle=3.0)
    assert before == pytest.approx(400.0)
    # the trailing window first holds >= 2,560 msg/s once 0.4 of its 0.5 s are past 2.5: at t = 2.9
    assert reached == pytest.approx(0.9)
    assert after == pytest.approx(3_200.0)
    assert series[0][0] == pytest.approx(-1.5) and series[-1][0] == pytest.approx(6.0)


def test_resize_figures_never_reaching_the_target_and_no_time_after():
    times = [0.0, 0.5, 1.0, 1.5, 2.0]
    counts = [0, 200, 400, 600, 800]
    before, reached, after, _ = resize_figures(times, counts, 1.0, threshold=2_560, window=0.5, settle=3.0)
    assert before == pytest.approx(400.0)
    assert reached is None and after is None


def scenarios() -> Scenarios:
    few = run("few keys: 200 keys, W=64", "key", "sleep", 64, 5_000)
    few.ideal_rate, few.ratio_to_ideal = 6_400.0, 5_000 / 6_400
    return Scenarios(
        few_keys=FewKeysResult(keys=200, run=few),
        resize=ResizeResult(
            keys=200,
            workers_before=4,
            workers_after=32,
            rate_before=390.0,
            ideal_before=400.0,
            seconds_to_target=None,
            target_fraction=0.8,
            rate_after=1_200.0,
            ideal_after=3_200.0,
            settle_seconds=3.0,
            window_seconds=0.5,
            backlog_exhausted=False,
            order_violations=1,
            series_seconds=[-0.5, 0.0, 0.5, 1.0],
            series_rates=[390.0, 390.0, 800.0, 1_200.0],
        ),
        hot_key=HotKeyResult(
            workers=32,
            hot_share=0.4,
            hot_messages=2_400,
            hot_handled=900,
            other_keys=980,
            other_messages=3_600,
            others_seconds=None,
            others_ideal_seconds=1.161,
            ratio_to_ideal=None,
            timeout_seconds=25,
            order_violations=0,
        ),
        raw_ceiling=RawCeilingResult(
            messages=18_000,
            seconds=0.1,
            rate=180_000.0,
            order_violations=2,
            compared_run="key W=16 no-op",
            compared_fraction=0.4,
        ),
    )


def test_scenarios_round_trip_count_violations_and_render(tmp_path):
    report = BenchReport(
        machine={"cpus": 2},
        parameters={"latency_ms": 10, "keys": 10_000, "partitions": 4},
        runs=[run("key W=64", "key", "sleep", 64, 5_000)],
        scenarios=scenarios(),
    )
    again = BenchReport.from_json(report.to_json())
    assert again == report
    assert again.scenarios.order_violations == 3
    table = scenarios_table(again.scenarios)
    assert "| few keys: 200 keys | 64 | 5,000 msg/s | 6,400 msg/s | 0.78 x ideal |" in table
    assert "0.8 x new ideal never" in table
    assert "others not done within 25 s" in table
    assert "key W=16 no-op: 0.40 x raw" in table
    image = plot_resize(again.scenarios.resize, tmp_path / "resize.png")
    assert image is not None and image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reports_from_before_the_scenarios_still_load():
    report = BenchReport(machine={}, parameters={}, runs=[run("key W=64", "key", "sleep", 64, 5_000)])
    data = json.loads(report.to_json())
    del data["scenarios"]
    assert BenchReport.from_json(json.dumps(data)) == report
