"""The pod against the real broker: order, concurrency, failures, rebalance, resize, metrics."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer, Producer

from keyorder.adapters.dead_letters import HEADER_ATTEMPTS, HEADER_ERROR, HEADER_OFFSET, HEADER_PARTITION, HEADER_TOPIC
from keyorder.devtools.loadgen import produce_keyed
from tests.conftest import Recorder, group_committed, stop_pod, wait_until
from tests.guarantees import (
    SerialPerKey,
    assert_at_least_once,
    assert_first_processing_in_order,
    assert_key_order,
)
from tests.support import wait_for, wait_for_commits

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]


def produce_one(bootstrap: str, topic: str, key: str, seq: int, partition: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=key.encode(), value=json.dumps({"key": key, "seq": seq}).encode(), partition=partition)
    assert producer.flush(10) == 0


def read_topic(bootstrap: str, topic: str, expect: int, linger: float = 2.0) -> list:
    """Everything in ``topic`` (waits for ``expect`` records, then ``linger`` more seconds for extras)."""
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{topic}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    reader.subscribe([topic])
    records, deadline, linger_until = [], time.monotonic() + 60, None
    try:
        while time.monotonic() < deadline:
            record = reader.poll(0.2)
            if record is not None and record.error() is None:
                records.append(record)
            if len(records) >= expect:
                linger_until = linger_until or time.monotonic() + linger
                if time.monotonic() >= linger_until:
                    break
    finally:
        reader.close()
    return records


def metrics_text(pod) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{pod.http_port}/metrics", timeout=5) as response:
        return response.read().decode()


def metric_value(text: str, name: str) -> float | None:
    """The first sample of ``name`` (``None`` when the family has no sample right now)."""
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_key_order_concurrency_and_commit_to_end(broker, make_topic, run_pod):
    """(a) 4 partitions, 200 keys, 20,000 messages, W=32, 0-5 ms handler; (b) real concurrency."""
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 20_000, 200, seed=11)
    recorder = Recorder(0.0, 0.005)
    pod = run_pod(topic, recorder, workers=32)
    wait_until(lambda: recorder.count() >= produced.total, 120, "every message handled")
    wait_until(
        lambda: {p.partition: p.committed for p in pod.runtime.snapshot.partitions} == produced.end_offsets,
        30,
        "commits to reach the end offsets",
    )
    stop_pod(pod)
    assert_key_order(recorder.records)
    recorder.serial.assert_serial()
    assert recorder.count() == produced.total
    assert group_committed(broker.bootstrap, f"g-{topic}", topic, 4) == produced.end_offsets


def test_async_handler_runs_thousands_of_workers_in_order(broker, make_topic, run_pod):
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 6_000, 2_000, seed=5)
    serial, records = SerialPerKey(), []

    async def handler(message):
        event = json.loads(message.value)
        serial.enter(event["key"])
        await asyncio.sleep(0.005)
        serial.leave(event["key"])
        records.append((event["key"], event["seq"]))

    pod = run_pod(topic, handler, workers=1024, max_workers=2048)
    wait_until(lambda: len(records) >= produced.total, 120, "every message handled")
    stop_pod(pod)
    assert_key_order(records)
    serial.assert_serial()


def test_sixteen_thread_workers_run_sixteen_keys_at_once(broker, make_topic, run_pod):
    """Concurrency as a behaviour, not a rate: the first 16 handler calls wait for each other at a
    barrier, so the pod gets past them only if 16 workers run 16 different keys at the same time."""
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 400, 100, seed=12)
    barrier, calls, lock = threading.Barrier(16, timeout=60), [0], threading.Lock()  # timeout: hang guard
    recorder = Recorder()

    def handler(message):
        with lock:
            calls[0] += 1
            first_sixteen = calls[0] <= 16
        if first_sixteen:
            barrier.wait()  # BrokenBarrierError (the message retried, the test failed) if fewer run at once
        recorder(message)

    run_pod(topic, handler, workers=16, max_attempts=1, on_exhausted="block")
    wait_until(lambda: recorder.count() >= produced.total, 120, "every message handled")
    assert not barrier.broken, "16 workers never ran 16 keys at once"
    assert_key_order(recorder.records)
    recorder.serial.assert_serial()


def test_async_workers_run_256_keys_at_once(broker, make_topic, run_pod):
    """The asyncio executor's concurrency as a behaviour: the first 256 calls meet at a barrier."""
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 1_000, 500, seed=13)
    serial, records, calls = SerialPerKey(), [], [0]
    barrier: asyncio.Barrier | None = None

    async def handler(message):
        nonlocal barrier
        event = json.loads(message.value)
        serial.enter(event["key"])
        calls[0] += 1
        if calls[0] <= 256:
            barrier = barrier or asyncio.Barrier(256)
            await asyncio.wait_for(barrier.wait(), 60)  # hang guard: fewer than 256 at once never meet
        serial.leave(event["key"])
        records.append((event["key"], event["seq"]))

    run_pod(topic, handler, workers=512, max_attempts=1, on_exhausted="block")
    wait_until(lambda: len(records) >= produced.total, 120, "every message handled")
    assert serial.peak >= 256
    assert_key_order(records)
    serial.assert_serial()


