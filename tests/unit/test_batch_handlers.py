"""Batch handlers (``--batch-max-messages``): one call for the heads of distinct ready lanes.

The pools are the real ``ThreadWorkerPool`` and ``AsyncWorkerPool`` under the pod simulation
(``tests/simulation``): threads, lock, event loop and clock are the simulation's, so each run is
deterministic on virtual time and takes milliseconds. The dead-letter sink is the FAKE of
``test_workers``. Order is checked with per-key sequence numbers carried in the messages.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from keyorder.batch import BatchLimits, BatchResultError, batch_outcomes
from keyorder.core.lanes import Delivery
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.engine.worker_pools import AsyncWorkerPool, Completions, ThreadWorkerPool
from keyorder.message import Message
from tests.guarantees import assert_key_order
from tests.simulation.eventloop import event_loop_factory
from tests.simulation.scheduler import Simulation
from tests.unit.test_workers import FakeDeadLetters


class Partition:
    def __init__(self, number: int = 0) -> None:
        self.number = number
        self.revoked = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:
        return self.revoked

    @property
    def may_let_go(self) -> bool:
        return self.revoked


def keyed(
    simulation: Simulation, keys: str, partition: Partition | None = None, first_offset: int = 0
) -> list[Delivery]:
    """One delivery per letter of ``keys`` (the letter is the key); each value is its key's sequence number."""
    partition = partition or Partition()
    sequence: dict[str, int] = {}
    out = []
    for offset, key in enumerate(keys, start=first_offset):
        seq = sequence[key] = sequence.get(key, -1) + 1
        message = Message("t", partition.number, offset, key.encode(), str(seq).encode())
        out.append(Delivery(message, key.encode(), partition, simulation.now))
    return out


def returned_by_key(simulation: Simulation, completions: Completions, expected: int) -> dict[str, tuple[bool, float]]:
    """Wait (bounded, on virtual time) until ``expected`` keys came back: per key, whether it was handled and when
    it came back."""
    back: dict[str, tuple[bool, float]] = {}
    while len(back) < expected and completions.wait(1, 30.0):  # hang guard
        while completions:
            delivery, handled = completions.popleft()
            back[name(delivery.message)[0]] = (handled, simulation.now)
    return back


def name(message: Message) -> tuple[str, int]:
    return message.key.decode(), int(message.value)  # type: ignore[union-attr,arg-type]


THREE = BatchLimits(3)
RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.05, max_backoff=0.05)


def make_pool(
    simulation: Simulation,
    handler: Callable[[list[Message]], Any],
    completions: Completions,
    *,
    executor: str = "thread",
    workers: int = 2,
    limits: BatchLimits = THREE,
    retry: RetryPolicy = RETRY,
    sink: FakeDeadLetters | None = None,
) -> ThreadWorkerPool | AsyncWorkerPool:
    shared: dict[str, Any] = {"clock": simulation.clock, "threads": simulation, "batch": limits}
    if executor == "async":
        return AsyncWorkerPool(handler, workers, retry, sink, completions, **shared,
                               event_loop=event_loop_factory(simulation))  # fmt: skip
    return ThreadWorkerPool(handler, workers, retry, sink, completions, **shared)


def drive(simulation: Simulation, main: Callable[[], None], limit: float = 100.0) -> None:
    simulation.spawn(main, name="main")
    simulation.run(limit=limit)
    simulation.close()
    assert simulation.errors == []


def collect(completions: Completions, expected: int, timeout: float = 30.0) -> list[tuple[Delivery, bool]]:
    """Wait (bounded, on virtual time) until ``expected`` deliveries came back; all of them."""
    back: list[tuple[Delivery, bool]] = []
    while len(back) < expected:
        if not completions.wait(1, timeout):  # hang guard
            break
        while completions:
            back.append(completions.popleft())
    return back


# -- the contract, pure ----------------------------------------------------------------------------------------
def test_the_three_answers_and_what_breaks_the_contract() -> None:
    def handle_batch(messages: list[Message]) -> None: ...

    failure = ValueError("row 2 rejected")
    assert batch_outcomes(handle_batch, 3, None) == [None, None, None]
    assert batch_outcomes(handle_batch, 3, [None, failure, None]) == [None, failure, None]
    assert batch_outcomes(handle_batch, 2, (None, None)) == [None, None], "any sequence"
    for returned, said in (
        ([None], "returned 1 outcomes for a batch of 3 messages"),
        ("ok", "returned a str ('ok')"),
        (True, "returned a bool (True)"),
        ([None, "failed", None], "returned 'failed' (a str) as the outcome of message 1 of 3"),
    ):
        outcomes = batch_outcomes(handle_batch, 3, returned)
        assert len(outcomes) == 3 and all(isinstance(error, BatchResultError) for error in outcomes), returned
        assert said in str(outcomes[0]) and "test_batch_handlers:test_the_three_answers" in str(outcomes[0])


