"""The Kafka side of a pod: consume, pause/resume, commit, rebalance callbacks.

Everything confluent-kafka specific is here, behind the small ``contracts.Source`` protocol, so the runtime
can be reasoned about (and another broker plugged in) without librdkafka details. Threading:
every method is called from the poll-loop thread, and the rebalance callbacks run inside
``consume`` on that same thread; only ``high_watermark`` and ``broker_reachable`` may be read from
elsewhere (a cache and a bool).

Broker reachability: librdkafka never reports "connected", only failures, through ``error_cb``
(served inside ``consume``). ``_ALL_BROKERS_DOWN`` marks the broker unreachable at once;
``_TRANSPORT`` and ``_RESOLVE`` concern one connection (one of several brokers may be down while the
others serve every partition), so they only make the state *suspect*. While suspect or unreachable,
``consume`` probes at most every ``PROBE_INTERVAL`` seconds with a metadata request for a subscribed
topic (``list_topics``, never answered from the cache: it succeeds only if some broker answers now,
within ``PROBE_TIMEOUT``). A probe that succeeds or an assignment (the group coordinator answered
a join) marks the broker reachable; a failed probe marks it unreachable. A consumed record is not
used: it may have been prefetched before the broker went away. Until the first success the broker
counts as unreachable: a pod is not ready before it has talked to Kafka.

librdkafka's own log lines (logger ``keyorder.librdkafka``, this consumer's and the dead-letter
producer's) pass a ``CollapsingFilter``: a broker that refuses connections makes librdkafka log the
same error about 20 times a second per client, so identical WARNING-or-worse lines are logged once
and then summarised once per ``LOG_COLLAPSE_INTERVAL``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition

from keyorder.contracts import (
    CommitError,
    CommitOutcome,
    FetchPosition,
    RebalanceCallback,
    SourceError,
    TopicPartitionId,
)
from keyorder.core import offset_metadata
from keyorder.message import Message

log = logging.getLogger(__name__)

LOG_COLLAPSE_INTERVAL = 10.0
"""Seconds over which identical librdkafka WARNING/ERROR lines are collapsed into one summary line."""
PROBE_INTERVAL = 5.0
"""Seconds between metadata probes while the broker is suspect or unreachable."""
PROBE_TIMEOUT = 0.5
"""Seconds one probe may block the poll loop (only while no broker is known to be reachable)."""
BROKER_ASSIGNS_SILENCE = 30.0
"""Seconds without any assignment, with ``group.protocol=consumer`` and a broker that answers, before the
pod says the broker may not support KIP-848 (librdkafka then waits without a word)."""
LEAVE_TIMEOUT = 5.0
"""Seconds a static member waits, when it stops, for its revoke to be served and its LeaveGroup sent."""

_NOT_CONTACTED = "no broker contacted yet"
_UNREACHABLE_CODES = (KafkaError._ALL_BROKERS_DOWN,)
_SUSPECT_CODES = (KafkaError._TRANSPORT, KafkaError._RESOLVE)
# librdkafka appends the time spent and its own suppression count: not part of what makes a line "the same"
_VOLATILE_SUFFIX = re.compile(r" \(after \d+ms in state [A-Z_]+(?:, \d+ identical error\(s\) suppressed)?\)$")


MIXED_PROTOCOLS = (
    "the group refused this member (%s): its other members use an assignment strategy of the other "
    "protocol (eager: range, roundrobin; cooperative: cooperative-sticky), and one group cannot mix "
    "them. This pod keeps retrying and joins once the others have left. To move a group between them, "
    "stop every old member before the new ones start (docs/rebalancing.md), or set "
    "partition.assignment.strategy to the group's current one."
)
"""Logged when the broker refuses the join because eager and cooperative members would mix."""


def broker_assigns(properties: Mapping[str, Any]) -> bool:
    """Whether ``properties`` choose KIP-848's consumer group protocol (``group.protocol=consumer``), where
    the broker assigns the partitions and a client-side assignment strategy does not apply."""
    return str(properties.get("group.protocol", "")).strip().lower() == "consumer"


def static_member(properties: Mapping[str, Any]) -> str | None:
    """The member's ``group.instance.id`` (KIP-345 static membership), or None for a dynamic member."""
    return str(properties.get("group.instance.id") or "").strip() or None


