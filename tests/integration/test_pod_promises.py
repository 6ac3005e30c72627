"""Promises of the README that no other test held the pod to, each against the real broker.

* **A worker that breaks** (a bug, not a handler failure): the pod logs it, ``/healthz`` turns 503,
  it commits what finished (never past an unfinished message) and ``keyorder run`` exits 1. The bug
  is injected into a real ``keyorder run`` process by ``tests/integration/broken_worker.py`` (named
  there as an injected defect): the dead-letter write raises a ``BaseException``, which the worker
  does not treat as a failed write.
* **The stall check**: ``/healthz`` turns 503 while the poll loop does not turn (here: a revoke
  waiting for a handler that does not end) and 200 again once it turns. The 60 s threshold is
  shortened for the test (``STALL_SECONDS``); the stall itself is real.
* **Several topics** in one pod: both drained in per-key order, both committed to their end.
* **Keyless messages**: in ``key`` ordering they share one lane per partition, so they run one at a
  time, in offset order, per partition.
* **``unordered``**: every message handled and committed, and one key's messages do run at the
  same time (a barrier the first calls of one key must meet).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer

from keyorder.adapters import http_server
from keyorder.devtools.embedded import FAST_GROUP_JOIN
from keyorder.devtools.loadgen import produce_keyed
from tests.conftest import Recorder, stop_pod
from tests.guarantees import assert_key_order
from tests.integration.file_handler import read_timed
from tests.support import EXACT_END_OFFSETS, free_port, group_committed, wait_for, wait_for_commits

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(180)]
REPO = Path(__file__).resolve().parents[2]


def healthz(port: int) -> int | None:
    """``/healthz``'s status code, or None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        with error:
            return error.code
    except OSError:
        return None


def produce_values(bootstrap: str, topic: str, records: list[tuple[bytes | None, dict, int]]) -> None:
    """``(key, value, partition)`` records, one per batch (exact end offsets on the test broker)."""
    producer = Producer({"bootstrap.servers": bootstrap, **EXACT_END_OFFSETS})
    for key, value, partition in records:
        producer.produce(topic, key=key, value=json.dumps(value).encode(), partition=partition)
    assert producer.flush(10) == 0


def test_a_broken_worker_turns_healthz_503_commits_what_finished_and_exits_1(broker, make_topic, tmp_path):
    topic = make_topic(2, with_dlq=False)
    produce_values(broker.bootstrap, topic, [(b"breaker", {"key": "breaker", "seq": 0}, 0)])
    produced = produce_keyed(broker.bootstrap, topic, 600, 60, seed=21, extra_config=EXACT_END_OFFSETS)
    records_file, port, group = tmp_path / "records.txt", free_port(), f"g-{topic}"
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "KEYORDER_TEST_RECORD_FILE": str(records_file),
        "KEYORDER_TEST_SLEEP": "0.3",  # the others are mid-call when the worker breaks: the shutdown waits
        "KEYORDER_TEST_POISON_KEY": "breaker",
        "KEYORDER_TEST_BREAK_KEY": "breaker",
        "KEYORDER_TEST_BREAK_AFTER_PARTITION": "1",  # partition 1 has finished work to commit when it breaks
    }
    command = [
        sys.executable, "-m", "tests.integration.broken_worker", "run",
        "--handler", "tests.integration.file_handler:handle_timed", "--bootstrap-servers", broker.bootstrap,
        "--topics", topic, "--group-id", group, "--workers", "8", "--max-attempts", "1",
        "--on-exhausted", "dlq", "--http-host", "127.0.0.1", "--http-port", str(port),
        "--commit-interval", "0.2", "--shutdown-grace", "10",
        "--kafka-property", "session.timeout.ms=6000", "--kafka-property", "heartbeat.interval.ms=500",
    ]  # fmt: skip
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO)
    statuses: list[int | None] = []
    try:
        wait_for(
            lambda: statuses.append(healthz(port)) or 503 in statuses or process.poll() is not None,
            60,
            "/healthz to answer 503 (or the process to end)",
            interval=0.01,
        )
        returncode = process.wait(30)  # hang guard
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate(timeout=30)[0].decode(errors="replace")
    assert 503 in statuses, f"/healthz never answered 503 after the worker broke: {set(statuses)}\n{output[-3000:]}"
    assert returncode == 1, f"exit status {returncode}\n{output[-3000:]}"
    assert "crashed" in output and "InjectedWorkerBug" in output, output[-3000:]
    handled = {(partition, offset) for _key, _seq, partition, offset, *_ in read_timed(str(records_file))}
    committed = group_committed(broker.bootstrap, group, topic, 2)
    assert committed.get(0) in (None, 0), f"partition 0 committed {committed.get(0)} past the unfinished message 0"
    for partition, offset in committed.items():  # what finished, and nothing beyond it
        below = {(partition, earlier) for earlier in range(offset)} - {(0, 0)}
        assert below <= handled, f"{topic}[{partition}] committed {offset} past unhandled offsets"
    assert committed.get(1, 0) > 0, "nothing that finished was committed"
    assert len(handled) < produced.total + 1, "the pod went on after its worker broke"


