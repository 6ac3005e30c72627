"""The process executor against the real broker: the pod's guarantees hold with worker processes.

Handlers run in real worker processes (loaded by path) and report through a shared file
(``file_handler.handle_timed``); one worker process is killed with SIGKILL mid-message; a real
``keyorder run --executor process`` is stopped with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from keyorder.devtools.loadgen import key_name, produce_keyed
from tests.conftest import group_committed, stop_pod, wait_until
from tests.guarantees import (
    assert_at_least_once,
    assert_first_processing_in_order,
    assert_key_order,
    assert_serial_in_order_per_key,
)
from tests.integration.file_handler import read_records, read_timed
from tests.integration.test_pod_kafka import metric_value, metrics_text, read_topic
from tests.integration.test_pod_process import start_consumer, stop
from tests.support import wait_for_commits

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]
HANDLER = "tests.integration.file_handler:handle_timed"
STALL_KEY, POISON_KEY = key_name(7), key_name(3)


@pytest.fixture
def record_file(tmp_path, monkeypatch):
    path = str(tmp_path / "records.txt")
    monkeypatch.setenv("KEYORDER_TEST_RECORD_FILE", path)  # the worker processes inherit the environment
    return path


def test_worker_processes_keep_key_order_run_keys_serially_and_commit_to_the_end(
    broker, make_topic, run_pod, record_file
):
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 6_000, 200, seed=21)
    pod = run_pod(topic, HANDLER, executor="process", workers=3)
    wait_until(lambda: len(read_timed(record_file)) >= produced.total, 120, "every message handled", interval=0.1)
    wait_for_commits(broker.bootstrap, f"g-{topic}", topic, produced.end_offsets, 30)
    text = metrics_text(pod)
    stop_pod(pod)
    runs = sorted(read_timed(record_file), key=lambda run: run[5])
    assert_key_order([(key, seq) for key, seq, *_ in runs])
    assert_serial_in_order_per_key([(key, seq, start, end) for key, seq, _p, _o, _pid, start, end in runs])
    assert len({pid for *_, pid, _start, _end in runs}) == 3 and os.getpid() not in {run[4] for run in runs}
    assert 'keyorder_pod_executor{executor="process"} 1.0' in text
    assert metric_value(text, "keyorder_worker_processes") == 3
    assert metric_value(text, "keyorder_pod_cpu_seconds_total") > metric_value(text, "process_cpu_seconds_total")


def test_a_worker_process_killed_with_sigkill_mid_message_loses_nothing_and_keeps_order(
    broker, make_topic, run_pod, record_file, monkeypatch
):
    monkeypatch.setenv("KEYORDER_TEST_STALL_KEY", STALL_KEY)
    topic = make_topic(2)
    produced = produce_keyed(broker.bootstrap, topic, 3_000, 50, seed=5)
    assert STALL_KEY in produced.sequences, sorted(produced.sequences)[:5]
    pod = run_pod(topic, HANDLER, executor="process", workers=2)
    marker = record_file + ".stalled"
    wait_until(lambda: os.path.exists(marker), 60, "the message of the stall key's seq 0 to stall in a worker process")
    with open(marker) as file:
        victim = int(file.read())
    assert victim in pod.pool.worker_pids()
    os.kill(victim, signal.SIGKILL)
    wait_for_commits(broker.bootstrap, f"g-{topic}", topic, produced.end_offsets, 120)
    assert victim not in pod.pool.worker_pids() and len(pod.pool.worker_pids()) == 2, "not replaced"
    text = metrics_text(pod)
    stop_pod(pod)
    runs = read_timed(record_file)
    records = [(key, seq) for key, seq, *_ in sorted(runs, key=lambda run: run[5])]
    assert_at_least_once(records, produced.sequences)
    assert_first_processing_in_order(records)
    assert (STALL_KEY, 0) in records
    assert 'keyorder_worker_process_restarts_total{reason="crashed"} 1.0' in text
    assert 'keyorder_messages_interrupted_total{reason="crashed"} 1.0' in text


def test_a_poison_key_is_dead_lettered_from_a_worker_process_while_the_other_keys_flow(
    broker, make_topic, run_pod, record_file, monkeypatch
):
    monkeypatch.setenv("KEYORDER_TEST_POISON_KEY", POISON_KEY)
    topic = make_topic(2)
    produced = produce_keyed(broker.bootstrap, topic, 400, 20, seed=3)
    poisoned = produced.sequences[POISON_KEY]
    pod = run_pod(topic, HANDLER, executor="process", workers=2, max_attempts=2, retry_initial_backoff=0.01)
    dead = read_topic(broker.bootstrap, f"{topic}.dlq", poisoned, linger=1.0)
    wait_for_commits(broker.bootstrap, f"g-{topic}", topic, produced.end_offsets, 60)
    stop_pod(pod)
    assert len(dead) == poisoned
    errors = {dict(record.headers())["keyorder.error"].decode() for record in dead}
    assert all(error.startswith(f"ValueError: poison {POISON_KEY}/") for error in errors), errors
    others = {key: total for key, total in produced.sequences.items() if key != POISON_KEY}
    assert_at_least_once([(key, seq) for key, seq, *_ in read_timed(record_file)], others)


def test_a_second_pod_joining_revokes_partitions_from_worker_processes_without_loss_or_reordering(
    broker, make_topic, run_pod, record_file, monkeypatch
):
    monkeypatch.setenv("KEYORDER_TEST_SLEEP", "0.003")  # the first pod still busy when the second has joined
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 6_000, 200, seed=23)
    group = f"g-{topic}"
    first = run_pod(topic, HANDLER, group=group, executor="process", workers=2)
    wait_until(lambda: len(read_timed(record_file)) >= 600, 60, "the first pod to make progress", interval=0.1)
    second = run_pod(topic, HANDLER, group=group, executor="process", workers=2)
    # its worker processes start and the group rebalances: seconds on a loaded machine (make test once read none
    # assigned after 9 s, when the first pod had drained the topic)
    wait_until(lambda: second.runtime.snapshot.partitions, 90, "the second pod to get partitions", interval=0.1)
    wait_for_commits(broker.bootstrap, group, topic, produced.end_offsets, 120)
    assert first.runtime.snapshot.rebalances >= 2 and second.runtime.snapshot.rebalances >= 1
    assert second.runtime.snapshot.partitions, "the second pod got no partitions"
    stop_pod(second)
    stop_pod(first)
    runs = sorted(read_timed(record_file), key=lambda run: run[5])
    records = [(key, seq) for key, seq, *_ in runs]
    duplicates = assert_at_least_once(records, produced.sequences)
    assert_first_processing_in_order(records)
    print(f"rebalance with worker processes: {duplicates} re-deliveries")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:
            return [int(child) for child in file.read().split()]
    except OSError:
        return []


def test_sigterm_lets_worker_processes_finish_commits_and_leaves_no_process_behind(broker, make_topic, tmp_path):
    topic = make_topic(2)
    produce_keyed(broker.bootstrap, topic, 5_000, 100, seed=17)
    records_file = tmp_path / "records.txt"
    group = f"g-{topic}"
    process = start_consumer(
        broker.bootstrap, topic, group, records_file, 0.004, "--executor", "process", "--workers", "2",
        "--shutdown-grace", "10",
    )  # fmt: skip
    try:
        wait_until(lambda: len(read_records(str(records_file))) >= 300, 90, "progress", interval=0.05)
        workers = _children(process.pid)
        assert len(workers) == 2, workers
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(20)
        took = time.monotonic() - signalled
    finally:
        output = stop(process)
    assert returncode == 0, output[-3000:]
    # hang guard: the grace is 10 s, after which Kubernetes would SIGKILL the pod (the behaviour checked is
    # the clean exit 0 and what it committed, below)
    assert took < 10 + 3, f"exit took {took:.1f}s, grace is 10s"
    left = [worker for worker in workers if os.path.exists(f"/proc/{worker}")]
    assert not left, f"worker processes {left} outlived the pod"
    records = read_records(str(records_file))
    committed = group_committed(broker.bootstrap, group, topic, 2)
    processed = {(partition, offset) for _, _, partition, offset in records}
    assert committed and sum(committed.values()) > 0, "nothing was committed on shutdown"
    for partition, position in committed.items():
        missing = [offset for offset in range(position) if (partition, offset) not in processed]
        assert not missing, f"partition {partition}: committed {position} but offsets {missing[:5]} never ran"


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_a_failing_set_up_hook_stops_keyorder_run_with_status_1_before_it_joins_the_group(executor):
    environment = {
        **os.environ,
        "KEYORDER_TOPICS": "t",
        "KEYORDER_GROUP_ID": "g",
        "KEYORDER_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "keyorder.cli", "run", "--http-port", "0", "--handler",
         "tests.unit.process_handlers:record", "--handler-setup", "tests.unit.process_handlers:failing_setup",
         "--executor", executor, "--workers", "2"],
        env=environment, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-2000:]
    assert "set-up hook failed: RuntimeError: database unreachable" in result.stderr
