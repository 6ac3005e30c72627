"""A Spark 4 Python Data Source that reads fenced offset ranges of Kafka partitions.

Spark's own Kafka connector is a JVM jar; this reader needs only confluent-kafka, on the
executors' Python. Each input split is one ``(topic, partition, start, end)``. The reader assigns
the partition at ``start``, reads up to the fence ``end`` (excluded), and then emits one *end
marker* row with the number of records it read, so the driver can prove every split reached its
fence. Clients are created inside ``read()``: confluent-kafka objects do not pickle.

Rows carry ``route``: the bytes that decide which messages must stay in order. In key ordering
that is the key (keyless records fall back to their partition, as in the pods); in partition
ordering it is the partition.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any, cast

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

SOURCE_NAME = "keyorder_kafka_ranges"
ROW_SCHEMA = (
    "route binary, topic string, partition int, offset long, key binary, value binary, "
    "headers array<struct<name: string, value: binary>>, timestamp double, marker_read long"
)
"""``marker_read`` is null on records and set on a split's end marker (then key/value are null)."""
OPTION_SPLITS = "splits"
OPTION_PROPERTIES = "kafka.properties.secret"  # "secret" in the name: Spark redacts it in plans and the UI
OPTION_ORDERING = "ordering"
OPTION_TIMEOUT = "read.timeout.seconds"
MARKER_PREFIX = b"\x00marker:"
KEYLESS_PREFIX = b"\x00partition:"


class SplitReadError(RuntimeError):
    """A split could not be read up to its fence (the job fails; nothing is committed)."""


def partition_route(topic: str, partition: int) -> bytes:
    return KEYLESS_PREFIX + f"{topic}:{partition}".encode()


def route_of(ordering: str, topic: str, partition: int, key: bytes | None) -> bytes:
    """Messages with equal routes are handled one at a time in (partition, offset) order."""
    if ordering == "partition" or key is None:
        return partition_route(topic, partition)
    return key


class KafkaRangeDataSource(DataSource):
    """``spark.read.format("keyorder_kafka_ranges").option("splits", json)...load()``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return ROW_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaRangeReader(self.options)


class KafkaRangeReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.splits = json.loads(options[OPTION_SPLITS])
        self.properties = json.loads(options.get(OPTION_PROPERTIES, "{}"))
        self.ordering = options.get(OPTION_ORDERING, "key")
        self.timeout = float(options.get(OPTION_TIMEOUT, "120"))

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(split) for split in self.splits]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        topic, number, start, end = partition.value
        yield from arrow_batches(read_split(self.properties, self.ordering, topic, number, start, end, self.timeout))


ARROW_BATCH_ROWS = 2_000


def arrow_schema():
    import pyarrow

    return pyarrow.schema(
        [
            ("route", pyarrow.binary()),
            ("topic", pyarrow.string()),
            ("partition", pyarrow.int32()),
            ("offset", pyarrow.int64()),
            ("key", pyarrow.binary()),
            ("value", pyarrow.binary()),
            ("headers", pyarrow.list_(pyarrow.struct([("name", pyarrow.string()), ("value", pyarrow.binary())]))),
            ("timestamp", pyarrow.float64()),
            ("marker_read", pyarrow.int64()),
        ]
    )


def arrow_batches(rows: Iterator[tuple], size: int = ARROW_BATCH_ROWS) -> Iterator[Any]:
    """Rows as Arrow record batches: Spark takes them without converting row by row."""
    import pyarrow

    schema = arrow_schema()

    def batch(columns: list[list]) -> Any:
        arrays = [pyarrow.array(column, type=field.type) for column, field in zip(columns, schema, strict=True)]
        return pyarrow.RecordBatch.from_arrays(arrays, schema=schema)

    columns: list[list] = [[] for _ in schema.names]
    for row in rows:
        for column, value in zip(columns, row, strict=True):
            column.append(value)
        if len(columns[0]) >= size:
            yield batch(columns)
            columns = [[] for _ in schema.names]
    if columns[0]:
        yield batch(columns)


def read_split(
    properties: dict[str, str], ordering: str, topic: str, partition: int, start: int, end: int, timeout: float
) -> Iterator[tuple]:
    """Rows of records at offsets ``start <= offset < end``, then the split's end marker."""
    import logging

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **properties,
            "group.id": "keyorder-catchup-reader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "logger": logging.getLogger("keyorder.librdkafka"),
        }
    )
    read = 0
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        position = start
        quiet_since = time.monotonic()
        while position < end:
            batch = consumer.consume(num_messages=1000, timeout=1.0)
            if not batch:
                if time.monotonic() - quiet_since > timeout:
                    raise SplitReadError(
                        f"{topic}[{partition}]: no records for {timeout}s at offset {position}, before the fence {end}"
                    )
                continue
            quiet_since = time.monotonic()
            for record in batch:
                error = record.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        eof_offset = record.offset()
                        if eof_offset is None:
                            raise SplitReadError(f"{topic}[{partition}]: end-of-partition event without an offset")
                        position = max(position, eof_offset)
                        if position < end:  # the end offset moved back (topic recreated?) or log truncated
                            raise SplitReadError(
                                f"{topic}[{partition}]: the log ends at {position}, before the fence {end}"
                            )
                        continue
                    raise SplitReadError(f"{topic}[{partition}]: {error.str()}")
                offset = record.offset()
                if offset is None:  # only error events lack one
                    raise SplitReadError(f"{topic}[{partition}]: record without an offset")
                position = offset + 1
                if offset >= end:
                    break
                key = record.key()
                timestamp_type, timestamp_ms = record.timestamp()
                # The stub's HeadersType also covers what produce() accepts (a dict); a consumed
                # record's headers are always a list of (name, bytes or None).
                record_headers = cast("list[tuple[str, bytes | None]] | None", record.headers())
                headers = [(name, value) for name, value in (record_headers or [])]
                read += 1
                yield (
                    route_of(ordering, topic, partition, key),
                    topic,
                    partition,
                    offset,
                    key,
                    record.value(),
                    headers,
                    timestamp_ms / 1000 if timestamp_type and timestamp_ms >= 0 else None,
                    None,
                )
    finally:
        consumer.close()
    marker = MARKER_PREFIX + f"{topic}:{partition}:{start}".encode()
    yield (marker, topic, partition, end, None, None, [], None, read)
