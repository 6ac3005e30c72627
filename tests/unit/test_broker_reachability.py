"""An unreachable broker is visible: the source's reachability state, the collapse of librdkafka's
repeated log lines, the snapshot, ``/readyz`` and the metrics.

No broker: librdkafka's ``error_cb`` is called directly with the errors it sends, the consumer
behind ``KafkaSource`` is replaced by a FAKE one where a probe or a record is needed, and time is a
FAKE clock.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from keyorder.adapters.http_server import PodHttpServer, readiness
from keyorder.adapters.kafka_source import LIBRDKAFKA_LOGGER, PROBE_INTERVAL, CollapsingFilter, KafkaSource
from keyorder.adapters.metrics import build_registry
from keyorder.core.retry import RetryPolicy
from keyorder.core.routing import Ordering
from keyorder.engine.poll_loop import ConsumerRuntime, RuntimeSettings, RuntimeSnapshot
from keyorder.engine.worker_pools import Completions, ThreadWorkerPool
from tests.fakes import FakeClock, RecordingSource

REFUSED = (
    "FAIL [rdkafka#consumer-1] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 "
    "failed: Connection refused (after {}ms in state CONNECT)"
)


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(autouse=True)
def fresh_librdkafka_logger() -> Any:
    """The filter is installed once per logger and keeps its creator's clock: start and end without one."""
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)

    def remove() -> None:
        for existing in [f for f in logger.filters if isinstance(f, CollapsingFilter)]:
            logger.removeFilter(existing)

    remove()
    yield
    remove()


@pytest.fixture
def captured() -> Any:
    logger = logging.getLogger(f"test.collapse.{id(object())}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = ListHandler()
    logger.addHandler(handler)
    clock = FakeClock()
    collapse = CollapsingFilter.install(logger, 10.0, clock)
    return logger, handler.lines, clock, collapse


# -- the collapse of repeated lines -------------------------------------------------------------------
def test_identical_error_lines_are_logged_once_then_counted_once_per_interval(captured) -> None:
    logger, lines, clock, collapse = captured
    for attempt in range(200):  # 20 a second for 10 s, as librdkafka does against a closed port
        logger.log(logging.ERROR, "%s", REFUSED.format(attempt % 3))  # the "after Nms" part varies
        clock.sleep(0.049)
    assert lines == [REFUSED.format(0)]
    clock.sleep(0.3)
    logger.error("%s", REFUSED.format(0))  # the interval is over: its summary, this one counted in the next
    assert lines[1:] == [REFUSED.format(0) + " (repeated 199 times in the last 10 s)"]
    clock.sleep(10)
    collapse.flush()  # no new line: the poll loop's flush still reports the last interval
    assert lines[2:] == [REFUSED.format(0) + " (repeated 1 times in the last 10 s)"]
    clock.sleep(10)
    collapse.flush()  # a quiet interval: nothing to say, the line is forgotten
    assert len(lines) == 3
    logger.error("%s", REFUSED.format(0))  # after a quiet interval it is news again
    assert lines[3:] == [REFUSED.format(0)]


def test_different_lines_and_lower_levels_are_not_collapsed(captured) -> None:
    logger, lines, _clock, _collapse = captured
    for _ in range(3):
        logger.warning("broker a down")
        logger.warning("broker b down")
        logger.info("rebalance")
    assert lines == ["broker a down", "broker b down", "rebalance", "rebalance", "rebalance"]


def test_the_source_collapses_every_librdkafka_line_with_its_clock() -> None:
    """The filter sits on the librdkafka logger the consumer and the dead-letter producer share."""
    clock = FakeClock()
    source = KafkaSource({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, clock=clock)
    try:
        logger = logging.getLogger(LIBRDKAFKA_LOGGER)
        collapse = source.librdkafka_log
        assert collapse in logger.filters
        assert KafkaSource({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}).librdkafka_log is collapse
        handler = ListHandler()
        logger.addHandler(handler)
        try:
            for _ in range(5):
                logger.error("%s", REFUSED.format(0) + " unique to this test")
            clock.sleep(collapse.interval)
            collapse.flush()
        finally:
            logger.removeHandler(handler)
        assert handler.lines == [
            REFUSED.format(0) + " unique to this test",
            REFUSED.format(0) + " unique to this test (repeated 4 times in the last 10 s)",
        ]
    finally:
        source._consumer.close()


# -- reachability --------------------------------------------------------------------------------------
class FakeConsumer:
    """FAKE confluent-kafka consumer: metadata probes answer or fail as told; no records."""

    def __init__(self) -> None:
        self.probes = 0
        self.fail_with: str | None = None
        self.on_assign: Any = None

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        self.probes += 1
        if self.fail_with:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, self.fail_with))
        return object()

    def consume(self, num_messages: int, timeout: float) -> list:
        return []

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self.on_assign = on_assign


