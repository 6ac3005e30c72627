"""The catch-up data source's reader against the real broker, without Spark: what one split yields."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from keyorder.catchup.datasource import (
    MARKER_PREFIX,
    SplitReadError,
    arrow_batches,
    arrow_schema,
    partition_route,
    read_split,
)
from keyorder.devtools.loadgen import create_topics

pytestmark = pytest.mark.broker


@pytest.fixture
def topic(broker) -> str:
    name = f"src-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap, [name], 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "batch.num.messages": 1})
    for index in range(30):
        key = None if index % 10 == 9 else f"k{index % 3}".encode()
        producer.produce(
            name,
            key=key,
            value=f"v{index}".encode(),
            partition=0,
            headers=[("trace", f"t{index}".encode()), ("trace", None)],
        )
    assert producer.flush(30) == 0
    return name


def test_a_split_yields_its_range_then_an_end_marker(broker, topic) -> None:
    rows = list(read_split({"bootstrap.servers": broker.bootstrap}, "key", topic, 0, 5, 25, timeout=30))
    records, marker = rows[:-1], rows[-1]
    assert [row[3] for row in records] == list(range(5, 25))  # offsets start..end-1, in order, once
    assert marker[0].startswith(MARKER_PREFIX) and marker[3] == 25 and marker[-1] == 20
    by_offset = {row[3]: row for row in records}
    assert by_offset[7][0] == b"k1" and by_offset[7][4] == b"k1" and by_offset[7][5] == b"v7"
    assert by_offset[9][0] == partition_route(topic, 0) and by_offset[9][4] is None  # keyless: its partition
    assert by_offset[7][6] == [("trace", b"t7"), ("trace", None)]  # headers in order, repeats and nulls kept
    assert all(row[-1] is None for row in records)


def test_partition_ordering_routes_every_record_by_its_partition(broker, topic) -> None:
    rows = list(read_split({"bootstrap.servers": broker.bootstrap}, "partition", topic, 0, 0, 10, timeout=30))
    assert {row[0] for row in rows[:-1]} == {partition_route(topic, 0)}


def test_a_fence_past_the_log_end_fails_the_split(broker, topic) -> None:
    with pytest.raises(SplitReadError, match=r"the log ends at 30, before the fence 40"):
        list(read_split({"bootstrap.servers": broker.bootstrap}, "key", topic, 0, 20, 40, timeout=30))


def test_arrow_batches_keep_every_row_and_the_schema(broker, topic) -> None:
    rows = list(read_split({"bootstrap.servers": broker.bootstrap}, "key", topic, 0, 0, 30, timeout=30))
    batches = list(arrow_batches(iter(rows), size=8))
    assert [batch.num_rows for batch in batches] == [8, 8, 8, 7]
    assert all(batch.schema == arrow_schema() for batch in batches)
    offsets = [offset for batch in batches for offset in batch.column("offset").to_pylist()]
    assert offsets == [*range(30), 30]  # the 30 records, then the marker at the fence
