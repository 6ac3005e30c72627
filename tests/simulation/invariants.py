"""What must hold after every run of the pod simulation, whatever the seed did (issue 36's invariants).

Each check reads the truth, not the pod's own view: the broker's records and commits
(``broker.SimulatedBroker``), the handler's calls and dead-letter writes (``workload.Journal``), and
when each pod session started, revoked, stopped or died (``pod.SimPod``, ``broker.RevokeSpan``).
Each violation is one sentence naming the partition, offset, key, sequence number and virtual time
it is about. In the spirit of Decaton's ``ProcessOrdering``/``SerialProcessing``/
``AtLeastOnceDelivery`` oracles:

* **commits**: no offset is committed past an unhandled record: when a commit was sent, every record
  below its offset, and every offset its metadata marks done, had been handled (succeeded or
  dead-lettered). A commit is judged against the log its leader epoch names (``Truth.log_judging``): one
  sent after a truncation by a pod that had not seen it yet speaks about the old log (KIP-320);
  one carrying the current generation's epoch, or none, against the log as it was when sent;
* **order**: a call of a key's record n starts only after record n-1 of that key in that partition
  completed at least once, across re-assignments and restarts; and within a pod session two calls
  of one key never overlap (across sessions only where the design allows it: the older session
  lost the partition, let its revoke drain or shutdown grace run out, or died);
* **at least once**: by the end every record is handled, except those of a key blocked by design
  (``onExhausted: block`` and a record that always fails), which then stay uncommitted;
* **bounded liveness** (checked while the run goes, ``LivenessMonitor``): a partition that is
  assigned, has work that can run (not behind a blocked key, not waiting for a retry's backoff) and
  is not over its own bounds sees a handler start within a bound derived from the configuration,
  as long as a worker is idle; a revoke with no handler of its partitions running returns within a
  small bound, one with handlers running soon after they end (at most the drain timeout); a
  shutdown ends within its grace, and soon after the last handler it waited for; a stopping pod's
  partitions are free for others at once (``Handover``);
* **flow control** (``HoldCheck``): the poll loop holds reading only for a partition (or the pod)
  that is full in flight and not paused; a paused partition is read past, not waited for;
* **lanes** (``LaneReportCheck``): a lane reported blocked has a head that exhausted its attempts;
* **nothing left behind**: after a pod stops, no lane holds a delivery, no worker thread or worker
  process is alive (save a handler still running past the grace, which the design abandons).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keyorder.core import offset_metadata
from tests.simulation.broker import Record

if TYPE_CHECKING:
    from tests.simulation.run import World

QUICK = 0.1
"""Virtual seconds a revoke or a shutdown may take beyond the handlers it waits for: the runtime's own
polling (2-25 ms), a synchronous commit round trip (at most 20 ms here) and the close."""
HANDOVER_BOUND = 1.0
"""Seconds within which a stopping pod's partitions must be free for another member."""
SPIN_REPEATS = 50
"""Identical flow decisions in a row (nothing changed, no hold) that count as the loop spinning: the
loop turns every 5 ms while a partition is paused, and a decision under commit pressure may be remade a
few times while its early commit waits for its spacing (20 ms), never 50."""
TICK = 0.05
"""Virtual seconds between two looks of the online checks."""


@dataclass(frozen=True)
class Violation:
    invariant: str
    at: float
    text: str

    def __str__(self) -> str:
        return f"[{self.invariant}] at {self.at:.3f}s: {self.text}"


def tp_name(tp: tuple[str, int]) -> str:
    return f"{tp[0]}[{tp[1]}]"


def check(world: World) -> list[Violation]:
    """Every post-run check, in a stable order."""
    violations = list(world.violations)  # the online ones
    for name, check_function in (
        ("commits", check_commits),
        ("order", check_order),
        ("serial", check_serial),
        ("at least once", check_at_least_once),
        ("revoke bound", check_revokes),
        ("shutdown bound", check_shutdowns),
        ("left behind", check_leftovers),
        ("handover", check_handovers),
        ("errors", check_errors),
    ):
        try:
            violations.extend(check_function(world))
        except Exception as error:  # a broken check is a finding too, not a crash of the whole soak
            violations.append(Violation(name, world.sim.clock(), f"the check itself failed: {error!r}"))
    return violations


