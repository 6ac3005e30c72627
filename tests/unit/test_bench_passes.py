"""``keyorder bench``'s compared rows measured as the raw loop is (issue 40): best of three passes with
their spread, order violations summed over the passes, and the passes of the rows a target compares
taking turns (the raw loop with the no-op batch row, each sink pair), so that the machine's drift over
minutes hits both sides alike. The targets give best over best and median over median; reports from
before the passes still load for ``--baseline``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from keyorder.devtools.bench import (
    BATCH_SIZE,
    FAST_RUN,
    LOCKED_RUN,
    NOOP_BATCH_RUN,
    NOOP_RUN,
    PRESETS,
    PURE_RUN,
    RAW_LOOP,
    SINK_PAIRS,
    SINK_WORKERS,
    WIDE_NOOP_BATCH_RUN,
    Runner,
    RunSpec,
    evaluate_targets,
    pass_order,
    raw_beside_rows,
    run_scenarios,
)
from keyorder.devtools.bench_report import (
    BenchReport,
    Pass,
    RawCeilingResult,
    Scenarios,
    best_of_passes,
    interleave,
    markdown_table,
    regressions,
)
from keyorder.progress import Progress
from tests.unit.test_bench_report import run as report_run

(THREAD_SINK, THREAD_BATCHED), (PROCESS_SINK, PROCESS_BATCHED) = SINK_PAIRS


def steps(order: list[Pass]) -> list[tuple[str, str]]:
    return [(step.name, step.text) for step in order]


def turns(names: tuple[str, ...], passes: int) -> list[tuple[str, str]]:
    return [(name, f"pass {number}/{passes}") for number in range(1, passes + 1) for name in names]


def test_the_ceiling_preset_runs_the_raw_loop_and_each_sink_pair_in_turns_with_the_rows_they_are_put_against():
    once = [(name, "pass 1/1") for name in (PURE_RUN, NOOP_RUN, LOCKED_RUN)]
    assert steps(pass_order(PRESETS["ceiling"])) == [
        *once,
        (RAW_LOOP, "warm-up pass"),
        *turns((RAW_LOOP, NOOP_BATCH_RUN), 3),
        (WIDE_NOOP_BATCH_RUN, "pass 1/1"),
        (FAST_RUN, "pass 1/1"),
        *turns((THREAD_SINK, THREAD_BATCHED), 3),
        *turns((PROCESS_SINK, PROCESS_BATCHED), 3),
    ]
    assert raw_beside_rows(PRESETS["full"]) and raw_beside_rows(PRESETS["ceiling"])


def test_without_the_no_op_batch_row_the_raw_loop_stays_a_scenario_and_rows_run_once_in_order():
    quick = PRESETS["quick"]
    assert not raw_beside_rows(quick) and not raw_beside_rows(PRESETS["executors"])
    assert steps(pass_order(quick)) == [(spec.name, "pass 1/1") for spec in quick.runs]
    no_scenarios = replace(PRESETS["ceiling"], with_scenarios=False)  # nothing measures the raw loop
    assert RAW_LOOP not in {step.name for step in pass_order(no_scenarios)}


def test_interleave_takes_turns_where_a_groups_first_row_is_defined_and_lets_a_longer_row_finish():
    rows = [("a", 1), ("b", 2), ("c", 1), ("d", 3), ("e", 1)]
    order = interleave(rows, [("d", "b"), ("absent", "e")], warmups={"d"})
    assert steps(order) == [
        ("a", "pass 1/1"),
        ("d", "warm-up pass"),
        ("d", "pass 1/3"),
        ("b", "pass 1/2"),
        ("d", "pass 2/3"),
        ("b", "pass 2/2"),
        ("d", "pass 3/3"),
        ("c", "pass 1/1"),
        ("e", "pass 1/1"),
    ]
    assert [step.last for step in order] == [True, False, False, False, False, True, True, True, True]
    with pytest.raises(ValueError, match="'b' is in two interleaved groups"):
        interleave(rows, [("a", "b"), ("b", "c")])


class RecordingRunner(Runner):
    """The runner with every pod run and raw pass canned and recorded in the order they were asked for."""

    def __init__(self, rates: dict[str, list[float]], raw: list[float]) -> None:
        super().__init__("127.0.0.1:9", "bench", PRESETS["ceiling"], Progress())
        self.rates, self.raw = {name: list(figures) for name, figures in rates.items()}, list(raw)
        self.calls: list[str] = []

    def run(self, spec: RunSpec, label: str, topic=None, messages=None, pass_label: str = ""):
        self.calls.append(f"{label} {spec.name}{pass_label}")
        result = report_run(spec.name, spec.mode, spec.handler, spec.workers, self.rates[spec.name].pop(0), spec.batch)
        result.order_violations = 1 if spec.name == NOOP_BATCH_RUN and len(self.rates[spec.name]) == 1 else 0
        return result

    def _raw_pass(self, name: str) -> tuple[int, float, float, int]:
        self.calls.append(name)
        rate = self.raw.pop(0)
        return int(rate), 1.0, rate, 0


def test_measure_interleaves_the_passes_keeps_the_rows_order_and_takes_each_rows_best_pass():
    rates = {spec.name: [10_000.0, 12_000.0, 11_000.0][: spec.passes] for spec in PRESETS["ceiling"].runs}
    rates[NOOP_BATCH_RUN] = [100_000.0, 120_000.0, 90_000.0]
    runner = RecordingRunner(rates, raw=[300_000.0, 140_000.0, 150_000.0, 145_000.0])
    said: list[str] = []
    results, raw = runner.measure(said.append)
    assert runner.calls[3:10] == [
        f"[4/10] {RAW_LOOP}, warm-up pass",
        f"[4/10] {RAW_LOOP}, pass 1/3",
        f"[4/10] {NOOP_BATCH_RUN}, pass 1/3",
        f"[4/10] {RAW_LOOP}, pass 2/3",
        f"[4/10] {NOOP_BATCH_RUN}, pass 2/3",
        f"[4/10] {RAW_LOOP}, pass 3/3",
        f"[4/10] {NOOP_BATCH_RUN}, pass 3/3",
    ]
    assert runner.calls[:3] == ["[1/10] " + PURE_RUN, "[2/10] " + NOOP_RUN, "[3/10] " + LOCKED_RUN]
    assert runner.calls[10:14] == [
        f"[5/10] {WIDE_NOOP_BATCH_RUN}",
        f"[6/10] {FAST_RUN}",
        f"[7/10] {THREAD_SINK}, pass 1/3",
        f"[8/10] {THREAD_BATCHED}, pass 1/3",
    ]
    assert [result.name for result in results] == [spec.name for spec in PRESETS["ceiling"].runs]
    batch_row = results[3]
    assert (batch_row.rate, batch_row.pass_rates, batch_row.order_violations) == (
        120_000.0,
        [100_000.0, 120_000.0, 90_000.0],
        1,  # the second pass's, though the best pass saw none
    )
    assert results[0].pass_rates == [] and results[6].rate == 12_000.0
    assert raw is not None and (raw.rate, raw.pass_rates, raw.warmup_rate) == (
        150_000.0,
        [140_000.0, 150_000.0, 145_000.0],
        300_000.0,
    )
    assert f"    [4/10] {NOOP_BATCH_RUN}, pass 2/3: 120,000 msg/s   violations 1" in said
    assert f"    [4/10] {RAW_LOOP}, warm-up pass: 300,000 msg/s (discarded)   violations 0" in said
    summary = [line for line in said if line.startswith(f"  {NOOP_BATCH_RUN} ")]
    assert summary == [
        f"  {NOOP_BATCH_RUN:<36}    120,000 msg/s, best of 3 (min 90,000, median 100,000, max 120,000)   violations 1"
    ]
    assert f"  {PURE_RUN:<36}     10,000 msg/s   violations 0" in said  # one pass: no spread, no pass line


def test_the_scenarios_do_not_measure_the_raw_loop_again_once_it_ran_beside_the_rows():
    class NoRawAgain(Runner):
        def raw_ceiling(self, label: str) -> RawCeilingResult:
            raise AssertionError("the raw loop was measured a second time")

    raw = RawCeilingResult(100, 1.0, 150_000.0, 0, pass_rates=[150_000.0, 140_000.0, 145_000.0])
    report = BenchReport(machine={}, parameters={}, scenarios=Scenarios(raw_ceiling=raw))
    run_scenarios("127.0.0.1:9", NoRawAgain("127.0.0.1:9", "bench", PRESETS["ceiling"], Progress()), report, Progress())
    assert report.scenarios.raw_ceiling is raw


def row(name: str, rate: float, pass_rates: list[float], handler: str = "sink", batch: int = 1):
    return replace(report_run(name, "key", handler, SINK_WORKERS, rate, batch), pass_rates=pass_rates)


def test_the_targets_compare_best_with_best_and_give_the_medians_ratio():
    runs = [
        row(NOOP_BATCH_RUN, 120_000, [100_000.0, 120_000.0, 90_000.0], "noop-batch", BATCH_SIZE),
        row(THREAD_SINK, 20_000, [18_000.0, 20_000.0, 19_000.0]),
        row(THREAD_BATCHED, 100_000, [100_000.0, 80_000.0, 85_500.0], "sink_batch", BATCH_SIZE),
        row(PROCESS_SINK, 10_000, []),
        row(PROCESS_BATCHED, 40_000, [], "sink_batch", BATCH_SIZE),
    ]
    raw = RawCeilingResult(100, 1.0, 150_000.0, 0, pass_rates=[140_000.0, 150_000.0, 125_000.0])
    report = BenchReport(machine={}, parameters={}, runs=runs, scenarios=Scenarios(raw_ceiling=raw))
    targets = evaluate_targets(report, quick=False)
    batch_target = targets[f"{NOOP_BATCH_RUN} >= 0.8 x the raw loop (best of 3)"]
    assert batch_target == {
        "ok": True,
        "required": False,
        "detail": "0.80 x (best 120,000 vs 150,000 msg/s; medians 0.71 x)",  # 100,000 / 140,000
    }
    assert targets[f"{THREAD_BATCHED} >= 5 x {THREAD_SINK}"]["detail"] == (
        "5.0x (best 100,000 vs 20,000 msg/s; medians 4.5x)"  # 85,500 / 19,000
    )
    # rows of one pass (a --quick run, an older report): no medians to give
    assert targets[f"{PROCESS_BATCHED} >= 5 x {PROCESS_SINK}"]["detail"] == "4.0x (best 40,000 vs 10,000 msg/s)"


def test_a_rows_passes_are_its_best_with_the_spread_in_the_table_and_violations_summed():
    passes = [
        replace(report_run(NOOP_BATCH_RUN, "key", "noop-batch", 16, rate), p50_ms=p50)
        for rate, p50 in ((52_618.44, 4.0), (61_000.06, 3.0), (40_000.0, 5.0))
    ]
    passes[0].order_violations, passes[2].order_violations = 2, 1
    best = best_of_passes(passes)
    assert (best.rate, best.p50_ms, best.order_violations) == (61_000.06, 3.0, 3)
    assert best.pass_rates == [52_618.4, 61_000.1, 40_000.0]
    assert best_of_passes(passes[:1]) is passes[0] and passes[0].pass_rates == []
    with pytest.raises(ValueError, match="at least one pass"):
        best_of_passes([])
    table = markdown_table([best, report_run(NOOP_RUN, "key", "noop", 16, 40_000)])
    assert (
        f"| {NOOP_BATCH_RUN} | noop-batch | 16 | 61,000, best of 3 (min 40,000, median 52,618, max 61,000) | " in table
    )
    assert f"| {NOOP_RUN} | noop | 16 | 40,000 | " in table


def test_reports_from_before_the_passes_load_and_baselines_compare_each_rows_best():
    report = BenchReport(machine={}, parameters={}, runs=[row(THREAD_SINK, 20_000, [18_000.0, 20_000.0, 19_000.0])])
    again = BenchReport.from_json(report.to_json())
    assert again == report
    data = json.loads(report.to_json())
    del data["runs"][0]["pass_rates"]
    old = BenchReport.from_json(json.dumps(data))
    assert old.runs[0].pass_rates == [] and old.runs[0].rate == 20_000
    # --baseline: this run's best pass against the old row's one figure
    assert regressions(again.runs, old.runs, 0.9) == ([(THREAD_SINK, 1.0)], [])
    assert regressions([row(THREAD_SINK, 17_000, [17_000.0, 16_000.0])], old.runs, 0.9)[1] == [(THREAD_SINK, 0.85)]
