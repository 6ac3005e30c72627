"""Issue 37 finding 1: a tenant's broker cannot take the operator down (``lag_reader``).

A hostile broker (``tests.unit.hostile_broker``: 21 bytes answering ApiVersions, which librdkafka's
``rd_kafka_handle_ApiVersion`` turns into ``rd_malloc`` of a negative size and an assertion: SIGABRT) aborted
the whole operator, since each resource's lag was read with librdkafka inside the operator's process. Now the
reads run in a child process per namespace (``LagReaders``): the child dies, the namespace's resources' samples
fail with ``LagReaderFailed`` naming the signal and the back-off, and the operator (here: the test process, and
another namespace's reader) goes on. A broker that never answers costs the sample's deadline, then the child is
killed. Resources of one namespace share its child; a namespace's last resource gone, its child exits.

No Kafka broker here: the healthy side is tested against Tansu in tests/integration/test_lag_source_kafka.py.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from keyorder_operator.lag_reader import (
    READER_FAILED,
    IsolatedLagSource,
    LagReaderProcess,
    LagReaders,
    RestartBackoff,
    answer_to_sample,
    exit_cause,
    sample_to_answer,
)
from keyorder_operator.observe import LagSample, LagUnavailable
from tests.fakes import FakeClock
from tests.unit.hostile_broker import hostile_broker

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def tenant_source(address: str, **readers: Any) -> IsolatedLagSource:
    """A resource's source in namespace ``tenant`` of a ``LagReaders`` of its own (``readers``: its options)."""
    return LagReaders(**readers).source("tenant", {"bootstrap.servers": address})


def failure(source: IsolatedLagSource, topics: list[str] | None = None) -> LagUnavailable:
    with pytest.raises(LagUnavailable) as error:
        source.sample(topics or ["orders"], "orders", 0.0)
    return error.value


# --- the pure decisions -----------------------------------------------------------------------------------


def test_restarts_back_off_doubling_up_to_the_longest_and_an_answer_ends_it():
    backoff = RestartBackoff(first_seconds=5, longest_seconds=30)
    assert backoff.waiting(0.0) == 0.0 and backoff.delay == 0.0
    delays = []
    now = 100.0
    for _ in range(5):
        backoff = backoff.failed("was killed by SIGABRT (exit code -6)", now)
        delays.append(backoff.delay)
        assert backoff.waiting(now) == backoff.delay and backoff.waiting(now + backoff.delay) == 0.0
        now += backoff.delay
    assert delays == [5, 10, 20, 30, 30]
    backoff = backoff.succeeded()
    assert (backoff.failures, backoff.retry_at, backoff.cause, backoff.waiting(now)) == (0, None, "", 0.0)
    assert backoff.failed("again", now).delay == 5  # starts over


@pytest.mark.parametrize(
    ("exitcode", "expected"),
    [
        (-6, "was killed by SIGABRT (exit code -6)"),
        (-9, "was killed by SIGKILL (exit code -9)"),
        (1, "exited with code 1"),
        (0, "exited with code 0"),
        (None, "did not exit"),
    ],
)
def test_how_a_reader_ended_is_named(exitcode, expected):
    assert exit_cause(exitcode) == expected


def test_what_crosses_the_pipe_is_json_read_strictly_never_a_pickle():
    """The child parses a tenant's broker's bytes in C: whatever it sends back is data, checked field by field,
    never unpickled (a pickle from a child gone wrong would run code in the operator)."""
    sample = LagSample(
        at=12.5, partitions=2, end_total=30, committed_total=10, partition_lags=(5, 15),
        end_offsets=(("orders", 0, 10), ("orders", 1, 20)),
    )  # fmt: skip
    assert answer_to_sample(json.dumps(sample_to_answer(sample)).encode()) == sample
    assert answer_to_sample(pickle.dumps(sample)) is None
    for bad in (b"[]", b'{"sample": {"at": 1}}', b'{"sample": {"at": 1, "partitions": "2", "end_total": 0, '
                b'"committed_total": 0, "partition_lags": [], "end_offsets": []}}', b"\xff"):  # fmt: skip
        assert answer_to_sample(bad) is None, bad
    with pytest.raises(LagUnavailable) as error:
        answer_to_sample(json.dumps({"unavailable": "x" * 5000, "reason": "topic 'orders' not found"}).encode())
    assert len(str(error.value)) == 1000 and error.value.reason == "topic 'orders' not found"
    assert error.value.condition == "LagUnavailable"  # the child's own answer: Kafka's side, not the reader's


