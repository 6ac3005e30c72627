"""One run of the pod simulation, and the command line that runs one seed or thousands.

``World`` is one run: the simulation (``scheduler.Simulation``), the broker, the journal of handler
calls, the pod sessions (a pod restarts as a new session after a SIGTERM, a crash or a fatal error)
and the online checks. ``run_plan`` plays a ``workload.Plan``: production and faults on their
timers, then a quiet phase in which, with no more faults, everything that can be handled must be,
then a final SIGTERM; then every invariant (``invariants.check``).

``python -m tests.simulation --seed N`` runs one seed and prints its summary and every violation;
``--seeds A-B`` runs many with a progress line (``--jobs 2`` on two processes); ``--trace`` prints
the run's event log; ``--plan NAME`` runs a named regression plan (``regressions``) instead of the
seed's random one. A failing seed prints the one command that replays it. The run must be replayed
with ``PYTHONHASHSEED=0`` (set and dict orders are part of a run): the command re-executes itself
with it when it is unset. Exit status 1 on any violation.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import sys
import time
import traceback
import types
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError

from keyorder.config import ConfigError, RunConfig, consumer_properties, kafka_properties, load_run_config
from keyorder.contracts import SourceError
from keyorder.engine import process_child as worker_process
from keyorder.engine.process_child import MAX_BATCH
from keyorder.pod import runtime_settings
from tests.simulation import invariants
from tests.simulation.broker import CommitFaults, Record, SimulatedBroker
from tests.simulation.invariants import TICK, HoldCheck, LaneReportCheck, LivenessMonitor, Violation, blocked_by_design
from tests.simulation.pod import SimPod
from tests.simulation.processes import live_processes
from tests.simulation.scheduler import Simulation, SimulationStuck
from tests.simulation.workload import Call, Fault, Journal, Plan, make_plan

REPLAY = "PYTHONHASHSEED=0 .venv/bin/python -m tests.simulation"
"""How a run is replayed (from the repository root)."""
SPIN_STEPS = 200_000
"""Steps without virtual time moving after which a run counts as stuck (a loop that never blocks)."""
SETTLE_SECONDS = 5.0
"""Virtual seconds the quiet phase lasts at least after the last fault or record."""


class _Capture(logging.Handler):
    """The pod's log lines during a run, stamped with virtual time; the workers' retry lines give the due
    time of each parked lane (``World.retry_due``)."""

    def __init__(self, world: World) -> None:
        super().__init__(logging.DEBUG)
        self.world = world

    def emit(self, record: logging.LogRecord) -> None:
        world = self.world
        now = world.sim.clock()
        if record.levelno >= logging.INFO:
            world.trace.append((now, f"{record.levelname.lower()} {record.name}: {record.getMessage()}"))
        message, args = record.msg, record.args
        if not isinstance(message, str) or not isinstance(args, tuple) or len(args) < 4:
            return
        try:
            if message.startswith("handler failed on") and "retrying its key in" in message:
                world.retry_due[(args[0], args[1], args[2])] = (now, now + float(args[5]))
            elif message.startswith("handler failed on") and "BLOCKED" in message:
                world.retry_due[(args[0], args[1], args[2])] = (now, now + float(args[4]))
            elif message.startswith("could not dead-letter"):
                world.retry_due[(args[0], args[1], args[2])] = (now, now + float(args[3]))
        except (IndexError, TypeError, ValueError):  # a changed log line: the backoff bound applies instead
            return


@dataclass
class Result:
    seed: int
    plan: str
    violations: list[Violation] = field(default_factory=list)
    refused: str | None = None
    """Why keyorder refused the plan's configuration (the seed then checks nothing else)."""
    summary: str = ""
    trace: list[str] = field(default_factory=list)
    real_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def replay(self) -> str:
        plan = f" --plan {self.plan}" if self.plan != "random" else ""
        return f"{REPLAY} --seed {self.seed}{plan}"


