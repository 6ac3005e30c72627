"""The catch-up reader task's timing without a broker: when its first Arrow batch comes (issue 38).

A by-partition reader task reads several partitions, one consumer each. librdkafka fetches in its own
threads from the moment a consumer is assigned, so the first fetches of a task's partitions can overlap;
the old reader created each partition's consumer only when it asked that partition for its first chunk,
so a task of two partitions waited for two first fetches, one after the other, before its first batch.
The real broker's side is in tests/integration/test_catchup_source.py.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message, TopicPartition

from keyorder.catchup.datasource import Split, read_task
from tests.fakes import FakeClock

FETCH_SECONDS = 0.5
"""How long a new consumer's first fetch takes (the embedded broker took 0.48-0.60 s for the hot-keys
scenario's partitions, a fetch response of about 1 MiB)."""


class FakeRangeConsumer:
    """FAKE confluent_kafka.Consumer (its ``assign``, ``consume`` and ``close`` as in confluent_kafka's
    cimpl.pyi) over one partition of ``records`` records (offsets 0..records-1) on a FakeClock.

    Like librdkafka, it starts fetching when assigned, in the background: its records are there
    ``FETCH_SECONDS`` after ``assign``, whatever the caller does meanwhile. ``consume`` follows
    librdkafka's ``rd_kafka_consume_batch_queue`` (src/rdkafka_queue.c, ``rd_kafka_q_serve_rkmessages``):
    it returns as soon as it has ``num_messages``, or what it has when ``timeout`` runs out (waiting is
    advancing the clock). After the last record comes one end-of-partition event (``enable.partition.eof``),
    as real ``Message`` objects."""

    def __init__(self, config: dict, clock: FakeClock, records: int, opened: list[float]) -> None:
        self.config = config
        self.clock = clock
        self.records = records
        self.opened = opened
        self.ready_at: float | None = None
        self.position = 0
        self.eof_sent = False
        self.closed = False

    def assign(self, partitions: list[TopicPartition]) -> None:
        (assigned,) = partitions
        self.topic, self.partition, self.position = assigned.topic, assigned.partition, assigned.offset
        self.ready_at = self.clock() + FETCH_SECONDS
        self.opened.append(self.clock())

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        assert self.ready_at is not None and not self.closed
        if self.clock() < self.ready_at:
            self.clock.sleep(min(self.ready_at - self.clock(), timeout))
            if self.clock() < self.ready_at:
                return []
        batch = [
            Message(topic=self.topic, partition=self.partition, offset=offset, key=b"k%d" % (offset % 3), value=b"v")
            for offset in range(self.position, min(self.position + num_messages, self.records))
        ]
        self.position += len(batch)
        if len(batch) < num_messages and self.position == self.records and not self.eof_sent:
            self.eof_sent = True
            eof = KafkaError(KafkaError._PARTITION_EOF)
            batch.append(Message(topic=self.topic, partition=self.partition, offset=self.records, error=eof))
        return batch

    def close(self) -> None:
        self.closed = True


def test_a_two_partition_task_yields_its_first_batch_after_one_first_fetch_not_two() -> None:
    clock = FakeClock(start=0.0)
    opened: list[float] = []
    consumers: list[FakeRangeConsumer] = []

    def factory(config: dict) -> FakeRangeConsumer:
        consumers.append(FakeRangeConsumer(config, clock, 10, opened))
        return consumers[-1]

    splits = [Split("t", 0, 0, 10, source=0), Split("t", 1, 0, 10, source=1)]
    batches = read_task(
        {}, "key", splits, timeout=30, chunk_rows=4, consumer_factory=factory, clock=clock, sleep=clock.sleep
    )

    first = next(batches)
    assert clock.now == FETCH_SECONDS, f"first batch at {clock.now} s: the partitions' first fetches did not overlap"
    assert opened == [0.0, 0.0]  # both consumers assigned before the task waited for any record
    rest = list(batches)
    rows = [row for batch in [first, *rest] for row in batch.to_pylist()]
    for source in (0, 1):  # each partition in offset order, once, then its end marker
        assert [r["offset"] for r in rows if r["source"] == source and r["marker_read"] is None] == list(range(10))
        assert [r["marker_read"] for r in rows if r["source"] == source and r["marker_read"] is not None] == [10]
    assert all(consumer.closed for consumer in consumers)


def test_an_abandoned_task_closes_the_consumers_it_opened() -> None:
    """Spark stops asking a failed or cancelled task for batches: every consumer opened is closed,
    the one already read from and the one only assigned."""
    clock = FakeClock(start=0.0)
    consumers: list[FakeRangeConsumer] = []

    def factory(config: dict) -> FakeRangeConsumer:
        consumers.append(FakeRangeConsumer(config, clock, 10, []))
        return consumers[-1]

    splits = [Split("t", 0, 0, 10, source=0), Split("t", 1, 0, 10, source=1)]
    batches = read_task(
        {}, "key", splits, timeout=30, chunk_rows=4, consumer_factory=factory, clock=clock, sleep=clock.sleep
    )
    next(batches)
    batches.close()  # type: ignore[attr-defined]
    assert len(consumers) == 2 and all(consumer.closed for consumer in consumers)


class FailingRangeConsumer(FakeRangeConsumer):
    """A FakeRangeConsumer whose ``consume`` raises (a broker connection lost under the client: the
    error a failed read task dies of), and whose ``close`` raises too when ``close_fails``."""

    def __init__(self, *args: object, close_fails: bool = False) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.close_fails = close_fails

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        raise RuntimeError(f"partition {self.partition}: connection lost")

    def close(self) -> None:
        super().close()
        if self.close_fails:
            raise RuntimeError("close failed")


def test_a_task_whose_first_partition_fails_closes_every_consumer_it_opened() -> None:
    """The first stream fails on its first chunk, before the others were asked for one: each opened
    consumer (the later ones only assigned) is closed by the time the error reaches the caller, though
    the caller still holds the error's traceback (the frames and their locals)."""
    clock = FakeClock(start=0.0)
    consumers: list[FakeRangeConsumer] = []

    def factory(config: dict) -> FakeRangeConsumer:
        kind = FailingRangeConsumer if not consumers else FakeRangeConsumer
        consumers.append(kind(config, clock, 10, []))
        return consumers[-1]

    splits = [Split("t", p, 0, 10 - p, source=p) for p in range(3)]
    batches = read_task(
        {}, "key", splits, timeout=30, chunk_rows=4, consumer_factory=factory, clock=clock, sleep=clock.sleep
    )
    with pytest.raises(RuntimeError, match="partition 0: connection lost") as failure:
        next(batches)
    assert len(consumers) == 3
    assert [consumer.closed for consumer in consumers] == [True, True, True], failure.traceback


def test_a_consumer_whose_close_fails_leaves_the_others_closed_and_the_tasks_error_raised() -> None:
    clock = FakeClock(start=0.0)
    consumers: list[FakeRangeConsumer] = []

    def factory(config: dict) -> FakeRangeConsumer:
        # the first fails to read; the second fails to close; the third must still be closed
        consumers.append(FailingRangeConsumer(config, clock, 10, [], close_fails=len(consumers) == 1))
        return consumers[-1]

    splits = [Split("t", p, 0, 10 - p, source=p) for p in range(3)]
    batches = read_task(
        {}, "key", splits, timeout=30, chunk_rows=4, consumer_factory=factory, clock=clock, sleep=clock.sleep
    )
    with pytest.raises(RuntimeError, match="partition 0: connection lost"):
        next(batches)
    assert [consumer.closed for consumer in consumers] == [True, True, True]