# -- order and one call per batch --------------------------------------------------------------------------------
@pytest.mark.parametrize("executor", ["thread", "async"])
def test_per_key_order_through_a_batch_handler_and_never_two_messages_of_a_key_in_one_call(executor: str) -> None:
    simulation = Simulation(7)
    records: list[tuple[str, int]] = []
    calls: list[list[tuple[str, int]]] = []

    def handle(messages: list[Message]) -> None:
        calls.append([name(message) for message in messages])
        records.extend(name(message) for message in messages)

    async def async_handle(messages: list[Message]) -> None:
        await asyncio.sleep(0.001)
        handle(messages)

    def sync_handle(messages: list[Message]) -> None:
        simulation.sleep(0.001)
        handle(messages)

    handler: Any = async_handle if executor == "async" else sync_handle
    completions = Completions(threads=simulation)
    pool = make_pool(simulation, handler, completions, executor=executor, limits=BatchLimits(4))
    keys = "abcde" * 6 + "aaaa"
    back: list[tuple[Delivery, bool]] = []

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, keys))
        back.extend(collect(completions, len(keys)))
        pool.stop(5.0)

    drive(simulation, main)
    assert sorted(delivery.message.offset for delivery, handled in back if handled) == list(range(len(keys)))
    assert_key_order(records)
    assert all(len(call) <= 4 for call in calls), calls
    assert all(len({key for key, _seq in call}) == len(call) for call in calls), f"a key twice in a call: {calls}"
    assert max(len(call) for call in calls) == 4, "the ready heads of distinct keys went in one call"
    stats = pool.stats()
    assert sum(worker.batch_sizes.count for worker in stats) == len(calls)
    assert sum(worker.handler_seconds.count for worker in stats) == len(keys), "seconds are counted per message"
    assert sum(worker.processed for worker in stats) == len(keys)


# -- failures ------------------------------------------------------------------------------------------------
def test_failed_items_are_retried_on_their_own_keys_while_the_others_of_the_batch_finish() -> None:
    simulation = Simulation(3)
    records: list[tuple[str, int, float]] = []
    failed_once: set[tuple[str, int]] = set()

    def handler(messages: list[Message]) -> list[BaseException | None]:
        simulation.sleep(0.001)
        outcomes: list[BaseException | None] = []
        for message in messages:
            key, seq = name(message)
            if key == "b" and seq == 0 and (key, seq) not in failed_once:
                failed_once.add((key, seq))
                outcomes.append(ValueError("b0 rejected once"))
            else:
                records.append((key, seq, simulation.now))
                outcomes.append(None)
        return outcomes

    completions = Completions(threads=simulation)
    pool = make_pool(simulation, handler, completions, workers=1, limits=BatchLimits(3))
    back: list[tuple[Delivery, bool]] = []

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "abcabc"))
        back.extend(collect(completions, 6))
        pool.stop(5.0)

    drive(simulation, main)
    assert sorted((delivery.message.offset, handled) for delivery, handled in back) == [(i, True) for i in range(6)]
    assert_key_order((key, seq) for key, seq, _at in records)
    finished = {(key, seq): at for key, seq, at in records}
    assert finished[("a", 1)] < finished[("b", 0)], "a's next message did not wait for b's retry"
    assert finished[("c", 1)] < finished[("b", 0)], "c's next message did not wait for b's retry"
    assert finished[("b", 0)] >= 0.05, "b0 ran again after its backoff"
    stats = pool.stats()
    assert (sum(worker.failed for worker in stats), sum(worker.retried for worker in stats)) == (1, 1)


def test_a_batch_that_raises_fails_every_message_and_each_is_retried() -> None:
    simulation = Simulation(5)
    calls: list[list[tuple[str, int]]] = []

    def handler(messages: list[Message]) -> None:
        calls.append([name(message) for message in messages])
        if len(calls) == 1:
            raise ConnectionError("database unreachable")

    completions = Completions(threads=simulation)
    pool = make_pool(simulation, handler, completions, workers=1, limits=BatchLimits(5))
    back: list[tuple[Delivery, bool]] = []

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "abcab"))
        back.extend(collect(completions, 5))
        pool.stop(5.0)

    drive(simulation, main)
    assert calls[0] == [("a", 0), ("b", 0), ("c", 0)], "one call for the heads of three keys"
    assert sorted(seq for call in calls[1:] for seq in call) == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0)]
    assert_key_order(seq for call in calls[1:] for seq in call)
    assert all(handled for _delivery, handled in back) and len(back) == 5
    assert [delivery.attempts for delivery, _ in back if name(delivery.message)[1] == 0] == [2, 2, 2]
    assert sum(worker.failed for worker in pool.stats()) == 3


@pytest.mark.parametrize("executor", ["thread", "async"])
def test_a_bad_return_value_fails_the_batch_with_an_error_naming_the_handler(executor: str) -> None:
    simulation = Simulation(1)
    sink = FakeDeadLetters()

    def returns_a_count(messages: list[Message]) -> int:
        return len(messages)  # a common slip: "rows written"

    async def returns_a_count_async(messages: list[Message]) -> int:
        return len(messages)

    handler = returns_a_count_async if executor == "async" else returns_a_count
    completions = Completions(threads=simulation)
    retry = RetryPolicy(max_attempts=1, exhausted=ExhaustedPolicy.DLQ)
    pool = make_pool(simulation, handler, completions, executor=executor, retry=retry, sink=sink)
    back: list[tuple[Delivery, bool]] = []

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "ab"))
        back.extend(collect(completions, 2))
        pool.stop(5.0)

    drive(simulation, main)
    assert sorted(offset for offset, _type, _attempts in sink.published) == [0, 1], "both dead-lettered"
    assert {type(error) for error in sink.errors} == {BatchResultError}
    assert "returned a int (2)" in str(sink.errors[0]) and handler.__qualname__ in str(sink.errors[0])