# -- the truth, indexed ------------------------------------------------------------------------------------
class Truth:
    """The broker's records by partition and chain, with when each was truncated away (if it was)."""

    def __init__(self, world: World) -> None:
        broker = world.broker
        self.world = world
        self.gone_at: dict[int, float] = dict(broker.gone_at)
        for ident in broker.skipped:  # never deliverable (Kafka's semantics after a truncation): as if gone
            self.gone_at.setdefault(ident, 0.0)
        self.by_partition: dict[tuple[str, int], list[Record]] = {}
        self.by_chain: dict[tuple[tuple[str, int], str], list[Record]] = {}
        for tp, log_ in broker.logs.items():
            every = sorted([*log_.records, *log_.gone], key=lambda record: record.ident)
            self.by_partition[tp] = every
            for record in every:
                self.by_chain.setdefault((tp, record.chain), []).append(record)
        self.handled_at = world.journal.handled_at
        self.block = world.config.on_exhausted == "block"
        self._blocked: set[int] | None = None

    def existed(self, record: Record, at: float) -> bool:
        """The record was in its partition's log at ``at``."""
        gone = self.gone_at.get(record.ident)
        return record.produced_at <= at and (gone is None or gone > at)

    def handled_by(self, record: Record, at: float) -> bool:
        handled = self.handled_at.get(record.ident)
        return handled is not None and handled <= at

    def log_at(self, tp: tuple[str, int], at: float) -> dict[int, Record]:
        """The partition's records by offset as they were at ``at``."""
        return {record.offset: record for record in self.by_partition[tp] if self.existed(record, at)}

    def log_of_generation(self, tp: tuple[str, int], generation: int) -> dict[int, Record]:
        """The partition's records by offset as they were at the end of log ``generation`` (before the
        truncation that ended it; the current log for the current generation)."""
        gone_in = self.world.broker.gone_in
        skipped = self.world.broker.skipped
        return {
            record.offset: record
            for record in self.by_partition[tp]
            if record.log_epoch <= generation
            and gone_in.get(record.ident, generation) >= generation
            and record.ident not in skipped
        }

    def log_judging(self, commit: Any) -> tuple[dict[int, Record], str]:
        """The log a commit speaks about, and how to name it in a violation: the log of the generation its
        leader epoch belongs to (``KafkaSource.commit`` sends the metadata's epoch, the greatest the pod had
        received). A pod that read the old log commits it, with its epoch, after a truncation it has not
        seen yet; librdkafka validating that position finds the divergence (KIP-320), and the epoch voids
        the metadata for the next owner. A commit with the current generation's epoch, or with none, is
        judged against the log at the time it was sent."""
        log_ = self.world.broker.logs[commit.tp]
        carried = offset_metadata.leader_epoch(commit.metadata)
        current = max(index for index, (_epoch, start) in enumerate(log_.generations) if start <= commit.sent_at)
        if carried is not None:
            generation = max(index for index, (first, _start) in enumerate(log_.generations) if first <= carried)
            if generation < current:
                about = f" (leader epoch {carried}: log generation {generation})"
                return self.log_of_generation(commit.tp, generation), about
        return self.log_at(commit.tp, commit.sent_at), ""

    def blocked_by_design(self, record: Record) -> bool:
        if self._blocked is None:
            self._blocked = blocked_by_design(
                self.block, self.by_partition.values(), self.gone_at, self.world.held_gone_poison()
            )
        return record.ident in self._blocked


