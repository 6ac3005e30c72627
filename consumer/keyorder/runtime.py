"""The poll loop of a keyorder pod: the one thread that owns offsets, routing and flow control.

Data flow: ``consume`` a batch -> record each offset (``PartitionOffsets.received``) -> route it
to a lane and a worker slot (``LaneAffinity``) -> hand per-slot batches to the pool -> workers
append finished deliveries to ``completions`` -> this loop marks them completed and commits each
partition's lowest unfinished offset, periodically, on revoke and on shutdown.

Threading: everything here runs on the poll-loop thread, rebalance callbacks included (they run
inside ``consume``). Other threads only call ``request_resize`` (an int assignment) and read
``snapshot``, an immutable object the loop republishes every ``snapshot_interval``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from keyorder.contracts import CommitError, CommitOutcome, Source, SourceError, TopicPartitionId
from keyorder.core import offset_metadata
from keyorder.core.flow import FlowControl, FlowLimits, Load
from keyorder.core.routing import KeyRouter, LaneAffinity
from keyorder.core.scheduling import Delivery
from keyorder.core.tracking import PartitionOffsets, ReceiveTimes
from keyorder.workers import Completions, WorkerCrashed, WorkerPool

log = logging.getLogger(__name__)

EARLY_COMMIT_SPACING = 0.1
"""Seconds between commits made early because the uncommitted window is half full (each commit
encodes metadata and is a broker request: once per poll batch would be wasteful)."""


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
    """Seconds in-flight messages may take to finish on shutdown (keep below the pod's grace period)."""
    max_workers: int = 4096
    """Upper bound for a live resize."""
    snapshot_interval: float = 0.5
    """Seconds between refreshes of the metrics snapshot."""
    broker_timeout: float = 10.0
    """Seconds to wait for the broker in blocking calls (committed offsets, synchronous commit)."""


class PartitionState:
    """What the pod knows about one assigned partition."""

    __slots__ = ("completed", "dropped", "id", "last_committed", "offsets", "outstanding", "receive_times", "revoked")

    def __init__(self, partition_id: TopicPartitionId, offsets: PartitionOffsets) -> None:
        self.id = partition_id
        self.offsets = offsets
        self.receive_times = ReceiveTimes()
        self.revoked = False
        """Set when the partition is being revoked: workers skip its messages that have not started."""
        self.dropped = False
        """Set once the pod has let the partition go: late completions no longer touch its offsets."""
        self.outstanding = 0
        """Deliveries handed to workers and not yet returned (finished or abandoned)."""
        self.last_committed: tuple[int, int] | None = None  # (position, completed-above count)
        self.completed = 0


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
    pinned_lanes: int = 0
    commits: int = 0
    commit_failures: int = 0
    rebalances: int = 0
    skipped: int = 0
    """Messages not run because the commit metadata said they were already done."""


class ConsumerRuntime:
    """Runs the poll loop until ``stop`` is set, then shuts down gracefully."""

    def __init__(
        self,
        settings: RuntimeSettings,
        source: Source,
        pool: WorkerPool,
        router: KeyRouter,
        completions: Completions,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.source = source
        self.pool = pool
        self.router = router
        self.affinity = LaneAffinity(router)
        self.completions = completions
        self.clock = clock
        self.flow = FlowControl(settings.flow)
        self.partitions: dict[TopicPartitionId, PartitionState] = {}
        self.inflight = 0
        self.snapshot = RuntimeSnapshot(workers=router.workers)
        self.started = threading.Event()
        self.stopping = False
        self.last_iteration = clock()
        self._requested_workers = router.workers
        self._closing = False
        self._next_early_commit = clock()
        self._retiring: set[int] = set()
        self._commits = self._commit_failures = self._rebalances = self._skipped = 0

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
        """Commit results (on the poll thread): confirm positions, or force a retry on failure."""
        failures = []
        for partition_id, offset, error in outcomes:
            state = self.partitions.get(partition_id)
            if error is None:
                if state is not None and offset >= 0:
                    state.offsets.commit_confirmed(offset)
                continue
            failures.append(f"{partition_id[0]}[{partition_id[1]}]@{offset}: {error}")
            if state is not None:
                state.offsets.commit_failed(offset)
                state.last_committed = None  # the next periodic commit sends it again
        if failures:
            self._commit_failures += 1
            log.warning("offset commit failed (the next commit retries): %s", "; ".join(failures))

    # -- the loop -----------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        settings = self.settings
        self.source.subscribe(settings.topics, self._on_assign, self._on_revoke, self._on_lost)
        self.pool.start()
        self.started.set()
        log.info(
            "consuming %s with %d %s-ordered workers",
            ",".join(settings.topics),
            self.router.workers,
            self.router.ordering.value,
        )
        next_commit = next_snapshot = self.clock()
        try:
            while not stop.is_set():
                now = self.clock()
                self.last_iteration = now
                self._collect_completions()
                if self.pool.health.crashed:
                    raise WorkerCrashed(self.pool.health.crashed)
                self._apply_resize()
                capacity = self._apply_flow()
                if capacity:
                    messages = self.source.consume(min(settings.poll_batch, capacity), settings.poll_timeout)
                else:  # every partition is paused: this call only serves rebalance callbacks
                    messages = self.source.consume(1, 0.01)
                if messages:
                    self._dispatch(messages, self.clock())
                now = self.clock()
                if now >= next_commit:
                    self._commit(self.partitions.values(), asynchronous=True)
                    next_commit = now + settings.commit_interval
                if now >= next_snapshot:
                    self._publish_snapshot(now)
                    next_snapshot = now + settings.snapshot_interval
        finally:
            self._shutdown()

    def _dispatch(self, messages: list, now: float) -> None:
        partitions = self.partitions
        lane_of, assign = self.router.lane, self.affinity.assign
        batches: dict[int, list[Delivery]] = {}
        state = None
        dispatched = 0
        for message in messages:
            partition_id = (message.topic, message.partition)
            if state is None or state.id != partition_id:
                state = partitions.get(partition_id)
                if state is None or state.revoked:  # no longer ours: the new owner fetches it again
                    state = None
                    continue
                state.receive_times.mark(message.offset, now)
            if not state.offsets.received(message.offset):
                self._skipped += 1
                continue
            lane = lane_of(message.topic, message.partition, message.key)
            slot = assign(lane)
            delivery = Delivery(message, lane, slot, state, now)
            state.outstanding += 1
            batch = batches.get(slot)
            if batch is None:
                batches[slot] = [delivery]
            else:
                batch.append(delivery)
            dispatched += 1
        self.inflight += dispatched
        if batches:
            self.pool.submit(batches)

    def _collect_completions(self) -> None:
        completions, release = self.completions, self.affinity.release
        finished = 0
        while completions:
            delivery, handled = completions.popleft()
            release(delivery.lane, delivery.slot)
            finished += 1
            state = delivery.partition
            state.outstanding -= 1
            if handled and not state.dropped:
                state.offsets.completed(delivery.message.offset)
                state.completed += 1
        self.inflight -= finished

    def _apply_resize(self) -> None:
        target = self._requested_workers
        if target != self.router.workers:
            log.info(
                "resizing key workers %d -> %d (in-flight keys finish on their current worker)",
                self.router.workers,
                target,
            )
            self.router.workers = target
            self.pool.resize(target)
            self._retiring = set(self.pool.retiring_slots())
        if self._retiring:  # only while a shrink is in progress: retire workers once they hold nothing
            for slot in [slot for slot in self._retiring if slot not in self.affinity.slot_load]:
                self.pool.retire(slot)
                self._retiring.discard(slot)

    def _loads(self) -> tuple[dict[TopicPartitionId, Load], Load]:
        loads = {pid: Load(state.offsets.inflight, state.offsets.uncommitted) for pid, state in self.partitions.items()}
        return loads, Load(self.inflight, sum(load.uncommitted for load in loads.values()))

    def _apply_flow(self) -> int:
        """Pause/resume partitions by their loads; returns how many messages may be taken now."""
        loads, pod = self._loads()
        now = self.clock()
        if now >= self._next_early_commit and self.flow.commit_pressure(loads, pod):
            self._commit(self.partitions.values(), asynchronous=True, only_if_moved=True)
            self._next_early_commit = now + min(self.settings.commit_interval, EARLY_COMMIT_SPACING)
            loads, pod = self._loads()
        to_pause, to_resume = self.flow.decide(loads, pod)
        if to_pause:
            self.source.pause(to_pause)
        if to_resume:
            self.source.resume({pid: self.partitions[pid].offsets.next_fetch for pid in to_resume})
        return self.flow.capacity(pod)

    # -- commits ----------------------------------------------------------------------------------
    def _commit(self, states: Iterable[PartitionState], asynchronous: bool, only_if_moved: bool = False) -> None:
        """Commit each partition's lowest unfinished offset, with its completed-above set as metadata.

        Partitions whose position and completed set are unchanged are skipped; ``only_if_moved``
        also skips those whose position did not move (early commits under backpressure).
        """
        offsets: dict[TopicPartitionId, tuple[int, str]] = {}
        marks = []
        for state in states:
            position = state.offsets.commit_position
            if position is None:
                continue
            if only_if_moved and state.last_committed and state.last_committed[0] == position:
                continue
            done = state.offsets.completed_above_position()
            mark = (position, len(done))
            if mark == state.last_committed:
                continue
            offsets[state.id] = (position, offset_metadata.encode(position, done))
            marks.append((state, mark))
        if not offsets:
            return
        for state, _mark in marks:
            state.offsets.commit_sent()
        try:
            outcomes = self.source.commit(offsets, asynchronous=asynchronous)
        except CommitError as error:  # e.g. a rebalance is in progress: the next commit retries
            self.record_commit_outcomes([(state.id, mark[0], str(error)) for state, mark in marks])
            return
        self._commits += 1
        for state, mark in marks:
            state.last_committed = mark
        self.record_commit_outcomes(outcomes)

    # -- rebalance callbacks (run inside consume, on the poll thread) --------------------------------
    def _on_assign(self, partition_ids: list[TopicPartitionId]) -> None:
        self._rebalances += 1
        committed = self._committed_with_retries(partition_ids) if partition_ids else {}
        for partition_id in partition_ids:
            offset, metadata = committed.get(partition_id, (None, None))
            prior_done = offset_metadata.decode(metadata, offset) if offset is not None else set()
            self.partitions[partition_id] = PartitionState(partition_id, PartitionOffsets(offset, prior_done))
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
                time.sleep(attempt)
        raise AssertionError("unreachable")

    def _on_revoke(self, partition_ids: list[TopicPartitionId]) -> None:
        """Stop starting their messages, let the running ones finish (bounded), commit, let go.

        Queued messages that have not started are not run here: the new owner receives them from
        the committed offset (the lowest unfinished one), so a rebalance takes as long as the
        longest running handler, not as long as the queue.
        """
        self._rebalances += 1
        states = [self.partitions[pid] for pid in partition_ids if pid in self.partitions]
        for state in states:
            state.revoked = True
        if not self._closing:
            deadline = self.clock() + self.settings.revoke_drain_timeout
            while any(state.outstanding for state in states) and self.clock() < deadline:
                time.sleep(0.002)
                self._collect_completions()
            still_running = sum(state.outstanding for state in states)
            if still_running:
                log.warning(
                    "revoke: %d messages still in a handler or waiting for a retry after %.0fs; the "
                    "new owner re-delivers them from the committed offset",
                    still_running,
                    self.settings.revoke_drain_timeout,
                )
        self._commit(states, asynchronous=False)
        self._drop(partition_ids)

    def _on_lost(self, partition_ids: list[TopicPartitionId]) -> None:
        """Partitions lost without a clean revoke: another member may own them already; never commit."""
        self._rebalances += 1
        log.warning("lost partitions %s; their in-flight work is abandoned", partition_ids)
        self._drop(partition_ids)

    def _drop(self, partition_ids: Iterable[TopicPartitionId]) -> None:
        partition_ids = list(partition_ids)
        for pid in partition_ids:
            state = self.partitions.pop(pid, None)
            if state is not None:
                state.revoked = state.dropped = True
        # librdkafka keeps a partition's pause flag across rebalances: clear it, or a later
        # re-assignment of the same partition to this pod would never fetch
        still_paused = [pid for pid in partition_ids if pid in self.flow.paused]
        if still_paused:
            self.source.resume(dict.fromkeys(still_paused))
        self.flow.paused.difference_update(partition_ids)
        log.info("released %s", ", ".join(f"{topic}[{partition}]" for topic, partition in partition_ids))

    # -- shutdown -------------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        self.stopping = True
        settings = self.settings
        deadline = self.clock() + settings.shutdown_grace
        log.info("shutting down: waiting up to %.0fs for %d in-flight messages", settings.shutdown_grace, self.inflight)
        next_commit = self.clock()
        while self.inflight and self.clock() < deadline:
            time.sleep(0.005)
            self._collect_completions()
            if self.clock() >= next_commit:
                self._commit(self.partitions.values(), asynchronous=True)
                next_commit = self.clock() + settings.commit_interval
        self.pool.stop(max(deadline - self.clock(), 0.5))
        self._collect_completions()
        if self.inflight:
            log.warning("shutdown: %d in-flight messages abandoned; they are re-delivered after restart", self.inflight)
        self._commit(self.partitions.values(), asynchronous=False)
        self._closing = True
        self.source.close()
        self._publish_snapshot(self.clock())
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
                )
            )
        self.snapshot = RuntimeSnapshot(
            partitions=tuple(partitions),
            inflight=self.inflight,
            workers=self.router.workers,
            pinned_lanes=self.affinity.pinned_lanes(),
            commits=self._commits,
            commit_failures=self._commit_failures,
            rebalances=self._rebalances,
            skipped=self._skipped,
        )
