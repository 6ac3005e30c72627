"""The process executor without a broker: real worker processes, a real SIGKILL, real hooks.

Handlers are loaded by path in each worker process (``tests.unit.process_handlers``) and report
through a shared file; the dead-letter sink is a FAKE in-memory sink (the real one is covered by
the integration tests). Lanes come from the real ``LaneScheduler``.
"""

from __future__ import annotations

import functools
import os
import signal
import time

import pytest

from keyorder.adapters.handlers import load_for_worker_process
from keyorder.batch import PER_MESSAGE, BatchLimits
from keyorder.core.lanes import Delivery
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.engine.process_pool import ProcessWorkerPool
from keyorder.engine.worker_pools import AsyncWorkerPool, Completions, HandlerSetupError, Lifecycle, ThreadWorkerPool
from keyorder.message import Message
from tests.conftest import wait_until
from tests.guarantees import assert_key_order, assert_serial_in_order_per_key
from tests.unit import process_handlers
from tests.unit.test_workers import FakeDeadLetters, Partition

pytestmark = pytest.mark.timeout(120)
HANDLERS = "tests.unit.process_handlers"


@pytest.fixture
def record_file(tmp_path, monkeypatch):
    path = str(tmp_path / "records.txt")
    monkeypatch.setenv("KEYORDER_TEST_RECORD_FILE", path)  # the worker processes inherit it
    return path


def keyed(keys: list[str]) -> list[Delivery]:
    """One delivery per key in ``keys``; each value is its key's sequence number."""
    partition = Partition()
    sequence: dict[str, int] = {}
    out = []
    for offset, key in enumerate(keys):
        seq = sequence.get(key, 0)
        sequence[key] = seq + 1
        message = Message("t", 0, offset, key.encode(), str(seq).encode())
        out.append(Delivery(message, key.encode(), partition, time.monotonic()))
    return out


def process_pool(
    handler: str,
    workers: int,
    completions: Completions,
    setup: str | None = None,
    teardown: str | None = None,
    retry: RetryPolicy | None = None,
    sink: FakeDeadLetters | None = None,
    handler_timeout: float | None = None,
    batch: BatchLimits = PER_MESSAGE,
) -> ProcessWorkerPool:
    load = functools.partial(
        load_for_worker_process,
        f"{HANDLERS}:{handler}",
        f"{HANDLERS}:{setup}" if setup else None,
        f"{HANDLERS}:{teardown}" if teardown else None,
    )
    return ProcessWorkerPool(
        load,
        workers,
        retry or RetryPolicy(max_attempts=3, initial_backoff=0.0, max_backoff=0.05),
        sink,
        completions,
        handler_timeout=handler_timeout,
        batch=batch,
    )


def live_children(pool: ProcessWorkerPool) -> set[int]:
    with pool._lock:
        workers = list(pool._workers.values())
    return {
        worker.child.pid
        for worker in workers
        if worker.child is not None and worker.child.process.poll() is None and not worker.retiring
    }


def test_keys_run_serially_and_in_order_across_worker_processes_with_batches(record_file, monkeypatch):
    """Many keys and a fast handler (batched round trips), then a slow one: order and seriality per key."""
    completions = Completions()
    pool = process_pool("record", 3, completions)
    pool.start()
    try:
        keys = [f"k{i % 40}" for i in range(3_000)]
        pool.submit(keyed(keys))
        wait_until(lambda: len(completions) == len(keys), 60, "every message handled")
    finally:
        pool.stop(5)
    runs = process_handlers.runs(record_file)
    assert len(runs) == 3_000 and all(handled for _delivery, handled in completions)
    runs.sort(key=lambda run: run[3])
    assert_key_order([(key, seq) for key, seq, _pid, _start, _end in runs])
    assert_serial_in_order_per_key([(key, seq, start, end) for key, seq, _pid, start, end in runs])
    pids = {pid for _key, _seq, pid, _start, _end in runs}
    assert len(pids) == 3 and os.getpid() not in pids, "the handler must run in the 3 worker processes"
    assert sum(stats.processed for stats in pool.stats()) == 3_000


