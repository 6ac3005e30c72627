"""What one seed of the pod simulation does: the pod's configuration, the records, the handler and the faults.

A seed becomes a ``Plan`` here, before anything runs: the flags of ``keyorder run`` (built into a
``RunConfig`` by the real parser, so a configuration a user would be refused is refused here too),
the topics, the keys (hot ones, slow ones, poison ones that always fail, some spread over several
partitions, some records without a key), the bursts of production, and a schedule of faults. What
a fault acts on (which partition, which worker process) is drawn when it fires, from the run's one
random source, so it fits the state of the run then.

The handler's outcome is a pure function of (seed, chain, partition, sequence number, attempt):
``HandlerPlan.outcome``. So the same message fails on its first attempt in every replay, and a
different interleaving cannot change what the handler does, only when. ``Journal`` records every
call (start and end virtual time, record, attempt, outcome) and every dead-letter write: with the
broker's records and commits it is what the invariants read.

About a third of the seeds run a batch handler (``--batch-max-messages``, ``make_batch_handler``): each
message keeps its own planned outcome (partial failures), and now and then a call fails as a whole (it
raises, or returns what the contract refuses), on every executor and under the same faults.

Sizes are small on purpose: a seed is a few hundred records over tens of virtual seconds, so a few
hundred seeds run inside ``make test`` and ten thousand in ``make soak``; the bounds (in flight,
uncommitted, batch) are small too, so that holds, pauses and commits under pressure happen.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keyorder.config import ConfigError, consumer_properties, kafka_properties, load_run_config
from keyorder.contracts import DeadLetterError
from keyorder.message import Message
from tests.simulation.broker import Record


@dataclass(frozen=True)
class Key:
    """One ordering chain's producer: a key (or none), where it goes, how it behaves."""

    name: str | None
    """The key (``None``: keyless records, ordered per partition)."""
    weight: float
    """Relative share of the production."""
    partitions: tuple[int, ...]
    """Partitions of the topic its records go to (several: the same key in several partitions)."""
    slow: float = 0.0
    """Extra virtual seconds each call of this key takes."""
    poison: float = 0.0
    """Share of its records on which the handler fails at every attempt."""
    fails: int = 0
    """Attempts of each of its records that fail before one succeeds (on top of the plan's flaky ones)."""
    duration: float | None = None
    """Virtual seconds each call takes, instead of the plan's drawn ones (``slow`` still added)."""


@dataclass(frozen=True)
class Burst:
    """``count`` records from ``start``, ``rate`` a second."""

    start: float
    count: int
    rate: float


@dataclass(frozen=True)
class Scripted:
    """One record a regression plan produces at a set time (``Plan.script``)."""

    at: float
    key: str | None
    partition: int
    poison: bool = False


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HandlerPlan:
    """How the handler behaves: a pure function of the seed and the call."""

    seed: int
    fail_rate: float
    """Chance that an attempt of an ordinary record fails (only its first ``flaky_attempts``)."""
    flaky_attempts: int
    base_duration: tuple[float, float]
    long_rate: float
    """Chance that a call takes ``long_duration`` (a slow external call)."""
    long_duration: tuple[float, float]
    dead_letter_failures: int
    """How many times at most the dead-letter write of a record fails before it succeeds."""
    batch_fail_rate: float = 0.0
    """Batch handlers only: chance that a call fails as a whole, by raising or by returning a value the
    contract refuses (``batch_fails``); each message's own outcome is ``outcome``'s otherwise."""
    process_start: float = 0.0
    """The process executor only: virtual seconds a worker process takes to load the handler and run its set-up
    hook, the first and each replacement. A review found a revoke waiting for a replacement's start, with the
    heads it held run after the revoke: at 0 no fault could land in that window."""

    def outcome(self, record: Record, key: Key | None, attempt: int) -> tuple[float, bool]:
        """``(virtual seconds, fails)`` of attempt ``attempt`` (from 1) of ``record`` (of ``key``)."""
        draw = random.Random(f"{self.seed}/{record.topic}/{record.partition}/{record.chain}/{record.seq}/{attempt}")
        duration = draw.uniform(*self.base_duration)
        if key is not None and key.duration is not None:
            duration = key.duration
        duration += key.slow if key is not None else 0.0
        if draw.random() < self.long_rate:
            duration += draw.uniform(*self.long_duration)
        if record.poison or (key is not None and attempt <= key.fails):
            return duration, True
        return duration, attempt <= self.flaky_attempts and draw.random() < self.fail_rate

    def batch_fails(self, first: Record, attempt: int) -> str | None:
        """How a batch call whose first message is attempt ``attempt`` of ``first`` fails as a whole: ``raise``,
        ``bad return`` (a value the contract refuses), or ``None`` (each message's own outcome)."""
        if not self.batch_fail_rate:
            return None
        draw = random.Random(f"{self.seed}/batch/{first.ident}/{attempt}")
        if draw.random() >= self.batch_fail_rate:
            return None
        return draw.choice(["raise", "bad return"])

    def dead_letter_fails(self, record: Record, write: int) -> bool:
        """Whether the ``write``-th (from 1) dead-letter write of ``record`` fails."""
        if not self.dead_letter_failures:
            return False
        draw = random.Random(f"{self.seed}/dlq/{record.ident}")
        return write <= draw.randint(0, self.dead_letter_failures)