@pytest.fixture
def source() -> Any:
    clock = FakeClock()
    real = KafkaSource({"bootstrap.servers": "127.0.0.1:1", "group.id": "g"}, clock=clock)
    real_consumer, fake = real._consumer, FakeConsumer()
    real._consumer = fake  # type: ignore[assignment]
    yield real, fake, clock
    real_consumer.close()


def test_not_reachable_until_a_broker_answers(source) -> None:
    kafka, fake, _clock = source
    assert kafka.broker_reachable is False and kafka.broker_error == "no broker contacted yet"
    kafka.consume(10, 0.0)
    assert fake.probes == 1 and kafka.broker_reachable is True and kafka.broker_error is None
    kafka.consume(10, 0.0)
    assert fake.probes == 1  # reachable and nothing suspect: no more probes


def test_all_brokers_down_is_unreachable_at_once_and_a_probe_brings_it_back(source) -> None:
    kafka, fake, clock = source
    kafka.consume(10, 0.0)
    kafka._error_callback(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
    assert kafka.broker_reachable is False and kafka.broker_error == "1/1 brokers are down"
    fake.fail_with = "Failed to get metadata: Local: Broker transport failure"
    clock.sleep(PROBE_INTERVAL)
    kafka.consume(10, 0.0)
    assert fake.probes == 2 and kafka.broker_reachable is False
    assert kafka.broker_error == fake.fail_with
    kafka.consume(10, 0.0)
    assert fake.probes == 2  # at most one probe per interval
    fake.fail_with = None
    clock.sleep(PROBE_INTERVAL)
    kafka.consume(10, 0.0)
    assert fake.probes == 3 and kafka.broker_reachable is True


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError._RESOLVE])
def test_one_connection_failing_is_only_suspect_until_a_probe_fails(source, code) -> None:
    kafka, fake, clock = source
    kafka.consume(10, 0.0)
    for _ in range(20):
        kafka._error_callback(KafkaError(code, "127.0.0.1:1/bootstrap: Connect failed: Connection refused"))
    assert kafka.broker_reachable is True  # another broker may serve everything
    clock.sleep(PROBE_INTERVAL)
    kafka.consume(10, 0.0)
    assert fake.probes == 2 and kafka.broker_reachable is True  # it did: the probe answered
    kafka._error_callback(KafkaError(code, "127.0.0.1:1/bootstrap: Connect failed: Connection refused"))
    fake.fail_with = "Failed to get metadata: Local: Broker transport failure"
    clock.sleep(PROBE_INTERVAL)
    kafka.consume(10, 0.0)
    assert fake.probes == 3 and kafka.broker_reachable is False


def test_an_assignment_proves_the_broker_reachable(source) -> None:
    kafka, fake, _clock = source
    assigned: list = []
    kafka.subscribe(["t"], assigned.append, lambda _p: None, lambda _p: None)
    fake.on_assign(None, [])  # an empty assignment (a surplus pod) still means the coordinator answered
    assert kafka.broker_reachable is True and assigned == [[]]