def test_a_worker_process_killed_mid_message_is_replaced_and_its_message_retried_in_order(record_file, monkeypatch):
    monkeypatch.setenv("KEYORDER_TEST_STALL_KEY", "victim")
    completions = Completions()
    pool = process_pool("stall_once", 2, completions)
    pool.start()
    try:
        keys = ["victim"] * 5 + [f"other{i % 7}" for i in range(60)]
        pool.submit(keyed(keys))
        wait_until(lambda: any(f[0] == "stalled" for f in process_handlers.read(record_file)), 30, "the stall")
        victim_pid = next(int(f[3]) for f in process_handlers.read(record_file) if f[0] == "stalled")
        os.kill(victim_pid, signal.SIGKILL)
        wait_until(lambda: len(completions) == len(keys), 60, "every message handled after the crash")
        # the replacement starts after the dead call's messages went back (the other worker may run them meanwhile)
        wait_until(lambda: victim_pid not in live_children(pool) and len(live_children(pool)) == 2, 60, "replaced")
    finally:
        pool.stop(5)
    assert all(handled for _delivery, handled in completions), "a message was handed back instead of retried"
    runs = process_handlers.runs(record_file)
    runs.sort(key=lambda run: run[3])
    assert_key_order([(key, seq) for key, seq, _pid, _start, _end in runs])  # victim/0 once (retried), then 1..4
    assert_serial_in_order_per_key([(key, seq, start, end) for key, seq, _pid, start, end in runs])
    stats = pool.stats()
    assert sum(s.process_restarts["crashed"] for s in stats) == 1
    assert sum(s.interrupted["crashed"] for s in stats) == 1
    assert sum(s.failed for s in stats) == 1 and sum(s.retried for s in stats) == 1


def test_a_batch_handler_in_a_process_keeps_key_order_through_a_partial_failure_and_a_death_mid_batch(
    record_file, monkeypatch
):
    """One call per batch in the worker process; a failed item retried on its own key; the process killed
    inside a batch call: every message of that call retried alone (none lost, none charged), each key still
    in order."""
    monkeypatch.setenv("KEYORDER_TEST_STALL_KEY", "victim")
    monkeypatch.setenv("KEYORDER_TEST_FAIL_KEY", "other3")
    monkeypatch.setenv("KEYORDER_TEST_FAIL_SEQ", "1")
    completions = Completions()
    pool = process_pool("batch_stall_once", 2, completions, batch=BatchLimits(8))
    pool.start()
    try:
        keys = ["victim"] * 3 + [f"other{i % 7}" for i in range(40)]
        pool.submit(keyed(keys))
        wait_until(lambda: any(f[0] == "stalled" for f in process_handlers.read(record_file)), 30, "the stall")
        stalled = next(f for f in process_handlers.read(record_file) if f[0] == "stalled")
        os.kill(int(stalled[3]), signal.SIGKILL)
        wait_until(lambda: len(completions) == len(keys), 60, "every message handled after the crash")
    finally:
        pool.stop(5)
    assert all(handled for _delivery, handled in completions), "a message was handed back instead of retried"
    runs = sorted(process_handlers.runs(record_file), key=lambda run: run[3])
    assert_key_order([(key, seq) for key, seq, _pid, _start, _end in runs])  # each message once, in key order
    stats = pool.stats()
    killed_batch = int(stalled[4])
    assert killed_batch > 1, "the victim was in a batch with other keys"
    assert sum(s.interrupted["crashed"] for s in stats) == killed_batch, "every message of the call was retried"
    assert sum(s.failed for s in stats) == 1, "only other3/1: the killed call's messages, retried alone, cost none"
    assert sum(s.batch_sizes.count for s in stats) < len(keys), "messages went in batch calls"