# --- the child process, for real --------------------------------------------------------------------------


def test_a_hostile_broker_kills_the_resources_reader_not_the_operator():
    clock = FakeClock(1000.0)
    with hostile_broker("abort") as address:
        source = tenant_source(address, deadline_seconds=60, clock=clock)
        try:
            error = failure(source)
            assert error.condition == READER_FAILED
            assert "was killed by SIGABRT (exit code -6)" in error.reason, error.reason
            assert "started again after 5 s (back-off)" in error.reason, error.reason
            assert source.started == 1
            # within the back-off no reader is started: the same reason, no new process
            clock.sleep(4.0)
            again = failure(source)
            assert (again.condition, again.reason, source.started) == (READER_FAILED, error.reason, 1)
            # after it, a new reader, which the broker kills again: the next wait is twice as long
            clock.sleep(1.0)
            third = failure(source)
            assert source.started == 2 and "started again after 10 s (back-off)" in third.reason, third.reason
        finally:
            source.close()


def test_a_broker_that_never_answers_costs_the_deadline_then_the_reader_is_killed():
    """The child's client waits 5 s per request; the sample's overall deadline (here 1 s) is what bounds it."""
    started_readers: list[LagReaderProcess] = []

    def start(memory_bytes):
        reader = LagReaderProcess(memory_bytes)
        started_readers.append(reader)
        return reader

    with hostile_broker("silent") as address:
        source = tenant_source(address, deadline_seconds=1.0, start_reader=start)
        try:
            asked = time.monotonic()
            error = failure(source)
            # hang guard: the deadline (1 s) plus killing and reaping the child, far below the client's own 5 s x 4
            assert time.monotonic() - asked < 15.0
        finally:
            source.close()
    assert error.condition == READER_FAILED
    assert "did not answer within 1 s and was killed" in error.reason, error.reason
    (reader,) = started_readers
    assert reader.process.returncode == -9  # SIGKILL, reaped: no process left behind


def test_a_reader_over_its_memory_limit_fails_alone():
    """RLIMIT_AS in the child: a broker announcing a ~95 MB response makes librdkafka allocate the buffer at once
    (``rd_kafka_recv``); under a 160 MiB limit the allocation fails and the reader dies, which is reported like
    any other crash, and the test process, which owns the reader, is untouched."""
    with hostile_broker("bloat") as address:
        source = tenant_source(address, deadline_seconds=30, memory_bytes=160 << 20)
        try:
            error = failure(source)
        finally:
            source.close()
    assert error.condition == READER_FAILED, error
    assert "the lag reader process was killed by SIGABRT" in error.reason, error.reason


def test_close_ends_a_sample_waiting_on_its_reader_at_once():
    """A rotated credential or a deleted resource closes the source; a sample waiting on the old child must
    not hold its poll thread until the deadline, and it is not the broker's fault (no back-off)."""
    import threading

    with hostile_broker("silent") as address:
        source = tenant_source(address, deadline_seconds=60)
        outcome: list[LagUnavailable] = []

        def sample() -> None:
            try:
                source.sample(["orders"], "orders", 0.0)
            except LagUnavailable as error:
                outcome.append(error)

        thread = threading.Thread(target=sample)
        thread.start()
        for _ in range(200):  # wait until the child exists (bounded)
            if source.started:
                break
            time.sleep(0.02)
        source.close()
        thread.join(20.0)  # hang guard
    assert not thread.is_alive()
    (error,) = outcome
    assert "closed" in str(error) and error.condition != READER_FAILED
    assert source.backoff.failures == 0