class SlowFailingFirstDeadLetters(FakeDeadLetters):
    """FAKE sink whose writes take 0.5 s (a round trip to the broker) and whose first write fails."""

    def __init__(self, simulation: Simulation) -> None:
        super().__init__()
        self.simulation = simulation
        self.writes = 0

    def publish(self, message, error, attempts):  # type: ignore[no-untyped-def]
        self.writes += 1
        self.simulation.sleep(0.5)
        if self.writes == 1:
            raise RuntimeError("the dead-letter topic is not there yet")
        super().publish(message, error, attempts)


def test_a_revoke_during_the_dead_letter_write_before_a_call_keeps_the_revoked_heads_out_of_the_call() -> None:
    """Simulation seed 60457: a worker took d0 (its dead-letter write to retry) with a0 and b0, checked that none
    was let go, wrote d0's dead letter (a round trip), and only then called the handler, with a0 too, though
    a0's partition had been revoked during the write: the revoke waited for a call that began after it. The
    batch is asked again after the writes: a0 goes back unrun, the call holds b0 alone."""
    simulation = Simulation(3)
    revoked, kept = Partition(0), Partition(1)
    calls: list[tuple[float, list[tuple[str, int]]]] = []

    def handler(messages: list[Message]) -> list[BaseException | None]:
        calls.append((simulation.now, [name(message) for message in messages]))
        simulation.sleep(0.1)
        return [RuntimeError("poison") if name(message)[0] == "d" else None for message in messages]

    completions = Completions(threads=simulation)
    sink = SlowFailingFirstDeadLetters(simulation)
    retry = RetryPolicy(max_attempts=1, exhausted=ExhaustedPolicy.DLQ, initial_backoff=0.0, max_backoff=0.0)
    pool = make_pool(simulation, handler, completions, workers=1, limits=BatchLimits(5), retry=retry, sink=sink)
    back: dict[str, tuple[bool, float]] = {}

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "d", kept))
        simulation.sleep(0.3)  # d0's call fails at 0.1; its first dead-letter write runs until 0.6, and fails
        pool.submit([*keyed(simulation, "a", revoked, first_offset=10), *keyed(simulation, "b", kept, 20)])
        simulation.sleep(0.5)  # at 0.6 d0 (due at once) is taken with a0 and b0; its write runs until 1.1
        revoked.revoked = True
        assert pool.withdraw(lambda item: item.partition.revoked) == [], "a0 was taken: the revoke waits for it"
        back.update(returned_by_key(simulation, completions, 3))
        pool.stop(5.0)

    drive(simulation, main)
    assert [batch for _at, batch in calls] == [[("d", 0)], [("b", 0)]], "a0 never ran: its partition was revoked"
    assert back["a"][0] is False, "a0 went back unrun"
    assert back["a"][1] < calls[1][0] + 0.01, "a0 went back before b0's call ended, not after it"
    assert [offset for offset, _type, _attempts in sink.published] == [0], "d0 dead-lettered on the second write"


class SlowDeadLetters(FakeDeadLetters):
    """FAKE sink whose writes take 0.5 s each (a round trip to the broker)."""

    def __init__(self, simulation: Simulation) -> None:
        super().__init__()
        self.simulation = simulation

    def publish(self, message, error, attempts):  # type: ignore[no-untyped-def]
        self.simulation.sleep(0.5)
        super().publish(message, error, attempts)


def dead_lettering_pool(
    simulation: Simulation, handler: Callable[[list[Message]], Any], pool_kind: str, limits: BatchLimits = THREE
) -> tuple[ThreadWorkerPool | AsyncWorkerPool, Completions, SlowDeadLetters]:
    """One worker calling ``handler`` (in an ``async def`` of its own on asyncio), each failed message dead-lettered
    at once, each write a round trip of 0.5 s; the pool, its completions and its sink."""

    async def async_handler(messages: list[Message]) -> Any:
        return handler(messages)

    completions = Completions(threads=simulation)
    sink = SlowDeadLetters(simulation)
    retry = RetryPolicy(max_attempts=1, exhausted=ExhaustedPolicy.DLQ, initial_backoff=0.0, max_backoff=0.0)
    chosen = async_handler if pool_kind == "async" else handler
    pool = make_pool(
        simulation, chosen, completions, executor=pool_kind, workers=1, limits=limits, retry=retry, sink=sink
    )
    return pool, completions, sink