class ValueThatKillsItsUnpickler(bytes):
    """A message value whose first unpickling ends the worker process (as a ``MemoryError`` while
    reading the batch would), before it begins the batch; later copies unpickle as plain bytes."""

    sent = 0

    def __reduce_ex__(self, protocol):  # type: ignore[no-untyped-def]  # pickled once per batch sent
        self.sent += 1
        return (os._exit, (9,)) if self.sent == 1 else (bytes, (bytes(self),))


def _one_worker_after_a_first_batch(completions: Completions) -> tuple[ProcessWorkerPool, int]:
    """A one-process pool that ran ``a``/0 (its progress slot 0 says SUCCEEDED), now idle."""
    pool = process_pool("record", 1, completions)
    pool.start()
    pool.submit(keyed(["a"]))
    wait_until(lambda: len(completions) == 1, 30, "the first batch handled")
    (pid,) = live_children(pool)
    return pool, pid


def _assert_ran_in_a_new_process_as_never_started(pool, completions, record_file, died: int) -> None:
    wait_until(lambda: len(completions) == 2, 30, "the second batch settled")
    (_first, (delivery, handled)) = completions
    assert (delivery.message.key, handled) == (b"b", True)
    runs = {(key, seq): pid for key, seq, pid, _start, _end in process_handlers.runs(record_file)}
    assert ("b", 0) in runs, "b/0 was reported handled but never ran: the previous batch's outcome was read"
    assert runs[("b", 0)] != died and runs[("b", 0)] in live_children(pool), "not run by the replacement"
    assert delivery.attempts == 1, "the batch the dead process never began must not count an attempt"
    stats = pool.stats()
    assert sum(s.process_restarts["crashed"] for s in stats) == 1
    assert sum(s.interrupted["crashed"] for s in stats) == 0, "no message was running"
    assert sum(s.failed for s in stats) == 0 and sum(s.retried for s in stats) == 0
    assert sum(s.processed for s in stats) == 2


def test_a_worker_process_killed_while_idle_runs_the_next_batch_in_its_replacement(record_file):
    """Killed between two batches (an OOM kill): sending the next one fails (EPIPE); the progress
    block still holds the first batch's SUCCEEDED slot, which is not the second batch's outcome."""
    completions = Completions()
    pool, idle = _one_worker_after_a_first_batch(completions)
    try:
        os.kill(idle, signal.SIGKILL)
        wait_until(lambda: _is_zombie(idle), 30, "the kill")
        pool.submit(keyed(["b"]))
        _assert_ran_in_a_new_process_as_never_started(pool, completions, record_file, idle)
    finally:
        pool.stop(5)


def test_a_worker_process_dying_before_it_begins_a_batch_runs_that_batch_in_its_replacement(record_file):
    """The process receives the batch and dies unpickling it: the pod's send succeeded, its receive
    fails, and the progress block still describes the batch before."""
    completions = Completions()
    pool, receiver = _one_worker_after_a_first_batch(completions)
    try:
        (delivery,) = keyed(["b"])
        delivery.message.value = ValueThatKillsItsUnpickler(b"0")
        pool.submit([delivery])
        _assert_ran_in_a_new_process_as_never_started(pool, completions, record_file, receiver)
        assert delivery.message.value.sent == 2, "sent to the process that died, then to its replacement"
    finally:
        pool.stop(5)