OPERATOR_PATH = textwrap.dedent(
    """
    import sys
    from keyorder_operator.context import OperatorContext
    from keyorder_operator.observe import LagUnavailable
    from tests.unit.hostile_broker import hostile_broker

    # the operator's own path: the context builds the resource's lag source as the poll does
    context = OperatorContext(kube=None, lag_wait_seconds=20.0)
    with hostile_broker("abort") as address:
        source = context.lag_source("tenant", "hostile", {"bootstrap.servers": address})
        try:
            source.sample(["orders"], "orders", 0.0)
        except LagUnavailable as error:
            print("LagUnknown", error.condition, error.reason)
        context.forget_lag_source("tenant", "hostile")
    print("operator still running")
    """
)


def test_the_operators_lag_path_survives_a_hostile_broker():
    """The operator's own wiring (``OperatorContext.lag_source`` as the poll calls it), in a subprocess so that
    the old code's abort can be observed: before, librdkafka aborted that process (exit code -6, ``rd_malloc:
    Assertion 'p' failed``); now it prints the resource's failure and goes on."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), str(ROOT / "consumer"), str(ROOT)]),
    }
    run = subprocess.run(
        [sys.executable, "-c", OPERATOR_PATH],
        capture_output=True,
        text=True,
        timeout=90,  # hang guard
        env=environment,
        cwd=ROOT,
    )
    assert run.returncode == 0, f"the operator's process ended with {run.returncode}: {run.stderr[-2000:]}"
    assert f"LagUnknown {READER_FAILED} the lag reader process was killed by SIGABRT" in run.stdout, run.stdout
    assert run.stdout.rstrip().endswith("operator still running"), run.stdout


# --- one child per namespace (tenant) ---------------------------------------------------------------------


def quick(client_id: str) -> dict[str, str]:
    """A configuration the child answers at once without a broker (its client cannot be built): the child's
    own answer, so the child works and stays; ``client_id`` makes configurations distinct."""
    return {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "NOT-A-PROTOCOL", "client.id": client_id}


def answered(source: Any) -> None:
    """The child answered (its own "unavailable"): not a reader failure."""
    error = failure(source)
    assert error.condition == "LagUnavailable" and "could not be built" in error.reason, error.reason


def reader_children() -> set[int]:
    """The live lag reader processes this test process started, from /proc (whatever shape the readers have)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(parent) == os.getpid() and state != "Z" and b"keyorder_operator.lag_reader" in command:
            found.add(int(entry.name))
    return found


def lag_source(context: Any, namespace: str, name: str, properties: dict[str, str]) -> IsolatedLagSource:
    """The resource's source as the poll gets it (``OperatorContext.lag_source``), without the poll's own
    back-off around it (``BoundedLagSource``), so that each sample here reaches the reader."""
    return context.lag_source(namespace, name, properties).inner


@pytest.fixture
def context():
    from keyorder_operator.context import OperatorContext

    context = OperatorContext(kube=None, lag_wait_seconds=20.0)  # type: ignore[arg-type]
    yield context
    for namespace, name in list(context._lag_sources):
        context.forget_lag_source(namespace, name)


def test_a_namespaces_resources_share_one_child_and_each_namespace_has_its_own(context):
    """A child costs ~15 MB private: one per resource does not fit hundreds of resources in the operator's
    limit. Two resources of one namespace (distinct configurations) are read by one child, another namespace's
    resource by a second one."""
    assert reader_children() == set()
    sources = [
        lag_source(context, "team-a", "orders", quick("orders")),
        lag_source(context, "team-a", "payments", quick("payments")),
        lag_source(context, "team-b", "orders", quick("orders")),
    ]
    for source in sources:
        answered(source)
    assert len(reader_children()) == 2, reader_children()
    team_a, team_b = context.lag_readers.reader("team-a"), context.lag_readers.reader("team-b")
    assert team_a.configurations == 2 and team_b.configurations == 1
    assert reader_children() == {team_a.pid, team_b.pid}


