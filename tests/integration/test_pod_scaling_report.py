"""A real pod's scaling report (``GET /admin/scaling``), read through the operator's own client.

Real broker, real pod: a hot key backlogged on one partition and a poison key blocked on the
other. The report must name the hot key and where it is, mark the blocked partition, and the
operator's ``combine`` must turn that into the blocked lag it leaves out of its sizing.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Producer

from keyorder_operator.pod_admin import fetch_reports
from keyorder_operator.pod_signals import combine
from tests.conftest import Recorder, stop_pod, wait_until
from tests.guarantees import assert_key_order

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]
TOKEN = "scaling-report-token-" + "x" * 20


def produce(bootstrap: str, topic: str, messages: list[tuple[str, int, int]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, seq, partition in messages:
        producer.produce(topic, key=key, value=json.dumps({"key": key, "seq": seq}), partition=partition)
    producer.flush(30)


def test_report_names_the_hot_key_and_the_blocked_partition(broker, make_topic, run_pod, tmp_path):
    topic = make_topic(2)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    hot = [("acct-17", seq, 0) for seq in range(1_500)]
    light = [(f"light-{n}", seq, 0) for seq in range(2) for n in range(100)]
    poison = [("poison", seq, 1) for seq in range(3)]
    recorder = Recorder(0.004, 0.006, fail=lambda event: event["key"] == "poison")
    pod = run_pod(
        topic,
        recorder,
        workers=4,
        max_attempts=2,
        on_exhausted="block",
        retry_initial_backoff=0.05,
        retry_max_backoff=0.1,
        shutdown_grace=1,  # the blocked key never finishes: do not wait the default 30 s for it
        admin_token_file=str(token_file),
    )
    produce(broker.bootstrap, topic, poison + hot + light)
    address = f"127.0.0.1:{pod.http_port}"

    seen: list[dict] = []

    def report_with_backlog() -> bool:
        reports, failures = fetch_reports([address], 0, TOKEN)
        assert not failures, failures
        (report,) = reports
        held = {part["partition"]: part["minOffsetHeld"] for part in report["partitions"]}
        lags = {part["partition"]: part["lag"] or 0 for part in report["partitions"]}
        busiest = report["busiestLane"]
        # the lag needs the partition's end offset, which the client learns from a fetch after the
        # assignment: a report right after a rebalance may still say 0
        if held.get(1) == "blocked" and lags.get(1, 0) >= 3 and busiest and busiest["backlog"] >= 100:
            seen.append(report)
        return bool(seen)

    wait_until(report_with_backlog, 60, "a report with the hot key backlogged and the poison key blocked")
    report = seen[0]
    assert report["busiestLane"]["key"] == "acct-17"
    assert (report["busiestLane"]["topic"], report["busiestLane"]["partition"]) == (topic, 0)
    assert report["ordering"] == "key" and report["workers"] == 4
    assert report["lanes"]["blocked"] == 1
    signals = combine([report])
    assert signals is not None and signals.busiest is not None
    assert signals.busiest.where == f"{topic}[0]"
    assert signals.blocked_lag >= 3, "the blocked key's partition lag (at least its 3 messages)"
    assert [held.where for held in signals.held if held.blocked] == [f"{topic}[1]"]

    _, failures = fetch_reports([address], 0, "wrong-token-" + "y" * 20)
    assert failures == [f"{address}: HTTP 401"]
    with pytest.raises(urllib.error.HTTPError) as unauthenticated:
        urllib.request.urlopen(f"http://{address}/admin/scaling", timeout=5)
    with unauthenticated.value as response:
        assert response.code == 401

    wait_until(lambda: recorder.count() >= len(hot) + len(light), 60, "the hot and light keys handled")
    stop_pod(pod)
    assert_key_order(recorder.records)
    assert not any(key == "poison" for key, _ in recorder.records)


def test_a_rotated_admin_token_is_accepted_without_a_restart(broker, make_topic, run_pod, tmp_path):
    """The operator recreates a deleted admin Secret with a new token; the kubelet updates the
    mounted file. The pod must then accept the new token, or every worker push would fail with 401
    until the pods restart, and refuse the old one at once, not only after a request with the new
    one (issue 37, finding 6)."""
    topic = make_topic(1)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    pod = run_pod(topic, Recorder(), workers=2, admin_token_file=str(token_file))
    address = f"127.0.0.1:{pod.http_port}"
    wait_until(lambda: not fetch_reports([address], 0, TOKEN)[1], 30, "the report with the first token")
    rotated = "rotated-token-" + "z" * 24
    token_file.write_text(rotated + "\n")
    assert fetch_reports([address], 0, TOKEN)[1] == [f"{address}: HTTP 401"], "the old token still works"
    reports, failures = fetch_reports([address], 0, rotated)
    assert not failures and reports[0]["workers"] == 2
    stop_pod(pod)
