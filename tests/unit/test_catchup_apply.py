"""ApplyHandler without Spark: batches shaped like the sorted Spark partition it receives."""

from __future__ import annotations

import re
import threading
import time

import pandas
import pytest

from keyorder.adapters.handlers import HandlerContractError, load_for_catchup
from keyorder.catchup.apply import ApplyHandler, OrderViolation, TaskFailed
from keyorder.catchup.datasource import PROGRESS_SCALE, lane_hash, progress_of
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from tests.guarantees import assert_key_order
from tests.unit import catchup_handlers

COLUMNS = [
    "lane",
    "source",
    "progress",
    "offset",
    "key",
    "value",
    "headers",
    "timestamp",
    "marker_read",
    "marker_skipped",
]


def batch(rows: list[tuple]) -> pandas.DataFrame:
    frame = pandas.DataFrame(rows, columns=COLUMNS)
    for column in ("marker_read", "marker_skipped"):
        frame[column] = frame[column].astype("Int64")  # nullable, as Arrow hands it over
    return frame


def sorted_partition(messages: list[bytes], batch_rows: int, sources: int = 1) -> list[pandas.DataFrame]:
    """Messages over ``sources`` partitions, each key in one (the n-th key seen in partition n % sources, as
    Kafka keeps a key in one partition), sorted by (progress, source, offset) as Spark hands them over, cut
    into batches; one end marker per source. A key's n-th message carries n."""
    per_source: list[list[tuple]] = [[] for _ in range(sources)]
    sequences: dict[bytes, int] = {}
    homes: dict[bytes, int] = {}
    for key in messages:
        source = homes.setdefault(key, len(homes) % sources)
        sequence = sequences[key] = sequences.get(key, -1) + 1
        per_source[source].append((key, str(sequence).encode()))
    rows = []
    for source, records in enumerate(per_source):
        for offset, (key, value) in enumerate(records):
            progress = progress_of(offset, 0, len(records))
            rows.append((lane_hash(key), source, progress, offset, key, value, [], 1.0, None, None))
        rows.append((0, source, PROGRESS_SCALE, len(records), None, None, [], None, len(records), 0))
    rows.sort(key=lambda row: (row[2], row[1], row[3]))
    return [batch(rows[start : start + batch_rows]) for start in range(0, len(rows), batch_rows)]


def apply(handler: str, workers: int, sources: int = 1) -> ApplyHandler:
    return ApplyHandler(
        handler=f"tests.unit.catchup_handlers:{handler}",
        policy=RetryPolicy(max_attempts=1),
        dlq_topic="unused",
        sources=[("t", index) for index in range(sources)],
        task_workers=workers,
    )


@pytest.mark.parametrize("handler", ["slow", "slow_async"])
def test_keys_run_in_parallel_each_in_order_across_batch_boundaries(handler: str) -> None:
    catchup_handlers.reset()
    messages = [f"k{index % 40:03d}".encode() for index in range(200)]
    (summary,) = [batch.to_pandas() for batch in apply(handler, 8)(iter(sorted_partition(messages, batch_rows=37)))]

    assert_key_order(catchup_handlers.RECORDS)
    assert len(catchup_handlers.RECORDS) == 200
    assert catchup_handlers.SERIAL.violations == 0  # never two messages of one key at once
    assert catchup_handlers.SERIAL.peak > 1  # but different keys at once
    assert summary.drop(columns=["dead_letter_offsets"]).to_dict("records") == [
        {
            "topic": "t",
            "partition": 0,
            "read": 200,
            "skipped": 0,
            "splits": 1,
            "processed": 200,
            "dead_lettered": 0,
            "violations": 0,
            "task": 0,
            "attempt": 0,
            "threads": 8,  # a sleeping handler keeps every thread (ThreadLimit)
        }
    ]


def test_a_hot_key_takes_one_thread_while_the_other_keys_pass_it() -> None:
    """One key with 150 messages among 300 light keys, on 3 partitions: the old batch barrier ran the hot
    key's batches on one thread; lanes let the light keys finish long before the hot key does."""
    catchup_handlers.reset()
    hot = [b"hot"] * 150
    light = [f"light{index}".encode() for index in range(300)]
    messages = [item for pair in zip(hot, light[:150], strict=True) for item in pair] + light[150:]
    summaries = [
        batch.to_pandas()
        for batch in apply("slow", 8, sources=3)(iter(sorted_partition(messages, batch_rows=50, sources=3)))
    ]

    assert sum(summaries[0]["processed"]) == 450
    assert_key_order(catchup_handlers.RECORDS)
    assert catchup_handlers.SERIAL.violations == 0
    finished = [key for key, _ in catchup_handlers.RECORDS]
    last_light = max(index for index, key in enumerate(finished) if key != "hot")
    hot_done_by_then = finished[: last_light + 1].count("hot")
    assert hot_done_by_then < 120, hot_done_by_then  # the light keys did not wait for the hot key


