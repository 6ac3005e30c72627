"""KafkaDeadLetterSink against a FAKE producer: a DLQ outage holds only the message being
dead-lettered, and a retried write never puts a second copy of a record in flight."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from keyorder.adapters.dead_letters import KafkaDeadLetterSink
from keyorder.contracts import DeadLetterError
from keyorder.message import Message
from tests.support import wait_for

SHORT = 0.2  # the sink's timeout in these tests (it waits at most twice that)


class FakeProducer:
    """FAKE confluent-kafka Producer: records ``produce`` calls; the test decides each record's
    outcome with ``complete``; like librdkafka, callbacks run only inside ``poll``/``flush``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.produced: list[tuple[str, bytes | None]] = []  # (topic, key)
        self._callbacks: list[Callable[[Any, Any], None]] = []
        self._outcomes: dict[int, Any] = {}  # record index -> error (None: delivered)
        self._served: set[int] = set()
        self.reported: set[int] = set()  # records whose delivery callback has returned
        self._lock = threading.Lock()

    def produce(self, topic: str, key: bytes | None = None, on_delivery: Any = None, **_: Any) -> None:
        with self._lock:
            self.produced.append((topic, key))
            self._callbacks.append(on_delivery)

    def complete(self, index: int, error: Any = None) -> None:
        with self._lock:
            self._outcomes[index] = error

    def _serve(self) -> int:
        with self._lock:
            ready = [(i, e) for i, e in self._outcomes.items() if i not in self._served]
            self._served.update(i for i, _ in ready)
            outstanding = len(self._callbacks) - len(self._served)
        for index, error in ready:
            self._callbacks[index](error, None)
            self.reported.add(index)
        return outstanding

    def poll(self, timeout: float) -> int:
        if self._serve():
            time.sleep(min(timeout, 0.01))
        return 0

    def flush(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while (outstanding := self._serve()) and time.monotonic() < deadline:
            time.sleep(0.01)
        return outstanding


def message(offset: int, key: bytes = b"k") -> Message:
    return Message(topic="orders", partition=0, offset=offset, key=key, value=b"v", headers=())


@pytest.fixture
def sink() -> Iterator[tuple[KafkaDeadLetterSink, FakeProducer]]:
    made: list[FakeProducer] = []

    def factory(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[0]

    dead_letters = KafkaDeadLetterSink({}, "{topic}.dlq", timeout=SHORT, producer_factory=factory)
    yield dead_letters, made[0]
    dead_letters.close()


def test_delivery_timeout_matches_the_publish_timeout(sink: tuple[KafkaDeadLetterSink, FakeProducer]) -> None:
    _, fake = sink
    assert fake.config["message.timeout.ms"] == int(SHORT * 1000)
    assert "delivery.timeout.ms" not in fake.config  # an alias of message.timeout.ms: one is set
    assert fake.config["enable.idempotence"] is True


def test_configured_delivery_timeout_is_kept() -> None:
    configs: list[dict[str, Any]] = []

    def factory(config: dict[str, Any]) -> FakeProducer:
        configs.append(config)
        return FakeProducer(config)

    KafkaDeadLetterSink({"delivery.timeout.ms": "9000"}, "{topic}.dlq", producer_factory=factory).close()
    assert configs[0]["delivery.timeout.ms"] == "9000"
    assert "message.timeout.ms" not in configs[0]


def test_a_waiting_publish_does_not_block_another_workers_publish() -> None:
    """(a) the old sink held one lock across produce+flush: the second publish could not even
    produce until the first one's flush gave up (after its whole timeout)."""
    made: list[FakeProducer] = []

    def factory(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[0]

    dead_letters = KafkaDeadLetterSink({}, "{topic}.dlq", timeout=5.0, producer_factory=factory)
    fake = made[0]
    stuck_outcome: list[BaseException | None] = []

    def stuck() -> None:  # the DLQ does not answer this record
        try:
            dead_letters.publish(message(1, b"a"), ValueError("bad"), 3)
            stuck_outcome.append(None)
        except DeadLetterError as error:
            stuck_outcome.append(error)

    first = threading.Thread(target=stuck, daemon=True)
    first.start()
    wait_for(lambda: len(fake.produced) == 1, 10, "the first record produced")

    done = threading.Event()

    def other() -> None:
        dead_letters.publish(message(2, b"b"), ValueError("bad"), 3)
        done.set()

    threading.Thread(target=other, daemon=True).start()
    wait_for(
        lambda: len(fake.produced) == 2, 10, "the second record produced"
    )  # produced without waiting for the first
    fake.complete(1)
    assert done.wait(SHORT * 10), "the second publish waited behind the first one's undelivered record"
    assert first.is_alive() and not stuck_outcome  # the first is still waiting for its own record
    fake.complete(0)
    first.join(2.0)
    assert stuck_outcome == [None]
    dead_letters.close()


def test_retry_waits_for_the_pending_record_instead_of_producing_a_copy(
    sink: tuple[KafkaDeadLetterSink, FakeProducer],
) -> None:
    """(b) the old sink produced a new record on every attempt, leaving the timed-out ones queued:
    a recovered DLQ received one copy per attempt."""
    dead_letters, fake = sink
    poison = message(7)
    with pytest.raises(DeadLetterError, match="no acknowledgement"):
        dead_letters.publish(poison, ValueError("bad"), 5)
    with pytest.raises(DeadLetterError, match="no acknowledgement"):
        dead_letters.publish(poison, ValueError("bad"), 5)  # still pending: not produced again
    assert len(fake.produced) == 1

    fake.complete(0)  # the first copy is finally delivered
    wait_for(
        lambda: 0 in fake.reported, 10, "the first record's delivery report"
    )  # its report arrived before the next attempt
    dead_letters.publish(poison, ValueError("bad"), 5)  # success, from the first copy's report
    assert fake.produced == [("orders.dlq", b"k")]


def test_retry_returns_when_the_pending_record_is_delivered_meanwhile(
    sink: tuple[KafkaDeadLetterSink, FakeProducer],
) -> None:
    dead_letters, fake = sink
    poison = message(7)
    with pytest.raises(DeadLetterError):
        dead_letters.publish(poison, ValueError("bad"), 5)
    threading.Timer(0.05, fake.complete, (0,)).start()  # delivered while the retry waits for it
    dead_letters.publish(poison, ValueError("bad"), 5)
    assert len(fake.produced) == 1


def test_retry_produces_again_once_the_pending_record_definitively_failed(
    sink: tuple[KafkaDeadLetterSink, FakeProducer],
) -> None:
    """(c) a record whose report says it failed is produced again, but only by the attempt after
    that report: the old sink produced a second copy while the first could still be delivered."""
    dead_letters, fake = sink
    poison = message(7)
    with pytest.raises(DeadLetterError, match="no acknowledgement"):
        dead_letters.publish(poison, ValueError("bad"), 5)
    threading.Timer(0.05, fake.complete, (0, "Local: Message timed out")).start()
    with pytest.raises(DeadLetterError, match="Message timed out"):
        dead_letters.publish(poison, ValueError("bad"), 5)  # waits for the first copy: it failed
    assert len(fake.produced) == 1

    def deliver_second() -> None:
        wait_for(lambda: len(fake.produced) == 2, 10, "a second record produced")
        fake.complete(1)

    threading.Thread(target=deliver_second, daemon=True).start()
    dead_letters.publish(poison, ValueError("bad"), 5)  # produced again, and delivered
    assert len(fake.produced) == 2


def test_produce_error_is_a_dead_letter_error_and_the_next_attempt_produces(
    sink: tuple[KafkaDeadLetterSink, FakeProducer],
) -> None:
    dead_letters, fake = sink
    real_produce = fake.produce
    calls = 0

    def full(*args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise BufferError("Local: Queue full")
        real_produce(*args, **kwargs)

    fake.produce = full  # type: ignore[method-assign]
    with pytest.raises(DeadLetterError, match="Queue full"):
        dead_letters.publish(message(3), ValueError("bad"), 5)
    threading.Timer(0.05, fake.complete, (0,)).start()
    dead_letters.publish(message(3), ValueError("bad"), 5)
    assert len(fake.produced) == 1


def test_close_flushes_and_stops_the_poll_thread() -> None:
    made: list[FakeProducer] = []

    def factory(config: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(config))
        return made[0]

    before = {thread.name for thread in threading.enumerate()}
    dead_letters = KafkaDeadLetterSink({}, "{topic}.dlq", timeout=SHORT, producer_factory=factory)
    assert "keyorder-dlq-poll" in {thread.name for thread in threading.enumerate()} - before
    with pytest.raises(DeadLetterError):
        dead_letters.publish(message(1), ValueError("bad"), 5)
    started = time.monotonic()
    dead_letters.close()  # the record is never delivered: the flush is bounded by the timeout
    assert time.monotonic() - started < SHORT + 1.0  # hang guard: close must not wait for an undelivered record
    assert not any(thread.name == "keyorder-dlq-poll" and thread.is_alive() for thread in threading.enumerate())