@pytest.mark.parametrize("pool_kind", ["thread", "async"])
def test_a_revoke_during_a_failed_batchs_dead_letter_writes_waits_for_its_own_messages_only(pool_kind: str) -> None:
    """Simulation seed 80443: a batch of two partitions' messages failed, each to be dead-lettered, one write (a
    round trip) after the other. A revoke of one partition came during the first write: its message not yet
    written was written all the same, and the revoke waited for the other partition's writes too. Now it goes
    back unwritten, at once (its new owner runs it again), and the other partition's writes go on."""
    simulation = Simulation(5)
    revoked, kept = Partition(0), Partition(1)

    def handler(messages: list[Message]) -> None:
        simulation.sleep(0.1)
        raise RuntimeError("the sink refused the batch")

    pool, completions, sink = dead_lettering_pool(simulation, handler, pool_kind)
    back: dict[str, tuple[bool, float]] = {}

    def main() -> None:
        pool.start()
        # b0 of the kept partition first, then a0 of the revoked one, then c0: the call fails at 0.1,
        # b0's write runs until 0.6, a0's would until 1.1, c0's until 1.6 (1.1 without a0's)
        pool.submit(
            [*keyed(simulation, "b", kept), *keyed(simulation, "a", revoked, 10), *keyed(simulation, "c", kept, 20)]
        )
        simulation.sleep(0.3)
        revoked.revoked = True
        assert pool.withdraw(lambda item: item.partition.revoked) == [], "a0 was taken: the revoke waits for it"
        back.update(returned_by_key(simulation, completions, 3))
        pool.stop(5.0)

    drive(simulation, main)
    assert back["a"][0] is False, "a0 went back unwritten: its new owner runs it"
    assert back["a"][1] < 0.61, f"a0 went back when b0's write ended, not after c0's: {back}"
    assert [offset for offset, _type, _attempts in sink.published] == [0, 20], "b0 and c0 dead-lettered, a0 not"


@pytest.mark.parametrize("pool_kind", ["thread", "async"])
@pytest.mark.parametrize("revoked_first", [False, True], ids=["kept-first", "revoked-first"])
def test_a_revoke_during_the_dead_letter_writes_retried_before_a_call_waits_for_its_own_messages_only(
    pool_kind: str, revoked_first: bool
) -> None:
    """The writes a batch retries before its call (heads whose last dead-letter write failed) follow the rule of
    the writes after a call (the test above): a revoke between two writes settles what is known at once, a head
    its partition let go goes back unwritten, and so does a head of that partition waiting for the call behind
    the writes. Before, the writes ran one after the other and nothing settled until the last: the revoked head
    was written after the revoke, or held until the other partition's write ended (a review found it)."""
    simulation = Simulation(5)
    revoked, kept = Partition(0), Partition(1)
    calls: list[list[str]] = []

    def handler(messages: list[Message]) -> None:
        calls.append([name(message)[0] for message in messages])

    pool, completions, sink = dead_lettering_pool(simulation, handler, pool_kind, BatchLimits(4))
    # d0 (kept) and e0 (revoked) gave up and their first write failed: only the write is left; f0 (revoked) and g0
    # (kept) are fresh heads waiting for the call behind the writes
    d0, e0 = keyed(simulation, "d", kept), keyed(simulation, "e", revoked, 10)
    for delivery in (*d0, *e0):
        delivery.pending_dead_letter, delivery.attempts = RuntimeError("poison"), 1
    writes = [*e0, *d0] if revoked_first else [*d0, *e0]
    back: dict[str, tuple[bool, float]] = {}

    def main() -> None:
        pool.start()
        pool.submit([*writes, *keyed(simulation, "f", revoked, 20), *keyed(simulation, "g", kept, 30)])
        simulation.sleep(0.2)  # the first write runs from 0.0 to 0.5
        revoked.revoked = True
        assert pool.withdraw(lambda item: item.partition.revoked) == [], "e0 and f0 were taken: the revoke waits"
        back.update(returned_by_key(simulation, completions, 4))
        pool.stop(5.0)

    drive(simulation, main)
    for key in ("e", "f"):  # the revoke waits out the write running when it came, not the next one
        assert back[key][1] < 0.51, f"{key}0 came back at {back[key][1]:.2f} s: {back}"
    assert back["f"][0] is False and calls == [["g"]], "f0 goes back unrun; the call holds g0 only"
    written = [offset for offset, _type, _attempts in sink.published]
    if revoked_first:
        assert back["e"] == (True, 0.5) and written == [10, 0], "e0's write had begun before the revoke: it ends"
    else:
        assert back["e"][0] is False and written == [0], "e0 goes back unwritten: its new owner runs it"


@pytest.mark.parametrize("pool_kind", ["thread", "async"])
def test_a_batchs_successes_are_settled_before_its_failures_are_dead_lettered(pool_kind: str) -> None:
    """A call whose failed messages are dead-lettered one round trip after another: the messages that succeeded
    are settled before the first write, so a shutdown whose grace ends during the writes commits them (a review
    found them held until the last write: run again after the restart)."""
    simulation = Simulation(2)

    def handler(messages: list[Message]) -> list[BaseException | None]:
        simulation.sleep(0.05)
        return [None if name(message)[0] == "a" else RuntimeError("bad") for message in messages]

    pool, completions, _sink = dead_lettering_pool(simulation, handler, pool_kind)
    back: dict[str, tuple[bool, float]] = {}

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "abc"))  # one call: a succeeds at 0.05; b, c written 0.05-0.55-1.05
        simulation.sleep(0.2)
        pool.begin_shutdown()
        pool.stop(0.2)  # the grace ends during b's write
        while completions:
            delivery, handled = completions.popleft()
            back[name(delivery.message)[0]] = (handled, simulation.now)

    drive(simulation, main, limit=10.0)
    assert back.get("a") == (True, 0.4), f"a0 succeeded at 0.05 s, settled before b0's write: {back}"