def test_an_out_of_order_row_stops_the_task_before_its_handler_runs() -> None:
    catchup_handlers.reset()
    rows = [(1, 0, 0, 5, b"a", b"0", [], None, None, None), (1, 0, 1, 3, b"a", b"1", [], None, None, None)]
    with pytest.raises(TaskFailed, match=r"order-violation: OrderViolation: t\[0\]@3 arrived after t\[0\]@5") as failed:
        list(apply("slow", 4)(iter([batch(rows)])))
    assert isinstance(failed.value.__cause__, OrderViolation)
    assert catchup_handlers.RECORDS == []  # the batch is checked before any of it is handled


def test_the_look_ahead_is_bounded_by_the_memory_of_the_messages_held() -> None:
    """A key whose first message hangs, its later messages of 1 KiB alternating with light keys: the hung
    key's lane holds its messages, so with room for 10 of them by memory (100,000 by count) the task reads
    no further (about 10 light keys handled) until the hung message moves."""
    from keyorder.catchup.apply import TaskRunner, footprint
    from keyorder.message import Message

    release, handled = threading.Event(), []

    def call(message: Message) -> None:
        if message.offset == 0:
            assert release.wait(10)
        handled.append((message.key, message.offset))

    value = b"v" * 1024
    keys = [b"hung"] + [b"hung" if n % 2 else b"k%d" % n for n in range(1, 201)]
    rows = [(lane_hash(key), 0, n, n, key, value, [], None, None, None) for n, key in enumerate(keys)]
    rows.append((0, 0, PROGRESS_SCALE, 201, None, None, [], None, 201, 0))
    one = footprint(Message(topic="t", partition=0, offset=1, key=b"hung", value=value))
    runner = TaskRunner(
        call, RetryPolicy(max_attempts=1), None, [("t", 0)], "key", 4, 100_000, lookahead_bytes=10 * one
    )
    frames = [batch(rows)]  # one batch: the bound must hold within a batch, not only between batches
    feeding = threading.Thread(target=runner.run, args=(iter(frames),))
    feeding.start()
    time.sleep(0.5)  # room for a look-ahead that would overrun the bound
    light = len(handled)
    assert 3 <= light <= 12, light  # without the bound: all 100 light keys
    release.set()
    feeding.join(10)
    assert len(handled) == 201 and runner.counts[0].processed == 201
    hung = [offset for key, offset in handled if key == b"hung"]
    assert hung == sorted(hung) and len(hung) == 101  # the hung key's messages in offset order


def test_a_message_larger_than_the_memory_bound_still_runs_alone() -> None:
    from keyorder.catchup.apply import TaskRunner

    handled: list[bytes | None] = []
    rows = [(lane_hash(b"k%d" % n), 0, n, n, b"k%d" % n, b"x" * 4096, [], None, None, None) for n in range(30)]
    rows.append((0, 0, PROGRESS_SCALE, 30, None, None, [], None, 30, 0))
    runner = TaskRunner(
        lambda message: handled.append(message.key), RetryPolicy(), None, [("t", 0)], "key", 4, 100, lookahead_bytes=1
    )
    runner.run(iter([batch(rows)]))
    assert len(handled) == 30 and runner.counts[0].processed == 30


def test_a_task_whose_handler_keeps_the_process_busy_runs_fewer_threads_and_says_so() -> None:
    """The process's CPU clock is a fake that runs as fast as the wall clock (a handler computing all the
    time, whatever the machine's load): the task steps its 8 threads down to 1 and reports it; with the
    real CPU clock a sleeping handler keeps all 8 (the first test)."""
    from keyorder.catchup.apply import TaskRunner

    handled: list[int] = []

    def call(message) -> None:
        time.sleep(0.0005)
        handled.append(message.offset)

    rows = [(lane_hash(b"k%d" % n), 0, n, n, b"k%d" % n, b"v", [], None, None, None) for n in range(8000)]
    rows.append((0, 0, PROGRESS_SCALE, 8000, None, None, [], None, 8000, 0))
    runner = TaskRunner(call, RetryPolicy(), None, [("t", 0)], "key", 8, 100_000, cpu_clock=time.monotonic)
    runner.run(iter([batch(rows)]))
    assert len(handled) == 8000 and runner.counts[0].processed == 8000
    assert runner.thread_limit == 1


