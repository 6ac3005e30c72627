"""The pod under network faults, against the real broker (Tansu) behind the test's ``FaultProxy``.

Each test breaks the network (or freezes a pod) while pods consume keyed messages that carry
per-key sequence numbers, then checks the guarantees with the shared oracles: nothing lost
(at-least-once), first processings in per-key order, and the group's committed offsets, sampled
from the broker throughout, never past a message that was not handled by then; at the end they
reach the end offsets. Each prints one ``FAULT`` line with its figures (messages, duplicates, time
to recover); README's "Faults, measured" table reports them.

Test-only client settings, never product defaults: ``session.timeout.ms`` 6000 and
``heartbeat.interval.ms`` 500 (FAST_GROUP_JOIN, so a group joins in about 3 s on Tansu), and small
in-flight windows so that a fault stalls the pods instead of letting them finish from memory.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from keyorder.adapters.dead_letters import HEADER_OFFSET, HEADER_PARTITION, HEADER_TOPIC, KafkaDeadLetterSink
from keyorder.devtools.embedded import FAST_GROUP_JOIN, EmbeddedBroker, free_port
from keyorder.devtools.loadgen import create_topics, produce_keyed
from tests.conftest import Recorder, group_committed, stop_pod, wait_until
from tests.faults.proxy import FaultProxy
from tests.guarantees import assert_at_least_once, assert_first_processing_in_order
from tests.integration.file_handler import read_timed
from tests.support import wait_for_commits

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]
SESSION_TIMEOUT = 6.0
"""Seconds: the test consumers' session.timeout.ms (FAST_GROUP_JOIN)."""
WINDOW = {"max_inflight": 400, "max_inflight_per_partition": 200, "max_uncommitted": 800}
"""In-flight bounds small enough that a pod cut off from the broker runs out of work."""


def handled(recorder: Recorder) -> list[tuple[int, int, float]]:
    return [(partition, offset, at) for _key, _seq, partition, offset, at in list(recorder.details)]


def wait_handled_and_committed(broker: Any, recorder: Recorder, produced: Any, group: str, topic: str) -> None:
    """Until every produced message was handled and the group's commits reached the end offsets."""
    wait_until(lambda: len(set(recorder.records)) >= produced.total, 60, "every message handled")
    wait_for_commits(broker.bootstrap, group, topic, produced.end_offsets, 30)


def assert_guarantees(recorder: Recorder, produced: Any, audit: Any) -> int:
    """Nothing lost, first processings in per-key order, one worker per key at a time, and no commit
    sample past an unhandled message; returns the duplicates."""
    duplicates = assert_at_least_once(recorder.records, produced.sequences)
    assert_first_processing_in_order(recorder.records)
    recorder.serial.assert_serial()
    assert audit.assert_never_past_unhandled(handled(recorder)) >= 2, "too few commit samples to audit"
    return duplicates


def report(scenario: str, messages: int, duplicates: int, recovered: float, what: str) -> None:
    print(f"\nFAULT {scenario}: {messages} messages, {duplicates} duplicates, recovered in {recovered:.1f} s ({what})")


def test_connection_cuts_mid_stream_lose_nothing_and_commits_reach_the_end(broker, make_topic, run_pod, commit_audit):
    """Every broker connection (fetch, heartbeat, commit, coordinator) is cut four times while two
    pods consume; the clients reconnect on their own."""
    topic = make_topic(4, with_dlq=False)
    produced = produce_keyed(broker.bootstrap, topic, 4_000, 200, seed=31)
    recorder = Recorder(0.002, 0.006)
    group = f"g-{topic}"
    audit = commit_audit(broker.bootstrap, group, topic, 4)
    pods = [run_pod(topic, recorder, group=group, workers=4, **WINDOW) for _ in range(2)]
    cuts = []
    for share in (0.15, 0.35, 0.55, 0.75):
        wait_until(lambda share=share: recorder.count() >= share * produced.total, 60, f"{share:.0%} handled")
        cuts.append(broker.proxy.cut())
    last_cut = time.monotonic()
    wait_handled_and_committed(broker, recorder, produced, group, topic)
    recovered = time.monotonic() - last_cut
    for pod in pods:
        stop_pod(pod)
    audit.close()
    assert all(cut >= 1 for cut in cuts), f"a cut found no connection to cut: {cuts}"
    duplicates = assert_guarantees(recorder, produced, audit)
    report("connection cuts", produced.total, duplicates, recovered, f"{sum(cuts)} connections cut in 4 cuts; "
           "last cut -> every message handled and committed")  # fmt: skip