def blocked_by_design(
    block: bool,
    partitions: Iterable[Iterable[Record]],
    gone_at: Any,
    held_gone: Iterable[tuple[tuple[str, int], int]] = (),
) -> set[int]:
    """The records that may stay unhandled by design (their identities), given every partition's records.

    Under ``onExhausted: block`` a record that always fails blocks its key for good: it, the key's records
    in other partitions (the key's lane is shared, so they queue behind it), and every record behind any
    of those in its partition (the blocked ones hold the partition's in-flight and uncommitted bounds, so
    the pod may never read further). The commit check still keeps all of them uncommitted. ``held_gone``:
    (partition, truncation point) of poison records a truncation removed after a pod had called them
    (``World.held_gone_poison``): a pod that has not seen the truncation, because the blocked record keeps
    its partition paused, still retries it, and the new log's records from that point wait behind it.
    """
    if not block:
        return set()
    every = [record for records in partitions for record in records if record.ident not in gone_at]
    poison_keys: dict[bytes, set[tuple[str, int]]] = {}
    for record in every:
        if record.poison and record.key is not None:
            poison_keys.setdefault(record.key, set()).add(record.tp)
    first_blocked: dict[tuple[str, int], int] = {}
    for record in every:
        blocking = record.poison or (record.key is not None and bool(poison_keys.get(record.key, set()) - {record.tp}))
        if blocking and record.offset < first_blocked.get(record.tp, record.offset + 1):
            first_blocked[record.tp] = record.offset
    for tp, truncated_at in held_gone:
        first_blocked[tp] = min(first_blocked.get(tp, truncated_at), truncated_at)
    return {record.ident for record in every if record.offset >= first_blocked.get(record.tp, record.offset + 1)}


# -- commits ------------------------------------------------------------------------------------------------
def check_commits(world: World) -> list[Violation]:
    """No commit passed an unhandled record, and no commit's metadata marked one done."""
    truth = Truth(world)
    violations: list[Violation] = []
    earliest: dict[tuple[Any, ...], Any] = {}
    committed: dict[tuple[str, int], int] = {}
    reported: set[int] = set()
    for commit in world.broker.commits:  # in the order the broker stored them
        if commit.error is not None:
            continue
        before = committed.get(commit.tp)
        committed[commit.tp] = commit.offset
        # the offset must be safe only where it moves the group's position forward (a pod re-committing the
        # offset it was assigned from says nothing new, even after a truncation made that offset stale)
        advances = before is None or commit.offset > before
        key = (commit.tp, commit.offset, commit.metadata, commit.log_epoch, advances)
        if key not in earliest or commit.sent_at < earliest[key].sent_at:
            earliest[key] = commit
    for (_tp, _offset, _metadata, _epoch, advances), commit in sorted(
        earliest.items(), key=lambda item: item[1].sent_at
    ):
        log_, about = truth.log_judging(commit)
        for offset in range(commit.offset if advances else 0):
            record = log_.get(offset)
            if record is not None and not truth.handled_by(record, commit.sent_at):
                if record.ident in reported:
                    break  # the first commit past it says it all
                reported.add(record.ident)
                violations.append(
                    Violation(
                        "commits",
                        commit.sent_at,
                        f"pod session {commit.session} committed {tp_name(commit.tp)} at offset "
                        f"{commit.offset}{about} while "
                        f"{record.describe()} below it was not handled (handled "
                        f"{_when(truth.handled_at.get(record.ident))})",
                    )
                )
                break
        for offset in sorted(offset_metadata.decode(commit.metadata, commit.offset)):
            record = log_.get(offset)
            if record is not None and not truth.handled_by(record, commit.sent_at):
                if record.ident in reported:
                    break
                reported.add(record.ident)
                violations.append(
                    Violation(
                        "commits",
                        commit.sent_at,
                        f"pod session {commit.session}'s commit of {tp_name(commit.tp)}@{commit.offset}{about} "
                        "marks offset "
                        f"{offset} done in its metadata, but {record.describe()} was not handled (handled "
                        f"{_when(truth.handled_at.get(record.ident))})",
                    )
                )
                break
    return violations


def _when(at: float | None) -> str:
    return "never" if at is None else f"only at {at:.3f}s"