def test_poison_key_goes_to_dlq_while_other_keys_flow(broker, make_topic, run_pod):
    """(c) only the poison message is dead-lettered, after exactly max_attempts attempts."""
    topic = make_topic(2)
    produce_one(broker.bootstrap, topic, "poison", 0, partition=0)
    produced = produce_keyed(broker.bootstrap, topic, 2_000, 50, seed=3)
    recorder = Recorder(0.0005, 0.002, fail=lambda event: event["key"] == "poison")
    pod = run_pod(topic, recorder, workers=8, max_attempts=3, retry_initial_backoff=0.4, retry_max_backoff=2)
    dead = read_topic(broker.bootstrap, f"{topic}.dlq", expect=1)
    wait_until(lambda: recorder.count() >= produced.total, 60, "other keys handled")
    assert len(dead) == 1, f"expected exactly the poison message in the DLQ, got {len(dead)}"
    record = dead[0]
    headers = dict(record.headers())
    assert record.key() == b"poison"
    assert json.loads(record.value()) == {"key": "poison", "seq": 0}
    assert headers[HEADER_TOPIC] == topic.encode()
    assert headers[HEADER_PARTITION] == b"0" and headers[HEADER_OFFSET] == b"0"
    assert headers[HEADER_ATTEMPTS] == b"3"
    assert b"poison message poison/0" in headers[HEADER_ERROR]
    assert len(recorder.attempts) == 3, f"handler attempts on the poison message: {len(recorder.attempts)}"
    last_attempt = recorder.attempts[-1][2]
    finished_meanwhile = [d for d in recorder.details if d[2] == 0 and d[4] < last_attempt]
    assert finished_meanwhile, "other keys of the poison message's partition waited for its retries"
    assert ("poison", 0) not in recorder.records
    assert_key_order(recorder.records)
    wait_until(
        lambda: metric_value(metrics_text(pod), "keyorder_messages_dead_lettered_total") == 1, 10, "the DLQ counter"
    )
    end = {p.partition: p.committed for p in pod.runtime.snapshot.partitions}
    assert end[0] == produced.end_offsets[0], "a dead-lettered message must let the commit pass it"