def test_a_silent_partition_past_the_session_timeout_rebalances_and_loses_nothing(
    broker, make_topic, run_pod, commit_audit
):
    """The network goes silent (nothing forwarded, no error) for longer than the session timeout,
    then heals: the group's sessions expire, the pods rejoin, and consumption resumes from the
    committed offsets."""
    topic = make_topic(4, with_dlq=False)
    produced = produce_keyed(broker.bootstrap, topic, 4_000, 200, seed=37)
    recorder = Recorder(0.002, 0.006)
    group = f"g-{topic}"
    audit = commit_audit(broker.bootstrap, group, topic, 4)
    pods = [run_pod(topic, recorder, group=group, workers=4, **WINDOW) for _ in range(2)]
    wait_until(lambda: recorder.count() >= 0.25 * produced.total, 60, "25% handled")
    wait_until(lambda: sum(pod.runtime.snapshot.assigned_partitions for pod in pods) == 4, 30, "a settled group")
    rebalances = [pod.runtime.snapshot.rebalances for pod in pods]
    broker.proxy.black_hole()
    time.sleep(SESSION_TIMEOUT + 2)  # the fault itself: silent for longer than the session timeout
    handled_in_partition = recorder.count()
    broker.proxy.heal()
    healed = time.monotonic()
    wait_handled_and_committed(broker, recorder, produced, group, topic)
    recovered = time.monotonic() - healed
    after = [pod.runtime.snapshot.rebalances for pod in pods]
    for pod in pods:
        stop_pod(pod)
    audit.close()
    assert handled_in_partition < produced.total, "everything was handled before the partition healed"
    assert all(now > before for now, before in zip(after, rebalances, strict=True)), (
        f"the pods did not rebalance after the partition: {rebalances} -> {after}"
    )
    duplicates = assert_guarantees(recorder, produced, audit)
    report("silent partition", produced.total, duplicates, recovered,
           f"{SESSION_TIMEOUT + 2:.0f} s black hole; heal -> every message handled and committed")  # fmt: skip


def test_a_lost_assignment_commits_nothing_for_the_lost_partitions(broker, make_topic, run_pod, commit_audit, caplog):
    """The network goes silent past the session timeout while handlers are mid-call: the client
    declares its assignment lost. The handlers then finish, but another member may own those
    partitions already, so the pod must commit none of them until it is assigned them again (README:
    "on a lost assignment nothing is committed"). A spy on the real source's ``commit`` (it calls
    through) records every commit the pod makes."""
    topic = make_topic(2, with_dlq=False)
    produced = produce_keyed(broker.bootstrap, topic, 2_000, 100, seed=47)
    group = f"g-{topic}"
    audit = commit_audit(broker.bootstrap, group, topic, 2)
    hold, release = threading.Event(), threading.Event()
    recorder = Recorder(0.001, 0.003)

    def handler(message: Any) -> None:
        if hold.is_set():
            release.wait(60)  # hang guard
        recorder(message)

    pod = run_pod(topic, handler, group=group, workers=4, **WINDOW)
    commits: list[tuple[float, set]] = []
    source, commit = pod.runtime.source, pod.runtime.source.commit

    def recording_commit(offsets: Any, asynchronous: bool) -> Any:
        commits.append((time.time(), set(offsets)))
        return commit(offsets, asynchronous)

    source.commit = recording_commit  # type: ignore[method-assign]
    wait_until(lambda: recorder.count() >= 300, 60, "some progress")
    wait_until(lambda: pod.runtime.snapshot.assigned_partitions == 2, 30, "both partitions assigned")
    caplog.set_level(logging.INFO, logger="keyorder.engine.poll_loop")
    hold.set()
    wait_until(lambda: pod.runtime.snapshot.inflight > 0, 10, "handlers held mid-call")
    broker.proxy.black_hole()

    def lost_at() -> float | None:
        return next((r.created for r in caplog.records if r.getMessage().startswith("lost partitions")), None)

    wait_until(lambda: lost_at() is not None, SESSION_TIMEOUT * 5, "the client to declare its assignment lost")
    release.set()  # the held handlers finish after the loss
    wait_until(lambda: pod.runtime.snapshot.inflight == 0, 30, "the held handlers to finish")
    broker.proxy.heal()
    wait_until(lambda: recorder.count() >= produced.total, 60, "every message handled")
    wait_for_commits(broker.bootstrap, group, topic, produced.end_offsets, 30)
    stop_pod(pod)
    audit.close()
    lost = lost_at()
    assert lost is not None
    reassigned = min(
        (r.created for r in caplog.records if r.created > lost and r.getMessage().startswith("assigned ")),
        default=float("inf"),
    )
    between = [partitions for at, partitions in commits if lost <= at < reassigned]
    assert not any(partition[0] == topic for partitions in between for partition in partitions), (
        f"committed lost partitions before they were assigned again: {between}"
    )
    assert any(at >= reassigned for at, _ in commits), "no commit after the partitions came back"
    assert_guarantees(recorder, produced, audit)