@dataclass(frozen=True)
class Plan:
    """Everything a seed decides up front."""

    seed: int
    flags: dict[str, Any]
    """``keyorder run`` settings by field name (what ``config.load_run_config`` takes)."""
    topics: dict[str, int]
    keys: tuple[Key, ...]
    bursts: tuple[Burst, ...]
    faults: tuple[Fault, ...]
    handler: HandlerPlan
    quiet_limit: float
    """Virtual seconds after the last fault and record within which everything must be handled."""
    preemption: float
    """The scheduler's chance to switch threads at a lock or event (``Simulation(preemption=)``)."""
    name: str = "random"
    """Which generator made it (``random``, or a regression's name)."""
    script: tuple[Scripted, ...] = ()
    """Records produced at set times, on top of the bursts (the regression plans use these)."""

    @property
    def faults_end(self) -> float:
        ends = [fault.at for fault in self.faults] + [burst.start + burst.count / burst.rate for burst in self.bursts]
        return max([*ends, *(record.at for record in self.script)], default=0.0)

    def describe(self) -> str:
        flags = ", ".join(f"{name}={value}" for name, value in sorted(self.flags.items()) if name != "handler")
        kinds: dict[str, int] = {}
        for fault in self.faults:
            kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
        faults = ", ".join(f"{kind} x{count}" for kind, count in sorted(kinds.items())) or "none"
        records = sum(burst.count for burst in self.bursts) + len(self.script)
        return (
            f"plan {self.name}: {records} records on {self.topics}, {len(self.keys)} keys; faults: {faults}\n"
            f"  flags: {flags}"
        )