class World:
    """One run: the simulation, the broker, the pods and what they did."""

    def __init__(self, plan: Plan, config: RunConfig) -> None:
        self.plan = plan
        self.config = config
        self.settings = runtime_settings(config)
        self.sim = Simulation(plan.seed, preemption=plan.preemption)
        self.broker = SimulatedBroker(self.sim, plan.topics)
        self.journal = Journal()
        self.pods: list[SimPod] = []
        self.violations: list[Violation] = []
        self.trace: list[tuple[float, str]] = []
        self.retry_due: dict[tuple[str, int, int], tuple[float, float]] = {}
        self.final = False
        self.ticking = True
        self.generation = 0
        self.holds: list[HoldCheck] = []
        self._unhandled: dict[tuple[tuple[str, int], str], deque[Record]] = {}
        self._chains_of: dict[tuple[str, int], list[str]] = {tp: [] for tp in self.broker.logs}
        self._key_partitions: dict[str, set[tuple[str, int]]] = {}
        self._poison_keys: set[str] = set()
        self.remaining = 0
        """Records neither handled nor gone nor blocked by design (the quiet phase runs until 0)."""
        self.broker.on_produce.append(self._produced)
        self.journal.on_handled.append(self._handled)
        self.journal.on_call.append(self._call_started)
        self.monitor = LivenessMonitor(self, self._liveness_bound())
        self.lanes = LaneReportCheck(self)
        self._capture = _Capture(self)
        self._max_poll_reported: set[tuple[float, int]] = set()
        self._time_seen, self._steps_seen = -1.0, 0

    # -- bounds ---------------------------------------------------------------------------------------------------
    def _liveness_bound(self) -> float:
        """A partition with work that can run and a worker idle sees a handler start within this: the loop's
        poll timeouts, holds of up to --pause-after for each other partition (``core.flow``'s guarantee: a
        partition that can be read waits because of holds at most ``pause_after`` for each partition whose
        records the client queued ahead of its own; seed 3682 has them follow each other across three
        partitions, each with an in-flight bound of one message), an uncommitted bound released by the next
        commit, a commit round trip, and a second of slack; for the process executor also a worst batch and a
        worker process's start (a dead one is replaced before its worker takes a lane again)."""
        config, settings = self.config, self.settings
        holds = max(1, len(self.broker.logs) - 1) * config.pause_after
        bound = 2 * settings.poll_timeout + holds + config.commit_interval + 0.02 + 1.0
        if config.executor == "process":
            handler = self.plan.handler
            longest = max(
                (key.slow + (key.duration or handler.base_duration[1]) for key in self.plan.keys), default=0.0
            )
            bound += MAX_BATCH * longest + 2 * self.plan.handler.process_start  # a replacement may start first
        return bound

    # -- the truth as the run goes -----------------------------------------------------------------------------
    def _produced(self, record: Record) -> None:
        self.journal.records[record.ident] = record
        key = (record.tp, record.chain)
        if key not in self._unhandled:
            self._unhandled[key] = deque()
            self._chains_of[record.tp].append(record.chain)
        self._unhandled[key].append(record)
        if record.key is not None:
            self._key_partitions.setdefault(record.chain, set()).add(record.tp)
            if record.poison:
                self._poison_keys.add(record.chain)
        self._recount()

    def _handled(self, record: Record) -> None:
        self._recount()

    def _call_started(self, call: Call) -> None:
        self.monitor.call_started(call.session, call.record.tp, call.started)

    def _recount(self) -> None:
        handled, gone = self.journal.handled_at, self._gone()
        block = self.config.on_exhausted == "block"
        logs = [log_.records for log_ in self.broker.logs.values()]
        excused = blocked_by_design(block, logs, gone, self.held_gone_poison() if block else ())
        remaining = 0
        for records in self._unhandled.values():
            while records and (records[0].ident in handled or records[0].ident in gone):
                records.popleft()
            for record in records:
                if record.ident in handled or record.ident in gone:
                    continue
                if record.ident in excused:
                    continue
                remaining += 1
        self.remaining = remaining

    def _gone(self) -> set[int]:
        """Records no pod can be asked to handle: truncated away, or skipped by Kafka after a truncation."""
        return self.broker.gone_at.keys() | self.broker.skipped

    def held_gone_poison(self) -> list[tuple[tuple[str, int], int]]:
        """(partition, truncation point) of each poison record a truncation removed after a pod had called it:
        a pod that has not seen the truncation (its partition paused behind that very record) still retries
        it, blocked, and the partition's records from the truncation point on may wait behind it."""
        called = {call.record.ident for call in self.journal.calls}
        held = []
        for tp, log_ in self.broker.logs.items():
            ends = dict(log_.truncations)
            for record in log_.gone:
                if record.poison and record.ident in called:
                    held.append((tp, ends[self.broker.gone_in[record.ident]]))
        return held

    def record_at(self, tp: tuple[str, int], offset: int) -> Record | None:
        records = self.broker.logs[tp].records
        return records[offset] if 0 <= offset < len(records) else None

    def records_ever_at(self, tp: tuple[str, int], offset: int) -> list[Record]:
        """Every record that has been at ``offset``: the log's now, and those truncations removed (a pod that
        has not yet seen a truncation still holds the old log's record there)."""
        log_ = self.broker.logs[tp]
        current = self.record_at(tp, offset)
        return [*(record for record in log_.gone if record.offset == offset), *([current] if current else [])]

    def failures(self, record: Record) -> int:
        """Failed attempts of ``record``: the handler raised, or its worker process died under it."""
        return sum(
            1
            for call in self.journal.calls
            if call.record.ident == record.ident and call.outcome in ("failed", "killed")
        )

    def running_pods(self) -> list[SimPod]:
        return [pod for pod in self.pods if pod.running]

    def running_work(self, session: int) -> int:
        return sum(1 for work in self.journal.running if work.session == session)

    def running_batches(self, session: int) -> int:
        """A batch handler's calls running in ``session``: its running messages' calls by thread and start (the
        messages of one call begin together on one thread), dead-letter writes one each."""
        running = [work for work in self.journal.running if work.session == session]
        return len({(getattr(work, "thread", id(work)), work.started) for work in running})

    def calls_running_at(self, session: int, at: float) -> list[Any]:
        return [
            work
            for work in [*self.journal.calls, *self.journal.dead_letters]
            if work.session == session and work.started <= at and (work.ended is None or work.ended > at)
        ]

    def thread_in_handler(self, name: str, at: float) -> bool:
        session = int(name.split("/", 1)[0].removeprefix("pod"))
        return bool(self.calls_running_at(session, at))

    def expected_exit(self, pod: SimPod) -> bool:
        return isinstance(pod.ending.error if pod.ending else None, SourceError)

    def taken_from(self, session: int, tp: tuple[str, int], at: float) -> bool:
        """The group took ``tp`` from ``session`` by ``at`` without its knowing (a session timeout, a fence):
        its calls since are those of a member that does not know yet."""
        return any(
            who == session and tp in partitions and when <= at and why != "max.poll.interval.ms exceeded"
            for when, who, partitions, why in self.broker.expiries
        )

    def abandoned(self, call: Call, at: float) -> bool:
        """The design let ``call``'s session give the partition up while ``call`` still ran: a session
        timeout took it, or a new member with its ``group.instance.id`` fenced it, or a revoke's drain
        timeout or a shutdown's grace ran out. (Not ``max.poll.interval.ms``: the poll loop must never
        let that pass; the liveness check reports it.)"""
        tp = call.record.tp
        end = call.ended if call.ended is not None else float("inf")
        if self.taken_from(call.session, tp, at):
            return True
        pod = next(pod for pod in self.pods if pod.session == call.session)
        for span in pod.source.revokes:
            if tp in span.partitions and span.ended is not None and span.ended <= at and span.ended < end:
                return True
        return pod.ending is not None and pod.ending.at <= at and pod.ending.at < end

    def runnable_head(self, tp: tuple[str, int], now: float, session: int | None = None) -> Record | None:
        """The first record of a chain of ``tp`` that could run now (see ``LivenessMonitor``); with ``session``,
        not while that pod session runs an earlier record of the chain again (a re-delivery of one another
        session handled already: seed 9166, the key's lane is busy with it)."""
        handled, gone = self.journal.handled_at, self._gone()
        block = self.config.on_exhausted == "block"
        running = {work.record.ident for work in self.journal.running}
        busy_chains = {
            work.record.chain for work in self.journal.running if work.session == session and work.record.tp == tp
        }
        for chain in self._chains_of[tp]:
            if chain in busy_chains:
                continue
            records = self._unhandled[(tp, chain)]
            head = next((r for r in records if r.ident not in handled and r.ident not in gone), None)
            if head is None or head.produced_at > now or head.ident in running:
                continue
            if head.key is not None:
                if block and chain in self._poison_keys:
                    continue
                others = self._key_partitions.get(chain, set()) - {tp}
                if any(self._has_unhandled(other, chain) for other in others):
                    continue
            if now < self.due(head):
                continue
            return head
        return None

    def _has_unhandled(self, tp: tuple[str, int], chain: str) -> bool:
        handled, gone = self.journal.handled_at, self._gone()
        return any(r.ident not in handled and r.ident not in gone for r in self._unhandled.get((tp, chain), ()))

    def has_runnable_work(self, tp: tuple[str, int], now: float, session: int | None = None) -> bool:
        return self.runnable_head(tp, now, session) is not None

    def due(self, record: Record) -> float:
        """When ``record`` may run again after its last failed call or dead-letter write (0: at once)."""
        config = self.config
        due = 0.0
        call = self.journal.last_call.get(record.ident)
        write = self.journal.last_dead_letter.get(record.ident)
        logged = self.retry_due.get((record.topic, record.partition, record.offset))
        if call is not None and call.outcome == "failed" and call.ended is not None:
            attempt = call.attempt
            backoff = (
                min(config.retry_max_backoff, config.retry_initial_backoff * 2 ** (attempt - 1))
                if attempt < config.max_attempts
                else (config.retry_max_backoff if config.on_exhausted == "block" else 0.0)
            )
            due = call.ended + backoff + self.monitor.bound
            if logged is not None and logged[0] >= call.ended:
                due = logged[1]
        if write is not None and not write.ok and write.ended is not None:
            due = max(due, write.ended + config.retry_max_backoff + self.monitor.bound)
            if logged is not None and logged[0] >= write.ended:
                due = logged[1]
        return due

    # -- the run ------------------------------------------------------------------------------------------------
    def start_pod(self) -> SimPod:
        session = len(self.pods) + 1
        pod = SimPod(self.sim, self.broker, self.journal, self.plan, self.config, session, self.generation)
        self.pods.append(pod)
        self.holds.append(HoldCheck(self, pod))
        pod.on_end.append(self._pod_ended)
        self.trace.append((self.sim.clock(), f"pod session {session} starts"))
        pod.start()
        return pod

    def _pod_ended(self, pod: SimPod) -> None:
        ending = pod.ending
        assert ending is not None
        error = f": {type(ending.error).__name__}: {ending.error}" if ending.error else ""
        self.trace.append((ending.at, f"pod session {pod.session} {ending.how}{error}"))
        for work in list(self.journal.running):  # what a SIGKILL cut short never ends by itself
            if work.session == pod.session and ending.how == "crashed":
                self.journal.end(work, ending.at, "crashed")
        if self.final or self.running_pods():
            return
        delay = getattr(pod, "restart_after", 0.5)
        self.sim.call_at(ending.at + delay, self._restart_if_none)

    def _restart_if_none(self) -> None:
        if not self.final and not self.running_pods():
            self.start_pod()

    def _tick(self) -> None:
        if not self.ticking:
            return
        self.broker.release_expired_static()
        self.monitor.tick()
        self.lanes.tick()
        self._check_max_poll()
        self.sim.call_at(self.sim.clock() + TICK, self._tick)

    def _check_max_poll(self) -> None:
        for when, session, _partitions, why in self.broker.expiries:
            if "max.poll.interval.ms" in why and (when, session) not in self._max_poll_reported:
                self._max_poll_reported.add((when, session))
                self.violations.append(
                    Violation(
                        "liveness",
                        when,
                        f"pod session {session} did not call the Kafka client for longer than max.poll.interval.ms "
                        f"({self.config_max_poll():g}s): the group removed it while it held partitions",
                    )
                )

    def config_max_poll(self) -> float:
        for item in self.config.kafka_property:
            name, _, value = item.partition("=")
            if name.strip() == "max.poll.interval.ms":
                return int(value) / 1000
        return 300.0

    def produce_burst(self, count: int, rate: float) -> None:
        plan, rng = self.plan, self.sim.rng
        weights = [key.weight for key in plan.keys]
        start = self.sim.clock()
        topic = next(iter(plan.topics))
        for index in range(count):

            def one() -> None:
                key = rng.choices(plan.keys, weights)[0]
                partition = rng.choice(key.partitions)
                poison = key.poison > 0 and rng.random() < key.poison
                self.broker.produce(topic, partition, key.name.encode() if key.name else None, poison)

            self.sim.call_at(start + index / rate, one)

    def apply(self, fault: Fault) -> None:
        """Apply one fault of the schedule to the state of the run now."""
        sim, broker, rng = self.sim, self.broker, self.sim.rng
        pods = self.running_pods()
        pod = pods[-1] if pods else None
        kind, params = fault.kind, fault.params
        text = f"fault {kind} {params}"
        tps = sorted(broker.logs)
        if kind == "resize" and pod is not None:
            pod.runtime.request_resize(params["workers"])
        elif kind == "move_elsewhere":
            tp = (tps[0][0], params["partition"]) if "partition" in params else rng.choice(tps)
            broker.move_elsewhere(tp, params["seconds"])
        elif kind == "session_lost" and pod is not None:
            broker.expire(pod.source, "session timed out (heartbeats failed)")
        elif kind == "commit_failures":
            code = rng.choice(
                [KafkaError.REQUEST_TIMED_OUT, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.REBALANCE_IN_PROGRESS]
            )
            broker.commit_faults = CommitFaults(sim.clock() + params["seconds"], params["whole"], code, params["share"])
        elif kind == "consumer_error" and pod is not None:
            code = rng.choice(
                [KafkaError._TRANSPORT, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.NOT_LEADER_FOR_PARTITION]
            )
            pod.source.queue_event(("error", KafkaError(code, "simulated fetch error", fatal=False)))
            if code == KafkaError.NOT_LEADER_FOR_PARTITION and pod.source.assigned:
                # what the error says: the partition's leadership moved, cleanly (a greater leader epoch, the log
                # kept whole): nothing may reset (no draw of the seed's random stream, so older seeds replay)
                tp = min(pod.source.assigned)
                broker.change_leader(tp)
                text += f" (clean leader change of {tp[0]}[{tp[1]}])"
        elif kind == "fatal_error" and pod is not None:
            pod.restart_after = params["restart_after"]  # type: ignore[attr-defined]
            pod.source.queue_event(("error", KafkaError(KafkaError._FENCED, "simulated fatal error", fatal=True)))
        elif kind == "truncate":
            tp = (tps[0][0], params["partition"]) if "partition" in params else rng.choice(tps)
            log_ = broker.logs[tp]
            if log_.end:  # fetched or not (finding F3, fixed: the pod tells the new log by its leader epoch)
                broker.truncate(tp, max(0, log_.end - params["back"]))
                self._recount()
            else:
                text += " (skipped: empty log)"
        elif kind == "outage":
            broker.down_until = sim.clock() + params["seconds"]
            for source in [p.source for p in pods]:
                if params["seconds"] > source.session_timeout:
                    sim.call_at(
                        sim.clock() + source.session_timeout,
                        lambda s=source: broker.expire(s, "session timed out (no broker reachable)"),
                    )
        elif kind == "sigterm" and pod is not None:
            pod.restart_after = params["restart_after"]  # type: ignore[attr-defined]
            pod.sigterm()
        elif kind == "rolling_restart" and pod is not None:
            self.generation += 1  # a Deployment's new pod: a new name, so a new group.instance.id if static
            self.start_pod()
            sim.call_at(sim.clock() + params["restart_after"], pod.sigterm)
        elif kind == "crash" and pod is not None:
            pod.restart_after = params["restart_after"]  # type: ignore[attr-defined]
            pod.crash()
        elif kind == "kill_process" and pod is not None:
            processes = live_processes(pod.children)
            wanted = [process for process in processes if process.busy == params["busy"]] or processes
            if wanted:
                process = rng.choice(wanted)
                identity = process._thread.ident
                process.kill()
                for work in list(self.journal.running):
                    if getattr(work, "thread", None) == identity:
                        self.journal.end(work, sim.clock(), "killed")
                text += f" (pid {process.pid}, {process.killed_while})"
        else:
            text += " (skipped: no pod)"
        self.trace.append((sim.clock(), text))

    def run(self) -> None:
        plan, sim = self.plan, self.sim
        # The simulated worker processes run the real run_batch, which times each handler call with
        # time.monotonic: the pool's batching (FAST_PROCESS_HANDLER_SECONDS) would follow real time, and a
        # replay under another load would batch differently. They read the virtual clock here instead.
        real_time = worker_process.time
        worker_process.time = types.SimpleNamespace(monotonic=sim.clock, sleep=real_time.sleep)  # type: ignore[assignment]
        logger = logging.getLogger("keyorder")
        previous_level = logger.level
        logger.setLevel(logging.INFO)
        logger.addHandler(self._capture)
        try:
            for burst in plan.bursts:
                sim.call_at(burst.start, lambda b=burst: self.produce_burst(b.count, b.rate))
            topic = next(iter(plan.topics))
            for scripted in plan.script:
                key = scripted.key.encode() if scripted.key is not None else None
                sim.call_at(scripted.at, lambda k=key, r=scripted: self.broker.produce(topic, r.partition, k, r.poison))
            for fault in plan.faults:
                sim.call_at(fault.at, lambda f=fault: self.apply(f))
            sim.call_at(TICK, self._tick)
            self.start_pod()
            end_of_faults = plan.faults_end
            sim.run(until=self._spinning, limit=end_of_faults)
            self._quiet_phase(end_of_faults)
            self.final = True
            self.trace.append((sim.clock(), "final SIGTERM"))
            for pod in self.running_pods():
                pod.sigterm()
            config = self.config
            sim.run(
                until=lambda: self._spinning() or not self.running_pods(),
                limit=sim.clock() + config.shutdown_grace + config.revoke_drain_timeout + 30.0,
            )
            for pod in self.running_pods():
                self.violations.append(
                    Violation(
                        "shutdown bound",
                        sim.clock(),
                        f"pod session {pod.session} never stopped after the final SIGTERM",
                    )
                )
            self.ticking = False
        finally:
            self.journal.closed = True
            sim.close()  # threads still blocked (a crashed pod's) end here; their last log lines are traced
            logger.removeHandler(self._capture)
            logger.setLevel(previous_level)
            worker_process.time = real_time

    def _spinning(self) -> bool:
        """Raise ``SimulationStuck`` when virtual time stood still for ``SPIN_STEPS`` steps: a loop somewhere
        never blocks (the run would never end). Checked by the driver between steps; returns False."""
        sim = self.sim
        if sim.now > self._time_seen:
            self._time_seen, self._steps_seen = sim.now, sim.steps
        elif sim.steps - self._steps_seen > SPIN_STEPS:
            running = ", ".join(sim.alive()[:8])
            raise SimulationStuck(
                f"seed {self.plan.seed}: virtual time stood still at {sim.now:.3f}s for {SPIN_STEPS} steps: a thread "
                f"loops without blocking (threads alive: {running})"
            )
        return False

    def _quiet_phase(self, start: float) -> None:
        """No more faults: run until everything that can be handled is, or until nothing was handled for
        ``stall_limit`` (then the at-least-once check names what was left), at most ``plan.quiet_limit``
        seconds after the last handling."""
        sim, config = self.sim, self.config
        per_record = config.max_attempts * (config.retry_max_backoff + self.plan.handler.long_duration[1] + 1.0)
        # a pod that died holds its partitions until its session times out
        session_timeout = max((pod.source.session_timeout for pod in self.pods), default=45.0)
        stall_limit = self.monitor.bound + per_record + 4 * config.retry_max_backoff + session_timeout + 10.0
        settled = start + SETTLE_SECONDS  # what the last faults started (a partition moved away for a while) plays out
        while True:
            self._recount()  # a consumer may have started past records of a truncated log (broker.skipped)
            sim.run(
                until=lambda: (
                    self._spinning() or (self.remaining == 0 and bool(self.running_pods()) and sim.clock() >= settled)
                ),
                limit=max(sim.clock() + 5.0, settled),
            )
            if self.remaining == 0 and self.running_pods() and sim.clock() >= settled:
                return
            progress = max(self.journal.handled_at.values(), default=start)
            if sim.clock() - max(progress, start) > min(stall_limit, self.plan.quiet_limit):
                return