def start_pod_process(bootstrap: str, topic: str, group: str, record_file: Path) -> subprocess.Popen:
    """``keyorder run`` as a real process, recording ``handle_timed`` runs (pid, start, end) to a file."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "KEYORDER_TEST_RECORD_FILE": str(record_file),
        "KEYORDER_TEST_SLEEP": "0.01",  # handlers mostly mid-call, so the freeze catches some
        "KEYORDER_BOOTSTRAP_SERVERS": bootstrap,
        "KEYORDER_TOPICS": topic,
        "KEYORDER_GROUP_ID": group,
    }
    command = [
        sys.executable, "-m", "keyorder.cli", "run", "--handler", "tests.integration.file_handler:handle_timed",
        "--workers", "4", "--http-port", "0", "--commit-interval", "0.2",
        "--max-inflight", str(WINDOW["max_inflight"]),
        "--max-inflight-per-partition", str(WINDOW["max_inflight_per_partition"]),
        "--max-uncommitted", str(WINDOW["max_uncommitted"]),
    ]  # fmt: skip
    for setting in FAST_GROUP_JOIN:
        command += ["--kafka-property", setting]
    return subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def stop_process(process: subprocess.Popen) -> str:
    """SIGCONT (in case it is frozen) and SIGTERM by PID, SIGKILL if it does not exit; its output."""
    if process.poll() is None:
        process.send_signal(signal.SIGCONT)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
    output, _ = process.communicate(timeout=30)
    return output.decode(errors="replace")


def test_a_frozen_pod_is_replaced_and_its_in_flight_work_is_redelivered(broker, make_topic, commit_audit, tmp_path):
    """Two ``keyorder run`` processes; one is SIGSTOPped (its sockets stay open, like a hung pod) past
    the session timeout, then SIGCONTed. The other takes its partitions over and runs again what the
    frozen one had in flight; the frozen one's late completions never let a commit pass an
    unhandled offset."""
    topic = make_topic(4, with_dlq=False)
    produced = produce_keyed(broker.bootstrap, topic, 2_000, 200, seed=41)
    group = f"g-{topic}"
    records_file = tmp_path / "runs.txt"
    audit = commit_audit(broker.bootstrap, group, topic, 4)
    processes = [start_pod_process(broker.bootstrap, topic, group, records_file) for _ in range(2)]
    try:
        frozen, other = processes

        def both_busy() -> bool:
            runs = read_timed(str(records_file))
            recent = time.monotonic() - 0.3
            return len(runs) >= 400 and {p.pid for p in processes} <= {pid for *_, pid, _s, end in runs if end > recent}

        wait_until(both_busy, 60, "both pods handling messages", interval=0.05)
        runs = read_timed(str(records_file))
        frozen_partitions = {partition for _k, _s, partition, _o, pid, _st, end in runs if pid == frozen.pid
                             and end > time.monotonic() - 1.0}  # fmt: skip
        frozen.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()

        def taken_over() -> bool:
            return any(pid == other.pid and partition in frozen_partitions and start > stopped
                       for _k, _s, partition, _o, pid, start, _e in read_timed(str(records_file)))  # fmt: skip

        wait_until(taken_over, 30, "the other pod to take the frozen pod's partitions over", interval=0.1)
        takeover = time.monotonic() - stopped
        # The frozen pod holds at most max-uncommitted offsets above its commits, which never pass its
        # highest finished offset: once the other pod has run past that on every partition it took,
        # it has re-run whatever was frozen in a handler.
        frozen_done = {p: max(o for _k, _s, part, o, pid, _st, _e in runs if pid == frozen.pid and part == p)
                       for p in frozen_partitions}  # fmt: skip

        def frozen_work_rerun() -> bool:
            runs = read_timed(str(records_file))
            return all(
                any(pid == other.pid and part == p and start > stopped
                    and o >= min(done + WINDOW["max_uncommitted"], produced.end_offsets[p] - 1)
                    for _k, _s, part, o, pid, start, _e in runs)
                for p, done in frozen_done.items()
            )  # fmt: skip

        wait_until(frozen_work_rerun, 30, "the other pod to run past the frozen pod's window", interval=0.2)
        time.sleep(max(0.0, SESSION_TIMEOUT + 2 - (time.monotonic() - stopped)))
        resumed = time.monotonic()  # before the signal: the resumed handlers finish at once
        frozen.send_signal(signal.SIGCONT)
        wait_until(
            lambda: len({(k, s) for k, s, *_ in read_timed(str(records_file))}) >= produced.total,
            60,
            "every message handled",
            interval=0.2,
        )
        wait_for_commits(broker.bootstrap, group, topic, produced.end_offsets, 30)
        recovered = time.monotonic() - resumed
    finally:
        outputs = [stop_process(process) for process in processes]
        audit.close()
    runs = sorted(read_timed(str(records_file)), key=lambda run: run[5])  # by start time
    duplicates = assert_at_least_once([(key, seq) for key, seq, *_ in runs], produced.sequences)
    assert_first_processing_in_order([(key, seq) for key, seq, *_ in runs])
    # started before the SIGCONT and finished after it: frozen in a handler (SIGSTOP takes effect a
    # moment after it is sent, so "started before it was sent" would miss some)
    frozen_in_flight = {(key, seq) for key, seq, _p, _o, pid, start, end in runs
                        if pid == frozen.pid and start < resumed < end}  # fmt: skip
    assert frozen_in_flight, "the pod was frozen while running nothing: the scenario tested nothing"
    rerun = {(key, seq) for key, seq, _p, _o, pid, _start, end in runs if pid == other.pid and end < resumed}
    assert frozen_in_flight <= rerun, (
        f"work frozen in a handler was not re-delivered to the other pod: {sorted(frozen_in_flight - rerun)[:5]}"
    )
    assert audit.assert_never_past_unhandled((p, o, end) for _k, _s, p, o, _pid, _start, end in runs) >= 2, (
        "too few commit samples to audit\n" + outputs[0][-2000:]
    )
    report("frozen pod", produced.total, duplicates, takeover,
           f"SIGSTOP -> the other pod runs its partitions; {len(frozen_in_flight)} frozen in a handler, "
           f"re-run by the other; SIGCONT -> all committed in {recovered:.1f} s")  # fmt: skip


class DeadLetterReader:
    """Reads a one-partition DLQ from its start (assigned, no group join), accumulating ``records``."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}", "enable.auto.commit": False},
            logger=logging.getLogger("keyorder.librdkafka"),
        )
        self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        self.records: list = []

    def read(self, seconds: float) -> list:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            record = self._consumer.poll(0.1)
            if record is not None and record.error() is None:
                self.records.append(record)
        return self.records

    def close(self) -> None:
        self._consumer.close()


