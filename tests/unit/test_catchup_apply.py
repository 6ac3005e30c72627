"""ApplyHandler without Spark: batches shaped like the sorted Spark partition it receives."""

from __future__ import annotations

import pandas
import pytest

from keyorder.catchup.apply import ApplyHandler, OrderViolation
from keyorder.catchup.datasource import MARKER_PREFIX
from keyorder.core.retry import RetryPolicy
from tests.guarantees import assert_key_order
from tests.unit import catchup_handlers

COLUMNS = ["route", "topic", "partition", "offset", "key", "value", "headers", "timestamp", "marker_read"]


def batch(rows: list[tuple]) -> pandas.DataFrame:
    frame = pandas.DataFrame(rows, columns=COLUMNS)
    frame["marker_read"] = frame["marker_read"].astype("Int64")  # nullable, as Arrow hands it over
    return frame


def sorted_partition(keys: int, per_key: int, batch_rows: int) -> list[pandas.DataFrame]:
    """Rows sorted by (route, topic, partition, offset), cut into batches, then one end marker."""
    rows = []
    for index in range(keys):  # key i's n-th message sits at offset i + n * keys: keys interleave in the log
        key = f"k{index:03d}".encode()
        for sequence in range(per_key):
            rows.append((key, "t", 0, index + sequence * keys, key, str(sequence).encode(), [], 1.0, None))
    rows.sort(key=lambda row: (row[0], row[1], row[2], row[3]))
    rows.append((MARKER_PREFIX + b"t:0:0", "t", 0, keys * per_key, None, None, [], None, keys * per_key))
    return [batch(rows[start : start + batch_rows]) for start in range(0, len(rows), batch_rows)]


@pytest.mark.parametrize("handler", ["slow", "slow_async"])
def test_keys_run_in_parallel_each_in_order_across_batch_boundaries(handler: str) -> None:
    catchup_handlers.reset()
    apply = ApplyHandler(
        handler=f"tests.unit.catchup_handlers:{handler}",
        policy=RetryPolicy(max_attempts=1),
        dlq_topic="unused",
        task_workers=8,
    )
    (summary,) = list(apply(iter(sorted_partition(keys=40, per_key=5, batch_rows=37))))  # runs cross batches

    assert_key_order(catchup_handlers.RECORDS)
    assert len(catchup_handlers.RECORDS) == 200
    assert catchup_handlers.SERIAL.violations == 0  # never two messages of one key at once
    assert catchup_handlers.SERIAL.peak > 1  # but different keys at once
    assert summary.to_dict("records") == [
        {"topic": "t", "partition": 0, "read": 200, "splits": 1, "processed": 200, "dead_lettered": 0, "violations": 0}
    ]


def test_an_out_of_order_row_stops_the_task_before_its_handler_runs() -> None:
    catchup_handlers.reset()
    rows = [(b"a", "t", 0, 5, b"a", b"0", [], None, None), (b"a", "t", 0, 3, b"a", b"1", [], None, None)]
    apply = ApplyHandler(
        handler="tests.unit.catchup_handlers:slow",
        policy=RetryPolicy(max_attempts=1),
        dlq_topic="unused",
        task_workers=4,
    )
    with pytest.raises(OrderViolation, match=r"t\[0\]@3 arrived after t\[0\]@5"):
        list(apply(iter([batch(rows)])))
    assert catchup_handlers.RECORDS == []  # the batch is checked before any of it is handled