def plan_for(seed: int, name: str = "random") -> Plan:
    if name == "random":
        return make_plan(seed)
    from tests.simulation.regressions import OPEN_FINDINGS, REGRESSIONS

    regression = REGRESSIONS.get(name) or OPEN_FINDINGS.get(name)
    if regression is None:
        raise SystemExit(f"--plan {name}: no such plan (random, {', '.join([*REGRESSIONS, *OPEN_FINDINGS])})")
    return regression.plan(seed)


def run_plan(plan: Plan, trace: bool = False) -> Result:
    """Run ``plan`` and check every invariant."""
    started = time.perf_counter()
    result = Result(plan.seed, plan.name)
    try:
        config = load_run_config(plan.flags, environ={})
        consumer_properties(config, kafka_properties(config, environ={}))  # where keyorder refuses unsafe ones
    except ConfigError as refused:
        result.refused = str(refused)
        result.summary = f"seed {plan.seed} ({plan.name}): configuration refused: {refused}"
        return result
    world = World(plan, config)
    try:
        world.run()
    except SimulationStuck as stuck:
        world.violations.append(Violation("stuck", world.sim.clock(), str(stuck)))
    except Exception:  # the simulation's own code failed: report it with the seed, and go on with the next
        world.violations.append(Violation("harness", world.sim.clock(), traceback.format_exc()))
    result.violations = invariants.check(world)
    result.real_seconds = time.perf_counter() - started
    result.summary = _summary(world, result)
    if trace:
        result.trace = _trace(world)
    return result


