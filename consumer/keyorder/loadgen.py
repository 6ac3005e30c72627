"""Topic set-up and keyed test traffic with per-key sequence numbers.

Used by ``keyorder dev``, ``keyorder bench`` and the tests: each message's JSON value carries its
key and its sequence number within that key, so any consumer can prove per-key order afterwards.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic


def create_topics(bootstrap: str, topics: Iterable[str], partitions: int, timeout: float = 30.0) -> None:
    """Create topics (idempotent: an existing topic is fine)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)
                                   for name in topics], request_timeout=timeout)
    for name, future in futures.items():
        try:
            future.result(timeout=timeout)
        except KafkaException as error:
            if "already exists" not in str(error).lower() and "TOPIC_ALREADY_EXISTS" not in str(error):
                raise RuntimeError(f"creating topic {name!r} failed: {error}") from error


def key_name(index: int) -> str:
    return f"key-{index:06d}"


@dataclass
class ProducedLog:
    """What the producer wrote: per-partition end offsets and the expected per-key sequences."""

    end_offsets: dict[int, int] = field(default_factory=dict)
    """Partition -> last acknowledged offset + 1."""
    sequences: dict[str, int] = field(default_factory=dict)
    """Key -> number of messages written for it (sequence numbers run 0..n-1)."""

    @property
    def total(self) -> int:
        return sum(self.sequences.values())


def produce_keyed(bootstrap: str, topic: str, messages: int, keys: int, value_bytes: int = 0,
                  seed: int = 7, start_sequences: dict[str, int] | None = None,
                  progress: Callable[[int], None] | None = None,
                  extra_config: dict | None = None) -> ProducedLog:
    """Write ``messages`` JSON records over ``keys`` random keys; sequence numbers continue from
    ``start_sequences``. Waits for every acknowledgement and fails loudly on any delivery error."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                         **(extra_config or {})}, logger=logging.getLogger("keyorder.librdkafka"))
    rng = random.Random(seed)
    sequences = dict(start_sequences or {})
    produced = ProducedLog(sequences=sequences)
    errors: list[str] = []
    padding = "x" * value_bytes

    def delivered(error, record) -> None:
        if error is not None:
            errors.append(str(error))
            return
        partition = record.partition()
        produced.end_offsets[partition] = max(produced.end_offsets.get(partition, 0), record.offset() + 1)

    for index in range(messages):
        key = key_name(rng.randrange(keys))
        sequence = sequences.get(key, 0)
        sequences[key] = sequence + 1
        value = {"key": key, "seq": sequence}
        if padding:
            value["pad"] = padding
        while True:
            try:
                producer.produce(topic, key=key.encode(), value=json.dumps(value).encode(), on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if index % 1000 == 0:
            producer.poll(0)
            if progress:
                progress(index)
    deadline = time.monotonic() + 60
    while producer.flush(1.0) and time.monotonic() < deadline:
        pass
    if len(producer):
        raise RuntimeError(f"{len(producer)} messages not acknowledged within 60s")
    if errors:
        raise RuntimeError(f"{len(errors)} messages failed to produce, first: {errors[0]}")
    if progress:
        progress(messages)
    return produced
