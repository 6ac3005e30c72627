"""When the poll loop decides flow control: on the turns after something it decides on changed, not
on every turn.

While some partitions are paused the loop turns every ``PARTLY_PAUSED_TIMEOUT`` (5 ms), so its
resumes stay prompt; deciding walks every partition, so a decision stands while nothing changed.
The loop runs on the test's thread with a FAKE source that plays a script (one step per
``consume``, that is per turn), a FAKE pool (``HoldingPool``: a delivery finishes when the script
says) and a FAKE clock, so every decision's turn is exact.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from keyorder.core.flow import FlowLimits
from keyorder.core.routing import Ordering
from keyorder.engine.poll_loop import PARTLY_PAUSED_TIMEOUT, ConsumerRuntime, RuntimeSettings
from keyorder.engine.worker_pools import Completions
from keyorder.message import Message
from tests.fakes import FakeClock, HoldingPool, RecordingSource

P0, P1 = ("t", 0), ("t", 1)
# two partitions: each may hold 2 in flight; a full one is paused at once (no hold) and resumes at 1
LIMITS = FlowLimits(max_inflight=10, max_inflight_per_partition=2, max_uncommitted=100, pause_after=0.0)


class ScriptedSource(RecordingSource):
    """FAKE Source: assigns P0 and P1 in the first ``consume``; each call runs that turn's step of the
    script (what it returns is what the client hands out), waits its timeout on the FAKE clock, and
    stops the loop after ``turns`` calls."""

    def __init__(
        self, clock: FakeClock, stop: threading.Event, turns: int, script: dict[int, Callable[[], list[Message]]]
    ) -> None:
        super().__init__({P0: 0, P1: 0})
        self.clock, self.stop, self.turns, self.script = clock, stop, turns, script
        self.timeouts: list[float] = []
        """Each ``consume``'s timeout, by turn."""
        self.resumed: list[tuple[int, list]] = []
        """(turn, partitions) of each resume."""

    def subscribe(self, topics, on_assign, on_revoke, on_lost) -> None:  # type: ignore[no-untyped-def]
        self._on_assign = on_assign

    def consume(self, max_messages: int, timeout: float) -> list[Message]:
        turn = len(self.timeouts)
        self.timeouts.append(timeout)
        if turn == 0:
            self._on_assign([P0, P1])
        if turn + 1 >= self.turns:
            self.stop.set()
        handed_out = self.script.get(turn, list)()
        # librdkafka's application position, past the last record handed out (src/rdkafka_queue.c sets
        # rktp_app_pos as it returns records; rd_kafka_position reads it), as tests/simulation/broker.py's fake does
        for message in handed_out:
            self.client_positions[(message.topic, message.partition)] = message.offset + 1
        self.clock.sleep(timeout)
        return handed_out

    def resume(self, partitions) -> None:  # type: ignore[no-untyped-def]
        self.resumed.append((len(self.timeouts), list(partitions)))


def message(partition: int, offset: int, key: str) -> Message:
    return Message("t", partition, offset, key.encode(), b"{}")


def test_the_loop_decides_only_on_turns_after_a_change_and_still_resumes_on_the_next_turn() -> None:
    clock, stop, completions = FakeClock(), threading.Event(), Completions()
    pool = HoldingPool(completions)
    script: dict[int, Callable[[], list[Message]]] = {
        0: lambda: [message(0, 0, "a"), message(0, 1, "b")],  # P0 full: paused on the next turn
        20: lambda: [message(1, 0, "c")],  # P1 receives one (not full)
        30: lambda: (pool.finish(1), [])[1],  # P0's first message finishes while the loop waits
    }
    source = ScriptedSource(clock, stop, turns=40, script=script)
    settings = RuntimeSettings(topics=("t",), flow=LIMITS, shutdown_grace=0.05)
    runtime = ConsumerRuntime(settings, source, pool, Ordering.KEY, completions, clock, clock.sleep)
    decided_on: list[int] = []
    decide = runtime.flow.decide

    def counting_decide(*args, **kwargs):  # type: ignore[no-untyped-def]
        decided_on.append(len(source.timeouts))  # the turn: decisions come before that turn's consume
        return decide(*args, **kwargs)

    runtime.flow.decide = counting_decide  # type: ignore[method-assign]
    runtime.run(stop)

    assert source.paused == [P0], "P0 was paused once, when it filled"
    assert decided_on == [0, 1, 21, 31], (
        "a decision on the first turn, after P0 filled, after P1 received, after P0's completion: "
        f"not on the turns in between (decided on turns {decided_on})"
    )
    assert source.timeouts[1:31] == [PARTLY_PAUSED_TIMEOUT] * 30, "while P0 was paused, consume waited 5 ms"
    assert source.resumed == [(31, [P0])], "P0 resumed on the turn right after its completion"
    assert source.timeouts[31:] == [settings.poll_timeout] * 9, "nothing paused: the poll timeout again"