def _summary(world: World, result: Result) -> str:
    journal, broker = world.journal, world.broker
    records = len(journal.records)
    handled = len(journal.handled_at)
    commits = sum(1 for commit in broker.commits if commit.error is None)
    failed = sum(1 for commit in broker.commits if commit.error is not None)
    status = "ok" if result.ok else f"{len(result.violations)} VIOLATIONS"
    endings = ", ".join(f"{pod.ending.how if pod.ending else 'running'}" for pod in world.pods)
    return (
        f"seed {world.plan.seed} ({world.plan.name}): {status}; {records} records, {handled} handled, "
        f"{len(journal.calls)} calls, {len(journal.dead_letters)} dead-letter writes, {commits} commits "
        f"({failed} refused), pod sessions: {endings}; virtual {world.sim.clock():.1f}s, "
        f"{world.sim.steps} steps, real {result.real_seconds:.2f}s\n{world.plan.describe()}"
    )


def _trace(world: World) -> list[str]:
    events = list(world.trace)
    events += [(event.at, f"group: {event.text}") for event in world.broker.events]
    for call in world.journal.calls:
        took = f"{call.ended - call.started:.3f}s" if call.ended is not None else "never ended"
        events.append(
            (
                call.started,
                f"pod{call.session} call {call.record.describe()} attempt {call.attempt} -> {call.outcome} ({took})",
            )
        )
    for write in world.journal.dead_letters:
        events.append(
            (
                write.started,
                f"pod{write.session} dead-letter {write.record.describe()} -> {'ok' if write.ok else 'failed'}",
            )
        )
    for commit in world.broker.commits:
        events.append(
            (
                commit.sent_at,
                f"pod{commit.session} commit {commit.tp[0]}[{commit.tp[1]}]@{commit.offset}"
                f"{' async' if commit.asynchronous else ''} -> {commit.error or 'stored'}",
            )
        )
    events.sort(key=lambda event: event[0])
    return [f"{at:10.4f} {text}" for at, text in events]


