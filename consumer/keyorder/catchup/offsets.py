"""The driver's Kafka calls: snapshot the partitions' offsets for the plan, and commit the fence.

Kept apart from the plan (pure) and from Spark: this is the only place the driver talks to Kafka.
The commit re-reads the group's offsets first and refuses to commit when they moved since the
plan (a live consumer is still running), because committing over it could skip messages.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from keyorder.catchup.plan import MembersUnknown, OffsetRange, PartitionSnapshot, TopicPartition, done_above
from keyorder.catchup.positions import Position, PositionKind

log = logging.getLogger(__name__)


class CatchupKafkaError(RuntimeError):
    """Kafka could not answer or refused; the message says what was asked."""


def passing_error_codes() -> frozenset[int]:
    """librdkafka's error codes (``KafkaError``) for a broker that cannot answer for now: the group's
    coordinator moving or loading its state, a request or the client timing out, brokers out of reach.
    Any other error (``GROUP_AUTHORIZATION_FAILED``: no DESCRIBE on the group; ``UNSUPPORTED_VERSION``
    or ``_UNSUPPORTED_FEATURE``: a broker without the API) answers the same when asked again."""
    from confluent_kafka import KafkaError

    return frozenset(
        {
            KafkaError.COORDINATOR_NOT_AVAILABLE,
            KafkaError.NOT_COORDINATOR,
            KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
            KafkaError.REQUEST_TIMED_OUT,
            KafkaError.NETWORK_EXCEPTION,
            KafkaError._TIMED_OUT,
            KafkaError._TRANSPORT,
            KafkaError._ALL_BROKERS_DOWN,
            KafkaError._WAIT_COORD,
        }
    )


def members_unknown(error: BaseException) -> MembersUnknown:
    """What a failed describe-groups means for the plan (pure): a ``KafkaException`` passes only for one of
    ``passing_error_codes``; a wait that timed out passes; anything else is taken as lasting (it fails
    closed: the operator stops retrying it)."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(error, TimeoutError):  # concurrent.futures' wait on the result
        return MembersUnknown(f"no answer within the timeout ({type(error).__name__})", passes=True)
    kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else None
    if isinstance(kafka_error, KafkaError):
        return MembersUnknown(
            f"{kafka_error.name()}: {kafka_error.str()}", passes=kafka_error.code() in passing_error_codes()
        )
    return MembersUnknown(f"{type(error).__name__}: {error}", passes=False)