def test_an_early_commit_put_off_by_its_pacing_is_sent_on_a_later_turn_without_another_change() -> None:
    """Under commit pressure the decision is remade until its early commit goes out (it is paced to
    one per ``EARLY_COMMIT_SPACING``): a standing decision must not sit on a commit that frees room."""
    clock, stop, completions = FakeClock(), threading.Event(), Completions()
    pool = HoldingPool(completions)
    script: dict[int, Callable[[], list[Message]]] = {
        # P0 fills both its counts (paused: the loop turns every 5 ms); P1's one message is commit pressure
        0: lambda: [message(0, 0, "a"), message(0, 1, "b"), message(1, 0, "c")],
        2: lambda: (pool.finish(1, P1), [])[1],  # P1's message finishes: its commit position moves to 1
    }
    source = ScriptedSource(clock, stop, turns=40, script=script)
    limits = FlowLimits(max_inflight=4, max_inflight_per_partition=2, max_uncommitted=4, pause_after=0.0)
    settings = RuntimeSettings(topics=("t",), flow=limits, shutdown_grace=0.05)  # periodic commits: 1 s apart
    runtime = ConsumerRuntime(settings, source, pool, Ordering.KEY, completions, clock, clock.sleep)
    decided_on: list[int] = []
    decide = runtime.flow.decide

    def counting_decide(*args, **kwargs):  # type: ignore[no-untyped-def]
        decided_on.append(len(source.timeouts))
        return decide(*args, **kwargs)

    runtime.flow.decide = counting_decide  # type: ignore[method-assign]
    committed_on: list[int] = []
    commit = source.commit

    def recording_commit(offsets, asynchronous):  # type: ignore[no-untyped-def]
        committed_on.append(len(source.timeouts))
        return commit(offsets, asynchronous)

    source.commit = recording_commit  # type: ignore[method-assign]
    runtime.run(stop)

    sent = list(zip(committed_on, source.commits, strict=True))
    asynchronous = [(turn, {pid: offset for pid, (offset, _) in offsets.items()}) for turn, (offsets, a) in sent if a]
    assert [positions for _turn, positions in asynchronous] == [{P0: 0, P1: 0}, {P1: 1}], (
        f"the periodic commit, then one early commit of P1's new position (commits on turns {committed_on})"
    )
    early_turn = asynchronous[1][0]
    assert early_turn > 3, "sent on a later turn than the completion's (3), with nothing new since"
    assert decided_on[-1] == early_turn, "decisions are remade until that commit, and not after it"


def test_a_pod_at_its_ceiling_pauses_every_partition_keeps_calling_the_client_and_reads_again_below_it(
    caplog,  # type: ignore[no-untyped-def]
) -> None:
    """The ceiling is 3 x the pod bounds (30 in flight here). P0 brings 30 in one turn (as partitions
    read under larger shares, then blocked, would): every partition is paused, P1 too, and the loop
    goes on calling the client without waiting (rebalances, max.poll.interval.ms) until the pod is a
    partition bound (5) below the ceiling."""
    clock, stop, completions = FakeClock(), threading.Event(), Completions()
    pool = HoldingPool(completions)
    script: dict[int, Callable[[], list[Message]]] = {
        0: lambda: [message(0, offset, f"k{offset}") for offset in range(30)],
        10: lambda: (pool.finish(4), [])[1],  # 26: not yet a partition bound below
        20: lambda: (pool.finish(1), [])[1],  # 25: released
    }
    source = ScriptedSource(clock, stop, turns=30, script=script)
    limits = FlowLimits(max_inflight=10, max_inflight_per_partition=10, max_uncommitted=100, pause_after=0.0)
    # every partition paused: each turn waits up to poll_timeout for completions, on the real clock
    settings = RuntimeSettings(topics=("t",), flow=limits, poll_timeout=0.001, shutdown_grace=0.05)
    runtime = ConsumerRuntime(settings, source, pool, Ordering.KEY, completions, clock, clock.sleep)
    with caplog.at_level("INFO", logger="keyorder.engine.poll_loop"):
        runtime.run(stop)

    assert sorted(source.paused) == [P0, P1], "both paused at the ceiling, P1 with nothing in it"
    assert source.timeouts[1:21] == [0] * 20, "every partition paused: a call that only serves the client"
    assert source.resumed == [(21, [P1])], "below the ceiling P1 is read again; P0 stays paused on its own bound"
    assert source.timeouts[21:] == [0.001] * 9, "some partitions paused: the poll timeout (under 5 ms)"
    ceiling_logs = [record.getMessage() for record in caplog.records if "ceiling" in record.getMessage()]
    assert len(ceiling_logs) == 2 and "at its ceiling (30 and 300" in ceiling_logs[0], ceiling_logs
    assert "back under its ceiling" in ceiling_logs[1]