# -- the command line ------------------------------------------------------------------------------------------
def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds.extend(range(int(first), int(last or first) + 1))
    return seeds


def _quiet_unwinding() -> None:
    """What the simulation's end unwinds (a crashed pod's threads, an abandoned event loop's tasks) logs after
    a run's own capture is gone: not to stderr (in this process, and in each ``--jobs`` worker)."""
    root = logging.getLogger()
    if not any(isinstance(handler, logging.NullHandler) for handler in root.handlers):
        root.addHandler(logging.NullHandler())


def _one(job: tuple[int, str, bool]) -> Result:
    _quiet_unwinding()
    seed, name, trace = job
    return run_plan(plan_for(seed, name), trace)


def _results(jobs: list[tuple[int, str, bool]], processes: int) -> Iterator[Result]:
    if processes <= 1:
        yield from map(_one, jobs)
        return
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        yield from pool.imap(_one, jobs, chunksize=4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.simulation", description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="run one seed and print its summary and violations")
    which.add_argument("--seeds", help="run many: A-B (inclusive), or a comma-separated list of those")
    which.add_argument("--regressions", action="store_true", help="run every named regression plan on its seed")
    parser.add_argument("--plan", default="random", help="a named regression plan (tests/simulation/regressions.py)")
    parser.add_argument("--jobs", type=int, default=1, help="processes for --seeds (default 1)")
    parser.add_argument("--trace", action="store_true", help="print the run's event log (with --seed)")
    args = parser.parse_args(argv)
    if os.environ.get("PYTHONHASHSEED") != "0":  # a run's set and dict orders depend on it: replays need 0
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.simulation", *(sys.argv[1:] if argv is None else argv)])
    if args.seed is not None:
        result = _one((args.seed, args.plan, args.trace))
        if args.trace:
            print("\n".join(result.trace))
        print(result.summary)
        for violation in result.violations:
            print(f"  VIOLATION {violation}")
        if not result.ok:
            print(f"replay: {result.replay()}")
        return 0 if result.ok else 1
    if args.regressions:
        from tests.simulation.regressions import REGRESSIONS

        jobs = [(regression.seed, name, False) for name, regression in REGRESSIONS.items()]
    else:
        jobs = [(seed, args.plan, False) for seed in _seeds(args.seeds)]
    return _report(jobs, args.jobs)


def _report(jobs: list[tuple[int, str, bool]], processes: int) -> int:
    started = time.perf_counter()
    failures: list[Result] = []
    refused = 0
    interactive = sys.stdout.isatty()
    for done, result in enumerate(_results(jobs, processes), start=1):
        refused += result.refused is not None
        if not result.ok:
            failures.append(result)
            print(f"\n{result.summary}")
            for violation in result.violations:
                print(f"  VIOLATION {violation}")
            print(f"replay: {result.replay()}", flush=True)
        if interactive or done % 100 == 0 or done == len(jobs):
            elapsed = time.perf_counter() - started
            line = f"{done}/{len(jobs)} runs, {len(failures)} failing, {refused} refused, {elapsed:.0f}s"
            last = done == len(jobs)
            print(f"\r{line}" if interactive else line, end="" if interactive and not last else "\n", flush=True)
    print(
        f"{len(jobs)} runs: {len(jobs) - len(failures) - refused} passed, {len(failures)} with violations, "
        f"{refused} refused by keyorder's configuration checks; {time.perf_counter() - started:.1f}s"
    )
    return 1 if failures else 0
