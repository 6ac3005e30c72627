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
from typing import Any

from keyorder.contracts import DeadLetterError
from keyorder.message import Message

log = logging.getLogger(__name__)

HEADER_TOPIC = "keyorder.original.topic"
HEADER_PARTITION = "keyorder.original.partition"
HEADER_OFFSET = "keyorder.original.offset"
HEADER_ERROR = "keyorder.error"
HEADER_ATTEMPTS = "keyorder.attempts"
MAX_ERROR_HEADER_BYTES = 1024


def dead_letter_topic(template: str, source_topic: str) -> str:
    """DLQ topic for a source topic: ``{topic}`` in the template is replaced by the source topic."""
    return template.replace("{topic}", source_topic)


def dead_letter_headers(message: Message, error: BaseException, attempts: int) -> list[tuple[str, bytes]]:
    """The original headers followed by keyorder's provenance headers."""
    description = f"{type(error).__name__}: {error}".encode(errors="replace")[:MAX_ERROR_HEADER_BYTES]
    description = description.decode("utf-8", "ignore").encode()  # never cut a character in half
    return [
        *((name, value if value is not None else b"") for name, value in message.headers),
        (HEADER_TOPIC, message.topic.encode()),
        (HEADER_PARTITION, str(message.partition).encode()),
        (HEADER_OFFSET, str(message.offset).encode()),
        (HEADER_ERROR, description),
        (HEADER_ATTEMPTS, str(attempts).encode()),
    ]


class KafkaDeadLetterSink:
    """Produces DLQ records with an idempotent producer and waits for each acknowledgement."""

    def __init__(self, producer_config: dict[str, Any], topic_template: str, timeout: float = 30.0) -> None:
        from confluent_kafka import KafkaException, Producer

        config = {"enable.idempotence": True, "acks": "all", "linger.ms": 5, **producer_config}
        try:
            self._producer = Producer(config, logger=logging.getLogger("keyorder.librdkafka"))
        except KafkaException as error:
            raise DeadLetterError(
                f"invalid Kafka client configuration (dead-letter producer): {error.args[0].str()}"
            ) from error
        self._topic_template = topic_template
        self._timeout = timeout
        self._lock = threading.Lock()  # serialises flush(): rare path, keeps error attribution exact

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        outcome: dict[str, Any] = {}

        def delivered(err: Any, _record: Any) -> None:
            outcome["error"] = err

        topic = dead_letter_topic(self._topic_template, message.topic)
        # produce() takes a list of the wider header type (lists are invariant): a copy, typed so.
        headers: list[tuple[str, str | bytes | None]] = list(dead_letter_headers(message, error, attempts))
        with self._lock:
            try:
                self._producer.produce(
                    topic,
                    key=message.key,
                    value=message.value,
                    headers=headers,
                    on_delivery=delivered,
                )
            except Exception as produce_error:  # BufferError, KafkaException
                raise DeadLetterError(f"producing to {topic!r} failed: {produce_error}") from produce_error
            self._producer.flush(self._timeout)
        if "error" not in outcome:
            raise DeadLetterError(f"no acknowledgement from {topic!r} within {self._timeout}s")
        if outcome["error"] is not None:
            raise DeadLetterError(f"producing to {topic!r} failed: {outcome['error']}")
        log.warning(
            "dead-lettered %s[%d]@%d to %s after %d attempts",
            message.topic,
            message.partition,
            message.offset,
            topic,
            attempts,
        )

    def close(self) -> None:
        self._producer.flush(self._timeout)
