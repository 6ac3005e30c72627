"""The catch-up data source's reader against the real broker, without Spark: what one split yields."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer

from keyorder.catchup.datasource import (
    PROGRESS_SCALE,
    Split,
    SplitReadError,
    arrow_schema,
    lane_hash,
    partition_route,
    read_split,
    read_task,
    record_lane,
)
from keyorder.devtools.loadgen import create_topics
from tests.fakes import FakeClock
from tests.support import EXACT_END_OFFSETS

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
    split = Split(topic, 0, 5, 25, source=3, range_start=5, range_end=45)  # the first half of its wave's range
    rows = list(read_split({"bootstrap.servers": broker.bootstrap}, "key", split, timeout=30))
    records, marker = rows[:-1], rows[-1]
    assert [row[3] for row in records] == list(range(5, 25))  # offsets start..end-1, in order, once
    assert marker[1:4] == (3, PROGRESS_SCALE, 25) and marker[-2:] == (20, 0)  # sorts after every record
    assert all(row[1] == 3 for row in records)  # the plan's index of the partition, not its name
    progress = [row[2] for row in records]
    assert progress == sorted(progress) and progress[0] == 0 and progress[-1] < PROGRESS_SCALE // 2
    by_offset = {row[3]: row for row in records}
    assert by_offset[7][0] == record_lane(topic, 0, b"k1") != lane_hash(b"k1")  # the key within its partition
    assert by_offset[7][4] == b"k1" and by_offset[7][5] == b"v7"
    assert by_offset[9][0] == lane_hash(partition_route(topic, 0)) and by_offset[9][4] is None  # keyless
    assert by_offset[7][6] == [("trace", b"t7"), ("trace", None)]  # headers in order, repeats and nulls kept
    assert all(row[-2] is None and row[-1] is None for row in records)


def test_offsets_the_group_finished_are_read_and_counted_but_never_yielded(broker, topic) -> None:
    """The split's skip runs (the commit metadata's finished offsets): counted in the end marker, so the
    audit still sees every offset of the range, and never handed to a handler."""
    split = Split(topic, 0, 5, 25, skip=[[7, 10], [24, 25]])
    rows = list(read_split({"bootstrap.servers": broker.bootstrap}, "key", split, timeout=30))
    records, marker = rows[:-1], rows[-1]
    assert [row[3] for row in records] == [5, 6, *range(10, 24)]
    assert marker[-2:] == (16, 4)  # 16 read (to handle), 4 skipped: 20 offsets accounted for


def test_partition_ordering_routes_every_record_by_its_partition(broker, topic) -> None:
    rows = list(read_split({"bootstrap.servers": broker.bootstrap}, "partition", Split(topic, 0, 0, 10), timeout=30))
    assert {row[0] for row in rows[:-1]} == {lane_hash(partition_route(topic, 0))}


def test_a_fence_past_the_log_end_fails_the_split(broker, topic) -> None:
    with pytest.raises(SplitReadError, match=r"the log ends at 30, before the fence 40"):
        list(read_split({"bootstrap.servers": broker.bootstrap}, "key", Split(topic, 0, 20, 40), timeout=30))


def test_a_task_reads_its_partitions_interleaved_each_in_offset_order(broker) -> None:
    """A by-partition task's input: every record and every split's end marker once, each partition's
    offsets increasing across its splits, the partitions interleaved chunk by chunk by progress."""
    name = f"src-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap, [name], 2)
    producer = Producer({"bootstrap.servers": broker.bootstrap, **EXACT_END_OFFSETS})
    for partition, count in ((0, 30), (1, 12)):
        for index in range(count):
            producer.produce(name, key=f"k{index}".encode(), value=b"v", partition=partition)
    assert producer.flush(30) == 0
    splits = [
        Split(name, 1, 0, 12, source=1),
        Split(name, 0, 15, 30, source=0, range_start=0, range_end=30),  # out of order: read after 0..15
        Split(name, 0, 0, 15, source=0, range_start=0, range_end=30),
    ]
    batches = list(read_task({"bootstrap.servers": broker.bootstrap}, "key", splits, timeout=30, chunk_rows=4))
    assert all(batch.schema == arrow_schema() for batch in batches)
    columns = [[batch.column(n).to_pylist() for n in arrow_schema().names] for batch in batches]
    rows = [row for batch in columns for row in zip(*batch, strict=True)]
    records = [(row[1], row[3]) for row in rows if row[8] is None]
    assert [offset for source, offset in records if source == 0] == list(range(30))
    assert [offset for source, offset in records if source == 1] == list(range(12))
    markers = sorted((row[1], row[3], row[8]) for row in rows if row[8] is not None)
    assert markers == [(0, 15, 15), (0, 30, 15), (1, 12, 12)]  # (source, fence, read) of each split
    sources = [batch.column("source")[0].as_py() for batch in batches]
    first = {source: sources.index(source) for source in (0, 1)}
    last = {source: len(sources) - 1 - sources[::-1].index(source) for source in (0, 1)}
    assert max(first.values()) < min(last.values()), sources  # interleaved, not one partition after the other


class FlakyConsumer:
    """A consumer that first reports transient errors, then delegates to the real one."""

    def __init__(self, config: dict, errors: list) -> None:
        from confluent_kafka import Consumer

        self.config = config
        self.real = Consumer(config)
        self.errors = errors

    def assign(self, partitions) -> None:
        self.real.assign(partitions)

    def consume(self, num_messages: int, timeout: float):
        if self.errors:
            return [ErrorEvent(self.errors.pop(0))]
        return self.real.consume(num_messages=num_messages, timeout=timeout)

    def close(self) -> None:
        self.real.close()


class ErrorEvent:
    def __init__(self, error) -> None:
        self._error = error

    def error(self):
        return self._error


def test_transient_read_errors_are_retried_within_a_bound_and_prefetch_is_bounded(broker, topic) -> None:
    from confluent_kafka import KafkaError

    made: list[FlakyConsumer] = []

    def flaky(errors: list):
        def factory(config: dict) -> FlakyConsumer:
            made.append(FlakyConsumer(config, errors))
            return made[-1]

        return factory

    pauses: list[float] = []
    transient = [KafkaError(KafkaError._TRANSPORT, "broker went away"), KafkaError(KafkaError._ALL_BROKERS_DOWN)]
    rows = list(
        read_split(
            {"bootstrap.servers": broker.bootstrap},
            "key",
            Split(topic, 0, 0, 30),
            timeout=30,
            consumer_factory=flaky(transient),
            sleep=pauses.append,
        )
    )
    assert [row[3] for row in rows[:-1]] == list(range(30)) and rows[-1][-2] == 30
    assert len(pauses) == 2 and pauses[0] < pauses[1]  # retried with a growing pause
    assert made[0].config["queued.max.messages.kbytes"] == 4096  # not librdkafka's 64 MiB past the fence

    # An outage is bounded by time (the read timeout), not by a count of errors: 100 errors in a row
    # within it are retried (a count of 30 used to fail the split after about a minute).
    clock = FakeClock(start=0.0)
    outage = [KafkaError(KafkaError._TRANSPORT, "down for a while")] * 100
    rows = list(
        read_split(
            {"bootstrap.servers": broker.bootstrap},
            "key",
            Split(topic, 0, 0, 30),
            600,
            flaky(outage),
            clock.sleep,
            clock,
        )
    )
    assert [row[3] for row in rows[:-1]] == list(range(30))
    assert 100 < clock.now < 600  # pauses growing to 2 s: ~3 minutes of broker outage survived

    clock = FakeClock(start=0.0)
    endless = [KafkaError(KafkaError._TRANSPORT, "still down")] * 1000
    with pytest.raises(SplitReadError, match=r"no record for 30s at offset 0, \d+ read errors in a row, .*still down"):
        list(
            read_split(
                {"bootstrap.servers": broker.bootstrap},
                "key",
                Split(topic, 0, 0, 30),
                30,
                flaky(endless),
                clock.sleep,
                clock,
            )
        )
    assert 30 < clock.now <= 33  # gave up once the read timeout had passed, not before
    permanent = [KafkaError(KafkaError.OFFSET_OUT_OF_RANGE, "gone")]
    with pytest.raises(SplitReadError, match="gone"):
        list(
            read_split(
                {"bootstrap.servers": broker.bootstrap},
                "key",
                Split(topic, 0, 0, 30),
                30,
                flaky(permanent),
                pauses.append,
            )
        )
