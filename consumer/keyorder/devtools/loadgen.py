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

EXACT_END_OFFSETS = {"batch.num.messages": 1}
"""Producer setting: the embedded broker (Tansu) reports exact end offsets only for one-record batches
(a multi-record batch's end reads as its base offset + 1), so whatever compares commits with end
offsets on it produces with this. Real Kafka needs nothing of the kind."""


def create_topics(bootstrap: str, topics: Iterable[str], partitions: int, timeout: float = 30.0) -> None:
    """Create topics (idempotent: an existing topic is fine)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in topics], request_timeout=timeout
    )
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


def produce_keyed(
    bootstrap: str,
    topic: str,
    messages: int,
    keys: int,
    value_bytes: int = 0,
    seed: int = 7,
    start_sequences: dict[str, int] | None = None,
    progress: Callable[[int], None] | None = None,
    extra_config: dict | None = None,
    hot_key_share: float = 0.0,
    hot_keys: int = 1,
) -> ProducedLog:
    """Write ``messages`` JSON records over ``keys`` random keys; sequence numbers continue from
    ``start_sequences``. Waits for every acknowledgement and fails loudly on any delivery error.

    ``hot_key_share`` skews the distribution, as real traffic often is (one tenant, one busy
    account): that share of the messages goes to ``key_name(0)`` (or, uniformly, to the first
    ``hot_keys`` keys), the rest uniformly to the other keys. The default (0) keeps the uniform
    draw, and so the same data, as before."""
    if not 0.0 <= hot_key_share < 1.0:
        raise ValueError(f"hot_key_share must be in [0, 1), got {hot_key_share}")
    if hot_key_share and keys <= hot_keys:
        raise ValueError("hot keys need at least one other key")
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True, **(extra_config or {})},
        logger=logging.getLogger("keyorder.librdkafka"),
    )
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
        if hot_key_share and rng.random() < hot_key_share:
            key = key_name(rng.randrange(hot_keys) if hot_keys > 1 else 0)
        elif hot_key_share:
            key = key_name(hot_keys + rng.randrange(keys - hot_keys))
        else:
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


ORDER_STATUSES = ("created", "paid", "shipped", "completed")


class OrderStream:
    """Order-lifecycle events, keyed by order id: created -> paid -> shipped -> completed.

    Orders are interleaved at random (many in progress at once) while each order's own events
    stay in sequence. ``expected`` is the number of events written per order, for the audit.
    """

    HOT_ORDER = "order-hot"
    POISON_ORDER = "order-poison"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        seed: int = 7,
        in_progress: int = 2_000,
        hot_key_share: float = 0.0,
        poison_every: int = 0,
    ) -> None:
        """``hot_key_share`` of the events go to one long-lived order (``HOT_ORDER``, cycling through
        the statuses); with ``poison_every`` > 0, every that-many-th event is a poison event of
        ``POISON_ORDER`` (the example handler always fails on it)."""
        if not 0.0 <= hot_key_share < 1.0:
            raise ValueError(f"hot_key_share must be in [0, 1), got {hot_key_share}")
        if in_progress < 1:
            raise ValueError(f"in_progress (keys) must be at least 1, got {in_progress}")
        if poison_every < 0:
            raise ValueError(f"poison_every must be >= 0, got {poison_every}")
        self.hot_key_share = hot_key_share
        self.poison_every = poison_every
        self.poisoned = 0
        # one record per batch: the embedded broker then reports exact end offsets (lag) to the admin API
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 2, "enable.idempotence": True, **EXACT_END_OFFSETS},
            logger=logging.getLogger("keyorder.librdkafka"),
        )
        self.bulk_producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True},
            logger=logging.getLogger("keyorder.librdkafka"),
        )
        """For a backlog written at once (``emit(bulk=True)``): full batches, several times faster; ``seal``
        then makes the end offsets exact again."""
        self.sealed_partitions: set[int] = set()
        """Partitions whose last write came from ``producer`` (one record per batch), since the last bulk."""
        self.topic = topic
        self.rng = random.Random(seed)
        self.in_progress = in_progress
        self.active: list[str] = []
        self.expected: dict[str, int] = {}
        self.next_order = 0
        self.errors: list[str] = []
        self.written = 0

    def _delivered(self, error, record) -> None:
        if error is not None:
            self.errors.append(str(error))
        else:
            self.sealed_partitions.add(record.partition())

    def _delivered_in_bulk(self, error, _record) -> None:
        if error is not None:
            self.errors.append(str(error))

    def emit(self, events: int, bulk: bool = False) -> None:
        """Write ``events`` more events (new orders are opened as old ones complete); ``bulk``: in full batches
        (a backlog written at once; ``seal`` it before reading end offsets)."""
        producer = self.bulk_producer if bulk else self.producer
        delivered = self._delivered_in_bulk if bulk else self._delivered
        if bulk:
            self.sealed_partitions.clear()
        for _ in range(events):
            while len(self.active) < self.in_progress:
                order = f"order-{self.next_order:08d}"
                self.next_order += 1
                self.active.append(order)
                self.expected[order] = 0
            special = self._special_order()
            index = -1 if special else self.rng.randrange(len(self.active))
            order = special or self.active[index]
            sequence = self.expected.get(order, 0)
            value: dict = {"order": order, "seq": sequence, "status": ORDER_STATUSES[sequence % len(ORDER_STATUSES)]}
            if order == self.POISON_ORDER:
                value["poison"] = True
            while True:
                try:
                    payload = json.dumps(value).encode()
                    producer.produce(self.topic, key=order.encode(), value=payload, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            self.expected[order] = sequence + 1
            if order == self.POISON_ORDER:
                self.poisoned += 1
            elif not special and sequence + 1 == len(ORDER_STATUSES):
                self.active[index] = self.active[-1]
                self.active.pop()
            self.written += 1
            if self.written % 1000 == 0:
                producer.poll(0)

    def _special_order(self) -> str | None:
        """The hot or the poison order for this event, or None for a random open order."""
        if self.poison_every and (self.written + 1) % self.poison_every == 0:
            return self.POISON_ORDER
        if self.hot_key_share and self.rng.random() < self.hot_key_share:
            return self.HOT_ORDER
        return None

    def flush(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for producer in (self.bulk_producer, self.producer):
            while producer.flush(1.0) and time.monotonic() < deadline:
                pass
        pending = len(self.bulk_producer) + len(self.producer)
        if pending or self.errors:
            raise RuntimeError(
                f"order events not acknowledged: {pending} pending, {len(self.errors)} failed {self.errors[:1]}"
            )

    def seal(self, partitions: int, most_events: int = 10_000) -> None:
        """After a bulk write: flush it, then write events one record per batch until each of the topic's
        ``partitions`` ends with one (``EXACT_END_OFFSETS``: the embedded broker reads a multi-record batch's
        end as its base offset + 1, so a lag read right after a bulk write would be short by up to a batch).
        Raises ``RuntimeError`` if ``most_events`` events did not reach every partition (a key distribution
        that misses one: the hot key alone, say)."""
        self.flush()
        for _ in range(most_events):
            if len(self.sealed_partitions) >= partitions:
                return
            self.emit(1)
            self.flush()
        raise RuntimeError(
            f"{most_events:,} events reached only partitions {sorted(self.sealed_partitions)} of {partitions}"
        )