# -- revoke, shutdown, fill --------------------------------------------------------------------------------------
def test_a_revoke_during_a_batch_hands_back_what_waits_and_the_batch_settles_on_its_own_keys() -> None:
    simulation = Simulation(11)
    revoked, kept = Partition(0), Partition(1)
    calls: list[list[tuple[str, int]]] = []

    def handler(messages: list[Message]) -> list[BaseException | None]:
        calls.append([name(message) for message in messages])
        simulation.sleep(1.0)
        # the revoked partition's head fails: handed back, never parked or retried here
        failing = [message.partition == 0 and name(message) == ("b", 0) for message in messages]
        return [ValueError("x") if fails else None for fails in failing]

    completions = Completions(threads=simulation)
    pool = make_pool(simulation, handler, completions, workers=1, limits=BatchLimits(4))
    back: dict[tuple[int, int], bool] = {}
    withdrawn: list[int] = []

    def main() -> None:
        pool.start()
        pool.submit([*keyed(simulation, "aab", revoked), *keyed(simulation, "cc", kept, first_offset=10)])
        simulation.sleep(0.5)  # the batch (a0, b0, c0) runs
        revoked.revoked = True
        withdrawn.extend(delivery.message.offset for delivery in pool.withdraw(lambda item: item.partition.revoked))
        for delivery, handled in collect(completions, 4):
            back[(delivery.message.partition, delivery.message.offset)] = handled
        pool.stop(5.0)

    drive(simulation, main)
    assert calls[0] == [("a", 0), ("b", 0), ("c", 0)]
    assert withdrawn == [1], "a1 waited behind its key: handed back at once"
    assert back == {(0, 0): True, (0, 2): False, (1, 10): True, (1, 11): True}, (
        "a0 succeeded during the revoke; b0 failed after it and went back unretried; c runs on"
    )
    assert [call for call in calls if ("b", 0) in call] == [calls[0]], "b0 was never retried here"


def test_shutdown_with_a_batch_in_flight_lets_it_finish_and_hands_back_the_rest() -> None:
    simulation = Simulation(2)
    calls: list[list[tuple[str, int]]] = []

    def handler(messages: list[Message]) -> None:
        calls.append([name(message) for message in messages])
        simulation.sleep(1.0)

    completions = Completions(threads=simulation)
    pool = make_pool(simulation, handler, completions, workers=1, limits=BatchLimits(2))
    back: dict[int, bool] = {}

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "abab"))
        simulation.sleep(0.5)
        pool.stop(5.0)  # the batch (a0, b0) is inside the handler
        while completions:
            delivery, handled = completions.popleft()
            back[delivery.message.offset] = handled

    drive(simulation, main)
    assert calls == [[("a", 0), ("b", 0)]]
    assert back == {0: True, 1: True, 2: False, 3: False}, "the running batch finished; the rest went back unrun"


@pytest.mark.parametrize("executor", ["thread", "async"])
def test_a_worker_waits_up_to_the_fill_time_for_more_keys_and_counts_why_each_batch_went(executor: str) -> None:
    simulation = Simulation(4)
    calls: list[tuple[float, list[tuple[str, int]]]] = []

    def record(messages: list[Message]) -> None:
        calls.append((simulation.now, [name(message) for message in messages]))

    async def record_async(messages: list[Message]) -> None:
        record(messages)

    completions = Completions(threads=simulation)
    handler = record_async if executor == "async" else record
    pool = make_pool(simulation, handler, completions, executor=executor, workers=1, limits=BatchLimits(3, 0.1))

    def main() -> None:
        pool.start()
        simulation.sleep(0.01)
        pool.submit(keyed(simulation, "a"))
        simulation.sleep(0.03)
        pool.submit(keyed(simulation, "bc", first_offset=1))  # fills the batch: sent at once, full
        collect(completions, 3)
        pool.submit(keyed(simulation, "d", first_offset=3))  # alone: sent when the wait ran out
        collect(completions, 1)
        pool.stop(5.0)

    drive(simulation, main)
    assert [batch for _at, batch in calls] == [[("a", 0), ("b", 0), ("c", 0)], [("d", 0)]]
    assert calls[0][0] == pytest.approx(0.04), "sent as soon as it was full"
    assert calls[1][0] == pytest.approx(0.04 + 0.1), "sent when the fill wait ran out"
    stats = pool.stats()
    assert {reason: sum(worker.batches[reason] for worker in stats) for reason in ("full", "waited")} == {
        "full": 1,
        "waited": 1,
    }
    assert sum(worker.batch_fill.total for worker in stats) == pytest.approx(0.03 + 0.1)


def one_worker_filling_for_half_a_second() -> tuple[
    Simulation, Partition, Partition, list[tuple[float, list[tuple[str, int]]]], Completions, Any
]:
    """The revoke-during-a-fill set-up: one thread worker filling batches of 5 for up to 0.5 s, a handler that
    records each call's time and messages and takes 1 s, and a partition to revoke beside one to keep."""
    simulation = Simulation(8)
    calls: list[tuple[float, list[tuple[str, int]]]] = []

    def handler(messages: list[Message]) -> None:
        calls.append((simulation.now, [name(message) for message in messages]))
        simulation.sleep(1.0)

    completions = Completions(threads=simulation)
    pool = make_pool(simulation, handler, completions, workers=1, limits=BatchLimits(5, 0.5))
    return simulation, Partition(0), Partition(1), calls, completions, pool


