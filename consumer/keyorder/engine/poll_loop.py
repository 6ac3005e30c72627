"""The poll loop of a keyorder pod: the one thread that owns offsets, routing and flow control.

Data flow: ``consume`` a batch -> record each offset (``PartitionOffsets.received``) -> give each
message its lane (``routing``) -> hand the batch to the pool's lane scheduler, where any idle worker
runs any ready lane -> workers append finished deliveries to ``completions`` -> this loop marks
them completed, and the ``Committer`` commits each partition's lowest unfinished offset,
periodically, on revoke and on shutdown.

Threading: everything here runs on the poll-loop thread, rebalance callbacks included (they run
inside ``consume``). Other threads only call ``request_resize`` (an int assignment) and read
``snapshot``, an immutable object the loop republishes every ``snapshot_interval``.

Flow control: each turn asks ``FlowControl`` whether to read, pause or resume, which walks every
partition. A decision stands while what it was made from stands (see ``_apply_flow``): a pod with
thousands of partitions, some of them paused, turns every 5 ms and must not walk them all each time.

Time: ``clock`` and ``sleep`` are injected (tests drive the revoke and shutdown deadlines and the
commit pacing with a fake clock); nothing here reads ``time`` directly.

Why one room of over 600 lines: nearly all of it is ``ConsumerRuntime``, and every method of that class
reads and writes the same state (the partitions, the standing flow decision, the in-flight and load
counters, the completions) that the threading contract above gives to the poll-loop thread alone. The
rebalance callbacks (``_on_assign``, ``_on_revoke``, ``_on_lost``) and the shutdown are the obvious seams,
but they run inside ``consume`` on that thread and change that state; split into modules, the rule "one
thread owns it" would have to be re-stated in each. It moves whole into the ``engine/`` package (issue 41).
"""

from __future__ import annotations

import itertools
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from keyorder.contracts import CommitOutcome, FetchPosition, Source, SourceError, TopicPartitionId
from keyorder.core import offset_metadata
from keyorder.core.flow import CEILING, FlowControl, FlowDecision, FlowLimits, Load
from keyorder.core.lanes import Delivery
from keyorder.core.partitions import PartitionState
from keyorder.core.routing import Ordering, lanes_function
from keyorder.core.tracking import EpochGap, LogTruncated, PartitionOffsets
from keyorder.engine.committer import Committer
from keyorder.engine.worker_pools import Completions, WorkerCrashed, WorkerPool

log = logging.getLogger(__name__)

_PARTITION_ID = operator.attrgetter("topic", "partition")
"""A message's ``(topic, partition)``."""
_PARTITION = operator.attrgetter("partition")
_OFFSET, _KEY = operator.attrgetter("offset"), operator.attrgetter("key")
_LEADER_EPOCH = operator.attrgetter("leader_epoch")
_MESSAGE_OFFSET = operator.attrgetter("message.offset")
_NO_ARGUMENTS = ()
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)

PARTLY_PAUSED_TIMEOUT = 0.005
"""Seconds a ``consume`` may wait for messages while some partitions are paused: their resumes
must not wait out the poll timeout of the partitions that are fetching."""

SHUTDOWN_POLL_INTERVAL = 0.005
"""Seconds between the shutdown's collections of finished messages while it waits for handlers."""

SHUTDOWN_LOOK_INTERVAL = 0.025
"""Seconds between the shutdown's looks at the lanes for something that can still finish (a running
handler, a ready lane, a retry due within the grace): ``lane_summary`` walks every lane under the
pool's lock, too dear for each collection on a pod with many keys."""


@dataclass(frozen=True)
class RuntimeSettings:
    """Poll-loop tuning; the CLI fills it from ``RunConfig``."""

    topics: tuple[str, ...]
    """Topics to subscribe to."""
    flow: FlowLimits = field(default_factory=FlowLimits)
    """In-flight bounds (backpressure)."""
    poll_batch: int = 500
    """Most messages taken from the client per poll."""
    poll_timeout: float = 0.1
    """Seconds one poll waits for messages when there are none."""
    commit_interval: float = 1.0
    """Seconds between periodic (asynchronous) commits."""
    revoke_drain_timeout: float = 10.0
    """Seconds a revoked partition's in-flight messages may take to finish before they are abandoned."""
    shutdown_grace: float = 25.0
    """Seconds in-flight messages may take to finish on shutdown (keep below the pod's grace period); the
    wait ends earlier once no handler runs, no lane is ready and no retry is due within it (what is left
    is blocked, or parked past the grace)."""
    max_workers: int = 4096
    """Upper bound for a live resize."""
    snapshot_interval: float = 0.5
    """Seconds between refreshes of the metrics snapshot."""
    broker_timeout: float = 10.0
    """Seconds to wait for the broker in blocking calls (committed offsets, synchronous commit)."""


