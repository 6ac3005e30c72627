"""Publishing messages that exhausted their retries to a dead-letter topic (DLQ).

A message is only counted as finished after the DLQ broker acknowledged it: if the DLQ write
fails, the message stays in flight (its offset is not committed) and is tried again later, so a
DLQ outage can delay but never lose a message.

The DLQ record keeps the original key, value and headers, and adds ``keyorder.*`` headers with
the origin and the error. It is therefore as sensitive as the source topic: protect it with the
same ACLs and retention rules.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from keyorder.contracts import DeadLetterError
from keyorder.core.errors import error_text
from keyorder.message import Message

log = logging.getLogger(__name__)

HEADER_TOPIC = "keyorder.original.topic"
HEADER_PARTITION = "keyorder.original.partition"
HEADER_OFFSET = "keyorder.original.offset"
HEADER_ERROR = "keyorder.error"
HEADER_ATTEMPTS = "keyorder.attempts"
MAX_ERROR_HEADER_BYTES = 1024
DELIVERY_TIMEOUT_PROPERTIES = frozenset({"message.timeout.ms", "delivery.timeout.ms"})
REPORT_GRACE_SECONDS = 5.0
POLL_INTERVAL_SECONDS = 0.1


def dead_letter_topic(template: str, source_topic: str) -> str:
    """DLQ topic for a source topic: ``{topic}`` in the template is replaced by the source topic."""
    return template.replace("{topic}", source_topic)


def dead_letter_headers(message: Message, error: BaseException, attempts: int) -> list[tuple[str, bytes]]:
    """The original headers followed by keyorder's provenance headers."""
    description = f"{type(error).__name__}: {error_text(error)}".encode(errors="replace")[:MAX_ERROR_HEADER_BYTES]
    description = description.decode("utf-8", "ignore").encode()  # never cut a character in half
    return [
        *((name, value if value is not None else b"") for name, value in message.headers),
        (HEADER_TOPIC, message.topic.encode()),
        (HEADER_PARTITION, str(message.partition).encode()),
        (HEADER_OFFSET, str(message.offset).encode()),
        (HEADER_ERROR, description),
        (HEADER_ATTEMPTS, str(attempts).encode()),
    ]


class _PendingRecord:
    """One DLQ record produced and not yet observed by a publish: its delivery report, once known."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: Any = None


ProducerFactory = Callable[[dict[str, Any]], Any]


def _kafka_producer(config: dict[str, Any]) -> Any:
    from confluent_kafka import Producer

    return Producer(config, logger=logging.getLogger("keyorder.librdkafka"))


class KafkaDeadLetterSink:
    """Produces DLQ records with an idempotent producer and waits for each acknowledgement.

    Workers never wait for each other: each publish waits for its own record's delivery report,
    served by one background thread polling the producer; no lock is held while waiting. A record
    whose wait timed out stays pending under its source message's (topic, partition, offset): the
    next publish of that message waits for it instead of producing a second copy, and produces
    again only once its delivery report says it failed. The producer's delivery timeout is the
    publish timeout, so every record ends in a report (delivered or failed) soon after it.
    """

    def __init__(
        self,
        producer_config: dict[str, Any],
        topic_template: str,
        timeout: float = 30.0,
        producer_factory: ProducerFactory = _kafka_producer,
    ) -> None:
        from confluent_kafka import KafkaException

        config: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 5, **producer_config}
        if not DELIVERY_TIMEOUT_PROPERTIES & config.keys():  # aliases: set one, never both
            config["message.timeout.ms"] = max(int(timeout * 1000), 1)
        try:
            self._producer = producer_factory(config)
        except KafkaException as error:
            raise DeadLetterError(
                f"invalid Kafka client configuration (dead-letter producer): {error.args[0].str()}"
            ) from error
        self._topic_template = topic_template
        self._timeout = timeout
        # The report of a record that timed out comes from librdkafka's periodic timeout scan,
        # slightly after the delivery timeout: wait a little longer so it is normally seen.
        self._wait = timeout + min(REPORT_GRACE_SECONDS, timeout)
        self._lock = threading.Lock()  # guards _pending only, never held while waiting
        self._pending: dict[tuple[str, int, int], _PendingRecord] = {}
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="keyorder-dlq-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        """Serve delivery reports (``on_delivery`` callbacks run inside ``poll``)."""
        while not self._stop.is_set():
            try:
                self._producer.poll(POLL_INTERVAL_SECONDS)
            except Exception:  # a raising callback must not end the thread that serves all of them
                log.exception("dead-letter producer poll failed")

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        topic = dead_letter_topic(self._topic_template, message.topic)
        source = (message.topic, message.partition, message.offset)
        with self._lock:
            pending = self._pending.get(source)
            produce = pending is None
            if pending is None:
                pending = self._pending[source] = _PendingRecord()
        if produce:
            self._produce(topic, source, pending, message, error, attempts)
        if not pending.done.wait(self._wait):
            raise DeadLetterError(
                f"no acknowledgement from {topic!r} within {self._wait:.0f}s"
                " (the record stays pending: the next attempt waits for it rather than producing a copy)"
            )
        self._forget(source, pending)
        if pending.error is not None:
            raise DeadLetterError(f"producing to {topic!r} failed: {pending.error}")
        log.warning(
            "dead-lettered %s[%d]@%d to %s after %d attempts",
            message.topic,
            message.partition,
            message.offset,
            topic,
            attempts,
        )

    def _produce(
        self,
        topic: str,
        source: tuple[str, int, int],
        pending: _PendingRecord,
        message: Message,
        error: BaseException,
        attempts: int,
    ) -> None:
        def delivered(err: Any, _record: Any) -> None:
            pending.error = err
            if err is not None:  # definitively failed: the next attempt produces again
                self._forget(source, pending)
            pending.done.set()

        # produce() takes a list of the wider header type (lists are invariant): a copy, typed so.
        headers: list[tuple[str, str | bytes | None]] = list(dead_letter_headers(message, error, attempts))
        try:
            self._producer.produce(topic, key=message.key, value=message.value, headers=headers, on_delivery=delivered)
        except Exception as produce_error:  # BufferError, KafkaException: nothing was queued
            self._forget(source, pending)
            pending.error = produce_error
            pending.done.set()  # a publish waiting on this record (same message) fails too
            raise DeadLetterError(f"producing to {topic!r} failed: {produce_error}") from produce_error

    def _forget(self, source: tuple[str, int, int], pending: _PendingRecord) -> None:
        with self._lock:
            if self._pending.get(source) is pending:
                del self._pending[source]

    def close(self) -> None:
        self._stop.set()
        self._poller.join(POLL_INTERVAL_SECONDS * 10)
        self._producer.flush(self._timeout)  # serves the remaining reports on this thread