def test_a_revoke_during_a_fill_gets_its_heads_back_before_the_other_partitions_call() -> None:
    """A worker filling a batch holds its heads as running; a revoke ends the fill, and the revoked heads go
    back at once, not after the call the worker then makes for the other partitions' heads."""
    simulation, revoked, kept, calls, completions, pool = one_worker_filling_for_half_a_second()
    back: dict[str, tuple[bool, float]] = {}

    def main() -> None:
        pool.start()
        pool.submit([*keyed(simulation, "a", revoked), *keyed(simulation, "b", kept, first_offset=10)])
        simulation.sleep(0.1)  # the worker holds a0 and b0, waiting to fill its batch
        revoked.revoked = True
        assert pool.withdraw(lambda item: item.partition.revoked) == [], "a0 was taken"
        back.update(returned_by_key(simulation, completions, 2))
        pool.stop(5.0)

    drive(simulation, main)
    assert calls == [(pytest.approx(0.1), [("b", 0)])], "the fill ended at the revoke; only b0 was called"
    assert back["a"] == (False, pytest.approx(0.1)), "a0 went back at the revoke, not after b0's call"
    assert back["b"] == (True, pytest.approx(1.1))


@pytest.mark.parametrize("executor", ["thread", "async"])
def test_once_the_shutdown_began_a_batch_goes_with_what_is_ready_and_a_due_retry_waits_for_no_fill(
    executor: str,
) -> None:
    """Simulation seed 53737: the shutdown waits for a retry that falls due within its grace; the worker took it
    when due, then waited the fill (``--batch-max-wait-ms``) past the grace, and the retry never ran. From
    ``begin_shutdown`` on, a worker filling a batch sends it at once, and no later batch waits to fill."""
    simulation = Simulation(8)
    calls: list[tuple[float, list[tuple[str, int]]]] = []
    failed: set[str] = set()

    def handler(messages: list[Message]) -> list[BaseException | None]:
        calls.append((simulation.now, [name(message) for message in messages]))
        outcomes: list[BaseException | None] = []
        for message in messages:
            key = name(message)[0]
            outcomes.append(None if key in failed or key != "r" else RuntimeError("once"))
            failed.add(key)
        return outcomes

    async def async_handler(messages: list[Message]) -> list[BaseException | None]:
        return handler(messages)

    completions = Completions(threads=simulation)
    retry = RetryPolicy(max_attempts=3, initial_backoff=0.2, max_backoff=0.2)
    pool = make_pool(
        simulation, async_handler if executor == "async" else handler, completions,
        executor=executor, workers=1, limits=BatchLimits(5, 0.5), retry=retry,
    )  # fmt: skip

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "r"))
        collect_until = simulation.now + 0.6
        simulation.sleep(collect_until - simulation.now)  # r0 filled for 0.5 s, failed at 0.5, due at 0.7
        pool.begin_shutdown()
        pool.submit(keyed(simulation, "b", first_offset=10))  # ready now: goes at once, no fill wait
        back = collect(completions, 2, timeout=5.0)
        assert sorted(name(delivery.message)[0] for delivery, handled in back if handled) == ["b", "r"]
        pool.stop(5.0)

    drive(simulation, main)
    assert calls[0] == (pytest.approx(0.5), [("r", 0)]), "before the shutdown: a fill of 0.5 s"
    assert calls[1:] == [(pytest.approx(0.6), [("b", 0)]), (pytest.approx(0.7), [("r", 0)])], (
        "after it: b0 at once, r0's retry when due, neither after a fill wait"
    )


def test_a_revoke_after_the_async_pool_stopped_does_not_reach_for_its_closed_event_loop() -> None:
    """The shutdown's last revoke comes after the pool stopped: waking fillers then would schedule a call on
    the workers' closed event loop (``RuntimeError: Event loop is closed``, simulation seed 1913)."""
    simulation = Simulation(6)

    async def handler(messages: list[Message]) -> None:
        await asyncio.sleep(0.001)

    completions = Completions(threads=simulation)
    pool = make_pool(simulation, handler, completions, executor="async", limits=BatchLimits(3, 0.05))
    withdrawn: list[Delivery] = []

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "ab"))
        collect(completions, 2)
        pool.stop(5.0)
        withdrawn.extend(pool.withdraw(lambda _item: True))

    drive(simulation, main)
    assert withdrawn == []


