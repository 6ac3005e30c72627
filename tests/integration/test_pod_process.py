"""``keyorder run`` as a real process: crash recovery (kill -9), SIGTERM, start-up errors."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from keyorder.devtools.embedded import FAST_GROUP_JOIN
from keyorder.devtools.loadgen import produce_keyed
from tests.conftest import group_committed, wait_until
from tests.guarantees import assert_at_least_once, assert_first_processing_in_order
from tests.integration.file_handler import read_records
from tests.support import wait_for_commits

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]
REPO = Path(__file__).resolve().parents[2]
MAX_INFLIGHT = 1_000


def start_consumer(
    bootstrap: str, topic: str, group: str, record_file: Path, sleep: float, *extra: str
) -> subprocess.Popen:
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "KEYORDER_TEST_RECORD_FILE": str(record_file),
        "KEYORDER_TEST_SLEEP": str(sleep),
        "KEYORDER_BOOTSTRAP_SERVERS": bootstrap,
        "KEYORDER_TOPICS": topic,
        "KEYORDER_GROUP_ID": group,
    }
    command = [
        sys.executable,
        "-m",
        "keyorder.cli",
        "run",
        "--handler",
        "tests.integration.file_handler:handle",
        "--workers",
        "16",
        "--http-port",
        "0",
        "--commit-interval",
        "0.2",
        "--max-inflight",
        str(MAX_INFLIGHT),
        "--max-inflight-per-partition",
        "500",
        "--max-uncommitted",
        str(MAX_INFLIGHT),
        *extra,
    ]
    for setting in FAST_GROUP_JOIN:
        command += ["--kafka-property", setting]
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def stop(process: subprocess.Popen) -> str:
    if process.poll() is None:
        process.kill()
    output, _ = process.communicate(timeout=30)
    return output.decode(errors="replace")


def test_kill_9_then_restart_loses_nothing_and_keeps_key_order(broker, make_topic, tmp_path):
    """(e) SIGKILL mid-stream, restart: at-least-once, first processings in key order, bounded duplicates."""
    topic = make_topic(4)
    produced = produce_keyed(broker.bootstrap, topic, 12_000, 300, seed=13)
    records_file = tmp_path / "records.txt"
    group = f"g-{topic}"
    first = start_consumer(broker.bootstrap, topic, group, records_file, 0.001)
    try:
        wait_until(
            lambda: len(read_records(str(records_file))) >= 4_000, 90, "progress before the crash", interval=0.02
        )
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        stop(first)
    before_crash = len(read_records(str(records_file)))
    assert before_crash < produced.total, "the crash came too late to test anything"
    second = start_consumer(broker.bootstrap, topic, group, records_file, 0.0)
    try:
        wait_until(
            lambda: len({(k, s) for k, s, _, _ in read_records(str(records_file))}) >= produced.total,
            120,
            "every message processed after the restart",
        )
        wait_for_commits(broker.bootstrap, group, topic, produced.end_offsets, 30)
    finally:
        output = stop(second)
    records = [(key, seq) for key, seq, _, _ in read_records(str(records_file))]
    duplicates = assert_at_least_once(records, produced.sequences)
    assert_first_processing_in_order(records)
    print(f"kill -9 after {before_crash} records: {duplicates} re-deliveries (bound {MAX_INFLIGHT})")
    assert duplicates <= MAX_INFLIGHT, f"{duplicates} re-deliveries exceed the in-flight bound\n{output[-3000:]}"


def test_sigterm_finishes_in_flight_commits_and_exits_within_grace(broker, make_topic, tmp_path):
    """(g) SIGTERM: stop polling, finish in-flight work, commit, exit 0 within the grace period."""
    topic = make_topic(2)
    produce_keyed(broker.bootstrap, topic, 20_000, 100, seed=17)
    records_file = tmp_path / "records.txt"
    group = f"g-{topic}"
    process = start_consumer(broker.bootstrap, topic, group, records_file, 0.004, "--shutdown-grace", "10")
    try:
        wait_until(lambda: len(read_records(str(records_file))) >= 1_000, 90, "progress", interval=0.02)
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
    assert "shutting down" in output and "stopped" in output
    records = read_records(str(records_file))
    committed = group_committed(broker.bootstrap, group, topic, 2)
    processed = {(partition, offset) for _, _, partition, offset in records}
    assert committed and sum(committed.values()) > 0, "nothing was committed on shutdown"
    for partition, position in committed.items():
        missing = [offset for offset in range(position) if (partition, offset) not in processed]
        assert not missing, f"partition {partition}: committed {position} but offsets {missing[:5]} never ran"
    in_flight_at_exit = len(processed) - sum(committed.values())
    assert 0 <= in_flight_at_exit <= MAX_INFLIGHT, "the final commit did not cover the finished work"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["--handler", "no_such_module:handle"], "module 'no_such_module' not found"),
        (["--handler", "keyorder_example.ledger:nope"], "has no attribute 'nope'"),
        (["--handler", "keyorder_example.ledger:nope", "--executor", "process"], "has no attribute 'nope'"),
        (["--handler", "keyorder_example.ledger:handle", "--handler-setup", "keyorder_example:nope"], "no attribute"),
        (["--handler", "keyorder_example.ledger:handle", "--handler-timeout", "5"], "needs --executor process"),
        (["--handler", "keyorder_example.ledger:handle", "--executor", "async"], "is a plain function"),
        (["--handler", "not-a-path"], "--handler / KEYORDER_HANDLER"),
        (["--handler", "keyorder_example.ledger:handle", "--workers", "0"], "--workers / KEYORDER_WORKERS"),
        (["--handler", "keyorder_example.ledger:handle", "--ordering", "random"], "--ordering / KEYORDER_ORDERING"),
        (
            ["--handler", "keyorder_example.ledger:handle", "--kafka-property", "no.such.property=1"],
            "No such configuration property",
        ),
        (
            ["--handler", "keyorder_example.ledger:handle", "--kafka-property", "enable.auto.commit=true"],
            "'enable.auto.commit' cannot be set",
        ),
    ],
)
def test_bad_start_up_input_exits_2_naming_the_problem(arguments, expected):
    environment = {
        **os.environ,
        "KEYORDER_TOPICS": "t",
        "KEYORDER_GROUP_ID": "g",
        "KEYORDER_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "keyorder.cli", "run", "--http-port", "0", *arguments],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr


def test_secrets_never_reach_the_logs(tmp_path):
    properties = tmp_path / "client.properties"
    properties.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=svc\nsasl.password=hunter2-very-secret\n"
    )
    environment = {
        **os.environ,
        "KEYORDER_TOPICS": "t",
        "KEYORDER_GROUP_ID": "g",
        "KEYORDER_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "KEYORDER_RDKAFKA_SSL_KEY_PASSWORD": "pw-secret-2",
    }
    log_file = tmp_path / "pod.log"
    with log_file.open("w") as log_output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keyorder.cli",
                "run",
                "--handler",
                "keyorder_example.ledger:handle",
                "--http-port",
                "0",
                "--kafka-properties-file",
                str(properties),
                "--log-level",
                "DEBUG",
            ],
            env=environment,
            stdout=log_output,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            wait_until(lambda: "librdkafka" in log_file.read_text(), 30, "client debug logs (connection attempts)")
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        finally:
            if process.poll() is None:
                process.kill()
    output = log_file.read_text()
    assert "Kafka properties" in output, output[-2000:]
    assert "hunter2" not in output and "pw-secret-2" not in output
    assert "sasl.mechanism" in output and "<redacted>" in output


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed when the block ends: connections to it are refused


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.mark.slow
def test_unreachable_broker_is_not_ready_is_measured_and_logs_once(tmp_path):
    """A pod pointed at a closed port: /readyz 503 naming the reason, the metric 0, and librdkafka's
    ~20 "Connection refused" lines a second collapsed (the first once, then a count per 10 s)."""
    environment = {
        **os.environ,
        "KEYORDER_TOPICS": "t",
        "KEYORDER_GROUP_ID": "g",
        "KEYORDER_BOOTSTRAP_SERVERS": f"127.0.0.1:{_closed_port()}",
    }
    log_file = tmp_path / "pod.log"
    with log_file.open("w") as log_output:
        process = subprocess.Popen(
            [sys.executable, "-m", "keyorder.cli", "run", "--handler", "keyorder_example.ledger:handle",
             "--http-port", "0"],
            env=environment, stdout=log_output, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            wait_until(lambda: "metrics and health on http://" in log_file.read_text(), 30, "the HTTP port")
            started = time.monotonic()
            port = int(re.search(r"metrics and health on http://[^:]+:(\d+)", log_file.read_text())[1])
            base = f"http://127.0.0.1:{port}"
            readiness: list[tuple[int, str]] = []

            def unreachable_reported() -> bool:  # "not started" comes first, while the consumer starts
                readiness.append(_get(base + "/readyz"))
                return readiness[-1][0] == 503 and json.loads(readiness[-1][1])["reason"] == "no broker reachable"

            wait_until(unreachable_reported, 15, "/readyz 503 with reason 'no broker reachable'")
            assert all(status == 503 for status, _ in readiness), readiness  # never ready meanwhile
            assert _get(base + "/healthz")[0] == 200  # alive: a restart would not bring the broker back
            metrics = _get(base + "/metrics")[1]
            assert re.search(r"^keyorder_broker_reachable 0\.0$", metrics, re.M), metrics
            assert re.search(r"^keyorder_partitions_assigned 0\.0$", metrics, re.M), metrics
            time.sleep(max(0.0, 5.0 - (time.monotonic() - started)))
            process.send_signal(signal.SIGTERM)
            process.wait(60)
        finally:
            if process.poll() is None:
                process.kill()
    output = log_file.read_text()
    refused = [line for line in output.splitlines() if "Connection refused" in line]
    assert 1 <= len(refused) < 10, output[-3000:]


def test_keyorder_run_sets_its_garbage_collector_from_the_flag(tmp_path):
    """``--gc-threshold`` reaches the pod's own process (``keyorder.collector``): its set-up hook, run on the
    pod's threads, sees the young generation's threshold the flag gave, before any broker answered."""
    record_file = tmp_path / "records.txt"
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "KEYORDER_TEST_RECORD_FILE": str(record_file),
        "KEYORDER_TOPICS": "t",
        "KEYORDER_GROUP_ID": "g",
        "KEYORDER_BOOTSTRAP_SERVERS": f"127.0.0.1:{_closed_port()}",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "keyorder.cli", "run", "--handler", "keyorder_example.ledger:handle",
         "--handler-setup", "tests.unit.process_handlers:record_gc_threshold_setup", "--gc-threshold", "23456",
         "--http-port", "0"],
        env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_until(lambda: record_file.exists() and record_file.read_text().strip(), 30, "the set-up hook's line")
    finally:
        output = stop(process)
    assert record_file.read_text().split() == ["gc", str(process.pid), "23456"], output[-2000:]