def _is_zombie(pid: int) -> bool:
    """Dead, not yet reaped (or gone)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_message_past_the_handler_timeout_has_its_process_killed_and_is_retried(record_file, monkeypatch):
    monkeypatch.setenv("KEYORDER_TEST_STALL_KEY", "slow")
    completions = Completions()
    pool = process_pool("stall_once", 1, completions, handler_timeout=0.5)
    pool.start()
    try:
        pool.submit(keyed(["slow", "slow", "fast"]))
        wait_until(lambda: len(completions) == 3, 30, "the stalled message retried after the timeout")
    finally:
        pool.stop(5)
    runs = sorted(process_handlers.runs(record_file), key=lambda run: run[3])
    assert [(key, seq) for key, seq, *_ in runs if key == "slow"] == [("slow", 0), ("slow", 1)]
    stats = pool.stats()
    assert sum(s.process_restarts["timeout"] for s in stats) == 1
    assert sum(s.interrupted["timeout"] for s in stats) == 1


def test_a_handler_error_in_a_process_is_retried_then_dead_lettered_under_its_own_name(record_file):
    completions = Completions()
    sink = FakeDeadLetters()
    retry = RetryPolicy(max_attempts=2, initial_backoff=0.0, max_backoff=0.01, exhausted=ExhaustedPolicy.DLQ)
    pool = process_pool("fail_value_error", 1, completions, retry=retry, sink=sink)
    pool.start()
    try:
        pool.submit(keyed(["k"]))
        wait_until(lambda: len(completions) == 1, 30, "the message dead-lettered")
    finally:
        pool.stop(5)
    assert sink.published == [(0, "ValueError", 2)], "the DLQ header must name the handler's own error"
    assert str(sink.errors[0]) == "cannot parse b'0'"


def test_each_worker_process_runs_the_hooks_and_a_resize_changes_the_number_of_processes(record_file):
    completions = Completions()
    pool = process_pool("record", 2, completions, setup="setup", teardown="teardown")
    pool.start()
    try:
        started = live_children(pool)
        assert len(started) == 2
        pool.resize(4)
        wait_until(lambda: len(live_children(pool)) == 4, 60, "4 worker processes after growing")
        pool.resize(1)
        wait_until(lambda: len(live_children(pool)) == 1, 60, "1 worker process after shrinking")
        pool.submit(keyed(["a", "b", "a"]))
        wait_until(lambda: len(completions) == 3, 30, "messages handled after the resizes")
    finally:
        pool.stop(5)
    lines = process_handlers.read(record_file)
    setups = {int(f[1]) for f in lines if f[0] == "setup"}
    teardowns = {int(f[1]) for f in lines if f[0] == "teardown"}
    assert len(setups) == 4 and setups == teardowns, "every process runs set-up once and tear-down once"
    assert {pid for _k, _s, pid, _b, _e in process_handlers.runs(record_file)} <= setups


def test_a_failing_set_up_stops_the_pool_from_starting_and_leaves_no_process(record_file):
    pool = process_pool("record", 2, Completions(), setup="failing_setup")
    with pytest.raises(HandlerSetupError, match="database unreachable") as raised:
        pool.start()
    assert raised.value.bad_input is False
    assert not live_children(pool)


def test_a_handler_path_a_worker_process_cannot_import_is_bad_input(record_file):
    pool = process_pool("no_such_handler", 1, Completions())
    with pytest.raises(HandlerSetupError, match="has no attribute 'no_such_handler'") as raised:
        pool.start()
    assert raised.value.bad_input is True


@pytest.mark.parametrize("pool_type", [ThreadWorkerPool, AsyncWorkerPool])
def test_thread_and_async_pools_run_the_hooks_once_around_the_messages(record_file, pool_type):
    if pool_type is AsyncWorkerPool:
        handler, hooks = (
            process_handlers.async_record,
            Lifecycle(process_handlers.async_setup, process_handlers.async_teardown),
        )
    else:
        handler, hooks = process_handlers.record, Lifecycle(process_handlers.setup, process_handlers.teardown)
    completions = Completions()
    pool = pool_type(handler, 4, RetryPolicy(max_attempts=1), None, completions, lifecycle=hooks)
    pool.start()
    try:
        pool.submit(keyed(["a", "b", "a", "c"]))
        wait_until(lambda: len(completions) == 4, 10, "every message handled")
        assert all(handled for _delivery, handled in completions)
    finally:
        pool.stop(2)
    kinds = [fields[0] for fields in process_handlers.read(record_file)]
    assert kinds == ["setup", "run", "run", "run", "run", "teardown"]
    assert {int(f[1]) for f in process_handlers.read(record_file) if f[0] != "run"} == {os.getpid()}


def test_stop_waits_for_the_grace_period_then_kills_a_process_still_in_the_handler_and_hands_its_message_back(
    record_file, monkeypatch
):
    monkeypatch.setenv("KEYORDER_TEST_STALL_KEY", "slow")
    completions = Completions()
    pool = process_pool("stall_once", 2, completions, teardown="teardown")
    pool.start()
    children = live_children(pool)
    pool.submit(keyed(["slow", "fast"]))
    wait_until(lambda: len(completions) == 1, 30, "the fast message while the slow one stalls")
    wait_until(lambda: any(f[0] == "stalled" for f in process_handlers.read(record_file)), 30, "the stall")
    stalled = next(int(f[3]) for f in process_handlers.read(record_file) if f[0] == "stalled")
    started = time.monotonic()
    pool.stop(0.5)
    assert time.monotonic() - started < 10  # hang guard: stop kills after the 0.5 s grace instead of waiting
    assert [(d.message.key, handled) for d, handled in completions] == [(b"fast", True), (b"slow", False)]
    assert all(not os.path.exists(f"/proc/{pid}") for pid in children), "a worker process outlived the pool"
    teardowns = {int(f[1]) for f in process_handlers.read(record_file) if f[0] == "teardown"}
    assert teardowns == children - {stalled}, "the idle process tears down; the killed one cannot"
    assert sum(s.process_restarts["crashed"] for s in pool.stats()) == 0, "a shutdown kill is not a crash"


def test_a_fresh_progress_block_shows_no_running_message():
    """Before a worker process starts its first message, nothing may look overdue to the timeout."""
    from keyorder.engine.process_child import Progress
    from keyorder.engine.process_pool import _progress_file

    fd = _progress_file()
    try:
        progress = Progress(fd, fresh=True)
        assert progress.running() == (-1, 0.0)
        progress.start(3, 12.5)
        assert progress.running() == (3, 12.5)
        progress.finish(3, 2, 0.25)
        assert progress.running() == (-1, 0.0) and progress.slot(3) == (2, 0.25)
        progress.close()
    finally:
        os.close(fd)


def test_a_batch_calls_slots_are_cleared_started_and_finished_whole_and_only_its_own():
    """``Progress.begin_batch``, ``start_all`` and ``finish_all`` write a batch's slots in one copy each: every
    slot of the batch, none past it, and the pod reads them as the per-message writes left them."""
    from keyorder.engine.process_child import FAILED, NOT_STARTED, RUNNING, SUCCEEDED, Progress
    from keyorder.engine.process_pool import _progress_file

    fd = _progress_file()
    try:
        progress = Progress(fd, fresh=True)
        progress.finish(5, FAILED, 9.0)  # a slot past the next batch, left by an earlier, longer one
        progress.begin_batch(7, 5)
        assert progress.batch() == 7 and [progress.slot(index) for index in range(5)] == [(NOT_STARTED, 0.0)] * 5
        progress.start_all(5, 12.5)
        assert progress.running() == (0, 12.5) and {progress.slot(index) for index in range(5)} == {(RUNNING, 0.0)}
        progress.finish_all(5, SUCCEEDED, 0.125)
        assert progress.running() == (-1, 0.0)
        assert [progress.slot(index) for index in range(6)] == [(SUCCEEDED, 0.125)] * 5 + [(FAILED, 9.0)]
        progress.close()
    finally:
        os.close(fd)


@pytest.mark.parametrize("pool_type", [ThreadWorkerPool, AsyncWorkerPool])
def test_a_failing_set_up_hook_stops_a_thread_or_async_pool_from_starting(pool_type):
    hooks = Lifecycle(setup=process_handlers.failing_setup)
    pool = pool_type(process_handlers.record, 2, RetryPolicy(), None, Completions(), lifecycle=hooks)
    with pytest.raises(HandlerSetupError, match="set-up hook failed: RuntimeError: database unreachable"):
        pool.start()
    assert pool.stats()[1:] == [], "no worker may start after a failed set-up"


def test_an_async_hook_for_a_plain_handler_is_refused_at_start_up_naming_the_flag():
    from keyorder.adapters.handlers import HandlerLoadError, load_lifecycle

    with pytest.raises(
        HandlerLoadError, match=r"--handler-setup .*async_setup.* is async def, but the handler is a plain"
    ):
        load_lifecycle(f"{HANDLERS}:async_setup", None, handler_is_async=False)
    with pytest.raises(HandlerLoadError, match=r"--handler-teardown .*: it must be callable without arguments"):
        load_lifecycle(None, f"{HANDLERS}:record", handler_is_async=False)
    hooks = load_lifecycle(f"{HANDLERS}:async_setup", f"{HANDLERS}:teardown", handler_is_async=True)
    assert hooks.setup is process_handlers.async_setup and hooks.teardown is process_handlers.teardown


def test_a_message_crosses_to_the_worker_process_whole() -> None:
    """Every field of a ``Message`` reaches the handler in the worker process, its leader epoch too."""
    from keyorder.engine.process_child import message_fields

    message = Message("orders", 3, 41, b"k", b"v", (("h", b"1"), ("h", None)), 1_700_000_000.5, leader_epoch=7)
    assert Message(*message_fields(message)) == message


def test_a_batch_handler_that_empties_its_list_in_a_process_settles_every_message(record_file):
    """``process_child.run_batch_call`` hands the handler a list of its own: draining it sent back a shorter
    result list, and the pod's ``zip(strict=True)`` crashed the key worker (the pod stopped)."""
    completions = Completions()
    pool = process_pool("batch_drains", 1, completions, batch=BatchLimits(4))
    pool.start()
    try:
        pool.submit(keyed(["a", "b", "c"]))
        wait_until(lambda: len(completions) == 3 or pool.health.crashed, 30, "the batch settled")
    finally:
        pool.stop(5)
    assert not pool.health.crashed
    assert sorted((delivery.message.key, handled) for delivery, handled in completions) == [
        (b"a", True), (b"b", True), (b"c", True)
    ]  # fmt: skip
    assert sorted((key, seq) for key, seq, *_ in process_handlers.runs(record_file)) == [("a", 0), ("b", 0), ("c", 0)]