def test_the_scaling_report_counts_a_batch_handlers_messages_and_its_calls() -> None:
    """The operator learns a worker's rate as handlerCallsTotal over handlerSecondsTotal (messages per busy
    second): a batch call counts its messages, its seconds split over them; handlerBatchesTotal counts calls."""
    from keyorder.adapters.scaling_report import build_report
    from keyorder.core.lanes import LaneSummary
    from keyorder.engine.poll_loop import RuntimeSnapshot
    from keyorder.engine.worker_pools import WorkerStats

    simulation = Simulation(9)

    def handler(messages: list[Message]) -> None:
        simulation.sleep(0.4)  # a bulk call: 0.4 s whatever its size

    completions = Completions(threads=simulation)
    pool = make_pool(simulation, handler, completions, workers=1, limits=BatchLimits(4))

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "abcdefgh"))
        collect(completions, 8)
        pool.stop(5.0)

    drive(simulation, main)
    stats: list[WorkerStats] = pool.stats()
    report = build_report(
        RuntimeSnapshot(), LaneSummary(), stats, ordering="key", executor="thread", workers=1, cpu_cores=1.0,
        cpu_seconds=0.0, worker_processes=0,
    )  # fmt: skip
    assert (report["handlerCallsTotal"], report["handlerBatchesTotal"]) == (8, 2)
    assert report["handlerSecondsTotal"] == pytest.approx(0.8), "two calls of 0.4 s: 0.1 s per message"


# -- review of the batch handlers (issue 40) -------------------------------------------------------------------
@pytest.mark.parametrize("executor", ["thread", "async"])
def test_a_handler_that_empties_its_list_still_settles_every_message_and_the_worker_lives(executor: str) -> None:
    """The handler's list is its own: one that drains it (``pop`` until empty) and returns None succeeded for
    every message. Before, the length was read after the call (0 outcomes for a batch of 0: no contract error)
    and ``zip(strict=True)`` raised outside any try: "key worker 0 crashed; the pod stops"."""
    simulation = Simulation(11)
    seen: list[list[tuple[str, int]]] = []

    def drains(messages: list[Message]) -> None:
        seen.append([name(message) for message in messages])
        while messages:
            messages.pop()

    async def async_drains(messages: list[Message]) -> None:
        drains(messages)

    completions = Completions(threads=simulation)
    pool = make_pool(simulation, async_drains if executor == "async" else drains, completions, executor=executor,
                     workers=1)  # fmt: skip
    back: list[tuple[Delivery, bool]] = []

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "abc"))
        back.extend(collect(completions, 3, timeout=5.0))
        pool.stop(1.0)

    drive(simulation, main)
    assert seen == [[("a", 0), ("b", 0), ("c", 0)]]
    assert sorted((name(delivery.message), handled) for delivery, handled in back) == [
        (("a", 0), True), (("b", 0), True), (("c", 0), True)
    ]  # fmt: skip
    assert not pool.health.crashed


@pytest.mark.parametrize("executor", ["thread", "async"])
def test_a_retry_runs_when_due_though_a_filling_worker_took_the_wake_up_meant_to_watch_it(executor: str) -> None:
    """Three workers, batches of 2 filled for up to 1 s, retries after 3 s. x0 fails at 0.32 and parks (due
    3.32) while a worker fills a batch with k1: the turn's wake-up "watch the new due time" reached a filler
    (fillers wait among the idle workers), which watched only until its own deadline. A worker takes x0 at
    3.32 and fills its batch for 1 s: the call at 4.32. Before, the idle thread worker slept on without a
    timeout and x0 ran at 12.0, after the 10 s call of a0."""
    from keyorder.core.retry import RetryPolicy

    simulation = Simulation(1)
    runs: list[tuple[float, list[tuple[str, int]]]] = []
    failed: set[tuple[str, int]] = set()

    def outcomes(names: list[tuple[str, int]]) -> list[BaseException | None]:
        out: list[BaseException | None] = []
        for item in names:
            out.append(ValueError("x0 once") if item == ("x", 0) and item not in failed else None)
            failed.add(item)  # each message fails at most once
        return out

    def seconds(names: list[tuple[str, int]]) -> float:
        keys = {key for key, _seq in names}
        return 10.0 if "a" in keys or ("k", 1) in names else 0.2 if "p" in keys else 0.3

    def handler(messages: list[Message]) -> list[BaseException | None]:
        names = [name(message) for message in messages]
        runs.append((simulation.now, names))
        simulation.sleep(seconds(names))
        return outcomes(names)

    async def async_handler(messages: list[Message]) -> list[BaseException | None]:
        names = [name(message) for message in messages]
        runs.append((simulation.now, names))
        await asyncio.sleep(seconds(names))
        return outcomes(names)

    completions = Completions(threads=simulation)
    retry = RetryPolicy(max_attempts=3, initial_backoff=3.0, max_backoff=3.0)
    pool = make_pool(simulation, async_handler if executor == "async" else handler, completions, executor=executor,
                     workers=3, limits=BatchLimits(2, 1.0), retry=retry)  # fmt: skip

    def main() -> None:
        pool.start()
        pool.submit(keyed(simulation, "a", Partition(0)))
        simulation.sleep(0.01)
        pool.submit(keyed(simulation, "pq", Partition(1)))
        simulation.sleep(0.01)
        pool.submit(keyed(simulation, "xkk", Partition(2)))
        collect(completions, 6, timeout=60.0)
        pool.stop(5.0)

    drive(simulation, main)
    x0 = [at for at, names in runs if ("x", 0) in names]
    assert len(x0) == 2 and x0[0] == pytest.approx(0.02)
    assert x0[1] == pytest.approx(4.32), f"x0's retry, due at 3.32 (+1 s fill wait), ran at {x0[1]:.2f}: {runs}"