# -- order --------------------------------------------------------------------------------------------------
def check_order(world: World) -> list[Violation]:
    """A call of record n of a chain starts only after record n-1 (of the partition's log then) was handled."""
    truth = Truth(world)
    violations: list[Violation] = []
    position: dict[int, int] = {}
    for chain in truth.by_chain.values():
        for index, record in enumerate(chain):
            position[record.ident] = index
    reported: set[tuple[Any, ...]] = set()
    for call in world.journal.calls:
        record = call.record
        chain = truth.by_chain[(record.tp, record.chain)]
        index = position[record.ident] - 1
        while index >= 0 and not truth.existed(chain[index], call.started):
            index -= 1  # truncated away before the call: not a predecessor any more
        if index < 0:
            continue
        before = chain[index]
        if not truth.handled_by(before, call.started):
            key = (record.tp, record.chain)
            if key in reported:
                continue
            reported.add(key)
            violations.append(
                Violation(
                    "order",
                    call.started,
                    f"pod session {call.session} started {record.describe()} (attempt {call.attempt}) before "
                    f"{before.describe()} was handled (handled {_when(truth.handled_at.get(before.ident))})",
                )
            )
    return violations


def check_serial(world: World) -> list[Violation]:
    """Two calls of one lane never overlap within a pod session; across sessions only where allowed."""
    violations: list[Violation] = []
    by_lane: dict[Any, list[Any]] = {}
    for call in world.journal.calls:
        record = call.record
        lane = record.key if record.key is not None else record.tp
        by_lane.setdefault(lane, []).append(call)
    for calls in by_lane.values():
        calls.sort(key=lambda call: call.started)
        for index, call in enumerate(calls):
            end = call.ended if call.ended is not None else float("inf")
            for later in calls[index + 1 :]:
                if later.started >= end:
                    break
                if later.session != call.session and (
                    later.record.tp != call.record.tp
                    or world.abandoned(call, later.started)
                    or world.taken_from(later.session, later.record.tp, later.started)
                ):
                    continue  # one key in two partitions of two members, or a partition the design let go
                violations.append(
                    Violation(
                        "serial",
                        later.started,
                        f"pod session {later.session} started {later.record.describe()} while pod session "
                        f"{call.session} was still running {call.record.describe()} of the same key "
                        f"(since {call.started:.3f}s)",
                    )
                )
                return violations  # one is enough to point at the interleaving
    return violations


# -- at least once ------------------------------------------------------------------------------------------
def check_at_least_once(world: World) -> list[Violation]:
    truth = Truth(world)
    missing = [
        record
        for records in truth.by_partition.values()
        for record in records
        if record.ident not in truth.gone_at
        and record.ident not in truth.handled_at
        and not truth.blocked_by_design(record)
    ]
    if not missing:
        return []
    first = min(missing, key=lambda record: (record.produced_at, record.ident))
    calls = [call for call in world.journal.calls if call.record.ident == first.ident]
    tried = f"{len(calls)} calls, the last {calls[-1].outcome} at {calls[-1].started:.3f}s" if calls else "never called"
    return [
        Violation(
            "at least once",
            world.sim.clock(),
            f"{len(missing)} records never handled by the end, the first {first.describe()} produced at "
            f"{first.produced_at:.3f}s ({tried})",
        )
    ]


# -- bounds ---------------------------------------------------------------------------------------------------
def _work_running(world: World, session: int, partitions: Iterable[tuple[str, int]], at: float) -> list[Any]:
    wanted = set(partitions)
    running = [
        call
        for call in world.journal.calls
        if call.session == session
        and call.record.tp in wanted
        and call.started <= at
        and (call.ended is None or call.ended > at)
    ]
    running += [
        write
        for write in world.journal.dead_letters
        if write.session == session
        and write.record.tp in wanted
        and write.started <= at
        and (write.ended is None or write.ended > at)
    ]
    return running


def _batch_end(world: World, call: Any) -> float:
    """When the worker process that ran ``call`` finished the batch it belonged to (a batch's messages run
    one after the other; the pool learns their outcomes when the whole batch returns)."""
    end = call.ended if call.ended is not None else float("inf")
    if world.config.executor != "process":
        return end
    for other in sorted((c for c in world.journal.calls if c.thread == call.thread), key=lambda c: c.started):
        if other.started < call.started:
            continue
        if other.started > end + 1e-9:
            break
        end = max(end, other.ended if other.ended is not None else float("inf"))
    return end


