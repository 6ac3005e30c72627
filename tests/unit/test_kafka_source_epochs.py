"""KafkaSource and leader epochs (KIP-320): records carry theirs, commits and resume seeks send one, and a
truncation librdkafka could not reset is said plainly.

No broker: the consumer behind ``KafkaSource`` is replaced by a FAKE one that hands out FAKE records and
records the commits and seeks it is asked for.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

from keyorder.adapters.kafka_source import LOG_TRUNCATED_NO_RESET, KafkaSource
from keyorder.contracts import FetchPosition
from keyorder.core import offset_metadata
from tests.fakes import FakeClock


class FakeRecord:
    """FAKE confluent-kafka record: the accessors ``KafkaSource.consume`` reads."""

    def __init__(self, offset: int, leader_epoch: int | None) -> None:
        self._offset, self._leader_epoch = offset, leader_epoch

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def headers(self) -> None:
        return None

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"{}"

    def leader_epoch(self) -> int | None:
        return self._leader_epoch


class FakeConsumer:
    """FAKE confluent-kafka consumer: hands out ``records`` once; records commits, resumes and seeks."""

    def __init__(self) -> None:
        self.records: list[Any] = []
        self.commits: list[list[TopicPartition]] = []
        self.seeks: list[TopicPartition] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        return object()

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        records, self.records = self.records, []
        return records

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition] | None:
        self.commits.append(offsets)
        return None if asynchronous else offsets

    def resume(self, partitions: list[TopicPartition]) -> None:
        pass

    def seek(self, partition: TopicPartition) -> None:
        self.seeks.append(partition)


@pytest.fixture
def source() -> Any:
    real = KafkaSource({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, clock=FakeClock())
    real_consumer, fake = real._consumer, FakeConsumer()
    real._consumer = fake  # type: ignore[assignment]
    yield real, fake
    real_consumer.close()


def test_a_record_carries_its_leader_epoch_and_none_when_the_broker_gave_none(source: Any) -> None:
    kafka, fake = source
    fake.records = [FakeRecord(5, 3), FakeRecord(6, None), FakeRecord(7, -1)]
    messages = kafka.consume(10, 0.0)
    assert [(message.offset, message.leader_epoch) for message in messages] == [(5, 3), (6, None), (7, None)]


def test_a_commit_carries_the_leader_epoch_its_metadata_records(source: Any) -> None:
    kafka, fake = source
    with_epoch = offset_metadata.encode(10, [12], leader_epoch=4)
    without = offset_metadata.encode(20, [21])
    kafka.commit({("orders", 0): (10, with_epoch), ("orders", 1): (20, without)}, asynchronous=True)
    (sent,) = fake.commits
    assert [(tp.partition, tp.offset, tp.metadata, tp.leader_epoch) for tp in sent] == [
        (0, 10, with_epoch, 4),
        (1, 20, without, None),
    ], "librdkafka stores the epoch with the offset, and validates a position that carries one"


def test_a_resume_seeks_with_the_leader_epoch_of_the_last_record(source: Any) -> None:
    kafka, fake = source
    kafka.resume({("orders", 0): FetchPosition(42, 7), ("orders", 1): FetchPosition(3), ("orders", 2): None})
    assert [(tp.partition, tp.offset, tp.leader_epoch) for tp in fake.seeks] == [(0, 42, 7), (1, 3, None)], (
        "a seek with an epoch is validated against a truncation while the partition was paused"
    )


@pytest.mark.parametrize("code", [KafkaError._AUTO_OFFSET_RESET, KafkaError._LOG_TRUNCATION])
def test_a_truncation_librdkafka_did_not_reset_is_an_error_line_not_a_fatal_error(
    code: int, caplog: pytest.LogCaptureFixture
) -> None:
    error = KafkaError(code, "Partition log truncation detected at offset 12 (leader epoch 3)", fatal=False)
    with caplog.at_level(logging.WARNING, logger="keyorder.adapters.kafka_source"):
        KafkaSource._consume_error(error)  # no SourceError: the pod goes on with its other partitions
    (line,) = caplog.records
    assert line.levelno == logging.ERROR
    assert line.getMessage() == LOG_TRUNCATED_NO_RESET % error.str()
    assert "auto.offset.reset" in line.getMessage()