def static_member_cannot_leave(properties: Mapping[str, Any]) -> bool:
    """Whether ``properties`` make a static member on KIP-848's consumer group protocol, which cannot leave.

    Under ``group.protocol=consumer`` librdkafka leaves the group with a ConsumerGroupHeartbeat whose
    member epoch is -2 for a static member (``group.instance.id`` set), -1 only for a dynamic one:
    librdkafka src/rdkafka_cgrp.c, ``rd_kafka_cgrp_consumer_leave`` (``if
    (RD_KAFKA_CGRP_IS_STATIC_MEMBER(rkcg)) member_epoch = -2``), reached from ``unsubscribe`` and
    ``close`` through ``rd_kafka_cgrp_leave_maybe``. Epoch -2 is KIP-848's temporary leave (the member
    will rejoin): the broker keeps the member's partitions until ``session.timeout.ms`` expires, so the
    explicit leave of a stopping static pod (``KafkaSource.close``) frees nothing, and librdkafka has no
    option to leave for good. The classic protocol's LeaveGroup does remove the member
    (``rd_kafka_cgrp_leave``), so the combination is refused (``STATIC_MEMBER_ON_CONSUMER_PROTOCOL``).
    """
    return static_member(properties) is not None and broker_assigns(properties)


STATIC_MEMBER_ON_CONSUMER_PROTOCOL = (
    "the Kafka properties group.instance.id (static membership) and group.protocol=consumer cannot be "
    "combined: under the consumer group protocol (KIP-848) librdkafka's leave for a static member is a "
    "temporary one (member epoch -2, librdkafka src/rdkafka_cgrp.c rd_kafka_cgrp_consumer_leave), so the "
    "broker keeps this pod's partitions, unread, until session.timeout.ms expires even after the pod has "
    "stopped. Remove group.instance.id (a dynamic member leaves at once), or use group.protocol=classic "
    "to keep static membership (docs/rebalancing.md)"
)
"""Why a static member on KIP-848's protocol is refused (``static_member_cannot_leave``), and what to do."""


LOG_TRUNCATED_NO_RESET = (
    "a partition's position could not be used and librdkafka did not reset it (%s): its log was truncated "
    "below the position (an unclean leader election) or the position is out of range, and auto.offset.reset "
    "is 'error', so the partition is not fetched until it is assigned again (a rebalance, or a restart of the "
    "pod). Set auto.offset.reset to earliest (keyorder's default) to let librdkafka move back to the "
    "truncation point: keyorder then processes the new log's records from there"
)
"""Logged for librdkafka's ``_AUTO_OFFSET_RESET`` consumer error. librdkafka emits it from ``rd_kafka_offset_reset``
(src/rdkafka_offset.c) only when it cannot move the position itself (``auto.offset.reset=error``); a detected
truncation reaches it with ``_LOG_TRUNCATION`` as the *reason* (``rd_kafka_toppar_handle_OffsetForLeaderEpoch``),
but the consumer error's code is ``_AUTO_OFFSET_RESET``. Matching ``_LOG_TRUNCATION`` too is harmless. With the
default ``auto.offset.reset`` the KIP-320 validation seeks to the truncation point without an error, and the
runtime sees the new log's records arrive under a greater leader epoch (``core.tracking.LogTruncated``, or
``EpochGap`` when records it had prefetched below that point were purged)."""


LIBRDKAFKA_LOGGER = "keyorder.librdkafka"
"""The logger every librdkafka client of the pod logs through (this consumer and the dead-letter producer)."""