def make_plan(seed: int) -> Plan:
    """The random plan of ``seed``: a configuration, a workload and a fault schedule."""
    rng = random.Random(f"plan/{seed}")
    executor = rng.choices(["thread", "process", "async"], [5, 3, 2])[0]
    workers = rng.choice([1, 1, 2, 2, 3, 4, 6, 8])
    max_inflight = rng.choice([2, 4, 8, 16, 32, 64, 200])
    per_partition = rng.randint(1, max_inflight)
    max_uncommitted = max_inflight * rng.choice([1, 1, 2, 4, 8])
    max_attempts = rng.choice([1, 2, 3, 3, 4, 5])
    initial_backoff = rng.choice([0.0, 0.01, 0.05, 0.1, 0.3])
    max_backoff = max(initial_backoff, rng.choice([0.05, 0.2, 0.5, 1.0, 2.0, 3.0]), 0.01)
    pause_after = rng.choice([0.0, 0.05, 0.2, 0.5, 1.0, 2.0])
    protocol = rng.choices(["cooperative", "eager", "consumer"], [6, 2, 2])[0]
    static = rng.random() < (0.02 if protocol == "consumer" else 0.2)
    short_poll_interval = rng.random() < 0.3
    shortest = 8_000 if executor == "thread" else 20_000  # the other executors' stop needs more after the grace
    max_poll_ms = rng.choice([shortest, 12_000, 20_000, 40_000]) if short_poll_interval else 300_000
    max_poll_ms = max(max_poll_ms, shortest)
    grace = rng.choice([0.0, 0.5, 2.0, 5.0, 10.0, 20.0])
    drain = rng.choice([0.0, 0.2, 1.0, 3.0, 10.0])
    fit_drains = rng.random() < 0.97  # mostly configurations a user could run; a few that keyorder must refuse
    properties = [
        "partition.assignment.strategy=range,roundrobin" if protocol == "eager" else "",
        "group.protocol=consumer" if protocol == "consumer" else "",
        f"group.instance.id=pod-{seed}" if static else "",
        f"max.poll.interval.ms={max_poll_ms}" if short_poll_interval else "",
        "session.timeout.ms=6000" if short_poll_interval and protocol != "consumer" else "",
    ]
    flags: dict[str, Any] = {
        "topics": "orders",
        "group_id": "simulated",
        "bootstrap_servers": "simulated:9092",
        "handler": "tests.simulation.workload:handler_for_the_process_executor",
        "executor": executor,
        "workers": workers,
        "max_workers": 16,
        "max_inflight": max_inflight,
        "max_inflight_per_partition": per_partition,
        "max_uncommitted": max_uncommitted,
        "resume_ratio": rng.choice([0.3, 0.5, 0.8]),
        "pause_after": pause_after,
        "poll_batch": rng.choice([1, 5, 20, 100, 500]),
        "commit_interval": rng.choice([0.05, 0.2, 0.5, 1.0, 2.0]),
        "max_attempts": max_attempts,
        "retry_initial_backoff": initial_backoff,
        "retry_max_backoff": max_backoff,
        "on_exhausted": rng.choice(["dlq", "dlq", "block"]),
        "revoke_drain_timeout": drain,
        "shutdown_grace": grace,
        "kafka_property": [item for item in properties if item],
    }
    flags.update(_batch_flags(seed))
    if fit_drains:
        flags.update(_fitting_drains(flags))
    partitions = rng.choice([1, 2, 2, 3, 4])
    topics = {"orders": partitions}
    keys = _keys(rng, partitions)
    bursts = _bursts(rng)
    end = max(burst.start + burst.count / burst.rate for burst in bursts)
    faults = _faults(rng, max(end, 3.0), executor)
    handler = HandlerPlan(
        seed=seed,
        fail_rate=rng.choice([0.0, 0.05, 0.1, 0.3]),
        flaky_attempts=rng.choice([1, 1, 2, 3]),
        base_duration=rng.choice([(0.001, 0.005), (0.002, 0.02), (0.01, 0.1)]),
        long_rate=rng.choice([0.0, 0.0, 0.01, 0.05]),
        long_duration=(0.5, 4.0),
        dead_letter_failures=rng.choice([0, 0, 1, 3]),
        batch_fail_rate=_batch_fail_rate(seed, flags),
        process_start=_process_start(seed, executor),
    )
    return Plan(
        seed,
        flags,
        topics,
        keys,
        tuple(bursts),
        tuple(faults),
        handler,
        quiet_limit=120.0,
        preemption=rng.choice([0.0, 0.1, 0.3]),
    )


def _process_start(seed: int, executor: str) -> float:
    """``HandlerPlan.process_start``, from a stream of its own: drawing it changes no other draw of the plan, so
    the seeds of earlier findings keep their configurations and workloads."""
    if executor != "process":
        return 0.0
    return random.Random(f"process-start/{seed}").choice([0.0, 0.0, 0.005, 0.05, 0.3])


BATCH_SHARE = 0.35
"""Share of the random seeds whose handler is a batch handler (``--batch-max-messages`` above 1)."""


def _batch_draw(seed: int) -> random.Random:
    """The batch settings' own random stream: the rest of a seed's plan is drawn as before batch handlers came,
    so the seeds that found defects earlier still make the plans they found them with. (The salt is chosen so
    that those seeds, ``test_simulation.SOAK_FINDINGS``, stay per-message.)"""
    return random.Random(f"plan/{seed}/batch-handler")


def _batch_flags(seed: int) -> dict[str, Any]:
    """``--batch-max-messages`` and ``--batch-max-wait-ms`` of ``seed``: a per-message handler (empty), or a
    batch handler of a few messages, with or without a fill wait."""
    rng = _batch_draw(seed)
    if rng.random() >= BATCH_SHARE:
        return {}
    return {"batch_max_messages": rng.choice([2, 3, 5, 8, 32]), "batch_max_wait_ms": rng.choice([0, 0, 5, 50])}


def _batch_fail_rate(seed: int, flags: dict[str, Any]) -> float:
    if flags.get("batch_max_messages", 1) == 1:
        return 0.0
    rng = _batch_draw(seed)
    rng.random()
    return rng.choice([0.0, 0.02, 0.1])