# -- the snapshot, /readyz, the metrics ----------------------------------------------------------------
def runtime_with(source: Any) -> ConsumerRuntime:
    completions = Completions()
    pool = ThreadWorkerPool(lambda _message: None, 2, RetryPolicy(), None, completions)
    clock = FakeClock()
    return ConsumerRuntime(RuntimeSettings(topics=("t",)), source, pool, Ordering.KEY, completions, clock=clock)


def test_the_snapshot_carries_reachability_and_the_assigned_partitions() -> None:
    source = RecordingSource({("t", 0): 0, ("t", 1): 0})
    source.broker_reachable = False  # type: ignore[attr-defined]
    source.broker_error = "1/1 brokers are down"  # type: ignore[attr-defined]
    runtime = runtime_with(source)
    runtime._publish_snapshot(0.0)
    assert runtime.snapshot.broker_reachable is False and runtime.snapshot.assigned_partitions == 0
    assert runtime.snapshot.broker_error == "1/1 brokers are down"
    source.broker_reachable = True  # type: ignore[attr-defined]
    source.broker_error = None  # type: ignore[attr-defined]
    runtime._on_assign([("t", 0), ("t", 1)])
    runtime._publish_snapshot(0.0)
    assert runtime.snapshot.broker_reachable is True and runtime.snapshot.assigned_partitions == 2


class _Runtime:
    """Stand-in for ConsumerRuntime: what /readyz and the collector read."""

    def __init__(self, snapshot: RuntimeSnapshot, started: bool = True, stopping: bool = False) -> None:
        self.snapshot = snapshot
        self.started = threading.Event()
        if started:
            self.started.set()
        self.stopping = stopping


@pytest.mark.parametrize(
    ("snapshot", "status", "reason"),
    [
        (RuntimeSnapshot(broker_reachable=False, broker_error="1/1 brokers are down"), 503, "no broker reachable"),
        (RuntimeSnapshot(broker_reachable=False, assigned_partitions=3), 503, "no broker reachable"),
        # a pod beyond the partition count is idle by design: ready, so rollouts and worker pushes proceed
        (RuntimeSnapshot(broker_reachable=True, assigned_partitions=0), 200, "no partitions assigned"),
        (RuntimeSnapshot(broker_reachable=True, assigned_partitions=3), 200, None),
    ],
)
def test_readyz_says_why(snapshot: RuntimeSnapshot, status: int, reason: str | None) -> None:
    answer, body = readiness(_Runtime(snapshot))  # type: ignore[arg-type]
    assert answer == status and body.get("reason") == reason
    assert body["status"] == ("ready" if status == 200 else "not ready")


def test_readyz_over_http_and_the_metrics() -> None:
    pool = ThreadWorkerPool(lambda _message: None, 2, RetryPolicy(), None, Completions())
    runtime = _Runtime(RuntimeSnapshot(broker_reachable=False, broker_error="1/1 brokers are down"))
    runtime.pool = pool  # type: ignore[attr-defined]
    registry = build_registry(runtime, pool)  # type: ignore[arg-type]
    server = PodHttpServer(runtime, registry, "127.0.0.1", 0, None)  # type: ignore[arg-type]
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/readyz", timeout=5)
        assert refused.value.code == 503
        assert json.loads(refused.value.read()) == {
            "status": "not ready",
            "reason": "no broker reachable",
            "error": "1/1 brokers are down",
        }
        metrics = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert "keyorder_broker_reachable 0.0" in metrics and "keyorder_partitions_assigned 0.0" in metrics
        runtime.snapshot = RuntimeSnapshot(broker_reachable=True, assigned_partitions=0)
        with urllib.request.urlopen(base + "/readyz", timeout=5) as response:
            assert response.status == 200
            assert json.loads(response.read())["reason"] == "no partitions assigned"
        metrics = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert "keyorder_broker_reachable 1.0" in metrics
    finally:
        server.stop()
