"""The Kafka side of a pod: consume, pause/resume, commit, rebalance callbacks.

Everything confluent-kafka specific is here, behind the small ``contracts.Source`` protocol, so the runtime
can be reasoned about (and another broker plugged in) without librdkafka details. Threading:
every method is called from the poll-loop thread, and the rebalance callbacks run inside
``consume`` on that same thread; only ``high_watermark`` may be called from elsewhere (it reads
librdkafka's cache).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

from keyorder.contracts import CommitError, CommitOutcome, RebalanceCallback, SourceError, TopicPartitionId
from keyorder.message import Message

log = logging.getLogger(__name__)


class KafkaSource:
    """A confluent-kafka consumer in a consumer group with manual commits."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.on_commit_result: Callable[[list[CommitOutcome]], None] | None = None
        """Called on the poll thread (inside ``consume``) with the outcome of asynchronous commits."""
        full_config = dict(config)
        full_config.update(
            {"enable.auto.commit": False, "enable.auto.offset.store": False, "on_commit": self._committed_callback}
        )
        try:
            self._consumer = Consumer(full_config, logger=logging.getLogger("keyorder.librdkafka"))
        except KafkaException as error:
            raise SourceError(f"invalid Kafka client configuration: {error.args[0].str()}") from error

    @staticmethod
    def _outcomes(error: Any, partitions: list[TopicPartition] | None) -> list[CommitOutcome]:
        request_error = str(error) if error is not None and error.code() != KafkaError._NO_OFFSET else None
        return [
            ((tp.topic, tp.partition), tp.offset, str(tp.error) if tp.error else request_error)
            for tp in partitions or ()
        ]

    def _committed_callback(self, error: Any, partitions: list[TopicPartition]) -> None:
        if self.on_commit_result is not None:
            self.on_commit_result(self._outcomes(error, partitions))

    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
        on_lost: RebalanceCallback,
    ) -> None:
        def ids(partitions: list[TopicPartition]) -> list[TopicPartitionId]:
            return [(tp.topic, tp.partition) for tp in partitions]

        self._consumer.subscribe(
            list(topics),
            on_assign=lambda _consumer, partitions: on_assign(ids(partitions)),
            on_revoke=lambda _consumer, partitions: on_revoke(ids(partitions)),
            on_lost=lambda _consumer, partitions: on_lost(ids(partitions)),
        )

    def consume(self, max_messages: int, timeout: float) -> list[Message]:
        records = self._consumer.consume(max_messages, timeout)
        messages: list[Message] = []
        append = messages.append
        for record in records:
            error = record.error()
            if error is not None:
                self._consume_error(error)
                continue
            topic, partition, offset = record.topic(), record.partition(), record.offset()
            if topic is None or partition is None or offset is None:  # only error events lack them
                raise SourceError(f"Kafka record without topic, partition or offset: {topic}[{partition}]@{offset}")
            _timestamp_type, timestamp_ms = record.timestamp()
            # The stub's HeadersType also covers what produce() accepts (a dict, str values); a consumed
            # record's headers are always a list of (name, bytes or None).
            headers = cast("list[tuple[str, bytes | None]] | None", record.headers())
            append(
                Message(
                    topic,
                    partition,
                    offset,
                    record.key(),
                    record.value(),
                    tuple(headers) if headers else (),
                    timestamp_ms / 1000.0 if timestamp_ms > 0 else None,
                )
            )
        return messages

    @staticmethod
    def _consume_error(error: KafkaError) -> None:
        if error.fatal():
            raise SourceError(f"fatal Kafka consumer error: {error.str()}")
        if error.code() in (KafkaError._PARTITION_EOF,):
            return
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            log.warning("subscribed topic not available yet: %s", error.str())
            return
        log.warning("Kafka consumer error (the client retries): %s", error.str())

    def pause(self, partitions: Sequence[TopicPartitionId]) -> None:
        self._consumer.pause([TopicPartition(topic, partition) for topic, partition in partitions])

    def resume(self, partitions: Mapping[TopicPartitionId, int | None]) -> None:
        """Resume fetching; re-seek to the next offset, or librdkafka waits ~1 s before fetching."""
        self._consumer.resume([TopicPartition(topic, partition) for topic, partition in partitions])
        for (topic, partition), next_offset in partitions.items():
            if next_offset is None:
                continue
            try:
                self._consumer.seek(TopicPartition(topic, partition, next_offset))
            except KafkaException as error:  # e.g. the partition is not fetching yet: resume alone works
                log.debug("seek after resume of %s[%d] skipped: %s", topic, partition, error)

    def committed(
        self, partitions: Sequence[TopicPartitionId], timeout: float
    ) -> dict[TopicPartitionId, tuple[int | None, str | None]]:
        try:
            result = self._consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout=timeout)
        except KafkaException as error:
            raise SourceError(f"committed offsets: {error.args[0].str()}") from error
        return {
            (tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None, getattr(tp, "metadata", None))
            for tp in result
        }

    def commit(self, offsets: Mapping[TopicPartitionId, tuple[int, str]], asynchronous: bool) -> list[CommitOutcome]:
        """Commit; a synchronous commit returns its outcomes (asynchronous ones arrive via the callback).

        Raises ``CommitError`` when the request as a whole fails.
        """
        if not offsets:
            return []
        partitions = [
            TopicPartition(topic, partition, offset, metadata)
            for (topic, partition), (offset, metadata) in offsets.items()
        ]
        try:
            if asynchronous:
                self._consumer.commit(offsets=partitions, asynchronous=True)
                return []
            result = self._consumer.commit(offsets=partitions, asynchronous=False)
        except KafkaException as error:
            raise CommitError(error.args[0].str()) from error
        return self._outcomes(None, result)

    def high_watermark(self, partition: TopicPartitionId) -> int | None:
        try:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(*partition), cached=True)
        except KafkaException:
            return None
        return high if high >= 0 and high != OFFSET_INVALID else None

    def close(self) -> None:
        self._consumer.close()