def _batches_with(world: World, session: int, partitions: Iterable[tuple[str, int]], at: float) -> list[Any]:
    """The process executor's batches running at ``at`` (any partition's message running) that hold a message
    of ``partitions``: the child runs a batch to its end, and the pool settles it only then."""
    wanted = set(partitions)
    found = []
    for call in world.journal.calls:
        if call.session != session or call.started > at or (call.ended is not None and call.ended <= at):
            continue
        end = _batch_end(world, call)
        batch = [
            other
            for other in world.journal.calls
            if other.thread == call.thread and call.started <= other.started <= end
        ]
        if any(other.record.tp in wanted for other in batch):
            found.append(call)
    return found


def check_revokes(world: World) -> list[Violation]:
    violations: list[Violation] = []
    drain = world.config.revoke_drain_timeout
    for pod in world.pods:
        for span in pod.source.revokes:
            if span.ended is None or span.closing:
                continue
            running = _work_running(world, span.session, span.partitions, span.started)
            if world.config.executor == "process":  # a batch sent before the revoke comes back whole
                running += _batches_with(world, span.session, span.partitions, span.started)
            if not running:
                bound = span.started + QUICK
                why = "no handler of its partitions was running"
            else:
                ends = [
                    _batch_end(world, work)
                    if hasattr(work, "attempt")
                    else (work.ended if work.ended is not None else float("inf"))
                    for work in running
                ]
                bound = min(max(ends), span.started + drain) + QUICK
                why = f"the {len(running)} handler calls it waited for ended by {max(ends):.3f}s"
            if span.ended > bound + 1e-9:
                violations.append(
                    Violation(
                        "revoke bound",
                        span.started,
                        f"pod session {span.session}'s revoke of {', '.join(map(tp_name, span.partitions))} took "
                        f"{span.ended - span.started:.3f}s (until {span.ended:.3f}s); {why} (bound {bound:.3f}s, "
                        f"drain timeout {drain:g}s)",
                    )
                )
    return violations


def check_shutdowns(world: World) -> list[Violation]:
    violations: list[Violation] = []
    config = world.config
    poll = world.settings.poll_timeout
    for pod in world.pods:
        ending = pod.ending
        if ending is None or ending.how != "stopped" or pod.stop_requested_at is None:
            continue
        asked = pod.stop_requested_at
        # a stop during the pod's start is noticed once the loop runs: its worker processes load first (seed 100217)
        loop_started = pod.runtime._loop_started
        asked = max(asked, loop_started) if loop_started is not None else asked
        # the loop notices the stop when the client call it is in returns (a callback may block in it)
        asked = max([asked, *(end for start, end in pod.source.long_consumes if start <= asked < end)])
        revoking = sum(
            (span.ended or ending.at) - max(span.started, asked)
            for span in pod.source.revokes
            if not span.closing and (span.ended or ending.at) > asked
        )
        latest = asked + config.shutdown_grace + config.revoke_drain_timeout + poll + 0.5 + QUICK
        if ending.at > latest + 1e-9:
            violations.append(
                Violation(
                    "shutdown bound",
                    asked,
                    f"pod session {pod.session} was asked to stop at {asked:.3f}s and stopped at {ending.at:.3f}s, "
                    f"beyond its grace of {config.shutdown_grace:g}s (bound {latest:.3f}s)",
                )
            )
            continue
        work = [
            call.ended if call.ended is not None else float("inf")
            for call in world.journal.calls
            if call.session == pod.session and (call.ended is None or call.ended > asked)
        ] + [
            write.ended if write.ended is not None else float("inf")
            for write in world.journal.dead_letters
            if write.session == pod.session and (write.ended is None or write.ended > asked)
        ]
        last = max(work, default=asked)
        noticed = asked + poll + revoking
        bound = min(max(noticed, last), asked + config.shutdown_grace + revoking + poll + 0.5) + QUICK
        if ending.at > bound + 1e-9:
            violations.append(
                Violation(
                    "shutdown bound",
                    asked,
                    f"pod session {pod.session} was asked to stop at {asked:.3f}s and stopped at {ending.at:.3f}s, "
                    f"although its last handler call or dead-letter write ended at {last:.3f}s (bound "
                    f"{bound:.3f}s; grace {config.shutdown_grace:g}s): it waited for work that was not running",
                )
            )
    return violations