def test_block_policy_parks_the_key_and_holds_the_commit(broker, make_topic, run_pod):
    topic = make_topic(1)
    produce_keyed(broker.bootstrap, topic, 100, 10, seed=2)
    produce_one(broker.bootstrap, topic, "stuck", 0, partition=0)
    produce_one(broker.bootstrap, topic, "stuck", 1, partition=0)
    later = produce_keyed(broker.bootstrap, topic, 300, 10, seed=4, start_sequences=None)
    recorder = Recorder(fail=lambda event: event["key"] == "stuck")
    pod = run_pod(
        topic,
        recorder,
        workers=4,
        max_attempts=2,
        on_exhausted="block",
        retry_initial_backoff=0.05,
        retry_max_backoff=0.5,
        shutdown_grace=1,
    )
    wait_until(lambda: recorder.count() >= 100 + later.total, 60, "keys other than the blocked one")
    wait_until(lambda: metric_value(metrics_text(pod), "keyorder_keys_blocked") == 1, 10, "the blocked-key gauge")
    wait_until(
        lambda: metric_value(metrics_text(pod), "keyorder_partition_min_inflight_offset") == 100,
        10,
        "the min-offset gauge to show the stuck offset",
    )
    wait_until(lambda: pod.runtime.snapshot.partitions[0].committed == 100, 10, "commit held at the stuck offset")
    assert not any(key == "stuck" for key, _ in recorder.records)
    wait_until(lambda: len(recorder.attempts) >= 4, 10, "a blocked key to keep being retried (every 0.5 s)")
    assert {seq for key, seq, _ in recorder.attempts if key == "stuck"} == {0}, "seq 1 ran before seq 0"


def test_rebalance_when_a_second_pod_joins(broker, make_topic, run_pod):
    """(d) a second consumer joins mid-stream: no loss, no per-key order violation."""
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 20_000, 200, seed=21)
    recorder = Recorder(0.002, 0.006)
    group = f"g-{topic}"
    first = run_pod(topic, recorder, group=group, workers=8)
    wait_until(lambda: recorder.count() >= 2_000, 60, "the first pod to make progress")
    second = run_pod(topic, recorder, group=group, workers=8)
    wait_until(lambda: len(set(recorder.records)) >= produced.total, 120, "every message handled once")
    wait_for_commits(broker.bootstrap, group, topic, produced.end_offsets, 30)
    assert first.runtime.snapshot.rebalances >= 2 and second.runtime.snapshot.rebalances >= 1
    assert second.runtime.snapshot.partitions, "the second pod got no partitions"
    duplicates = assert_at_least_once(recorder.records, produced.sequences)
    assert_first_processing_in_order(recorder.records)
    recorder.serial.assert_serial()
    print(f"rebalance: {duplicates} re-deliveries")


def test_live_resize_over_the_admin_endpoint(broker, make_topic, run_pod, tmp_path):
    """(f) 8 -> 32 -> 4 key workers mid-stream, through the token-protected endpoint: no violation."""
    token = "t0ken-" + "x" * 26
    token_file = tmp_path / "admin-token"
    token_file.write_text(token + "\n")
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 20_000, 300, seed=8)
    recorder = Recorder(0.0005, 0.003)
    pod = run_pod(topic, recorder, workers=8, admin_token_file=str(token_file))
    url = f"http://127.0.0.1:{pod.http_port}/admin/workers"

    def put(body: bytes, auth: str | None) -> tuple[int, dict]:
        request = urllib.request.Request(url, data=body, method="PUT", headers={"Authorization": auth} if auth else {})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            with error:
                return error.code, json.loads(error.read())

    assert put(b'{"workers": 32}', None)[0] == 401
    assert put(b'{"workers": 32}', "Bearer wrong-token-wrong-token")[0] == 401
    status, body = put(b'{"workers": "many"}', f"Bearer {token}")
    assert status == 400 and "workers" in body["error"]
    status, body = put(b'{"workers": 0}', f"Bearer {token}")
    assert status == 400 and "between 1 and" in body["error"]
    assert pod.runtime.workers == 8

    wait_until(lambda: recorder.count() >= 3_000, 60, "progress at 8 workers")
    assert put(b'{"workers": 32}', f"Bearer {token}") == (200, {"workers": 32, "previous": 8})
    wait_until(lambda: recorder.count() >= 9_000, 60, "progress at 32 workers")
    assert put(b'{"workers": 4}', f"Bearer {token}") == (200, {"workers": 4, "previous": 32})
    wait_until(lambda: recorder.count() >= produced.total, 120, "every message handled")
    wait_until(lambda: len(pod.pool.stats()) == 1 + 4, 10, "the 28 surplus workers to retire")
    assert metric_value(metrics_text(pod), "keyorder_workers") == 4
    stop_pod(pod)
    assert_key_order(recorder.records)
    recorder.serial.assert_serial()
    assert recorder.serial.peak > 8, "the resize to 32 never ran more than 8 handlers at once"


