"""The fence's cost measurement (keyorder.devtools.catchup_bench_fence): its input has the reader's shape,
and both of its runs handle it, the fenced one through the driver's listener."""

from __future__ import annotations

import pyarrow

from keyorder.devtools.catchup_bench_fence import measure, task_frames


def test_the_task_input_is_shaped_as_a_by_partition_reader_hands_it_over() -> None:
    frames = task_frames(per_hot=30, hot_keys=2, light_keys=10, per_light=3, partitions=2)
    rows = pyarrow.Table.from_batches(frames).to_pylist()
    records = [row for row in rows if row["marker_read"] is None]
    markers = [row for row in rows if row["marker_read"] is not None]

    assert len(records) == 2 * 30 + 10 * 3
    homes: dict[bytes, set[int]] = {}
    for row in records:
        homes.setdefault(row["key"], set()).add(row["source"])
    assert all(len(sources) == 1 for sources in homes.values())  # a key lives in one partition
    for source in (0, 1):
        offsets = [row["offset"] for row in records if row["source"] == source]
        assert offsets == list(range(len(offsets)))  # each partition in offset order, no gap
    assert {(row["source"], row["marker_read"]) for row in markers} == {
        (source, sum(1 for row in records if row["source"] == source)) for source in (0, 1)
    }
    assert [(row["progress"], row["source"], row["offset"]) for row in rows] == sorted(
        (row["progress"], row["source"], row["offset"]) for row in rows
    )


def test_both_runs_handle_the_input_and_the_fenced_one_reports_to_the_listener() -> None:
    cost = measure(per_hot=20, rounds=1, workers=4, light_keys=10)  # raises when the listener heard nothing

    assert len(cost.fenced) == len(cost.unfenced) == 1
    assert cost.chain_seconds > 0