def check_leftovers(world: World) -> list[Violation]:
    violations: list[Violation] = []
    for pod in world.pods:
        ending = pod.ending
        if ending is None or ending.how == "crashed":
            continue
        still_running = world.calls_running_at(pod.session, ending.at) or any(
            call.session == pod.session and call.outcome == "cancelled" for call in world.journal.calls
        )  # a handler past the grace: the thread pool leaves it running, the async pool cancels it
        if ending.lanes_left and not still_running:
            violations.append(
                Violation(
                    "left behind",
                    ending.at,
                    f"pod session {pod.session} stopped with {ending.lanes_left} deliveries still in its lanes",
                )
            )
        threads = [name for name in ending.threads_left if not world.thread_in_handler(name, ending.at)]
        if threads:
            violations.append(
                Violation(
                    "left behind",
                    ending.at,
                    f"pod session {pod.session} stopped with threads still alive: {', '.join(threads)}",
                )
            )
        if ending.processes_left:
            violations.append(
                Violation(
                    "left behind",
                    ending.at,
                    f"pod session {pod.session} stopped with worker processes alive: {ending.processes_left}",
                )
            )
    return violations


def check_handovers(world: World) -> list[Violation]:
    violations: list[Violation] = []
    end = world.sim.clock()
    for handover in world.broker.handovers:
        if not handover.kept:
            continue
        kept_until = [world.broker.kept_for_static[tp][1] for tp in handover.kept if tp in world.broker.kept_for_static]
        released = handover.released_at if handover.released_at is not None else max(kept_until, default=end)
        if released - handover.closed_at > HANDOVER_BOUND:
            violations.append(
                Violation(
                    "handover",
                    handover.closed_at,
                    f"pod session {handover.session} stopped at {handover.closed_at:.3f}s, but the broker kept "
                    f"{', '.join(map(tp_name, sorted(handover.kept)))} assigned to it until {released:.3f}s: its "
                    "leave was only temporary, and no other member could consume them",
                )
            )
    return violations


def check_errors(world: World) -> list[Violation]:
    violations = [
        Violation("errors", world.sim.clock(), f"managed thread {name} died of {type(error).__name__}: {error}")
        for name, error in world.sim.errors
    ]
    for pod in world.pods:
        ending = pod.ending
        if ending is not None and ending.how == "exited" and not world.expected_exit(pod):
            violations.append(
                Violation(
                    "errors",
                    ending.at,
                    f"pod session {pod.session}'s poll loop raised {type(ending.error).__name__}: {ending.error}",
                )
            )
    return violations