def test_healthz_fails_while_the_poll_loop_stalls_and_recovers_when_it_turns(broker, make_topic, run_pod, monkeypatch):
    monkeypatch.setattr(http_server, "STALL_SECONDS", 1.0)  # the 60 s threshold, shortened for the test
    topic = make_topic(2, with_dlq=False)
    produce_values(broker.bootstrap, topic, [(b"stuck", {"key": "stuck", "seq": 0}, 0)])
    release, entered = threading.Event(), threading.Event()
    recorder = Recorder()

    def handler(message):
        if message.key == b"stuck":
            entered.set()
            release.wait(60)  # hang guard
        recorder(message)

    group = f"g-{topic}"
    # eager (range): a join revokes every partition, the stuck handler's too (a cooperative join may
    # move only the other one, and then nothing waits)
    eager = [*FAST_GROUP_JOIN, "partition.assignment.strategy=range"]
    first = run_pod(topic, handler, group=group, workers=2, revoke_drain_timeout=30, kafka_property=eager)
    wait_for(entered.is_set, 30, "the stuck handler to start")
    assert healthz(first.http_port) == 200
    # a second member joins: the eager rebalance revokes every partition, and the revoke waits for the
    # running handler, so the poll loop stops turning
    second = run_pod(topic, Recorder(), group=group, workers=2, kafka_property=eager)
    wait_for(lambda: healthz(first.http_port) == 503, 30, "/healthz 503 while the poll loop is stuck in the revoke")
    release.set()
    wait_for(lambda: healthz(first.http_port) == 200, 30, "/healthz 200 once the poll loop turns again")
    stop_pod(second)
    stop_pod(first)


def test_one_pod_on_two_topics_drains_both_in_key_order_and_commits_both(broker, make_topic, run_pod):
    topics = [make_topic(2, with_dlq=False), make_topic(3, with_dlq=False)]
    produced = [
        produce_keyed(broker.bootstrap, name, 1_500, 40, seed=31 + index, extra_config=EXACT_END_OFFSETS)
        for index, name in enumerate(topics)
    ]
    # one recorder per topic: the same key names on both topics are separate keys, free to run at once
    recorders = {name: Recorder() for name in topics}

    def handler(message):
        recorders[message.topic](message)

    group = f"g-{topics[0]}-both"
    run_pod(topics[0], handler, group=group, topics=topics, workers=8)
    total = sum(log.total for log in produced)
    wait_for(lambda: sum(recorder.count() for recorder in recorders.values()) >= total, 60, "both topics handled")
    for name, log in zip(topics, produced, strict=True):
        assert recorders[name].count() == log.total, name
        assert_key_order(recorders[name].records)
        recorders[name].serial.assert_serial()
        wait_for_commits(broker.bootstrap, group, name, log.end_offsets, 30)


def test_keyless_messages_run_one_at_a_time_in_offset_order_per_partition(broker, make_topic, run_pod):
    topic = make_topic(2, with_dlq=False)
    records = [(None, {"key": f"p{index % 2}", "seq": index // 2}, index % 2) for index in range(400)]
    produce_values(broker.bootstrap, topic, records)
    running: dict[int, int] = {0: 0, 1: 0}
    overlaps, order, lock = [0], {0: [], 1: []}, threading.Lock()

    def handler(message):
        assert message.key is None
        with lock:
            running[message.partition] += 1
            overlaps[0] += running[message.partition] > 1
            order[message.partition].append(message.offset)
        threading.Event().wait(0.001)
        with lock:
            running[message.partition] -= 1

    group = f"g-{topic}"
    run_pod(topic, handler, group=group, workers=16)
    wait_for(lambda: len(order[0]) + len(order[1]) >= 400, 60, "every keyless message handled")
    assert overlaps[0] == 0, "two keyless messages of one partition ran at the same time"
    assert order == {0: list(range(200)), 1: list(range(200))}, "keyless messages out of offset order"
    wait_for_commits(broker.bootstrap, group, topic, {0: 200, 1: 200}, 30)


def test_unordered_mode_runs_one_keys_messages_at_the_same_time_and_commits_everything(broker, make_topic, run_pod):
    topic = make_topic(1, with_dlq=False)
    produced = produce_keyed(broker.bootstrap, topic, 500, 1, seed=41, extra_config=EXACT_END_OFFSETS)
    barrier, calls, lock = threading.Barrier(4, timeout=60), [0], threading.Lock()  # timeout: hang guard
    recorder = Recorder()

    def handler(message):
        with lock:
            calls[0] += 1
            first_four = calls[0] <= 4
        if first_four:  # four messages of the one key meet here: only unordered mode lets them
            barrier.wait()
        with lock:
            recorder.records.append((json.loads(message.value)["key"], json.loads(message.value)["seq"]))

    group = f"g-{topic}"
    run_pod(topic, handler, group=group, workers=8, ordering="unordered", max_attempts=1, on_exhausted="block")
    wait_for(lambda: len(recorder.records) >= produced.total, 60, "every message handled")
    assert not barrier.broken, "one key's messages never ran at the same time"
    assert sorted(seq for _key, seq in recorder.records) == list(range(produced.total))
    wait_for_commits(broker.bootstrap, group, topic, produced.end_offsets, 30)