def test_a_crash_of_one_namespaces_child_fails_its_resources_alone(context):
    """The hostile broker aborts team-a's child: both of team-a's resources say LagReaderFailed (one child, one
    back-off: the second does not start a child of its own), team-b's child goes on answering, the same process."""
    with hostile_broker("abort") as address:
        steady = lag_source(context, "team-b", "orders", quick("orders"))
        answered(steady)
        (steady_pid,) = reader_children()
        first = lag_source(context, "team-a", "orders", {"bootstrap.servers": address, "client.id": "orders"})
        second = lag_source(context, "team-a", "payments", {"bootstrap.servers": address, "client.id": "payments"})
        errors = [failure(first), failure(second)]
        for error in errors:
            assert error.condition == READER_FAILED, error
            assert "the lag reader process was killed by SIGABRT (exit code -6)" in error.reason, error.reason
        assert errors[0].reason == errors[1].reason
        team_a = context.lag_readers.reader("team-a")
        assert team_a.started == 1 and team_a.backoff.failures == 1  # the second waited for the shared back-off
        answered(steady)
        assert reader_children() == {steady_pid}


def test_a_configuration_change_of_one_resource_keeps_the_child_of_the_others(context):
    """A rotated password closes the old configuration in the namespace's child and sends the new one; the
    other resource's reads go on in the same process."""
    rotating = lag_source(context, "team-a", "orders", quick("orders"))
    other = lag_source(context, "team-a", "payments", quick("payments"))
    answered(rotating)
    answered(other)
    (pid,) = reader_children()
    rotated = lag_source(context, "team-a", "orders", {**quick("orders"), "sasl.password": "rotated"})
    assert rotated is not rotating
    with pytest.raises(LagUnavailable, match="closed"):
        rotating.sample(["orders"], "orders", 0.0)
    answered(rotated)
    answered(other)
    team_a = context.lag_readers.reader("team-a")
    assert reader_children() == {pid} and team_a.started == 1
    assert team_a.configurations == 2  # the old one is closed: the new one and the other resource's
    assert team_a._sent == {rotated.configuration, other.configuration}  # and the child was told


def test_a_namespaces_child_exits_with_its_last_resource(context):
    first = lag_source(context, "team-a", "orders", quick("orders"))
    second = lag_source(context, "team-a", "payments", quick("payments"))
    answered(first)
    answered(second)
    (pid,) = reader_children()
    assert Path(f"/proc/{pid}/oom_score_adj").read_text().strip() == "1000"  # the OOM killer's first pick
    context.forget_lag_source("team-a", "orders")
    assert reader_children() == {pid}
    answered(second)
    context.forget_lag_source("team-a", "payments")
    assert reader_children() == set()  # killed and reaped
    assert context.lag_readers.reader("team-a") is None and len(context.lag_readers) == 0
    answered(lag_source(context, "team-a", "orders", quick("orders")))  # a new resource: a new child
    assert len(reader_children()) == 1


def test_waiting_for_the_namespaces_child_counts_toward_a_resources_own_deadline():
    """A hung broker holds team-a's child for one resource's whole deadline; another resource of team-a asks
    meanwhile: its sample ends within its own deadline from when it asked (LagReaderFailed), not after the
    first's deadline plus its own."""
    import threading

    readers = LagReaders(deadline_seconds=3.0)
    with hostile_broker("silent") as address:
        hung = readers.source("team-a", {"bootstrap.servers": address})
        # the same cluster (one child: a namespace's readers are per cluster), another configuration
        waiting = readers.source("team-a", {"bootstrap.servers": address, "client.id": "payments"})
        outcome: list[LagUnavailable] = []

        def sample_hung() -> None:
            with pytest.raises(LagUnavailable) as error:
                hung.sample(["orders"], "orders", 0.0)
            outcome.append(error.value)

        thread = threading.Thread(target=sample_hung)
        thread.start()
        for _ in range(500):  # until the hung request is with the child (bounded)
            if hung.reader.pid is not None:
                break
            time.sleep(0.01)
        time.sleep(1.0)  # event order: the second resource asks a second into the first one's request
        asked = time.monotonic()
        error = failure(waiting)
        waited = time.monotonic() - asked
        thread.join(20.0)  # hang guard
        hung.close()
        waiting.close()
    assert waited < 3.0 + 0.5, waited  # hang guard: its own deadline (3 s) and the kill, not 2 x 3 s
    assert error.condition == READER_FAILED, error
    (first,) = outcome
    assert "did not answer within" in first.reason and first.condition == READER_FAILED, first.reason