@dataclass(frozen=True)
class _StandingDecision:
    """A flow decision the loop goes on with while nothing it was made from changes."""

    made_from: tuple[int, int, int]
    """``ConsumerRuntime._decision_inputs()`` when it was made."""
    capacity: int
    decision: FlowDecision[TopicPartitionId]
    """With no pause or resume left to apply (those were applied when it was made)."""


@dataclass(frozen=True)
class PartitionSnapshot:
    topic: str
    partition: int
    committed: int | None
    high_watermark: int | None
    min_inflight: int | None
    oldest_inflight_age: float
    inflight: int
    uncommitted: int
    paused: bool
    completed: int
    resets: int = 0
    """Times the log was found reset below the committed offset (re-based there) since the assignment."""
    pauses: int = 0
    """Times flow control paused the partition since the assignment."""
    fetch_queue: int | None = None
    """Messages the client has fetched and not yet handed out (its latest statistics; None: unknown)."""

    @property
    def lag(self) -> int | None:
        """End offset minus committed offset (``None`` while either is unknown)."""
        if self.high_watermark is None or self.committed is None:
            return None
        return max(self.high_watermark - self.committed, 0)


@dataclass(frozen=True)
class RuntimeSnapshot:
    partitions: tuple[PartitionSnapshot, ...] = ()
    inflight: int = 0
    workers: int = 0
    commits: int = 0
    commit_failures: int = 0
    rebalances: int = 0
    skipped: int = 0
    """Messages not run because the commit metadata said they were already done (re-deliveries are not counted)."""
    broker_reachable: bool = True
    """False while the source reports no broker reachable (a source without the attribute counts as reachable)."""
    broker_error: str | None = None
    """Why no broker is reachable (the source's last error), None while one is."""
    assigned_partitions: int = 0
    """Partitions assigned to this pod and not revoked (0 is normal for a pod beyond the partition count)."""
    partitions_revoked: int = 0
    """Partitions taken from this pod by rebalances (revoked or lost); an eager rebalance takes all of them,
    a cooperative one only those that change owner."""
    assignment_age: float | None = None
    """Seconds since this pod's partitions last changed (an assign, a revoke or a loss); ``None`` before
    any. The operator takes the group's smallest to time a scale step until every partition is owned."""
    rebalance_idle_seconds: float = 0.0
    """Seconds this pod held no partition between a rebalance that took its last one and the next that gave
    it some back: the stop an eager rebalance costs each member (a cooperative one leaves it at 0)."""
    poll_loop_seconds: float = 0.0
    """Seconds the poll loop has run; split below into reading and waiting, the rest is its own work."""
    reading_seconds: float = 0.0
    """Seconds the poll loop spent inside the client's ``consume`` (fetching, or waiting for messages)."""
    waiting_seconds: float = 0.0
    """Seconds the poll loop waited for the workers while flow control held or paused every partition."""
    holds: int = 0
    """Times a partition full in flight made the poll loop stop reading (flow control's first step)."""