def _fitting_drains(flags: dict[str, Any]) -> dict[str, Any]:
    """The shutdown grace and revoke drain timeout, halved until keyorder's own check accepts them (it
    bounds them by ``max.poll.interval.ms``, ``--pause-after`` and the executor's overruns)."""
    grace, drain = flags["shutdown_grace"], flags["revoke_drain_timeout"]
    while True:
        try:
            config = load_run_config({**flags, "shutdown_grace": grace, "revoke_drain_timeout": drain}, environ={})
            consumer_properties(config, kafka_properties(config, environ={}))
        except ConfigError as refused:
            text = str(refused)
            if ("shutdown-grace" not in text and "revoke-drain-timeout" not in text) or grace == drain == 0:
                break
            grace = 0.0 if grace < 0.1 else grace / 2
            drain = 0.0 if drain < 0.1 else drain / 2
            continue
        break
    return {"shutdown_grace": round(grace, 3), "revoke_drain_timeout": round(drain, 3)}


def _keys(rng: random.Random, partitions: int) -> tuple[Key, ...]:
    count = rng.randint(2, 24)
    poisoned = set(rng.sample(range(count), k=min(count, rng.choices([0, 1, 2], [6, 3, 1])[0])))
    keys = []
    for index in range(count):
        home = rng.randrange(partitions)
        spread = (home,)
        if partitions > 1 and rng.random() < 0.15:  # the same key in two partitions (explicit partitioning)
            spread = (home, (home + 1) % partitions)
        keys.append(
            Key(
                name=f"k{index}",
                weight=1.0 / (index + 1) ** rng.choice([0.0, 0.8, 1.2]),  # uniform, or hot keys first
                partitions=spread,
                slow=rng.choice([0.0] * 8 + [0.2, 1.0]),
                poison=rng.choice([0.05, 0.2, 1.0]) if index in poisoned else 0.0,
            )
        )
    if rng.random() < 0.3:
        keys.append(Key(None, 0.5, tuple(range(partitions))))
    return tuple(keys)


def _bursts(rng: random.Random) -> list[Burst]:
    bursts = []
    start = 0.0
    for _ in range(rng.randint(1, 4)):
        start += rng.uniform(0.0, 8.0)
        bursts.append(Burst(start, rng.randint(5, 120), rng.choice([10.0, 50.0, 300.0, 2000.0])))
    return bursts


def _faults(rng: random.Random, window: float, executor: str) -> list[Fault]:
    weights = {
        "resize": 3,
        "move_elsewhere": 3,
        "session_lost": 1,
        "commit_failures": 2,
        "consumer_error": 1,
        "fatal_error": 0.5,
        "truncate": 0.5,
        "outage": 1,
        "sigterm": 1.5,
        "rolling_restart": 1,
        "crash": 1,
        "kill_process": 3 if executor == "process" else 0,
    }
    kinds, shares = zip(*weights.items(), strict=True)
    faults = []
    for _ in range(rng.choice([0, 1, 2, 3, 4, 6, 8])):
        kind = rng.choices(kinds, shares)[0]
        at = rng.uniform(0.2, window + 2.0)
        params: dict[str, Any] = {}
        if kind == "resize":
            params["workers"] = rng.choice([1, 2, 3, 4, 8])
        elif kind == "move_elsewhere":
            params["seconds"] = rng.choice([0.05, 0.3, 1.0, 4.0])
        elif kind == "commit_failures":
            params.update(seconds=rng.uniform(0.2, 4.0), whole=rng.random() < 0.5, share=rng.choice([0.3, 1.0]))
        elif kind == "truncate":
            params["back"] = rng.randint(0, 30)
        elif kind == "outage":
            params["seconds"] = rng.choice([0.3, 2.0, 8.0])
        elif kind in ("sigterm", "rolling_restart", "crash", "fatal_error"):
            params["restart_after"] = rng.choice([0.1, 1.0, 3.0])
        elif kind == "kill_process":
            params["busy"] = rng.random() < 0.5
        faults.append(Fault(at, kind, params))
    return sorted(faults, key=lambda fault: fault.at)


# -- the run's record of what the handler did --------------------------------------------------------------
@dataclass(eq=False)
class Call:
    """One handler call."""

    session: int
    record: Record
    attempt: int
    started: float
    thread: int
    """``threading.get_ident()`` of the thread that ran it (a worker thread, or a worker process's)."""
    ended: float | None = None
    outcome: str = "running"
    """``ok``, ``failed``, ``killed`` (its worker process was), ``crashed`` (its pod was), ``cancelled`` (the
    async pool's stop cancelled it after the grace) or ``running``."""


@dataclass(eq=False)
class DeadLetterWrite:
    session: int
    record: Record
    started: float
    ended: float | None = None
    ok: bool = False