def test_a_revoke_just_after_the_turn_that_took_the_heads_ends_the_fill() -> None:
    """A revoke between the turn that took a batch's first heads (lock released) and the fill's first step
    must end the fill at once. Before, the fill read the revoke count only then, missed this revoke, and held
    the revoked head a0 (running, so not withdrawn) until the fill's deadline, 0.5 s."""
    simulation, revoked, kept, calls, completions, pool = one_worker_filling_for_half_a_second()
    assert isinstance(pool, ThreadWorkerPool)
    fill = pool._fill

    def revoke_then_fill(worker: Any, taken: list[Delivery]) -> tuple[str, float]:
        if revoked.revoked:
            return fill(worker, taken)
        revoked.revoked = True  # the poll loop's revoke, landing in the window after _turn let go of the lock
        assert pool.withdraw(lambda item: item.partition.revoked) == [], "a0 was taken"
        return fill(worker, taken)

    pool._fill = revoke_then_fill  # type: ignore[method-assign]
    back: dict[str, tuple[bool, float]] = {}

    def main() -> None:
        pool.start()
        pool.submit([*keyed(simulation, "a", revoked), *keyed(simulation, "b", kept, first_offset=10)])
        back.update(returned_by_key(simulation, completions, 2))
        pool.stop(5.0)

    drive(simulation, main)
    assert calls == [(pytest.approx(0.0), [("b", 0)])], "the fill ended at the revoke; only b0 was called"
    assert back["a"] == (False, pytest.approx(0.0)), "a0 went back at once, not at the fill's deadline"


def test_a_plain_handler_hook_or_batch_handler_that_returns_a_coroutine_is_refused_and_the_coroutine_closed() -> None:
    """One rule for the three plain call sites (``batch.is_unawaited``): the awaitable is refused with a
    TypeError naming the fix, and a coroutine is closed first, so Python does not warn it was never awaited."""
    import warnings

    from keyorder.batch import call_sync_batch, is_unawaited
    from keyorder.engine.worker_pools import call_sync_handler, run_sync_hook

    async def meant_async(*_: object) -> None:
        return None

    assert is_unawaited(None) is False and is_unawaited([None]) is False
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
        with pytest.raises(TypeError, match="async def"):
            call_sync_batch(meant_async, [object()])
        with pytest.raises(TypeError, match="async def"):
            call_sync_handler(meant_async, object())
        with pytest.raises(TypeError, match="make the hook a plain function"):
            run_sync_hook(meant_async)
        import gc

        gc.collect()


@pytest.mark.parametrize("batched", [True, False])
def test_an_async_worker_closed_while_its_handler_awaits_stops_without_an_error(batched: bool) -> None:
    """A worker's coroutine closed at its handler's await (its loop went away, or it was collected) gets
    ``GeneratorExit``: it must stop, not count the messages failed (asking for the current task with no running
    loop raised ``RuntimeError: no running event loop``, printed as "Exception ignored" in the simulation)."""
    from keyorder.batch import PER_MESSAGE
    from keyorder.engine.worker_pools import _Worker

    loop = asyncio.new_event_loop()  # the pool's, never started: the future on it never completes
    never: asyncio.Future[None] = loop.create_future()

    async def handler(_messages: object) -> None:
        await never

    limits = BatchLimits(10, 0.0) if batched else PER_MESSAGE
    pool = AsyncWorkerPool(handler, 1, RetryPolicy(), None, Completions(), batch=limits, event_loop=lambda: loop)
    partition = Partition()
    delivery = Delivery(Message("t", 0, 0, b"k", b"", (), 0), b"k", partition, 0.0)
    worker = _Worker(0)
    coroutine = pool._run_batch(worker, [delivery], "full", 0.0) if batched else pool._execute(worker, delivery)
    try:
        coroutine.send(None)  # runs up to the handler's await of the future
        coroutine.close()  # GeneratorExit there: no RuntimeError, nothing counted failed
    finally:
        loop.close()
    assert worker.stats.failed == 0 and not worker.stats.busy


def test_an_async_worker_closed_while_it_awaits_stops_and_does_not_crash_the_pod() -> None:
    """The same close, seen by the worker's whole life (``_run``): a stop, not a crash (a crash stops the pod)."""
    from keyorder.engine.worker_pools import _Worker

    loop = asyncio.new_event_loop()  # the pool's, never started: the future on it never completes
    never: asyncio.Future[None] = loop.create_future()

    async def handler(_message: object) -> None:
        raise AssertionError("not called")

    async def work_awaiting(_worker: _Worker) -> None:  # a worker's loop, at its handler's await
        await never

    pool = AsyncWorkerPool(handler, 1, RetryPolicy(), None, Completions(), event_loop=lambda: loop)
    pool._work = work_awaiting  # type: ignore[method-assign]
    whole = pool._run(_Worker(1))
    try:
        whole.send(None)
        whole.close()
    finally:
        loop.close()
    assert pool.health.crashed is None, "a closed worker stopped; it did not crash (the pod would exit)"


def test_all_succeeded_is_every_outcome_being_none_itself_not_an_error_equal_to_it() -> None:
    from keyorder.batch import all_none

    class EqualToEverything(Exception):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = Exception.__hash__

    assert all_none([None, None]) and all_none([])
    assert [EqualToEverything()].count(None) == 1, "what == would have taken for a success"
    assert not all_none([None, EqualToEverything()])