class KafkaOffsets:
    """Offset queries and the final commit for one group, with a bounded wait on every call."""

    def __init__(self, properties: Mapping[str, str], group: str, timeout: float = 30.0) -> None:
        from confluent_kafka import Consumer, KafkaException
        from confluent_kafka.admin import AdminClient

        self.group = group
        self.timeout = timeout
        logger = logging.getLogger("keyorder.librdkafka")
        try:
            # Kept referenced for the whole job: an unreferenced AdminClient can hang a pending call.
            self._admin = AdminClient({**properties}, logger=logger)
            self._consumer = Consumer(
                {
                    **properties,
                    "group.id": group,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "logger": logger,
                }
            )
        except KafkaException as error:
            raise CatchupKafkaError(f"invalid Kafka client configuration: {error.args[0].str()}") from None

    def close(self) -> None:
        self._consumer.close()

    def partitions(self, topics: Sequence[str]) -> list[TopicPartition]:
        metadata = self._call("list topics", lambda: self._admin.list_topics(timeout=self.timeout))
        found = []
        for topic in topics:
            described = metadata.topics.get(topic)
            if described is None or described.error is not None:
                raise CatchupKafkaError(f"topic {topic!r} not found")
            found += [(topic, partition) for partition in sorted(described.partitions)]
        return found

    def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        return {tp: offset for tp, (offset, _) in self.committed_with_metadata(partitions).items()}

    def committed_with_metadata(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, tuple[int | None, str | None]]:
        """The group's committed offset and commit metadata per partition (``None``: none)."""
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        request = [KafkaTopicPartition(topic, partition) for topic, partition in partitions]
        result = self._call(
            f"committed offsets of group {self.group!r}",
            lambda: self._consumer.committed(request, timeout=self.timeout),
        )
        return {
            (tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None, getattr(tp, "metadata", None))
            for tp in result
        }

    def _list_offsets(self, partitions: Sequence[TopicPartition], spec, what: str) -> dict[TopicPartition, int]:
        from confluent_kafka import IsolationLevel
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        def ask() -> dict[TopicPartition, int]:
            # read_committed, as the reader and the pods: the end is the last stable offset, so an open
            # transaction's records are left for the pods instead of stalling a split before its fence
            futures = self._admin.list_offsets(
                {KafkaTopicPartition(t, p): spec for t, p in partitions},
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self.timeout,
            )
            return {
                (tp.topic, tp.partition): future.result(timeout=self.timeout).offset for tp, future in futures.items()
            }

        return self._call(what, ask)

    def snapshot(
        self, topics: Sequence[str], start: Position, until: Position
    ) -> dict[TopicPartition, PartitionSnapshot]:
        """Everything ``plan.resolve_ranges`` needs, read once."""
        from confluent_kafka.admin import OffsetSpec

        partitions = self.partitions(topics)
        earliest = self._list_offsets(partitions, OffsetSpec.earliest(), "earliest offsets")
        end = self._list_offsets(partitions, OffsetSpec.latest(), "end offsets")
        committed = self.committed_with_metadata(partitions)  # also the baseline the commits check against
        from_time = self._times(partitions, start)
        until_time = self._times(partitions, until)
        snapshots = {}
        for tp in partitions:
            offset, metadata = committed.get(tp, (None, None))
            done, problem = done_above(metadata, offset)
            if problem:
                log.warning("%s[%d]: %s; the offsets it marked done are handled again", *tp, problem)
            snapshots[tp] = PartitionSnapshot(
                earliest=earliest[tp],
                end=end[tp],
                committed=offset,
                from_time=from_time.get(tp),
                until_time=until_time.get(tp),
                done=done,
            )
        return snapshots

    def members(self) -> int | MembersUnknown:
        """Members of the group right now, or why the broker could not say (``MembersUnknown``)."""
        try:
            futures = self._admin.describe_consumer_groups([self.group], request_timeout=self.timeout)
            description = futures[self.group].result(timeout=self.timeout)
        except Exception as error:  # KafkaException (its KafkaError says which), TimeoutError
            unknown = members_unknown(error)
            log.warning("could not check the members of group %s: %s", self.group, unknown.reason)
            return unknown
        return len(description.members or [])

    def _times(self, partitions: Sequence[TopicPartition], position: Position) -> dict[TopicPartition, int | None]:
        from confluent_kafka.admin import OffsetSpec

        if position.kind is not PositionKind.TIMESTAMP:
            return {}
        if position.timestamp_ms is None:
            raise ValueError(f"a timestamp position without a timestamp: {position!r}")
        found = self._list_offsets(
            partitions,
            OffsetSpec.for_timestamp(position.timestamp_ms),
            f"offsets for timestamp {position.timestamp_ms}",
        )
        return {tp: offset if offset >= 0 else None for tp, offset in found.items()}

    def commit_fence(
        self,
        ranges: Sequence[OffsetRange],
        expected_committed: Mapping[TopicPartition, int | None],
        metadata: Mapping[TopicPartition, str] | None = None,
    ) -> None:
        """Commit each range's end for the group, unless the group's offsets moved since the plan;
        ``metadata`` (``plan.fence_metadata``) keeps the finished offsets above an end known."""
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        now = self.committed([(r.topic, r.partition) for r in ranges])
        moved = [
            f"{t}[{p}]: {expected_committed.get((t, p))} -> {offset}"
            for (t, p), offset in now.items()
            if offset != expected_committed.get((t, p))
        ]
        if moved:
            raise CatchupKafkaError(
                f"group {self.group!r} committed offsets moved while the job ran "
                f"({'; '.join(moved)}): is a live consumer still running? Nothing committed."
            )
        request = []
        for r in ranges:
            written = (metadata or {}).get((r.topic, r.partition))
            request.append(
                KafkaTopicPartition(r.topic, r.partition, r.end)
                if written is None
                else KafkaTopicPartition(r.topic, r.partition, r.end, metadata=written)
            )
        result = self._call(
            f"commit for group {self.group!r}", lambda: self._consumer.commit(offsets=request, asynchronous=False)
        )
        failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in result or [] if tp.error is not None]
        if failed:
            raise CatchupKafkaError(f"commit for group {self.group!r} failed: {'; '.join(failed)}")
        log.info("committed the fence for group %s: %s", self.group, ", ".join(f"{r.name()}={r.end}" for r in ranges))

    def _call(self, what: str, action):
        from confluent_kafka import KafkaException

        try:
            return action()
        except KafkaException as error:
            detail = error.args[0].str() if error.args and hasattr(error.args[0], "str") else str(error)
            raise CatchupKafkaError(f"Kafka: {what}: {detail}") from error
        except TimeoutError as error:
            raise CatchupKafkaError(f"Kafka did not answer within {self.timeout}s: {what}") from error