def test_a_poison_message_that_kills_its_batch_call_dead_letters_itself_alone(record_file, monkeypatch):
    """``maxAttempts`` 1 and a dead-letter topic; the process dies in every call that holds ``poison``. The
    call's messages are not charged for a death any of them may have caused: each runs next in a call of its
    own, so only ``poison`` is dead-lettered. Before, every message of the call failed (``WorkerProcessDied``)
    with its one attempt, and its innocent keys were dead-lettered with it."""
    monkeypatch.setenv("KEYORDER_TEST_POISON_KEY", "poison")
    sink = FakeDeadLetters()
    retry = RetryPolicy(max_attempts=1, initial_backoff=0.0, max_backoff=0.01, exhausted=ExhaustedPolicy.DLQ)
    completions = Completions()
    pool = process_pool("batch_poison", 1, completions, retry=retry, sink=sink, batch=BatchLimits(4))
    pool.start()
    try:
        pool.submit(keyed(["a", "poison", "b", "c"]))
        wait_until(lambda: len(completions) == 4, 30, "every message settled")
    finally:
        pool.stop(5)
    assert [(offset, error) for offset, error, _attempts in sink.published] == [(1, "WorkerProcessDied")]
    assert sorted((key, seq) for key, seq, *_ in process_handlers.runs(record_file)) == [("a", 0), ("b", 0), ("c", 0)]
    stats = pool.stats()
    assert sum(s.interrupted["crashed"] for s in stats) == 5, "the call of 4, then poison alone"