def test_metrics_and_health_endpoints(broker, make_topic, run_pod):
    topic = make_topic(2)
    produced = produce_keyed(broker.bootstrap, topic, 500, 20, seed=9, extra_config={"batch.num.messages": 1})
    recorder = Recorder()
    pod = run_pod(topic, recorder, workers=4)
    wait_until(lambda: recorder.count() >= produced.total, 60, "every message handled")
    base = f"http://127.0.0.1:{pod.http_port}"
    for path, expected in (("/healthz", "ok"), ("/readyz", "ready")):
        with urllib.request.urlopen(base + path, timeout=5) as response:
            assert json.loads(response.read())["status"] == expected
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(base + "/nope", timeout=5)
    missing.value.close()
    assert missing.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as disabled:
        urllib.request.urlopen(
            urllib.request.Request(base + "/admin/workers", data=b'{"workers": 2}', method="PUT"), timeout=5
        )
    disabled.value.close()
    assert disabled.value.code == 403, "without a token file the admin endpoint must be disabled"
    wait_until(
        lambda: metric_value(metrics_text(pod), "keyorder_messages_processed_total") == produced.total,
        10,
        "the processed counter",
    )
    committed_series = f'keyorder_partition_committed_offset{{partition="0",topic="{topic}"}}'
    wait_until(
        lambda: metric_value(metrics_text(pod), committed_series) == produced.end_offsets[0],
        10,
        "the committed-offset gauge to reach the end offset",
    )
    text = metrics_text(pod)
    assert metric_value(text, "keyorder_workers") == 4
    assert metric_value(text, "keyorder_pod_inflight_messages") == 0
    assert metric_value(text, "keyorder_handler_duration_seconds_count") == produced.total
    lag_series = f'keyorder_partition_lag_messages{{partition="1",topic="{topic}"}}'
    wait_until(lambda: metric_value(metrics_text(pod), lag_series) == 0, 15, "lag 0 at the end")
    assert len(pod.runtime.snapshot.partitions) == 2
    assert "key-" not in text, "metrics must never carry message keys"
    reading = metric_value(text, 'keyorder_poll_loop_seconds_total{activity="reading"}')
    assert reading is not None and reading > 0, "the poll loop's time inside consume"
    assert metric_value(text, f'keyorder_partition_pauses_total{{partition="0",topic="{topic}"}}') == 0
    fetch_queue = f'keyorder_partition_fetch_queue_messages{{partition="0",topic="{topic}"}}'
    wait_until(  # librdkafka's statistics come every 5 s
        lambda: metric_value(metrics_text(pod), fetch_queue) == 0, 15, "the drained partition's fetch queue"
    )


def test_a_fast_handler_at_the_bounds_holds_the_reading_without_pausing(broker, make_topic, run_pod):
    """The bounds are reached all the time, yet the workers keep up: the pod stops reading while they
    catch up (a hold) and never pauses, so the client's prefetched messages are never dropped."""
    topic = make_topic(2)
    produced = produce_keyed(broker.bootstrap, topic, 6_000, 300, seed=12)
    recorder = Recorder()
    bound = 100
    pod = run_pod(
        topic,
        recorder,
        workers=4,
        max_inflight=2 * bound,
        max_inflight_per_partition=bound,
        poll_batch=50,
        pause_after=30,  # a hold on a loaded machine must not turn into a pause here
    )
    wait_until(lambda: recorder.count() >= produced.total, 60, "every message handled")
    wait_until(
        lambda: {p.partition: p.committed for p in pod.runtime.snapshot.partitions} == produced.end_offsets,
        30,
        "commits to reach the end offsets",
    )
    snapshot = pod.runtime.snapshot
    stop_pod(pod)
    assert snapshot.holds > 0, "6,000 messages through a 100-message window must have reached it"
    assert [part.pauses for part in snapshot.partitions] == [0, 0]
    assert snapshot.waiting_seconds > 0, "the loop waited for the workers during the holds"
    assert_key_order(recorder.records)
    assert recorder.count() == produced.total