# -- online checks ----------------------------------------------------------------------------------------------
class LivenessMonitor:
    """Looks every ``TICK`` at each running pod: a partition with work that can run and a worker idle must
    see a handler start within ``bound`` virtual seconds.

    Work that can run: the first unhandled record of a chain (its predecessors handled), not blocked by
    design, not running, not waiting for its retry's backoff (the due time the pool logged when it parked
    the lane, or the policy's longest backoff after the failed call), of a key not spread over several
    partitions with unhandled records in more than one. Exempt: a pod that is stopping or serving a
    revoke, a partition not (or recently) assigned, over its own in-flight or uncommitted bound, a pod
    whose commits failed lately or whose broker is down. An idle worker: for threads, fewer calls running
    than workers (for a batch handler, fewer batch calls); for the process executor, whose workers may take
    several lanes into one batch, none running at all.
    """

    def __init__(self, world: World, bound: float) -> None:
        self.world = world
        self.bound = bound
        self.since: dict[tuple[int, tuple[str, int]], float] = {}
        self.last_start: dict[tuple[int, tuple[str, int]], float] = {}
        self.reported: set[tuple[int, tuple[str, int]]] = set()

    def call_started(self, session: int, tp: tuple[str, int], at: float) -> None:
        self.last_start[(session, tp)] = at
        self.since.pop((session, tp), None)

    def tick(self) -> None:
        world = self.world
        now = world.sim.clock()
        for pod in world.running_pods():
            if not self._pod_eligible(pod, now):
                self._reset(pod.session)
                continue
            running = world.running_work(pod.session)
            workers = pod.pool.size
            if world.config.executor == "process":
                idle = running == 0
            elif world.config.batch_max_messages > 1:  # a batch call is one worker's, whatever its size
                idle = world.running_batches(pod.session) < workers
            else:
                idle = running < workers
            if not idle:
                self._reset(pod.session)
                continue
            runtime = pod.runtime
            states = dict(runtime.partitions)
            bound_load = runtime.flow.partition_bound(len(states))
            for tp, state in states.items():
                key = (pod.session, tp)
                fetching = pod.source.assigned.get(tp)
                owner = world.broker.owner.get(tp)
                if (
                    state.revoked
                    or fetching is None
                    or owner is not pod.source.member
                    or now - fetching.assigned_at < self.bound
                    or self._over_own_bounds(tp, state.offsets, bound_load, runtime.flow)
                    or not world.has_runnable_work(tp, now, pod.session)
                ):
                    self.since.pop(key, None)
                    continue
                since = self.since.setdefault(key, max(now - TICK, self.last_start.get(key, 0.0)))
                if now - since > self.bound and key not in self.reported:
                    self.reported.add(key)
                    head = world.runnable_head(tp, now, pod.session)
                    world.violations.append(
                        Violation(
                            "liveness",
                            since,
                            f"pod session {pod.session}: {tp_name(tp)} had work that could run "
                            f"({head.describe() if head else '?'}) and an idle worker ({running} of {workers} busy) "
                            f"from {since:.3f}s to {now:.3f}s without a handler start (bound {self.bound:.2f}s; "
                            f"{state.offsets.inflight} in flight, {state.offsets.uncommitted} uncommitted, bounds "
                            f"{bound_load.inflight}/{bound_load.uncommitted}; paused: {tp in runtime.flow.paused})",
                        )
                    )

    @staticmethod
    def _over_own_bounds(tp: tuple[str, int], offsets: Any, bound: Any, flow: Any) -> bool:
        """At its own in-flight or uncommitted bound, or paused and not yet back at its low-water mark."""
        if offsets.inflight >= bound.inflight or offsets.uncommitted >= bound.uncommitted:
            return True
        ratio = flow.limits.resume_ratio
        return tp in flow.paused and (
            offsets.inflight > bound.inflight * ratio or offsets.uncommitted > bound.uncommitted * ratio
        )

    def _pod_eligible(self, pod: Any, now: float) -> bool:
        world = self.world
        if pod.stopping or not pod.runtime.started.is_set() or world.broker.down:
            return False
        if pod.source.assigning or any(span.ended is None for span in pod.source.revokes):
            return False  # the loop is inside a rebalance callback (a revoke's drain, an assign's committed offsets)
        last_failure = world.broker.commit_failed_at.get(pod.session)
        return last_failure is None or now - last_failure > self.bound

    def _reset(self, session: int) -> None:
        for key in [key for key in self.since if key[0] == session]:
            del self.since[key]


