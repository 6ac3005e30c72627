"""ApplyHandler without Spark: batches shaped like the sorted Spark partition it receives."""

from __future__ import annotations

import pandas
import pytest

from keyorder.catchup.apply import ApplyHandler, OrderViolation
from keyorder.catchup.datasource import PROGRESS_SCALE, lane_hash, progress_of
from keyorder.core.retry import RetryPolicy
from tests.guarantees import assert_key_order
from tests.unit import catchup_handlers

COLUMNS = [
    "lane",
    "source",
    "progress",
    "offset",
    "key",
    "value",
    "headers",
    "timestamp",
    "marker_read",
    "marker_skipped",
]


def batch(rows: list[tuple]) -> pandas.DataFrame:
    frame = pandas.DataFrame(rows, columns=COLUMNS)
    for column in ("marker_read", "marker_skipped"):
        frame[column] = frame[column].astype("Int64")  # nullable, as Arrow hands it over
    return frame


def sorted_partition(messages: list[bytes], batch_rows: int, sources: int = 1) -> list[pandas.DataFrame]:
    """Messages spread round-robin over ``sources`` partitions, sorted by (progress, source, offset) as
    Spark hands them over, cut into batches; one end marker per source. A key's n-th message carries n."""
    per_source: list[list[tuple]] = [[] for _ in range(sources)]
    sequences: dict[bytes, int] = {}
    for index, key in enumerate(messages):
        source = index % sources if sources > 1 else 0
        sequence = sequences[key] = sequences.get(key, -1) + 1
        per_source[source].append((key, str(sequence).encode()))
    rows = []
    for source, records in enumerate(per_source):
        for offset, (key, value) in enumerate(records):
            progress = progress_of(offset, 0, len(records))
            rows.append((lane_hash(key), source, progress, offset, key, value, [], 1.0, None, None))
        rows.append((0, source, PROGRESS_SCALE, len(records), None, None, [], None, len(records), 0))
    rows.sort(key=lambda row: (row[2], row[1], row[3]))
    return [batch(rows[start : start + batch_rows]) for start in range(0, len(rows), batch_rows)]


def apply(handler: str, workers: int, sources: int = 1) -> ApplyHandler:
    return ApplyHandler(
        handler=f"tests.unit.catchup_handlers:{handler}",
        policy=RetryPolicy(max_attempts=1),
        dlq_topic="unused",
        sources=[("t", index) for index in range(sources)],
        task_workers=workers,
    )


@pytest.mark.parametrize("handler", ["slow", "slow_async"])
def test_keys_run_in_parallel_each_in_order_across_batch_boundaries(handler: str) -> None:
    catchup_handlers.reset()
    messages = [f"k{index % 40:03d}".encode() for index in range(200)]
    (summary,) = list(apply(handler, 8)(iter(sorted_partition(messages, batch_rows=37))))

    assert_key_order(catchup_handlers.RECORDS)
    assert len(catchup_handlers.RECORDS) == 200
    assert catchup_handlers.SERIAL.violations == 0  # never two messages of one key at once
    assert catchup_handlers.SERIAL.peak > 1  # but different keys at once
    assert summary.drop(columns=["dead_letter_offsets"]).to_dict("records") == [
        {
            "topic": "t",
            "partition": 0,
            "read": 200,
            "skipped": 0,
            "splits": 1,
            "processed": 200,
            "dead_lettered": 0,
            "violations": 0,
            "task": 0,
            "attempt": 0,
        }
    ]


def test_a_hot_key_takes_one_thread_while_the_other_keys_pass_it() -> None:
    """One key with 150 messages among 300 light keys, on 3 partitions: the old batch barrier ran the hot
    key's batches on one thread; lanes let the light keys finish long before the hot key does."""
    catchup_handlers.reset()
    hot = [b"hot"] * 150
    light = [f"light{index}".encode() for index in range(300)]
    messages = [item for pair in zip(hot, light[:150], strict=True) for item in pair] + light[150:]
    summaries = list(apply("slow", 8, sources=3)(iter(sorted_partition(messages, batch_rows=50, sources=3))))

    assert sum(summaries[0]["processed"]) == 450
    assert_key_order(catchup_handlers.RECORDS)
    assert catchup_handlers.SERIAL.violations == 0
    finished = [key for key, _ in catchup_handlers.RECORDS]
    last_light = max(index for index, key in enumerate(finished) if key != "hot")
    hot_done_by_then = finished[: last_light + 1].count("hot")
    assert hot_done_by_then < 120, hot_done_by_then  # the light keys did not wait for the hot key


def test_an_out_of_order_row_stops_the_task_before_its_handler_runs() -> None:
    catchup_handlers.reset()
    rows = [(1, 0, 0, 5, b"a", b"0", [], None, None, None), (1, 0, 1, 3, b"a", b"1", [], None, None, None)]
    with pytest.raises(OrderViolation, match=r"t\[0\]@3 arrived after t\[0\]@5"):
        list(apply("slow", 4)(iter([batch(rows)])))
    assert catchup_handlers.RECORDS == []  # the batch is checked before any of it is handled