def test_backpressure_bounds_what_a_blocked_key_holds_back(broker, make_topic, run_pod):
    """A blocked key at the head of a partition: the pod pauses the partition instead of buffering it."""
    topic = make_topic(1)
    produce_one(broker.bootstrap, topic, "stuck", 0, partition=0)
    produced = produce_keyed(broker.bootstrap, topic, 3_000, 50, seed=6)
    recorder = Recorder(fail=lambda event: event["key"] == "stuck")
    bound, batch = 300, 50
    pod = run_pod(
        topic,
        recorder,
        workers=8,
        max_attempts=1,
        on_exhausted="block",
        retry_max_backoff=5,
        max_inflight_per_partition=bound,
        max_inflight=bound,
        max_uncommitted=bound,
        poll_batch=batch,
        shutdown_grace=1,
    )
    series = f'keyorder_partition_paused{{partition="0",topic="{topic}"}}'
    wait_until(lambda: metric_value(metrics_text(pod), series) == 1, 30, "the partition to be paused")
    handled_when_paused = recorder.count()
    wait_until(lambda: pod.runtime.snapshot.partitions[0].uncommitted >= bound, 5, "the snapshot to catch up")
    part = pod.runtime.snapshot.partitions[0]
    assert part.uncommitted <= bound + batch, f"{part.uncommitted} uncommitted > bound {bound} + one batch"
    assert part.committed == 0 and part.min_inflight == 0
    assert handled_when_paused < bound + batch < produced.total
    # the poll loop must have run (and could have delivered) before "nothing was delivered" means anything
    iterations: set[float] = set()
    wait_for(
        lambda: iterations.add(pod.runtime.last_iteration) or len(iterations) >= 20,
        30,
        "20 poll-loop iterations while the partition is paused",
        interval=0.005,
    )
    assert recorder.count() == handled_when_paused, "a paused partition kept delivering"


def test_a_transactional_topic_reaches_zero_lag(broker, make_topic, run_pod):
    """Defect 7: each committed transaction leaves a commit marker the client never hands out. The
    group's committed offset must reach the log end (past the last marker), yet never pass a record."""
    topic = make_topic(1, with_dlq=False)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(15)
    sequences = {"a": 0, "b": 0}
    for _transaction in range(20):
        producer.begin_transaction()
        for index in range(5):
            key = "a" if index % 2 else "b"
            producer.produce(topic, key=key.encode(), value=json.dumps({"key": key, "seq": sequences[key]}).encode())
            sequences[key] += 1
        producer.commit_transaction(15)
    recorder = Recorder()
    pod = run_pod(topic, recorder, workers=4)
    wait_until(lambda: recorder.count() >= 100, 60, "every record handled")
    offsets = sorted(offset for _key, _seq, _partition, offset, _at in recorder.details)
    assert offsets[-1] == 100 - 1 + 20 - 1, "records at 0-4, 6-10, ...: one marker after each transaction"
    log_end = offsets[-1] + 2  # past the last transaction's marker
    wait_until(
        lambda: group_committed(broker.bootstrap, f"g-{topic}", topic, 1) == {0: log_end},
        15,
        f"the committed offset to pass the last marker to {log_end}",
        interval=0.3,
    )
    wait_until(lambda: [p.lag for p in pod.runtime.snapshot.partitions] == [0], 10, "lag 0 in the pod's view")
    stop_pod(pod)
    assert_key_order(recorder.records)
    assert group_committed(broker.bootstrap, f"g-{topic}", topic, 1) == {0: log_end}
