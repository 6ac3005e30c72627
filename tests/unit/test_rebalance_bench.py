"""The rebalance bench's pure figures: stalls, waits and the delivery audit from handler-call records."""

from __future__ import annotations

import argparse

import pytest

from keyorder.devtools.rebalance_bench import (
    StepFigures,
    add_rebalance_bench_flags,
    delivery_audit,
    longest_gap,
    parse_options,
    step_figures,
)


def test_longest_gap_counts_the_window_edges() -> None:
    assert longest_gap([2.0, 3.0, 9.0], 0.0, 10.0) == 6.0
    assert longest_gap([], 5.0, 7.5) == 2.5  # nothing at all: the whole window
    assert longest_gap([1.0, 20.0], 2.0, 4.0) == 2.0  # calls outside the window do not count


def calls(pod_times: list[float], partition: int, key: str = "k") -> list[tuple[float, str, int, int]]:
    return [(t, key, seq, partition) for seq, t in enumerate(pod_times)]


def test_a_step_where_the_old_pod_keeps_running_and_a_moved_partition_waits() -> None:
    # pod a runs partition 0 every 0.1 s throughout; partition 1 is a's until 10.0, then nobody's
    # until pod b (started at 10.0) takes it at 13.0
    steady = [round(i * 0.1, 1) for i in range(200)]
    a = calls(steady, 0, "x") + calls([round(i * 0.1, 1) for i in range(100)], 1, "y")
    b = calls([round(13.0 + i * 0.1, 1) for i in range(70)], 1, "z")
    figures = step_figures({"a": a, "b": b}, {"a": 0.0, "b": 10.0}, [(0.0, 1), (10.0, 2)], end=19.95)
    first, second = figures
    assert first == StepFigures(0, 1, group_stall=0.1, kept_pod_stall=0.0, partition_wait=0.1, calls=200)
    assert (second.pods_before, second.pods_after) == (1, 2)
    assert second.group_stall == pytest.approx(0.1)
    assert second.kept_pod_stall == pytest.approx(0.1)  # a never stopped
    assert second.partition_wait == pytest.approx(3.0)  # partition 1: nothing from the step (10.0) to 13.0


def test_an_eager_step_stops_the_old_pod_and_the_group() -> None:
    a = calls([1.0, 2.0, 3.0, 7.0, 8.0], 0)
    figures = step_figures({"a": a}, {"a": 0.0}, [(0.0, 1), (2.5, 2)], end=8.0)
    assert (figures[1].group_stall, figures[1].kept_pod_stall) == (4.0, 4.0)


def test_delivery_audit_counts_redeliveries_and_gaps_by_start_time() -> None:
    records = [(0.0, "k", 0, 0), (1.0, "k", 1, 0), (2.0, "k", 1, 0), (3.0, "k", 2, 0), (4.0, "j", 1, 1)]
    assert delivery_audit(records) == (1, 1)  # k's seq 1 twice; j starts at 1, not 0


def parsed(*argv: str):
    parser = argparse.ArgumentParser()
    add_rebalance_bench_flags(parser)
    return parse_options(parser.parse_args(list(argv)))


def test_defaults_grow_1_2_4_8_on_8_partitions_both_strategies() -> None:
    options, strategies = parsed()
    assert (options.steps, options.partitions, strategies) == ((1, 2, 4, 8), 8, ["eager", "cooperative"])


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--steps", "1,x"], "--steps must be comma-separated"),
        (["--steps", "2,1"], "--steps must be increasing"),
        (["--steps", "1,16"], "--partitions is 8"),
        (["--strategies", "sticky"], "--strategies: unknown ['sticky']"),
        (["--step-seconds", "0"], "--step-seconds must be positive"),
        (["--workers", "0"], "--workers must be at least 1"),
    ],
)
def test_bad_flags_are_named(argv: list[str], names: str) -> None:
    with pytest.raises(ValueError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parsed(*argv)