def test_a_dlq_outage_holds_only_the_poison_key_and_the_poison_message_lands_once(broker, make_topic, run_pod):
    """The dead-letter broker is down (connections refused) while a poison key exhausts its
    attempts. The pod's own dead-letter producer writes to the consumed cluster, so making only the
    DLQ unavailable needs a second cluster: a second real Tansu behind its own proxy, and the pod is
    handed the real ``KafkaDeadLetterSink`` bound to it (a DLQ on another cluster, not a fake)."""
    topic = make_topic(2, with_dlq=False)
    dlq_topic = f"{topic}.dlq"
    first = produce_keyed(broker.bootstrap, topic, 1_000, 50, seed=43)
    producer = Producer({"bootstrap.servers": broker.bootstrap}, logger=logging.getLogger("keyorder.librdkafka"))
    producer.produce(topic, key=b"poison", value=json.dumps({"key": "poison", "seq": 0}).encode(), partition=0,
                     on_delivery=lambda _error, record: poison.append(record.offset()))  # fmt: skip
    poison: list[int] = []
    assert producer.flush(10) == 0
    rest = produce_keyed(broker.bootstrap, topic, 3_000, 50, seed=44, start_sequences=dict(first.sequences))
    end_offsets = {p: max(first.end_offsets.get(p, 0), rest.end_offsets.get(p, 0)) for p in (0, 1)}
    end_offsets[0] = max(end_offsets[0], poison[0] + 1)
    dlq_proxy_port = free_port()
    dlq_broker = EmbeddedBroker(advertised_port=dlq_proxy_port)
    with FaultProxy(dlq_broker.port, port=dlq_proxy_port) as dlq_proxy, dlq_broker:
        create_topics(dlq_proxy.address, [dlq_topic], 1)
        dlq_proxy.refuse()
        # test setting: the DLQ producer retries its connection at least every second, so recovery
        # is measured in seconds rather than librdkafka's 10 s reconnect back-off ceiling
        sink = KafkaDeadLetterSink(
            {"bootstrap.servers": dlq_proxy.address, "reconnect.backoff.max.ms": 1000}, "{topic}.dlq", timeout=2.0
        )
        recorder = Recorder(0.004, 0.008, fail=lambda event: event["key"] == "poison")
        pod = run_pod(topic, recorder, workers=4, max_attempts=3, retry_initial_backoff=0.2, retry_max_backoff=0.5,
                      dead_letters=sink)  # fmt: skip
        wait_until(lambda: len(recorder.attempts) >= 3, 60, "the poison message to exhaust its attempts")
        exhausted = time.monotonic()
        count_at_exhaustion = recorder.count()
        # the outage, after the attempts ran out: the dead-letter write keeps failing, and meanwhile the
        # commit of partition 0 reaches the poison message and stops there while the other keys go on
        wait_until(
            lambda: group_committed(broker.bootstrap, f"g-{topic}", topic, 2).get(0) == poison[0],
            30,
            "partition 0's commit to reach the poison message (the broker's word)",
            interval=0.3,
        )
        during = min(count_at_exhaustion + 1_000, first.total + rest.total)
        wait_until(lambda: recorder.count() >= during, 60, "other keys handled during the outage")
        count_at_heal = recorder.count()
        committed = group_committed(broker.bootstrap, f"g-{topic}", topic, 2).get(0)
        assert committed == poison[0], f"partition 0 committed {committed}, past an undelivered dead letter"
        assert len(recorder.attempts) == 3, "the exhausted poison message was handled again"
        dlq_proxy.heal()
        healed = time.monotonic()
        dead_letters = DeadLetterReader(dlq_proxy.address, dlq_topic)
        wait_until(lambda: dead_letters.read(0.2), 30, "the poison message in the DLQ", interval=0)
        recovered = time.monotonic() - healed
        wait_until(lambda: recorder.count() >= rest.total, 60, "every other message handled")  # rest counts first
        wait_for_commits(broker.bootstrap, f"g-{topic}", topic, end_offsets, 30)
        stop_pod(pod)
        landed = dead_letters.read(2.0)  # and any late copy
        dead_letters.close()
    first_handled = min(at for *_, at in recorder.details)
    first_attempt = recorder.attempts[0][2]
    rate_before = sum(1 for *_, at in recorder.details if at <= first_attempt) / max(first_attempt - first_handled, 0.1)
    rate_during = (count_at_heal - count_at_exhaustion) / (healed - exhausted)  # reported, not asserted
    copies = {(record.offset(), record.value()) for record in landed}
    assert copies, "the poison message never reached the DLQ"
    for record in landed:
        headers = dict(record.headers())
        assert record.key() == b"poison" and json.loads(record.value()) == {"key": "poison", "seq": 0}
        assert headers[HEADER_TOPIC] == topic.encode()
        assert (headers[HEADER_PARTITION], headers[HEADER_OFFSET]) == (b"0", str(poison[0]).encode())
    # the sink produces again only after a failure report, and a record that failed was never sent (the DLQ
    # refused every connection from the start): exactly one copy
    assert len(copies) == 1, f"{len(copies)} copies of one dead letter"
    assert ("poison", 0) not in recorder.records
    assert_at_least_once([r for r in recorder.records if r[0] != "poison"], rest.sequences)
    assert_first_processing_in_order(recorder.records)
    recorder.serial.assert_serial()
    report("DLQ unavailable", rest.total + 1, len(copies) - 1, recovered,
           f"other keys at {rate_during:.0f} msg/s during the outage vs {rate_before:.0f} before; "
           "heal -> the poison message in the DLQ")  # fmt: skip


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def gauge(port: int, name: str) -> float | None:
    for line in http_get(port, "/metrics")[1].splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_readiness_follows_broker_reachability_and_reports_an_idle_pod(broker, make_topic, run_pod):
    """Two pods, one partition: the pod without a partition stays ready (200) and says so
    (``no partitions assigned``, ``keyorder_partitions_assigned`` 0), so surplus pods never block a
    rollout. While the broker refuses connections both pods answer 503 ``no broker reachable``
    with ``keyorder_broker_reachable`` 0; after the heal both are ready again."""
    topic = make_topic(1, with_dlq=False)
    produce_keyed(broker.bootstrap, topic, 200, 20, seed=47)
    recorder = Recorder()
    group = f"g-{topic}"
    pods = [run_pod(topic, recorder, group=group, workers=2) for _ in range(2)]
    wait_until(
        lambda: sorted(pod.runtime.snapshot.assigned_partitions for pod in pods) == [0, 1], 30, "one partition owner"
    )
    idle = next(pod for pod in pods if pod.runtime.snapshot.assigned_partitions == 0)
    status, body = http_get(idle.http_port, "/readyz")
    assert (status, json.loads(body)) == (200, {"status": "ready", "reason": "no partitions assigned", "partitions": 0})
    assert gauge(idle.http_port, "keyorder_partitions_assigned") == 0
    assert all(gauge(pod.http_port, "keyorder_broker_reachable") == 1 for pod in pods)

    broker.proxy.refuse()
    refused = time.monotonic()
    readiness: dict[int, tuple[int, str]] = {}

    def not_ready(pod) -> bool:
        readiness[pod.http_port] = http_get(pod.http_port, "/readyz")
        status, body = readiness[pod.http_port]
        return status == 503 and json.loads(body)["reason"] == "no broker reachable"

    wait_until(lambda: all(not_ready(pod) for pod in pods), 30, "/readyz 503 'no broker reachable' on both pods")
    detected = time.monotonic() - refused
    assert all(gauge(pod.http_port, "keyorder_broker_reachable") == 0 for pod in pods)
    assert all(http_get(pod.http_port, "/healthz")[0] == 200 for pod in pods), "alive: a restart would not help"

    broker.proxy.heal()
    healed = time.monotonic()
    wait_until(lambda: all(http_get(pod.http_port, "/readyz")[0] == 200 for pod in pods), 30, "both pods ready again")
    recovered = time.monotonic() - healed
    assert all(gauge(pod.http_port, "keyorder_broker_reachable") == 1 for pod in pods)
    for pod in pods:
        stop_pod(pod)
    report("broker unreachable (readiness)", 200, 0, recovered,
           f"refused -> /readyz 503 on both pods in {detected:.1f} s; heal -> 200")  # fmt: skip