class CollapsingFilter(logging.Filter):
    """Collapses repeated identical WARNING-or-worse lines of one logger (librdkafka's).

    A line is logged the first time; identical ones within ``interval`` seconds are only counted, and
    when the interval ends one line says how many there were (``... (repeated 137 times in the last
    10 s)``) and a new interval starts; a line that stops repeating is forgotten after one quiet
    interval. Lower levels pass through. It is a filter on the logger, not a wrapper handed to one
    client, so it covers every client logging there (the dead-letter producer repeats the same
    ``Connection refused`` line). ``clock`` is injectable so tests drive the interval; ``flush``
    (called from the poll loop) emits summaries that are due when no new line arrives.
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = LOG_COLLAPSE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, list[Any]] = {}  # key -> [window start, repeats, level, line]

    @classmethod
    def install(
        cls,
        logger: logging.Logger,
        interval: float = LOG_COLLAPSE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> CollapsingFilter:
        """The filter already on ``logger`` (one per logger, shared by its clients), or a new one added to it."""
        for existing in logger.filters:
            if isinstance(existing, cls):
                return existing
        created = cls(logger, interval, clock)
        logger.addFilter(created)
        return created

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "keyorder_summary", False):
            return True
        line = record.getMessage()
        key = _VOLATILE_SUFFIX.sub("", line)
        with self._lock:
            now = self.clock()
            summaries = self._due(now)
            window = self._windows.get(key)
            if window is not None:
                window[1] += 1
            else:
                self._windows[key] = [now, 0, record.levelno, line]
        self._emit(summaries)
        return window is None

    def flush(self) -> None:
        if not self._windows:  # the poll loop calls this on every turn: nothing to do when all is quiet
            return
        with self._lock:
            summaries = self._due(self.clock())
        self._emit(summaries)

    def _emit(self, summaries: list[tuple[int, str]]) -> None:
        for level, summary in summaries:
            self.logger.log(level, "%s", summary, extra={"keyorder_summary": True})

    def _due(self, now: float) -> list[tuple[int, str]]:
        summaries = []
        for key, window in list(self._windows.items()):
            start, repeats, level, line = window
            if now - start < self.interval:
                continue
            if repeats:
                summaries.append((level, f"{line} (repeated {repeats} times in the last {self.interval:g} s)"))
                self._windows[key] = [now, 0, level, line]
            else:
                del self._windows[key]
        return summaries


def _epoch_or_unknown(metadata: str) -> int:
    """The leader epoch to commit with: the metadata's, or -1 (confluent-kafka's "none", which it refuses as None)."""
    epoch = offset_metadata.leader_epoch(metadata)
    return epoch if epoch is not None else -1


class KafkaSource:
    """A confluent-kafka consumer in a consumer group with manual commits."""

    def __init__(
        self,
        config: Mapping[str, Any],
        clock: Callable[[], float] = time.monotonic,
        log_collapse_interval: float = LOG_COLLAPSE_INTERVAL,
    ) -> None:
        self.on_commit_result: Callable[[list[CommitOutcome]], None] | None = None
        """Called on the poll thread (inside ``consume``) with the outcome of asynchronous commits."""
        self.clock = clock
        self.broker_reachable = False
        """False until some broker answered, and while librdkafka reports every broker down."""
        self.broker_error: str | None = _NOT_CONTACTED
        """Why the broker counts as unreachable (the last error), None while reachable."""
        self._suspect = True  # probe at the next consume
        self._next_probe = clock()
        self._topics: list[str] = []
        self.broker_assigns_silence = BROKER_ASSIGNS_SILENCE
        # KIP-848: with group.protocol=consumer the broker assigns; one that lacks the protocol never
        # answers the heartbeat and librdkafka says nothing, so the pod watches for the first assignment
        # (until one comes, or it has said so)
        self._awaiting_broker_assignment = broker_assigns(config)
        if static_member_cannot_leave(config):  # consumer_properties refuses it first: this guards other builders
            raise SourceError(STATIC_MEMBER_ON_CONSUMER_PROTOCOL)
        self._static_member = static_member(config)
        self._subscribed_at: float | None = None
        self._fetch_queues: dict[TopicPartitionId, int] = {}  # replaced whole by each statistics callback
        librdkafka_logger = logging.getLogger(LIBRDKAFKA_LOGGER)
        self.librdkafka_log = CollapsingFilter.install(librdkafka_logger, log_collapse_interval, clock)
        full_config = dict(config)
        full_config.update(
            {
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "on_commit": self._committed_callback,
                "stats_cb": self._statistics,
                "error_cb": self._error_callback,
            }
        )
        try:
            self._consumer = Consumer(full_config, logger=librdkafka_logger)
        except KafkaException as error:
            raise SourceError(f"invalid Kafka client configuration: {error.args[0].str()}") from error

    # -- broker reachability ------------------------------------------------------------------------
    def _error_callback(self, error: KafkaError) -> None:
        """librdkafka's ``error_cb`` (served inside ``consume``): client-level errors, the client retries."""
        code = error.code()
        if code in _UNREACHABLE_CODES:
            self._mark_unreachable(error.str())
        elif code in _SUSPECT_CODES:
            self._suspect = True  # the next due probe decides; one broker of several down is not "no broker"
        elif code == KafkaError.INCONSISTENT_GROUP_PROTOCOL:
            log.error("%s", MIXED_PROTOCOLS % error.str())
        elif error.fatal():
            log.error("fatal Kafka client error: %s", error.str())

    def _mark_unreachable(self, reason: str) -> None:
        self._suspect = True
        if self.broker_reachable or self.broker_error == _NOT_CONTACTED:  # once per outage, not per error
            log.warning("no Kafka broker reachable: %s (not ready until one answers)", reason)
        self.broker_reachable = False
        self.broker_error = reason

    def _mark_reachable(self) -> None:
        self._suspect = False
        if not self.broker_reachable:
            if self.broker_error == _NOT_CONTACTED:
                log.info("Kafka broker reachable")
            else:
                log.info("Kafka broker reachable again (was: %s)", self.broker_error)
        self.broker_reachable = True
        self.broker_error = None

    def _probe_if_due(self) -> None:
        if not self._suspect:
            return
        now = self.clock()
        if now < self._next_probe:
            return
        self._next_probe = now + PROBE_INTERVAL
        try:
            # a named topic keeps the request small; metadata requests are never served from the cache
            self._consumer.list_topics(self._topics[0] if self._topics else None, timeout=PROBE_TIMEOUT)
        except KafkaException as error:
            self._mark_unreachable(error.args[0].str())
            return
        self._mark_reachable()

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

        def assigned(partitions: list[TopicPartition]) -> None:
            self._mark_reachable()  # the group coordinator answered
            self._awaiting_broker_assignment = False  # an empty one counts: a member beyond the partition count
            on_assign(ids(partitions))

        self._topics = list(topics)
        self._subscribed_at = self.clock()
        self._consumer.subscribe(
            list(topics),
            on_assign=lambda _consumer, partitions: assigned(partitions),
            on_revoke=lambda _consumer, partitions: on_revoke(ids(partitions)),
            on_lost=lambda _consumer, partitions: on_lost(ids(partitions)),
        )

    def consume(self, max_messages: int, timeout: float) -> list[Message]:
        self._probe_if_due()
        records = self._consumer.consume(max_messages, timeout)
        self.librdkafka_log.flush()
        if self._awaiting_broker_assignment:
            self._check_broker_assigns()
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
            leader_epoch = record.leader_epoch()
            # The stub's HeadersType also covers what produce() accepts (a dict, str values); a consumed
            # record's headers are always a list of (name, bytes or None). (No ``cast``: a call per record.)
            headers: list[tuple[str, bytes | None]] | None = record.headers()  # type: ignore[assignment]
            append(
                Message(
                    topic,
                    partition,
                    offset,
                    record.key(),
                    record.value(),
                    tuple(headers) if headers else (),
                    timestamp_ms / 1000.0 if timestamp_ms > 0 else None,
                    leader_epoch if leader_epoch is not None and leader_epoch >= 0 else None,
                )
            )
        # A record is no proof of a live broker: librdkafka hands out records it prefetched earlier.
        return messages

    def _check_broker_assigns(self) -> None:
        """Say once, as an error, that a broker which answers has given no assignment under KIP-848."""
        if self._subscribed_at is None or not self.broker_reachable:
            return
        if self.clock() - self._subscribed_at < self.broker_assigns_silence:
            return
        self._awaiting_broker_assignment = False  # said once
        log.error(
            "no partition assignment %.0f s after subscribing with group.protocol=consumer, although the broker "
            "answers: it may not support KIP-848's consumer group protocol (ConsumerGroupHeartbeat, Apache Kafka "
            "4.0 and later), and librdkafka then waits without an error. Remove group.protocol=consumer to use "
            "the classic protocol (keyorder's default, with cooperative-sticky rebalancing); docs/rebalancing.md",
            self.broker_assigns_silence,
        )

    @staticmethod
    def _consume_error(error: KafkaError) -> None:
        if error.fatal():
            raise SourceError(f"fatal Kafka consumer error: {error.str()}")
        if error.code() in (KafkaError._PARTITION_EOF,):
            return
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            log.warning("subscribed topic not available yet: %s", error.str())
            return
        if error.code() == KafkaError.INCONSISTENT_GROUP_PROTOCOL:
            log.error("%s", MIXED_PROTOCOLS % error.str())
            return
        if error.code() in (KafkaError._LOG_TRUNCATION, KafkaError._AUTO_OFFSET_RESET):
            log.error(LOG_TRUNCATED_NO_RESET, error.str())
            return
        log.warning("Kafka consumer error (the client retries): %s", error.str())

    def pause(self, partitions: Sequence[TopicPartitionId]) -> None:
        self._consumer.pause([TopicPartition(topic, partition) for topic, partition in partitions])

    def resume(self, partitions: Mapping[TopicPartitionId, FetchPosition | None]) -> None:
        """Resume fetching; re-seek to the next offset, or librdkafka waits ~1 s before fetching.

        The seek carries the leader epoch of the record before that offset: librdkafka then validates the
        position (src/rdkafka_partition.c ``rd_kafka_toppar_op_seek`` -> ``rd_kafka_offset_validate``), so a log
        truncated below it while the partition was paused is read again from the truncation point. A seek
        without an epoch is not validated and would skip the new log's records up to the offset."""
        self._consumer.resume([TopicPartition(topic, partition) for topic, partition in partitions])
        for (topic, partition), position in partitions.items():
            if position is None:
                continue
            epoch = position.leader_epoch if position.leader_epoch is not None else -1
            try:
                self._consumer.seek(TopicPartition(topic, partition, position.offset, leader_epoch=epoch))
            except KafkaException as error:  # e.g. the partition is not fetching yet: resume alone works
                # a seek back after an EpochGap that fails leaves the purged records unread: say so
                log.warning(
                    "seek of %s[%d] to offset %d (leader epoch %d) failed; fetching goes on from where the client "
                    "is: %s",
                    topic, partition, position.offset, epoch, error,
                )  # fmt: skip

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

        Each offset goes with the leader epoch its commit metadata records (``offset_metadata.leader_epoch``:
        the greatest epoch the pod received on the partition), as librdkafka commits a stored offset with its
        record's epoch (KIP-320): the broker keeps it with the offset, and librdkafka validates a position
        that carries an epoch against a truncation (src/rdkafka_offset.c ``rd_kafka_offset_validate``) when
        the partition's leader epoch changes. Raises ``CommitError`` when the request as a whole fails.
        """
        if not offsets:
            return []
        partitions = [
            TopicPartition(topic, partition, offset, metadata, leader_epoch=_epoch_or_unknown(metadata))
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

    def _statistics(self, text: str) -> None:
        """librdkafka's statistics (every ``statistics.interval.ms``, inside ``consume``): the fetch queues."""
        try:
            topics = json.loads(text).get("topics", {})
            queues = {
                (topic, int(partition)): int(figures["fetchq_cnt"])
                for topic, topic_figures in topics.items()
                for partition, figures in topic_figures.get("partitions", {}).items()
                if partition != "-1" and "fetchq_cnt" in figures
            }
        except (ValueError, TypeError, AttributeError) as error:  # a client version with another layout
            log.debug("librdkafka statistics not understood: %s", error)
            return
        self._fetch_queues = queues

    def fetch_queue(self, partition: TopicPartitionId) -> int | None:
        return self._fetch_queues.get(partition)

    def high_watermark(self, partition: TopicPartitionId) -> int | None:
        try:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(*partition), cached=True)
        except KafkaException:
            return None
        return high if high >= 0 and high != OFFSET_INVALID else None

    def positions(self, partitions: Sequence[TopicPartitionId]) -> dict[TopicPartitionId, int | None]:
        """librdkafka's application position (last record consumed + 1, moved past control records)."""
        if not partitions:
            return {}
        try:
            found = self._consumer.position([TopicPartition(topic, partition) for topic, partition in partitions])
        except KafkaException as error:
            log.debug("client positions unavailable: %s", error)
            return {}
        return {(tp.topic, tp.partition): tp.offset if tp.error is None and tp.offset >= 0 else None for tp in found}

    def close(self) -> None:
        """Leave the group and close the client. A static member (``group.instance.id``) leaves
        explicitly first: librdkafka sends no LeaveGroup when one closes (KIP-345 keeps its partitions
        for a restart within ``session.timeout.ms``), so a pod stopping for good, a scale-in, would
        otherwise leave its partitions idle that long. The classic protocol only: under KIP-848's a
        static member's leave is temporary, and that combination is refused (``static_member_cannot_leave``)."""
        if self._static_member and self._topics:
            self._leave_group()
        self._consumer.close()

    def _leave_group(self) -> None:
        """``unsubscribe()`` revokes the assignment (the rebalance callbacks run inside ``poll``) and
        then sends the LeaveGroup, clearing the member id; ``close()`` before that would skip it."""
        if not self._consumer.memberid():
            return  # never joined: nothing to leave
        try:
            self._consumer.unsubscribe()
        except KafkaException as error:
            log.warning("could not leave the consumer group before closing: %s", error.args[0].str())
            return
        deadline = self.clock() + LEAVE_TIMEOUT
        while self._consumer.memberid() and self.clock() < deadline:
            self._consumer.poll(0.05)  # a prefetched message returned here was never handled: re-delivered
        if self._consumer.memberid():
            log.warning(
                "static member %s: the group did not confirm the leave within %.0fs; its partitions move once "
                "session.timeout.ms passes",
                self._static_member,
                LEAVE_TIMEOUT,
            )
        else:
            log.info("static member %s left the consumer group", self._static_member)