def spark_job_error(error: BaseException, simplified: bool) -> str:
    """The text of the driver's exception for a task that raised ``error``: the Python worker formats the
    traceback as pyspark/util.py ``handle_worker_exception`` does (``SPARK_SIMPLIFIED_TRACEBACK`` drops the
    cause), the JVM wraps it in a ``PythonException`` inside the stage failure."""
    import traceback

    if simplified:
        error.__cause__ = None
    python = "".join(traceback.TracebackException(type(error), error, error.__traceback__, compact=True).format())
    return (
        "An error occurred while calling o91.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times, "
        "most recent failure: Lost task 0.0 in stage 3.0 (TID 7) (10.0.0.5 executor driver): "
        f"org.apache.spark.api.python.PythonException: {python}\n"
        "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException("
        "PythonRunner.scala:572)\n"
    )


@pytest.mark.parametrize("simplified", [False, True])
def test_a_blocked_key_is_never_retried_whatever_lines_its_handlers_error_holds(simplified: bool) -> None:
    """The old driver took the last line that looked like an error ("TimeoutError: also quoted from a log")
    and retried the wave: a blocked key looked like a passing fault."""
    import uuid

    from keyorder.catchup.apply import TaskFailure
    from keyorder.catchup.job import retryable_wave_error, wave_failure
    from keyorder.core.retry import ExhaustedPolicy

    token = uuid.uuid4().hex
    task = ApplyHandler(
        handler="tests.unit.catchup_handlers:fails_with_many_lines",
        policy=RetryPolicy(max_attempts=1, exhausted=ExhaustedPolicy.BLOCK),
        dlq_topic="unused",
        sources=[("t", 0)],
        failure_token=token,
    )
    with pytest.raises(TaskFailed) as failed:
        list(task(iter(sorted_partition([b"k"], batch_rows=10))))
    text = spark_job_error(failed.value, simplified)
    assert "\nTimeoutError: also quoted from a log" in text  # the handler's lines reach the driver

    message, failure = wave_failure(RuntimeError(text), token)
    assert failure is TaskFailure.KEY_BLOCKED
    assert message.startswith("KeyBlocked: t[0]@0 failed 1 times and on-exhausted is block")
    assert not retryable_wave_error(message, failure)
    # a failure no task typed (a crashed Python worker) is retried, whatever the text says
    crashed = RuntimeError(
        text.replace(token, "0" * 32).replace("PythonException", "SparkException: Python worker exited")
    )
    assert wave_failure(crashed, token)[1] is None
    assert retryable_wave_error(*wave_failure(crashed, token))


def with_hooks(handler: str, setup: str | None, teardown: str | None) -> ApplyHandler:
    return ApplyHandler(
        handler=f"tests.unit.catchup_handlers:{handler}",
        policy=RetryPolicy(max_attempts=1),
        dlq_topic="unused",
        sources=[("t", 0)],
        setup=setup and f"tests.unit.catchup_handlers:{setup}",
        teardown=teardown and f"tests.unit.catchup_handlers:{teardown}",
    )


def test_a_tasks_hooks_run_once_around_its_messages_as_a_pods_do() -> None:
    catchup_handlers.HOOK_CALLS.clear()
    frames = sorted_partition([b"a", b"a", b"b"], batch_rows=2)
    list(with_hooks("needs_setup", "open_connection", "close_connection")(iter(frames)))
    calls = catchup_handlers.HOOK_CALLS
    assert calls[0] == "setup" and calls[-1] == "teardown", calls
    assert sorted(calls[1:-1]) == ["message 0", "message 0", "message 1"], calls  # each message once, between


def test_a_failing_set_up_fails_the_task_before_any_message_and_a_failed_task_still_tears_down() -> None:
    catchup_handlers.HOOK_CALLS.clear()
    frames = sorted_partition([b"a"], batch_rows=2)
    with pytest.raises(TaskFailed, match="the database is not there"):
        list(with_hooks("needs_setup", "fails_setup", "close_connection")(iter(frames)))
    assert catchup_handlers.HOOK_CALLS == [], "no message ran, and no tear-down without a set-up"
    frames = sorted_partition([b"a"], batch_rows=2)
    with pytest.raises(TaskFailed):  # the handler fails (no set-up hook): its key blocks, the task fails
        list(
            ApplyHandler(
                handler="tests.unit.catchup_handlers:needs_setup",
                policy=RetryPolicy(max_attempts=1, exhausted=ExhaustedPolicy.BLOCK),
                dlq_topic="unused",
                sources=[("t", 0)],
                teardown="tests.unit.catchup_handlers:close_connection",
            )(iter(frames))
        )
    assert catchup_handlers.HOOK_CALLS == ["teardown"]