def test_an_answer_that_stalls_midway_ends_at_the_deadline_not_never() -> None:
    """The parent reads a child's answer under one deadline for the whole frame: a child that sent the header
    and part of the payload, then stalled (compromised, or stopped), cannot hold the resource's thread."""
    from keyorder_operator.lag_reader import FRAME_HEADER, receive_frame

    parent, child = socket.socketpair()
    with parent, child:
        child.sendall(FRAME_HEADER.pack(100) + b"x" * 10)
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="10 of 100 bytes"):
            receive_frame(parent, 1 << 20, started + 0.5)
        assert time.monotonic() - started < 5  # hang guard


def test_an_answer_over_the_limit_is_refused_before_it_is_read() -> None:
    from keyorder_operator.lag_reader import FRAME_HEADER, receive_frame

    parent, child = socket.socketpair()
    with parent, child:
        child.sendall(FRAME_HEADER.pack(17 << 20))
        with pytest.raises(OSError, match="limit"):
            receive_frame(parent, 16 << 20, time.monotonic() + 5)


def test_a_tenants_unreachable_cluster_does_not_share_a_child_with_its_healthy_one():
    """A namespace's readers are per Kafka cluster: a child serves one request at a time, so an unreachable
    cluster's samples (each waiting out the client's timeouts) must not queue ahead of a healthy cluster's."""
    readers = LagReaders()
    dead = readers.source("team-a", {"bootstrap.servers": "127.0.0.1:1"})
    healthy = readers.source("team-a", {"bootstrap.servers": "127.0.0.1:2"})
    same = readers.source("team-a", {"bootstrap.servers": "127.0.0.1:2", "client.id": "other"})
    try:
        assert dead.reader is not healthy.reader and same.reader is healthy.reader
    finally:
        for source in (dead, healthy, same):
            source.close()
    assert len(readers) == 0, "the last resource of each cluster stops its reader"


# --- the child's stderr, which it shares with the operator ------------------------------------------------


def start_child(log_format: str) -> tuple[socket.socket, subprocess.Popen[str]]:
    """A lag reader child as ``LagReaderProcess`` starts it, logging in ``log_format``; its stderr piped."""
    ours, theirs = socket.socketpair()
    memory = str(512 << 20)
    child = subprocess.Popen(
        [sys.executable, "-m", "keyorder_operator.lag_reader", str(theirs.fileno()), memory, "INFO", log_format],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        pass_fds=(theirs.fileno(),),
        text=True,
    )
    theirs.close()
    return ours, child


def send(channel: socket.socket, request: dict[str, Any]) -> None:
    payload = json.dumps(request).encode()
    channel.sendall(len(payload).to_bytes(4, "big") + payload)


def test_a_child_whose_operator_left_while_it_answered_exits_without_a_traceback() -> None:
    # The request is buffered, then the operator's end closes: the child reads it, and its answer meets a
    # closed pipe (EPIPE). It printed a bare traceback into a --log-format json operator's stderr (CI, 44).
    ours, child = start_child("json")
    send(ours, {"id": 7, "do": "sample", "topics": ["orders"], "group": "orders", "now": 0.0})
    ours.close()
    _, errors = child.communicate(timeout=60)  # hang guard
    assert (child.returncode, errors) == (0, "")


def test_a_child_that_fails_logs_it_as_one_json_object_per_line_when_the_operator_logs_json() -> None:
    ours, child = start_child("json")
    send(ours, {"do": "sample"})  # no "id": the child's loop fails (the operator never sends this)
    _, errors = child.communicate(timeout=60)  # hang guard
    ours.close()
    lines = errors.splitlines()
    assert child.returncode == 1 and len(lines) == 1, errors
    entry = json.loads(lines[0])
    assert entry["level"] == "ERROR" and "lag reader process" in entry["message"]
    assert "KeyError: 'id'" in entry["exception"]


def test_the_child_is_started_with_the_operators_level_and_format(monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from keyorder.logs import JsonFormatter
    from keyorder_operator.lag_reader import operator_logging

    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(root, "level", logging.WARNING)
    assert operator_logging() == ("WARNING", "json")
    handler.setFormatter(logging.Formatter())
    assert operator_logging() == ("WARNING", "text")