class ConsumerRuntime:
    """Runs the poll loop until ``stop`` is set, then shuts down gracefully."""

    def __init__(
        self,
        settings: RuntimeSettings,
        source: Source,
        pool: WorkerPool,
        ordering: Ordering | str,
        completions: Completions,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.source = source
        self.pool = pool
        self.ordering = Ordering(ordering)
        self._lanes_of = lanes_function(self.ordering)
        self.completions = completions
        self.clock = clock
        self.sleep = sleep
        self.flow = FlowControl[TopicPartitionId](settings.flow)
        self.partitions: dict[TopicPartitionId, PartitionState] = {}
        self.committer = Committer(source, settings.commit_interval, self.partitions.get, clock())
        self.inflight = 0
        self.snapshot = RuntimeSnapshot(workers=pool.size)
        self.started = threading.Event()
        self.stopping = False
        self.last_iteration = clock()
        self._requested_workers = pool.size
        self._closing = False
        self._rebalances = self._skipped = self._partitions_revoked = 0
        self._rebalance_idle = 0.0
        self._emptied_at: float | None = None  # when a rebalance took the last partition, until one is assigned
        self._assignment_changed_at: float | None = None
        self._loop_started: float | None = None
        self._reading = self._waiting = 0.0
        self._holds = 0
        self._holding = False
        self._drained_at: float | None = None
        """When the latest ``consume`` that returned fewer records than it asked for began: the client had handed
        out all it held (``PartitionState.lost_place``)."""
        self._next_place_check = clock()
        self._load_changes = 0
        """Bumped by whatever changes a count flow control decides on: a partition's in-flight or
        uncommitted count, the pod's, or the assigned partitions (messages received, completions,
        hand-backs, rebalances, commit results). Poll thread only."""
        self._standing: _StandingDecision | None = None
        self._at_ceiling = False  # flow control's, as last logged

    # -- called from other threads ---------------------------------------------------------------
    def request_resize(self, workers: int) -> int:
        """Ask the loop to run ``workers`` key workers (applied within one poll); returns the old target."""
        if not 1 <= workers <= self.settings.max_workers:
            raise ValueError(f"workers must be between 1 and {self.settings.max_workers}, got {workers}")
        previous, self._requested_workers = self._requested_workers, workers
        return previous

    @property
    def workers(self) -> int:
        return self._requested_workers

    def record_commit_outcomes(self, outcomes: list[CommitOutcome]) -> None:
        """Commit results from the source (on the poll thread, inside ``consume``)."""
        if outcomes:
            self._load_changes += 1  # a confirmed commit lowers the uncommitted counts
        self.committer.record_outcomes(outcomes)

    # -- the loop -----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        settings = self.settings
        try:
            self.pool.start()  # the handler's set-up runs here: a failure leaves nothing subscribed
        except BaseException:
            self.source.close()
            raise
        self.source.subscribe(settings.topics, self._on_assign, self._on_revoke, self._on_lost)
        self._publish_snapshot(self.clock())  # readiness must see the source's reachability, not a default
        self.started.set()
        log.info(
            "consuming %s with %d %s-ordered %s workers",
            ",".join(settings.topics),
            self.pool.size,
            self.ordering.value,
            self.pool.executor,
        )
        next_snapshot = self._loop_started = self.clock()
        try:
            while not stop.is_set():
                self.last_iteration = self.clock()
                self._collect_completions()
                if self.pool.health.crashed:
                    raise WorkerCrashed(self.pool.health.crashed)
                self._apply_resize()
                messages = self._read()
                if messages:
                    self._dispatch(messages, self.clock())
                now = self.clock()
                self.committer.periodic(self.partitions.values(), now)
                if now >= self._next_place_check:
                    self._fetch_where_the_client_lost_its_place()
                    self._next_place_check = now + settings.commit_interval
                if now >= next_snapshot:
                    self._publish_snapshot(now)
                    next_snapshot = now + settings.snapshot_interval
        finally:
            self._shutdown()

    def _read(self) -> list:
        """Take what the client has; or, while flow control holds or pauses, wait for the workers.

        While a partition is full in flight within its hold, the loop does not call the client: its
        prefetched messages stay queued there, and reading goes on as soon as enough messages have
        finished. While every partition is paused (each on its own bounds, or all of them at the
        pod's ceiling), a non-blocking call serves the client's rebalance callbacks. Either way the
        loop then waits for the completions that can end the hold or a pause, not a fixed poll
        timeout: the workers must not run dry meanwhile. While only some partitions are paused, a
        short timeout keeps their resumes prompt; such a turn with nothing new costs no flow
        decision (``_apply_flow``).
        """
        settings, clock = self.settings, self.clock
        capacity, decision = self._apply_flow()
        hold = decision.hold
        if hold is not None and not self._holding:
            self._holds += 1
        self._holding = hold is not None
        all_paused = self.flow.all_paused(len(self.partitions))
        started = clock()
        # without a partition the call only serves the group join, whatever handlers a revoke left running
        if not self.partitions or (hold is None and not all_paused):
            timeout = min(settings.poll_timeout, PARTLY_PAUSED_TIMEOUT) if self.flow.paused else settings.poll_timeout
            asked = min(settings.poll_batch, capacity)  # capacity: at least 1
            messages = self.source.consume(asked, timeout)
            self._reading += clock() - started
            if len(messages) < asked:
                self._drained_at = started
            return messages
        if all_paused:
            messages = self.source.consume(1, 0)
            if messages:  # librdkafka dropped the paused partitions' prefetch: rare, but never lose one
                self._reading += clock() - started
                return messages
        wait = settings.poll_timeout if hold is None else min(settings.poll_timeout, hold)
        self.completions.wait(decision.release_after, wait)
        self._waiting += clock() - started
        return []

    def _dispatch(self, messages: list, now: float) -> None:
        """Record, route and hand to the pool what ``consume`` returned, a run of one partition at a time.

        The client hands out one partition's fetched records after another, so a batch is a few runs. A run
        in the plain case (each record above the last received, of the leader epoch known, none to skip by
        the commit metadata: ``PartitionOffsets.received_run``) is recorded and routed in one step; any other
        run goes record by record (``_receive_each``)."""
        self._load_changes += 1
        partitions = self.partitions
        lanes_of = self._lanes_of
        deliveries: list[Delivery] = []
        refetching: set[TopicPartitionId] = set()  # partitions sent back to an earlier offset (EpochGap)
        for partition_id, grouped in itertools.groupby(messages, _PARTITION_ID):
            state = partitions.get(partition_id)
            if state is None or state.revoked or partition_id in refetching:
                continue  # no longer ours (the new owner fetches it again), or fetched again
            run = list(grouped)
            first = run[0].offset
            state.receive_times.mark(first, now)
            state.sought_at = None  # a record: the client knows its position again
            offsets = state.offsets
            if offsets.last_received is None and offsets.start is not None and first < offsets.start:
                log.warning(
                    "%s[%d]: offset reset: committed offset %d but received %d below it (topic recreated or "
                    "truncated?); tracking and committing from %d",
                    *partition_id,
                    offsets.start,
                    first,
                    first,
                )
            if not offsets.received_run(list(map(_OFFSET, run)), list(map(_LEADER_EPOCH, run))):
                run, deliveries, fetched_again = self._receive_each(state, run, deliveries, now)
                if fetched_again:
                    refetching.add(partition_id)
            if not run:
                continue
            lanes = lanes_of(partition_id, list(map(_KEY, run)))
            if len(lanes) != len(run):
                raise RuntimeError(f"routing gave {len(lanes)} lanes for {len(run)} messages of {partition_id}")
            deliveries += map(Delivery, run, lanes, itertools.repeat(state), itertools.repeat(now))
            state.outstanding += len(run)
        if deliveries:
            self.inflight += len(deliveries)
            self.pool.submit(deliveries)

    def _receive_each(
        self, state: PartitionState, run: list, deliveries: list[Delivery], now: float
    ) -> tuple[list, list[Delivery], bool]:
        """``PartitionOffsets.received`` for each record of a partition's run, in order: the records to process,
        the batch's deliveries so far without those a log truncation let go (``LogTruncated``), and whether the
        partition is fetched again from an earlier offset (``EpochGap``: the records from the one that raised it
        on are not taken; they arrive again)."""
        offsets = state.offsets
        fresh: list = []
        for message in run:
            try:
                taken = offsets.received(message.offset, message.leader_epoch)
            except LogTruncated as truncated:
                deliveries = self._log_truncated(state, truncated, deliveries, now)
                fresh = [kept for kept in fresh if not offsets.is_stale(kept.offset, kept.leader_epoch)]
                taken = offsets.received(message.offset, message.leader_epoch)
            except EpochGap as gap:
                state.receive_times.unmark(message.offset)  # the run's mark, if nothing of it was taken
                self._fetch_again(state, gap)
                return fresh, deliveries, True
            if taken:
                fresh.append(message)
            elif offsets.skipped != state.skipped_counted:  # marked done by the commit metadata, not a re-delivery
                self._skipped += offsets.skipped - state.skipped_counted
                state.skipped_counted = offsets.skipped
        return fresh, deliveries, False

    def _log_truncated(
        self, state: PartitionState, truncated: LogTruncated, batch: list[Delivery], now: float
    ) -> list[Delivery]:
        """A record at an offset already received, of a greater leader epoch: the partition's log was truncated
        there and refilled (an unclean leader election; librdkafka's KIP-320 validation moved the fetch position
        back to the truncation point). The tracker forgets what it received from there on and its commit
        position moves back; the old log's messages from there on that have not started are withdrawn (queued
        or parked, and those of this batch); the running ones finish, and their completions are ignored
        (``PartitionOffsets.completed``). Returns the batch without them."""
        offsets = state.offsets
        position = offsets.commit_position
        offsets.truncate(truncated.offset, truncated.leader_epoch)
        state.receive_times.truncate(truncated.offset, now)
        stale = offsets.is_stale
        kept = [
            delivery
            for delivery in batch
            if delivery.partition is not state or not stale(delivery.message.offset, delivery.message.leader_epoch)
        ]
        state.outstanding -= len(batch) - len(kept)
        self._hand_back(
            self.pool.withdraw(
                lambda delivery: (
                    delivery.partition is state and stale(delivery.message.offset, delivery.message.leader_epoch)
                )
            )
        )
        log.warning(
            "%s[%d]: log truncated at offset %d (a record of the greater leader epoch %d at an offset already "
            "received: an unclean leader election?); the old log's messages from there on are dropped, the "
            "new records processed, and the commit position moves back from %s to %s",
            *state.id,
            truncated.offset,
            truncated.leader_epoch,
            position,
            offsets.commit_position,
        )
        return kept

    def _fetch_again(self, state: PartitionState, gap: EpochGap) -> None:
        """A record of a greater leader epoch arrived above the next expected offset: the client may have purged
        records below a truncation point that it had prefetched (``core.tracking.EpochGap``). The partition's
        rest of the batch is dropped (by the caller) and it is fetched again from the expected offset, with the
        epoch received so far, which librdkafka validates (a seek: ``Source.resume`` with a position). A
        partition paused by flow control stays paused: its resume seeks to that same position."""
        log.info(
            "%s[%d]: offset %d arrived under a greater leader epoch while %d was expected (a truncation that "
            "dropped prefetched records, or a leader change after a gap); fetching again from %d, validated "
            "with leader epoch %d",
            *state.id,
            gap.offset,
            gap.resume_at,
            gap.resume_at,
            gap.leader_epoch,
        )
        if state.id not in self.flow.paused:
            self._resume({state.id: FetchPosition(gap.resume_at, gap.leader_epoch)})

    def _fetch_where_the_client_lost_its_place(self) -> None:
        """Partitions whose position the client no longer knows though the pod read them
        (``PartitionState.lost_place``), checked every commit interval: librdkafka sought them by itself. It does
        so on a log truncation below its *fetch* position (``core.tracking``'s module docstring), purging what it
        had prefetched, those records below the truncation point too, and its position stays unknown until it
        hands out a record. When the new log has no record past the truncation point yet, no record comes to tell
        the pod (``EpochGap`` needs one): the purged records would wait for good, whether the purge came after
        the pod's last record or after the pod's own seek, and whether a key of the partition holds messages in
        flight (a blocked one) or none. So the partition is sought back to where the pod is, with the leader
        epoch it knows, which librdkafka validates (a truncation below it moves it to the truncation point, and
        ``LogTruncated`` follows). Not while the loop holds (it reads nothing, so no record could come), the
        partition is paused (its resume seeks the same way) or no broker answers."""
        if self._holding or not self.source.broker_reachable:
            return
        read = [
            state
            for state in self.partitions.values()
            if state.offsets.last_received is not None
            and not (state.revoked or state.dropped or state.id in self.flow.paused)
        ]
        if not read:
            return
        positions = self.source.positions([state.id for state in read])
        now = self.clock()
        for state in read:
            if state.id not in positions:  # the client could not say: nothing to go on
                continue
            position = positions[state.id]
            high_watermark = self.source.high_watermark(state.id) if position is None else None
            if not state.lost_place(position, high_watermark, self._drained_at):
                continue
            fetch_position = self._fetch_position(state.offsets)
            if fetch_position is None:
                continue
            if state.sought_at is None:
                why = "no position, and the pod did not seek it"
            else:
                why = (
                    f"none of its records in {now - state.sought_at:.1f} s since the pod sought it, though the "
                    f"client has handed out all it held and the broker has records up to {high_watermark}"
                )
            log.info(
                "%s[%d]: the client lost its place (%s): a truncation that dropped prefetched records? Fetching "
                "again from %d, validated with leader epoch %s",
                *state.id,
                why,
                fetch_position.offset,
                fetch_position.leader_epoch,
            )
            self._resume({state.id: fetch_position})

    def _resume(self, positions: dict[TopicPartitionId, FetchPosition | None]) -> None:
        """Resume fetching, seeking where a position is given; a sought partition is marked so until its next
        record (``PartitionState.sought_at``: the client knows no position for it meanwhile)."""
        self.source.resume(positions)
        now = self.clock()
        for partition_id, position in positions.items():
            if position is not None:
                self.partitions[partition_id].sought_at = now

    def _collect_completions(self) -> None:
        """Mark what the workers finished completed in its partition's offsets (handed-back deliveries only
        leave the in-flight counts), a run of one partition's finished messages at a time: workers take heads
        in arrival order, and arrival comes a partition's fetch at a time, so a batch call's messages come back
        in a few such runs (``PartitionOffsets.completed_all``)."""
        completions = self.completions
        if not completions:
            return
        # as many as are there now (workers may append meanwhile: next turn's), popped in C
        entries = list(itertools.starmap(completions.popleft, itertools.repeat(_NO_ARGUMENTS, len(completions))))
        self.inflight -= len(entries)
        self._load_changes += 1
        deliveries = list(map(_FIRST, entries))
        runs: Iterable[tuple[PartitionState, bool, list[Delivery]]]
        if all(map(_SECOND, entries)):  # the common case, every one handled: runs of one partition
            runs = ((state, True, list(run)) for state, run in itertools.groupby(deliveries, _PARTITION))
        else:  # and of one outcome
            keyed = zip(zip(map(_PARTITION, deliveries), map(_SECOND, entries), strict=True), deliveries, strict=True)
            by_outcome = itertools.groupby(keyed, _FIRST)
            runs = ((state, handled, list(map(_SECOND, run))) for (state, handled), run in by_outcome)
        handled_runs = []
        for state, handled, finished in runs:
            state.outstanding -= len(finished)  # every count first: an offset error below leaves none behind
            if handled and not state.dropped:
                handled_runs.append((state, finished))
        for state, finished in handled_runs:
            offsets = state.offsets
            if offsets.truncated:  # some may be of the old log (stale): each is asked
                for delivery in finished:
                    message = delivery.message
                    if offsets.completed(message.offset, message.leader_epoch):
                        state.completed += 1
                continue
            offsets.completed_all(list(map(_MESSAGE_OFFSET, finished)))
            state.completed += len(finished)

    def _hand_back(self, deliveries: list[Delivery]) -> None:
        """Deliveries withdrawn from the scheduler unprocessed: no longer in flight, offsets untouched."""
        if not deliveries:
            return
        for delivery in deliveries:
            delivery.partition.outstanding -= 1
        self.inflight -= len(deliveries)
        self._load_changes += 1

    def _apply_resize(self) -> None:
        target = self._requested_workers
        if target != self.pool.size:
            log.info("resizing key workers %d -> %d (takes effect on the next message)", self.pool.size, target)
            self.pool.resize(target)

    def _loads(self) -> tuple[dict[TopicPartitionId, Load], Load]:
        loads = {pid: Load(state.offsets.inflight, state.offsets.uncommitted) for pid, state in self.partitions.items()}
        return loads, Load(self.inflight, sum(load.uncommitted for load in loads.values()))

    def _decision_inputs(self) -> tuple[int, int, int]:
        """Changes to the loads, and commits sent or failed (a synchronous result confirms inside ``commit``)."""
        return self._load_changes, self.committer.commits, self.committer.failures

    def _apply_flow(self) -> tuple[int, FlowDecision[TopicPartitionId]]:
        """Pause/resume partitions by their loads; how many messages may be taken now, and the decision.

        Deciding is O(partitions), and while some partitions are paused the loop turns every
        ``PARTLY_PAUSED_TIMEOUT``. So the last decision stands, and is neither remade nor re-applied,
        while nothing it was made from changed (``_decision_inputs``) and it has no time limit:
        ``FlowControl.decide`` changes its answer over time only by ending a hold, and a decision
        with a hold is remade each turn. So is one made under commit pressure whose early commit
        its pacing put off: that commit is still to be sent.
        """
        standing = self._standing
        if standing is not None and standing.made_from == self._decision_inputs():
            return standing.capacity, standing.decision
        loads, pod = self._loads()
        now = self.clock()
        pressure = self.flow.commit_pressure(loads, pod)
        committed_early = self.committer.early(self.partitions.values(), now, pressure)
        if committed_early:
            loads, pod = self._loads()
        decision = self.flow.decide(loads, pod, now)
        if self.flow.at_ceiling != self._at_ceiling:
            self._log_ceiling(pod)
        if decision.to_pause:
            for pid in decision.to_pause:
                self.partitions[pid].pauses += 1
            self.source.pause(decision.to_pause)
        if decision.to_resume:
            self._resume({pid: self._fetch_position(self.partitions[pid].offsets) for pid in decision.to_resume})
        capacity = self.flow.capacity(pod)
        if decision.hold is None and (committed_early or not pressure):
            applied = replace(decision, to_pause=[], to_resume=[])
            self._standing = _StandingDecision(self._decision_inputs(), capacity, applied)
        else:
            self._standing = None
        return capacity, decision

    @staticmethod
    def _fetch_position(offsets: PartitionOffsets) -> FetchPosition | None:
        """Where a resumed partition fetches next, with the leader epoch of the last record received (or of the
        committed offset), so that the client validates it against a truncation while it was paused."""
        next_fetch = offsets.next_fetch
        return FetchPosition(next_fetch, offsets.leader_epoch) if next_fetch is not None else None

    def _log_ceiling(self, pod: Load) -> None:
        self._at_ceiling = self.flow.at_ceiling
        ceiling = self.flow.ceiling
        if self._at_ceiling:
            log.warning(
                "flow control: the pod holds %d messages in flight and %d uncommitted, at its ceiling (%d and %d: "
                "%d x --max-inflight and --max-uncommitted); every partition is paused until the pod is one "
                "partition bound below it. Partitions that cannot drain (blocked keys, long retries, hung "
                "handlers) hold it; keyorder_partition_inflight_messages and _uncommitted_messages show which",
                pod.inflight,
                pod.uncommitted,
                ceiling.inflight,
                ceiling.uncommitted,
                CEILING,
            )
        else:
            log.info(
                "flow control: the pod is back under its ceiling (%d in flight, %d uncommitted); reading again",
                pod.inflight,
                pod.uncommitted,
            )

    # -- rebalance callbacks (run inside consume, on the poll thread) --------------------------------
    def _on_assign(self, partition_ids: list[TopicPartitionId]) -> None:
        self._rebalances += 1
        self._load_changes += 1
        if partition_ids:
            self._assignment_changed_at = self.clock()
        if partition_ids and self._emptied_at is not None:
            self._rebalance_idle += self.clock() - self._emptied_at
            self._emptied_at = None
        committed = self._committed_with_retries(partition_ids) if partition_ids else {}
        for partition_id in partition_ids:
            offset, metadata = committed.get(partition_id, (None, None))
            decoded = offset_metadata.decode_checked(metadata, offset) if offset is not None else None
            prior_done = decoded.done if decoded is not None else set()
            prior_epoch = decoded.leader_epoch if decoded is not None else None
            if decoded is not None and decoded.refused:
                log.warning(
                    "%s[%d]: commit metadata ignored (%s); the offsets it marked done are processed again",
                    *partition_id,
                    decoded.refused,
                )
            offsets = PartitionOffsets(offset, prior_done, prior_epoch)
            self.partitions[partition_id] = PartitionState(partition_id, offsets)
            log.info(
                "assigned %s[%d] from offset %s%s",
                *partition_id,
                offset if offset is not None else "reset",
                f" ({len(prior_done)} offsets above it already done)" if prior_done else "",
            )

    def _committed_with_retries(
        self, partition_ids: list[TopicPartitionId], attempts: int = 3
    ) -> dict[TopicPartitionId, tuple[int | None, str | None]]:
        for attempt in range(1, attempts + 1):
            try:
                return self.source.committed(partition_ids, self.settings.broker_timeout)
            except SourceError as error:
                if attempt == attempts:
                    raise SourceError(
                        f"could not read the committed offsets of the assigned partitions "
                        f"after {attempts} attempts: {error}"
                    ) from error
                log.warning("reading committed offsets failed (attempt %d/%d), retrying: %s", attempt, attempts, error)
                self.sleep(attempt)
        raise AssertionError("unreachable")

    def _on_revoke(self, partition_ids: list[TopicPartitionId]) -> None:
        """Hand back what has not started, let the running handlers finish (bounded), commit, let go.

        Queued and parked deliveries of the revoked partitions are withdrawn from the scheduler at
        once: the new owner receives them from the committed offset (the lowest unfinished one), so
        a rebalance waits only for the handlers that are actually running, never for a retry's
        backoff or a queue.
        """
        self._rebalances += 1
        states = [self.partitions[pid] for pid in partition_ids if pid in self.partitions]
        for state in states:
            state.revoked = True
        self._hand_back(self.pool.withdraw(lambda delivery: delivery.partition.revoked))
        if not self._closing:
            deadline = self.clock() + self.settings.revoke_drain_timeout
            self._collect_completions()
            while any(state.outstanding for state in states) and self.clock() < deadline:
                self.sleep(0.002)
                self._collect_completions()
            still_running = sum(state.outstanding for state in states)
            if still_running:
                log.warning(
                    "revoke: %d messages still in a handler after %.0fs; the new owner re-delivers them from "
                    "the committed offset",
                    still_running,
                    self.settings.revoke_drain_timeout,
                )
        self.committer.commit(states, asynchronous=False)
        self._drop(partition_ids)

    def _on_lost(self, partition_ids: list[TopicPartitionId]) -> None:
        """Partitions lost without a clean revoke: another member may own them already; never commit."""
        self._rebalances += 1
        log.warning("lost partitions %s; their in-flight work is abandoned", partition_ids)
        self._drop(partition_ids)

    def _drop(self, partition_ids: Iterable[TopicPartitionId]) -> None:
        partition_ids = list(partition_ids)
        self._load_changes += 1
        for pid in partition_ids:
            state = self.partitions.pop(pid, None)
            if state is not None:
                state.revoked = state.dropped = True
                self._partitions_revoked += 1
        if partition_ids:
            self._assignment_changed_at = self.clock()
        if partition_ids and not self.partitions and not self._closing:
            self._emptied_at = self.clock()
        self._hand_back(self.pool.withdraw(lambda delivery: delivery.partition.dropped))
        # librdkafka keeps a partition's pause flag across rebalances: clear it, or a later
        # re-assignment of the same partition to this pod would never fetch
        still_paused = [pid for pid in partition_ids if pid in self.flow.paused]
        if still_paused:
            self.source.resume(dict.fromkeys(still_paused))
        self.flow.forget(partition_ids)
        log.info("released %s", ", ".join(f"{topic}[{partition}]" for topic, partition in partition_ids))

    # -- shutdown -------------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Let what can still finish finish (within the grace), hand back the rest, commit, close.

        The wait ends as soon as nothing in flight can finish within the grace: no handler is running,
        no lane is ready to run, and no retry is due before the deadline (``LaneSummary.next_retry_due``,
        on the pool's clock, which is this loop's). What is left then is parked for a retry due after
        the grace, or blocked (``onExhausted: block``, whose retries only succeed once what blocks it
        is fixed): waiting for it would only spend the grace. ``pool.stop`` hands it back, and the
        final commit stays at its offset, so the next owner runs it again.
        """
        self.stopping = True
        self.pool.begin_shutdown()  # no batch waits to fill within the grace
        self.committer.learn_client_positions = False  # what the client read past now is no one's to skip
        settings, clock = self.settings, self.clock
        deadline = clock() + settings.shutdown_grace
        log.info("shutting down: waiting up to %.0fs for %d in-flight messages", settings.shutdown_grace, self.inflight)
        next_look = clock()
        self._collect_completions()
        while self.inflight and (now := clock()) < deadline:
            if now >= next_look:  # the lanes are O(lanes) to count, under the pool's lock: not every turn
                lanes = self.pool.lane_summary()
                retry_due = lanes.next_retry_due
                if not lanes.running and not lanes.ready and (retry_due is None or retry_due >= deadline):
                    log.info(
                        "shutdown: no handler is running, no lane is ready and no retry is due within the grace; "
                        "not waiting for the %d lanes parked for a retry (%d of them blocked)",
                        lanes.parked,
                        lanes.blocked,
                    )
                    break
                next_look = now + SHUTDOWN_LOOK_INTERVAL
            self.sleep(SHUTDOWN_POLL_INTERVAL)
            self._collect_completions()
            self.committer.periodic(self.partitions.values(), clock())
        self.pool.stop(max(deadline - clock(), 0.5))
        self._collect_completions()
        if self.inflight:
            log.warning("shutdown: %d in-flight messages abandoned; they are re-delivered after restart", self.inflight)
        self.committer.commit(self.partitions.values(), asynchronous=False)
        self._closing = True
        self.source.close()
        self._publish_snapshot(clock())
        log.info("stopped")

    # -- observability --------------------------------------------------------------------------------
    def _publish_snapshot(self, now: float) -> None:
        paused = self.flow.paused
        partitions = []
        for state in list(self.partitions.values()):
            offsets = state.offsets
            committed = state.last_committed[0] if state.last_committed else offsets.start
            partitions.append(
                PartitionSnapshot(
                    topic=state.id[0],
                    partition=state.id[1],
                    committed=committed,
                    high_watermark=self.source.high_watermark(state.id),
                    min_inflight=offsets.min_inflight,
                    oldest_inflight_age=state.receive_times.oldest_age(offsets.min_inflight, now),
                    inflight=offsets.inflight,
                    uncommitted=offsets.uncommitted,
                    paused=state.id in paused,
                    completed=state.completed,
                    resets=state.resets,
                    pauses=state.pauses,
                    fetch_queue=self.source.fetch_queue(state.id),
                )
            )
        self.snapshot = RuntimeSnapshot(
            partitions=tuple(partitions),
            inflight=self.inflight,
            workers=self.pool.size,
            commits=self.committer.commits,
            commit_failures=self.committer.failures,
            rebalances=self._rebalances,
            partitions_revoked=self._partitions_revoked,
            rebalance_idle_seconds=self._rebalance_idle,
            assignment_age=None if self._assignment_changed_at is None else now - self._assignment_changed_at,
            skipped=self._skipped,
            poll_loop_seconds=now - self._loop_started if self._loop_started is not None else 0.0,
            reading_seconds=self._reading,
            waiting_seconds=self._waiting,
            holds=self._holds,
            # optional on a Source: fakes and other brokers' adapters without it count as reachable
            broker_reachable=self.source.broker_reachable,
            broker_error=self.source.broker_error,
            assigned_partitions=sum(1 for state in self.partitions.values() if not state.revoked),
        )