def test_a_failing_tear_down_after_a_task_that_succeeded_is_logged_and_fails_nothing(caplog) -> None:
    """As on a pod. Before (a review), it failed the task, so the wave, which ran again: every message twice."""
    catchup_handlers.HOOK_CALLS.clear()
    frames = sorted_partition([b"a", b"b"], batch_rows=2)
    rows = list(with_hooks("needs_setup", "open_connection", "fails_teardown")(iter(frames)))
    assert rows, "the task's summary"
    assert catchup_handlers.HOOK_CALLS[-1] == "teardown"
    assert "the tear-down hook failed" in caplog.text


def test_an_async_handlers_hooks_run_on_each_task_threads_loop_around_its_messages() -> None:
    """The hooks' resources belong to the loop that runs the handler, as on a pod's asyncio workers: each task
    thread has its own, so each thread that handled a message set up and tears down on its own loop."""
    catchup_handlers.HOOK_CALLS.clear()
    frames = sorted_partition([b"a", b"b", b"c", b"d", b"a", b"b"], batch_rows=3)
    handler = with_hooks("needs_loop_setup", "open_async", "close_async")
    handler.task_workers = 3
    list(handler(iter(frames)))
    calls = catchup_handlers.HOOK_CALLS
    setups, teardowns = calls.count("async setup"), calls.count("async teardown")
    assert 1 <= setups <= 3 and teardowns == setups, calls  # one per thread that ran a message
    assert sorted(call for call in calls if call.startswith("message")) == ["message 0"] * 4 + ["message 1"] * 2
    assert calls[0] == "async setup" and calls[-1] == "async teardown", calls


def test_an_async_set_up_that_fails_fails_the_task_and_no_message_is_retried_or_dead_lettered() -> None:
    catchup_handlers.HOOK_CALLS.clear()
    frames = sorted_partition([b"a", b"b"], batch_rows=2)
    with pytest.raises(TaskFailed, match="the database is not there"):
        list(with_hooks("needs_loop_setup", "fails_async_setup", "close_async")(iter(frames)))
    assert catchup_handlers.HOOK_CALLS == [], "no message ran, and no tear-down after a failed set-up"


def test_an_async_hook_beside_a_plain_handler_is_refused_naming_it() -> None:
    with pytest.raises(
        HandlerContractError, match=re.escape("--handler-setup 'tests.unit.catchup_handlers:open_async'")
    ):
        load_for_catchup("tests.unit.catchup_handlers:slow", "tests.unit.catchup_handlers:open_async", None)


def test_a_plain_hook_beside_an_async_handler_runs_once_per_task_not_once_per_thread() -> None:
    """A plain set-up making a global client runs once, as on a pod (a review: once per thread leaked N - 1)."""
    catchup_handlers.HOOK_CALLS.clear()
    frames = sorted_partition([b"a", b"b", b"c", b"d"], batch_rows=2)
    handler = with_hooks("slow_async", "open_once", "close_once")
    handler.task_workers = 4
    list(handler(iter(frames)))
    assert catchup_handlers.HOOK_CALLS == ["setup", "teardown"]


def test_an_async_tear_down_that_raises_cancelled_error_is_logged_and_every_loop_is_closed(caplog) -> None:
    """``CancelledError`` is a BaseException: it escaped the task unmarked (retryable), leaving loops open."""
    catchup_handlers.HOOK_CALLS.clear()
    frames = sorted_partition([b"a", b"b", b"c"], batch_rows=2)
    handler = with_hooks("needs_loop_setup", "open_async", "cancelled_teardown")
    handler.task_workers = 3
    rows = list(handler(iter(frames)))
    assert rows and "the tear-down hook failed on a task thread's event loop" in caplog.text
    assert catchup_handlers.HOOK_CALLS.count("async teardown") == catchup_handlers.HOOK_CALLS.count("async setup")


def test_a_handler_the_executor_cannot_load_fails_the_task_as_one_no_retry_would_fix() -> None:
    from keyorder.catchup.apply import TaskFailure, read_task_failure
    from keyorder.catchup.job import retryable_wave_error

    frames = sorted_partition([b"a"], batch_rows=2)
    with pytest.raises(TaskFailed) as failed:
        list(with_hooks("nope", None, None)(iter(frames)))
    kind, summary = read_task_failure(str(failed.value), "0" * 32)
    assert kind is TaskFailure.HANDLER_NOT_LOADED and "has no attribute 'nope'" in summary
    assert not retryable_wave_error(str(failed.value), kind)
