"""The benchmark's arithmetic: ideal, ratios, percentiles from histogram buckets, the resize
scenario's windowed rates, the hot-key scenario's split by partition, report round-trip
(scenarios included)."""

from __future__ import annotations

import json

import pytest

from keyorder.config import RunConfig
from keyorder.devtools.bench import evaluate_targets, hot_key_summary, partition_inflight_bound
from keyorder.devtools.bench_plots import plot, plot_resize
from keyorder.devtools.bench_report import (
    LOOK_AHEAD_NOTE,
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
    resize_figures,
    scenarios_table,
    split_by_hot_partition,
    trailing_rates,
)
from keyorder.engine.worker_pools import LATENCY_BUCKETS


def run(name: str, mode: str, handler: str, workers: int, rate: float, batch: int = 1) -> RunResult:
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
        batch=batch,
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
            hot_partition=2,
            partition_inflight_bound=2_500,
            other_partitions_keys=735,
            other_partitions_messages=2_700,
            other_partitions_seconds=1.3,
            other_partitions_ideal_seconds=0.871,
            other_partitions_ratio_to_ideal=1.3 / 0.871,
            hot_partition_keys=245,
            hot_partition_messages=900,
            hot_partition_seconds=None,
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
    assert "| hot key: 40% on one key, all 980 others | 32 | not done within 25 s (3,600 messages;" in table
    assert (
        "| hot key: others on other partitions, 735 keys | 32 | done in 1.30 s (2,700 messages) | 0.87 s "
        "| 1.49 x ideal | <= 1.5 x ideal |"
    ) in table
    assert (
        "| hot key: others on the hot key's partition 2, 245 keys | 32 | not done within 25 s (900 messages," in table
    )
    assert f"look-ahead: 2,500 in flight per partition) | - | none: {LOOK_AHEAD_NOTE} |" in table
    assert "key W=16 no-op: 0.40 x raw" in table
    image = plot_resize(again.scenarios.resize, tmp_path / "resize.png")
    assert image is not None and image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_reports_from_before_the_scenarios_still_load():
    report = BenchReport(machine={}, parameters={}, runs=[run("key W=64", "key", "sleep", 64, 5_000)])
    data = json.loads(report.to_json())
    del data["scenarios"]
    assert BenchReport.from_json(json.dumps(data)) == report


HOT, A, B, C, D = b"k-0", b"k-1", b"k-2", b"k-3", b"k-4"


def test_split_by_hot_partition_times_each_group_by_its_last_key():
    expected = {HOT: 6, A: 2, B: 1, C: 3, D: 2}
    partitions = {HOT: 1, A: 0, B: 1, C: 2, D: 1}
    finished = {A: 10.5, B: 13.0, C: 11.0, D: 12.0}
    end_offsets = {0: 2, 1: 9, 2: 3}
    hot_partition, far, near = split_by_hot_partition(HOT, expected, partitions, finished, end_offsets, started=10.0)
    assert hot_partition == 1
    assert (far.keys, far.messages, far.seconds) == (2, 5, pytest.approx(1.0))
    assert (near.keys, near.messages, near.seconds) == (2, 3, pytest.approx(3.0))


def test_split_by_hot_partition_counts_keys_not_handled_yet_from_the_end_offsets():
    # D (partition 1, behind the hot key) was never handled: its group is not done, the other is
    expected = {HOT: 6, A: 2, B: 1, C: 3, D: 2}
    partitions = {HOT: 1, A: 0, B: 1, C: 2}
    finished = {A: 10.5, B: 13.0, C: 11.0}
    hot_partition, far, near = split_by_hot_partition(
        HOT, expected, partitions, finished, {0: 2, 1: 9, 2: 3}, started=10.0
    )
    assert hot_partition == 1 and far.seconds == pytest.approx(1.0)
    assert (near.keys, near.messages, near.seconds) == (1, 3, None)
    # without usable end offsets an unseen key could be in either group: neither is done
    _, far, near = split_by_hot_partition(HOT, expected, partitions, finished, {}, started=10.0)
    assert far.seconds is None and near.seconds is None and (far.messages, near.messages) == (5, 1)


def test_split_by_hot_partition_needs_the_hot_key_seen_and_keys_in_a_group():
    expected = {HOT: 6, A: 2}
    assert split_by_hot_partition(HOT, expected, {A: 0}, {A: 11.0}, {0: 8}, started=10.0) is None
    _, far, near = split_by_hot_partition(HOT, expected, {HOT: 0, A: 0}, {A: 11.0}, {0: 8}, started=10.0)
    assert (far.keys, far.messages, far.seconds) == (0, 0, None)
    assert near.seconds == pytest.approx(1.0)


def test_partition_inflight_bound_is_the_pods_fair_share_of_the_config_defaults():
    fields = RunConfig.model_fields
    per_pod, per_partition = fields["max_inflight"].default, fields["max_inflight_per_partition"].default
    assert partition_inflight_bound(4) == min(per_partition, per_pod // 4)
    assert partition_inflight_bound(1) == min(per_partition, per_pod)


def test_the_hot_key_target_is_the_other_partitions_and_the_hot_partition_is_explained():
    report = BenchReport(machine={}, parameters={}, scenarios=scenarios())
    targets = evaluate_targets(report, quick=True)
    name = "hot key (40% on one key): the others on other partitions finish within 1.5 x their ideal"
    assert targets[name]["ok"] and not targets[name]["required"]
    assert targets[name]["detail"].startswith("1.49 x ideal (1.30 s vs 0.87 s); 735 keys, 2,700 messages")
    assert not [target for target in targets if "hot key's partition" in target]
    summary = hot_key_summary(report.scenarios.hot_key)
    assert "others on other partitions (735 keys, 2,700 messages) done in 1.30 s (ideal 0.87 s, 1.49 x)" in summary
    assert "others on the hot key's partition 2 (245 keys, 900 messages) not done" in summary
    assert LOOK_AHEAD_NOTE in summary and "(2,500 in flight per partition)" in summary


def test_hot_key_reports_from_before_the_split_still_load_and_render():
    report = BenchReport(machine={}, parameters={}, scenarios=scenarios())
    data = json.loads(report.to_json())
    for name in list(data["scenarios"]["hot_key"]):
        if name.startswith(("other_partitions", "hot_partition", "partition_inflight")):
            del data["scenarios"]["hot_key"][name]
    again = BenchReport.from_json(json.dumps(data))
    hot = again.scenarios.hot_key
    assert hot.hot_partition is None and hot.other_partitions_seconds is None
    table = scenarios_table(again.scenarios)
    assert "| hot key: 40% on one key, all 980 others |" in table and "<= 1.5 x ideal" in table
    assert "other partitions" not in table
    assert not [name for name in evaluate_targets(again, quick=True) if name.startswith("hot key")]