class HoldCheck:
    """Wraps a runtime's ``FlowControl.decide``: a hold needs a partition (or the pod) full in flight and
    not paused (the flow design: a partition full in flight holds reading up to ``pause_after``, then is
    paused and read past; a paused one is never waited for)."""

    def __init__(self, world: World, pod: Any) -> None:
        self.world = world
        self.pod = pod
        flow = pod.runtime.flow
        self.flow = flow
        self.original = flow.decide
        self.reported = False
        self.holding = False
        self.repeats = 0
        self.repeats_since = 0.0
        self._last_inputs: Any = None
        self.spin_reported = False
        flow.decide = self.decide

    def decide(self, partitions: Any, pod_load: Any, now: float) -> Any:
        decision = self.original(partitions, pod_load, now)
        flow = self.flow
        if decision.to_pause or decision.to_resume or (decision.hold is not None) != self.holding:
            bound = flow.partition_bound(len(partitions))
            full = ", ".join(tp_name(tp) for tp, load in partitions.items() if load.inflight >= bound.inflight)
            paused = ", ".join(map(tp_name, sorted(flow.paused)))
            hold = "none" if decision.hold is None else f"{decision.hold:.3f}s"
            text = (
                f"pod{self.pod.session} flow: hold {hold}, paused {paused or 'none'}, full in flight {full or 'none'}"
            )
            self.world.trace.append((now, text))
        self.holding = decision.hold is not None
        self._count_repeats(partitions, pod_load, decision, now)
        if decision.hold is None or self.reported:
            return decision
        limits = flow.limits
        ratio = limits.resume_ratio
        if pod_load.inflight >= limits.max_inflight:  # (the code before issue 36 also held for a full pod)
            return decision
        bound = flow.partition_bound(len(partitions))
        if any(load.inflight > bound.inflight * ratio for tp, load in partitions.items() if tp not in flow.paused):
            return decision
        full = [tp for tp, load in partitions.items() if load.inflight >= bound.inflight]
        self.reported = True
        self.world.violations.append(
            Violation(
                "flow",
                now,
                f"pod session {self.pod.session}'s poll loop held reading for {decision.hold:.3f}s although no "
                f"partition full in flight was unpaused (full: {', '.join(map(tp_name, full)) or 'none'}; paused: "
                f"{', '.join(map(tp_name, sorted(flow.paused)))}; pod {pod_load.inflight} in flight of "
                f"{limits.max_inflight})",
            )
        )
        return decision

    def _count_repeats(self, partitions: Any, pod_load: Any, decision: Any, now: float) -> None:
        """Issue 36, defect 8: the poll loop must not redo the same flow decision, an O(partitions) walk,
        at every turn (5 ms while some partition is paused) when nothing it is made from changed."""
        committer = self.pod.runtime.committer  # a commit sent or failed is news too (the loop re-decides on it)
        inputs = (tuple(sorted(partitions.items())), pod_load, committer.commits, committer.failures)
        if decision.hold is None and self.flow.paused and inputs == self._last_inputs:
            self.repeats += 1
        else:
            self.repeats, self.repeats_since = 0, now
        self._last_inputs = inputs if decision.hold is None else None
        if self.repeats == SPIN_REPEATS and not self.spin_reported:
            self.spin_reported = True
            self.world.violations.append(
                Violation(
                    "flow",
                    self.repeats_since,
                    f"pod session {self.pod.session}'s poll loop made the same flow decision {SPIN_REPEATS} times in "
                    f"a row from {self.repeats_since:.3f}s to {now:.3f}s while {tp_name(min(self.flow.paused))} was "
                    "paused and nothing it is made from changed (each an O(partitions) walk)",
                )
            )


class LaneReportCheck:
    """A lane the pool reports blocked (``LaneSummary.parked_heads``) has a head whose attempts are
    exhausted (``onExhausted: block``): the metrics must not blame a message that has not failed."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.reported: set[int] = set()

    def tick(self) -> None:
        world = self.world
        attempts = world.config.max_attempts
        for pod in world.running_pods():
            if pod.session in self.reported:
                continue
            pool = pod.pool
            if pool._lock.locked():  # a worker is inside its turn: look next time
                continue
            summary = pool._scheduler.summary()
            for state, offset, blocked in summary.parked_heads:
                if not blocked:
                    continue
                # the head may be a record of a log truncated since, which the pod has not noticed yet
                records = world.records_ever_at(state.id, offset)
                failures = max((world.failures(record) for record in records), default=0)
                if failures < attempts:
                    self.reported.add(pod.session)
                    world.violations.append(
                        Violation(
                            "lanes",
                            world.sim.clock(),
                            f"pod session {pod.session}'s lanes report {tp_name(state.id)}@{offset} blocked, but "
                            f"{records[-1].describe() if records else 'that record'} has failed {failures} "
                            f"times, fewer than --max-attempts {attempts}",
                        )
                    )
                    break