class HandlerFailure(RuntimeError):
    """What the simulated handler raises on a failing attempt."""


class Journal:
    """Every handler call and dead-letter write of a run, and when each record was first handled."""

    def __init__(self) -> None:
        self.records: dict[int, Record] = {}
        self.calls: list[Call] = []
        self.dead_letters: list[DeadLetterWrite] = []
        self.attempts: dict[int, int] = {}
        self.dead_letter_attempts: dict[int, int] = {}
        self.handled_at: dict[int, float] = {}
        """Record identity -> when its first successful call (or dead-letter write) ended."""
        self.on_handled: list[Callable[[Record], None]] = []
        self.on_call: list[Callable[[Call], None]] = []
        self.closed = False
        """Set when the run ends: threads the simulation unwinds then (a frozen worker process's batch loop
        catches the unwinding and goes on to its next message) must not add calls."""
        self.running: set[Call | DeadLetterWrite] = set()
        """Calls and dead-letter writes started and not ended (a killed one is ended by whoever kills it)."""
        self.last_call: dict[int, Call] = {}
        self.last_dead_letter: dict[int, DeadLetterWrite] = {}

    def begin(self, work: Call | DeadLetterWrite) -> None:
        self.running.add(work)
        if isinstance(work, Call):
            self.calls.append(work)
            self.last_call[work.record.ident] = work
            for listener in self.on_call:
                listener(work)
        else:
            self.dead_letters.append(work)
            self.last_dead_letter[work.record.ident] = work

    def end(self, work: Call | DeadLetterWrite, at: float, outcome: str | None = None) -> None:
        """``work`` ended at ``at`` (``outcome``: a call's, when it did not end by itself: killed, crashed)."""
        if work not in self.running:
            return
        self.running.discard(work)
        work.ended = at
        if isinstance(work, Call) and outcome is not None:
            work.outcome = outcome

    def handled(self, record: Record, at: float) -> None:
        if record.ident not in self.handled_at:
            self.handled_at[record.ident] = at
            for listener in self.on_handled:
                listener(record)


class _Calls:
    """What both handlers (plain and async) do around the plan's time: journal the call's start, then
    its outcome, and fail it when the plan says so."""

    def __init__(self, journal: Journal, plan: Plan, simulation: Any, session: int) -> None:
        self.journal, self.plan, self.simulation, self.session = journal, plan, simulation, session
        self.keys = {key.name if key.name is not None else "<none>": key for key in plan.keys}

    def begin(self, message: Message) -> tuple[Call, float, bool]:
        """Find the record, journal the call; the plan's duration and whether the attempt fails."""
        journal = self.journal
        if journal.closed:
            raise HandlerFailure("the simulation has ended")
        payload = json.loads(message.value or b"{}")
        record = journal.records[payload["id"]]
        attempt = journal.attempts.get(record.ident, 0) + 1
        journal.attempts[record.ident] = attempt
        call = Call(self.session, record, attempt, self.simulation.clock(), threading.get_ident())
        journal.begin(call)
        duration, fails = self.plan.handler.outcome(record, self.keys.get(record.chain), attempt)
        return call, duration, fails

    def end(self, call: Call, fails: bool) -> None:
        """The plan's time has passed: journal the outcome; raise for a failing attempt."""
        call.outcome = "failed" if fails else "ok"
        self.journal.end(call, self.simulation.clock())
        if fails:
            raise HandlerFailure(f"{call.record.describe()} attempt {call.attempt} failed")
        self.journal.handled(call.record, self.simulation.clock())


def make_async_handler(journal: Journal, plan: Plan, simulation: Any, session: int) -> Callable[[Message], Any]:
    """The async executor's handler: as ``make_handler``'s, awaiting the virtual time on the pool's
    (simulated) event loop."""
    calls = _Calls(journal, plan, simulation, session)

    async def handle(message: Message) -> None:
        call, duration, fails = calls.begin(message)
        try:
            await asyncio.sleep(duration)
        except BaseException:  # cancelled by the pool's stop after the grace: the call ends here
            call.outcome = "cancelled"
            journal.end(call, simulation.clock())
            raise
        calls.end(call, fails)

    return handle


def make_handler(journal: Journal, plan: Plan, simulation: Any, session: int) -> Callable[[Message], None]:
    """The pod session's handler: find the record, take the plan's time, succeed or raise."""
    calls = _Calls(journal, plan, simulation, session)

    def handle(message: Message) -> None:
        call, duration, fails = calls.begin(message)
        simulation.sleep(duration)
        calls.end(call, fails)

    return handle


BATCH_CALL_SECONDS_PER_MESSAGE = 0.0002
"""What each message adds to a batch call's time (a bulk write's per-row cost)."""


class _BatchCalls(_Calls):
    """A batch handler's calls: one ``Call`` per message, all begun together and ended together."""

    def begin_batch(self, messages: list[Message]) -> tuple[list[tuple[Call, float, bool]], float]:
        begun = [self.begin(message) for message in messages]
        duration = max(duration for _call, duration, _fails in begun)  # the slowest row sets the bulk call's time
        return begun, duration + BATCH_CALL_SECONDS_PER_MESSAGE * len(begun)

    def end_batch(self, begun: list[tuple[Call, float, bool]]) -> Any:
        """The time has passed: journal every outcome; the batch's answer under the contract (or raise)."""
        first = begun[0][0]
        whole = self.plan.handler.batch_fails(first.record, first.attempt)
        now = self.simulation.clock()
        outcomes: list[BaseException | None] = []
        for call, _duration, fails in begun:
            failed = fails or whole is not None
            call.outcome = "failed" if failed else "ok"
            self.journal.end(call, now)
            if failed:
                outcomes.append(HandlerFailure(f"{call.record.describe()} attempt {call.attempt} failed"))
            else:
                self.journal.handled(call.record, now)
                outcomes.append(None)
        if whole == "raise":
            raise HandlerFailure(f"the batch of {len(begun)} from {first.record.describe()} failed as a whole")
        if whole == "bad return":
            return len(begun)  # "rows written": the contract refuses it, and every message fails
        return outcomes


def make_batch_handler(journal: Journal, plan: Plan, simulation: Any, session: int) -> Callable[[list[Message]], Any]:
    """The pod session's batch handler (``--batch-max-messages`` above 1): the plan's outcome per message, in one
    call that takes its slowest message's time plus a little per message, and fails as a whole now and then."""
    calls = _BatchCalls(journal, plan, simulation, session)

    def handle_batch(messages: list[Message]) -> Any:
        begun, duration = calls.begin_batch(messages)
        simulation.sleep(duration)
        return calls.end_batch(begun)

    return handle_batch


def make_async_batch_handler(
    journal: Journal, plan: Plan, simulation: Any, session: int
) -> Callable[[list[Message]], Any]:
    """``make_batch_handler``'s, awaiting the virtual time on the pool's (simulated) event loop."""
    calls = _BatchCalls(journal, plan, simulation, session)

    async def handle_batch(messages: list[Message]) -> Any:
        begun, duration = calls.begin_batch(messages)
        try:
            await asyncio.sleep(duration)
        except BaseException:  # cancelled by the pool's stop after the grace: every call of the batch ends here
            for call, _duration, _fails in begun:
                call.outcome = "cancelled"
                journal.end(call, simulation.clock())
            raise
        return calls.end_batch(begun)

    return handle_batch


def handler_for_the_process_executor(message: Message) -> None:
    """The ``--handler`` path the simulated pods' configuration names (the real handler is passed in)."""
    raise AssertionError("the simulation passes its handler to the pools itself")


class SimulatedDeadLetters:
    """FAKE ``keyorder.contracts.DeadLetterSink``: records the write; may fail it (``DeadLetterError``)
    as the plan says, a few times per record at most, so the pool's retry of the write is exercised."""

    def __init__(self, journal: Journal, plan: Plan, simulation: Any, session: int) -> None:
        self.journal, self.plan, self.simulation, self.session = journal, plan, simulation, session

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        if self.journal.closed:
            raise DeadLetterError("the simulation has ended")
        payload = json.loads(message.value or b"{}")
        record = self.journal.records[payload["id"]]
        journal = self.journal
        write_number = journal.dead_letter_attempts.get(record.ident, 0) + 1
        journal.dead_letter_attempts[record.ident] = write_number
        write = DeadLetterWrite(self.session, record, self.simulation.clock())
        journal.begin(write)
        latency = random.Random(f"{self.plan.seed}/dlq-latency/{record.ident}/{write_number}").uniform(0.001, 0.02)
        self.simulation.sleep(latency)
        failed = self.plan.handler.dead_letter_fails(record, write_number)
        write.ok = not failed
        journal.end(write, self.simulation.clock())
        if failed:
            raise DeadLetterError(f"simulated: the dead-letter write of {record.describe()} failed")
        journal.handled(record, self.simulation.clock())

    def close(self) -> None:
        pass
