"""A simulated Kafka broker and consumer client: the pod's ``Source`` seam, on the simulation's clock.

The pod simulation runs the real poll loop, lanes, flow control, committer and executors; what it
cannot run is Kafka. ``SimulatedBroker`` keeps the truth a run is judged by (every produced record
with its key and per-key sequence number, every commit with its metadata, time and pod session,
and which member owns which partition), and ``SimulatedSource`` is one pod's consumer on it: a
**fake** implementing ``keyorder.contracts.Source``. Its two halves copy the parts they stand in for:

* the adapter's side copies ``keyorder/adapters/kafka_source.py``: ``KafkaSource.consume`` (the
  records, and consumer error events through the real ``KafkaSource._consume_error``: transient ones
  logged, fatal ones raised as ``SourceError``), ``resume`` (a seek to the offset given),
  ``commit`` (a synchronous commit returns its outcomes or raises ``CommitError``; asynchronous
  results arrive later through ``on_commit_result``), ``_outcomes`` (a per-partition error, else the
  request's), ``committed`` (offsets with their metadata strings; ``SourceError`` on failure) and
  ``close``/``_leave_group`` (a static member leaves explicitly before closing);
* the client's behaviour copies librdkafka (github.com/confluentinc/librdkafka, master as fetched;
  each method's docstring names the file and function it follows).

Everything blocking waits on the simulation (``Simulation.Event().wait``, ``Simulation.sleep``),
never on real time; timers are ``Simulation.call_at`` callbacks, which run on the driver between
two steps of the managed threads. Every method of a source is called from its pod's poll thread;
the broker's own callbacks run on the driver; the simulation runs one of them at a time, so nothing
here needs a lock.

The group is simplified to what the pod can tell apart: members are the pods' sessions (a pod that
restarts joins as a new member) and "another member" (``ELSEWHERE``), which holds a partition the
fault schedule moved away for a while without consuming it, then gives it back.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError

from keyorder.adapters.kafka_source import KafkaSource, broker_assigns
from keyorder.contracts import (
    CommitError,
    CommitOutcome,
    FetchPosition,
    RebalanceCallback,
    SourceError,
    TopicPartitionId,
)
from keyorder.core import offset_metadata
from keyorder.message import Message

log = logging.getLogger("keyorder.simulation.broker")

ELSEWHERE = "another member"
"""The owner of a partition the fault schedule gave to a member outside the simulation."""

LIBRDKAFKA_SESSION_TIMEOUT_MS = 45_000
"""librdkafka's default ``session.timeout.ms`` (src/rdkafka_conf.c); KIP-848's broker default
``group.consumer.session.timeout.ms`` is the same."""
LIBRDKAFKA_MAX_POLL_INTERVAL_MS = 300_000
"""librdkafka's default ``max.poll.interval.ms`` (src/rdkafka_conf.c)."""
MAX_POLL_CHECK_SECONDS = 0.5
"""librdkafka checks ``max.poll.interval.ms`` on a 500 ms timer (``rd_kafka_cgrp_max_poll_interval_check_tmr_cb``)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One produced record, as the broker keeps it (the truth the invariants read)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    chain: str
    """The ordering chain the record belongs to: its key, or ``"<none>"`` for a keyless record."""
    seq: int
    """Its number in the chain, within the partition (0, 1, 2, ...)."""
    ident: int
    """Unique across the run (the handler finds the record by it)."""
    produced_at: float
    log_epoch: int
    """The partition's log generation it was written in (a truncation starts a new one)."""
    poison: bool = False
    """The handler fails on it at every attempt (the workload's decision, kept for the report)."""
    leader_epoch: int = 0
    """The partition's leader epoch it was written in (KIP-320): a truncation starts a greater one, and so
    does a clean leader change (``SimulatedBroker.change_leader``), which truncates nothing."""

    @property
    def tp(self) -> TopicPartitionId:
        return (self.topic, self.partition)

    def describe(self) -> str:
        key = self.key.decode() if self.key is not None else "(no key)"
        return f"{self.topic}[{self.partition}]@{self.offset} key {key} seq {self.seq}"


@dataclass(slots=True)
class CommitRecord:
    """One partition's commit as the broker saw it."""

    session: int
    """The pod session (``SimulatedSource.session``) that sent it."""
    tp: TopicPartitionId
    offset: int
    metadata: str | None
    sent_at: float
    """When the pod sent it: its offset must be safe at this time."""
    asynchronous: bool
    applied_at: float | None = None
    error: str | None = None
    """Why the broker refused it (``None``: stored)."""
    log_epoch: int = 0


class PartitionLog:
    """One partition: its records (offsets from 0), the truncated ones, and its committed offset."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.records: list[Record] = []
        """The current log: ``records[i].offset == i``."""
        self.gone: list[Record] = []
        """Records a truncation removed (never delivered again)."""
        self.epoch = 0
        """The log generation (a truncation starts a new one)."""
        self.truncations: list[tuple[int, int]] = []
        """(generation that ended, its end offset)."""
        self.generations: list[tuple[int, float]] = [(0, 0.0)]
        """(first leader epoch, start time) of each log generation, by generation: a commit carrying a leader
        epoch speaks about the generation that epoch belongs to (the invariants judge it against that log)."""
        self.leader_epoch = 0
        """The partition's current leader epoch: new records are written in it."""
        self.epoch_starts: list[tuple[int, int]] = []
        """(leader epoch, offset of its first record) of the epochs with records in the current log, in order:
        the leader's epoch cache, which answers OffsetForLeaderEpoch (``end_offset_of``)."""
        self.committed: tuple[int, str | None, int] | None = None
        """(offset, metadata, log epoch when committed)."""

    def end_offset_of(self, leader_epoch: int) -> int:
        """The OffsetForLeaderEpoch answer for ``leader_epoch``: the first offset of the first greater epoch in
        the log, else the log's end (Kafka's ``LeaderEpochFileCache.endOffsetFor``)."""
        for epoch, start in self.epoch_starts:
            if epoch > leader_epoch:
                return start
        return self.end

    @property
    def end(self) -> int:
        return len(self.records)


class Member:
    """A consumer-group member (one session of a pod) as the group coordinator sees it."""

    def __init__(self, source: SimulatedSource, number: int) -> None:
        self.source = source
        self.member_id = f"{source.name}-member-{number}"
        self.owned: set[TopicPartitionId] = set()
        self.revoking: set[TopicPartitionId] = set()


@dataclass
class CommitFaults:
    """A window in which the broker refuses commits (the fault schedule sets it)."""

    until: float
    whole_request: bool
    """True: the request fails as a whole (``CommitError``); False: some partitions fail."""
    code: int = KafkaError.REQUEST_TIMED_OUT
    share: float = 0.5
    """Of the partitions (``whole_request`` False), or of the requests, which fail."""


@dataclass
class GroupEvent:
    """Something that happened in the group, for the trace and the report."""

    at: float
    text: str


@dataclass
class Handover:
    """A member that stopped while it owned partitions: until when the broker kept them for it."""

    session: int
    closed_at: float
    kept: set[TopicPartitionId] = field(default_factory=set)
    released_at: float | None = None


class SimulatedBroker:
    """The cluster and the group coordinator of one run, keeping the truth.

    ``protocol``: ``"cooperative"`` (classic protocol, cooperative-sticky: incremental revoke and
    assign, KIP-429), ``"eager"`` (classic, range/roundrobin: every rebalance revokes everything
    first) or ``"consumer"`` (KIP-848: the broker assigns, incrementally).
    """

    def __init__(
        self,
        simulation: Any,
        topics: Mapping[str, int],
        rebalance_delay: tuple[float, float] = (0.005, 0.2),
        commit_latency: tuple[float, float] = (0.001, 0.02),
    ) -> None:
        self.sim = simulation
        self.rng = simulation.rng
        self.logs: dict[TopicPartitionId, PartitionLog] = {
            (topic, partition): PartitionLog(topic, partition)
            for topic, count in topics.items()
            for partition in range(count)
        }
        self.rebalance_delay = rebalance_delay
        self.commit_latency = commit_latency
        self.members: dict[str, Member] = {}
        self.owner: dict[TopicPartitionId, Member | str | None] = dict.fromkeys(self.logs)
        self.elsewhere_until: dict[TopicPartitionId, float] = {}
        self.kept_for_static: dict[TopicPartitionId, tuple[str, float]] = {}
        """Partitions of a static member that left temporarily (KIP-848 epoch -2): (instance id, until)."""
        self.commits: list[CommitRecord] = []
        self.commit_failed_at: dict[int, float] = {}
        """Pod session -> when a commit of it last failed (a request, or one partition)."""
        self.expiries: list[tuple[float, int, list[TopicPartitionId], str]] = []
        """(time, pod session, partitions, why) of every member the group removed without a leave."""
        self.gone_at: dict[int, float] = {}
        """Record identity -> when a truncation removed it."""
        self.gone_in: dict[int, int] = {}
        """Record identity -> the log generation whose truncation removed it (its last generation)."""
        self.skipped: set[int] = set()
        """Records of a truncated log a consumer started past, from a committed offset written before the
        truncation (``start_of``): never delivered, by Kafka's semantics."""
        self.events: list[GroupEvent] = []
        self.handovers: list[Handover] = []
        self.commit_faults: CommitFaults | None = None
        self.down_until = -1.0
        """The brokers are unreachable until then (an outage)."""
        self.sources: list[SimulatedSource] = []
        self.on_produce: list[Callable[[Record], None]] = []
        self._rebalance_due: float | None = None
        self._members_made = 0
        self._idents = 0
        self._chain_seqs: dict[tuple[TopicPartitionId, str], int] = {}

    # -- the cluster ------------------------------------------------------------------------------------
    def now(self) -> float:
        return float(self.sim.clock())

    def note(self, text: str) -> None:
        self.events.append(GroupEvent(self.now(), text))

    @property
    def down(self) -> bool:
        return self.now() < self.down_until

    def produce(self, topic: str, partition: int, key: bytes | None, poison: bool = False) -> Record:
        """Append a record; its value carries its chain, sequence number and identity (JSON)."""
        log_ = self.logs[(topic, partition)]
        chain = key.decode() if key is not None else "<none>"
        chain_key = ((topic, partition), chain)
        seq = self._chain_seqs.get(chain_key, 0)
        self._chain_seqs[chain_key] = seq + 1
        record = Record(
            topic, partition, log_.end, key, chain, seq, self._idents, self.now(), log_.epoch, poison, log_.leader_epoch
        )
        self._idents += 1
        if not log_.epoch_starts or log_.epoch_starts[-1][0] != log_.leader_epoch:
            log_.epoch_starts.append((log_.leader_epoch, record.offset))
        log_.records.append(record)
        for listener in self.on_produce:
            listener(record)
        owner = self.owner[record.tp]
        if isinstance(owner, Member):
            owner.source.wake()
        return record

    @staticmethod
    def value_of(record: Record) -> bytes:
        return json.dumps({"chain": record.chain, "seq": record.seq, "id": record.ident}).encode()

    def truncate(self, tp: TopicPartitionId, to_offset: int) -> list[Record]:
        """The partition's log loses its records from ``to_offset`` on (an unclean leader election; a
        topic recreated is the case ``to_offset=0``), and new records get offsets from there: below the
        committed offset. Clients fetching past it are moved back to ``to_offset`` (``SimulatedSource``)."""
        log_ = self.logs[tp]
        to_offset = max(0, min(to_offset, log_.end))
        removed = log_.records[to_offset:]
        del log_.records[to_offset:]
        log_.gone.extend(removed)
        for record in removed:
            self.gone_at[record.ident] = self.now()
            self.gone_in[record.ident] = log_.epoch
        log_.truncations.append((log_.epoch, to_offset))
        log_.epoch += 1
        log_.leader_epoch += 1  # the unclean leader's epoch: greater than any the log had
        log_.generations.append((log_.leader_epoch, self.now()))
        log_.epoch_starts = [(epoch, start) for epoch, start in log_.epoch_starts if start < to_offset]
        self.note(
            f"log of {tp[0]}[{tp[1]}] truncated at {to_offset}: {len(removed)} records gone "
            f"(leader epoch {log_.leader_epoch})"
        )
        for source in self.sources:
            source.validate_position(tp)
        return removed

    def change_leader(self, tp: TopicPartitionId) -> None:
        """A clean leader change (a broker restarted, a preferred-leader election): the leader epoch grows, the
        log is kept whole. Clients validate their positions against it and keep them."""
        log_ = self.logs[tp]
        log_.leader_epoch += 1
        self.note(f"leader of {tp[0]}[{tp[1]}] changed cleanly (leader epoch {log_.leader_epoch})")
        for source in self.sources:
            source.validate_position(tp)

    def start_of(self, tp: TopicPartitionId, committed: tuple[int, str | None, int] | None) -> int:
        """Where a client starts fetching a partition assigned with ``committed`` as its committed offset.

        As librdkafka: the committed offset, unless it is beyond the log's end, which the fetch answers
        with OFFSET_OUT_OF_RANGE and ``auto.offset.reset=earliest`` (keyorder's default) resets to the log's
        start (src/rdkafka_offset.c ``rd_kafka_offset_reset``); no committed offset: the log's start too.
        keyorder commits offsets with a leader epoch (``KafkaSource.commit``), but librdkafka does not validate a
        committed offset when the fetch starts (src/rdkafka_partition.c ``rd_kafka_toppar_fetch_start``: an
        absolute offset goes straight to FETCH_ACTIVE), only when the leader epoch changes later or on a seek
        (``validate_position``): one still inside the new log is used as it is, and the new log's records
        below it are not delivered. That is Kafka's behaviour, not the pod's: those records are listed in
        ``skipped`` and excused from the checks.
        """
        log_ = self.logs[tp]
        if committed is None:
            return 0
        offset = committed[0]
        if offset > log_.end:
            return 0
        if log_.truncations:  # records of the log written since its truncation, below a committed offset
            # that predates it (or was re-committed from one that did): written under a greater leader epoch
            # than the one the commit carries (the metadata's, as ``KafkaSource.commit`` sends it), or, for a
            # commit with none, than the broker's when it was stored (soak seed 5956: two truncations before
            # a pod started from a commit of epoch 0, and the records of epoch 1 below it were not excused)
            carried = offset_metadata.leader_epoch(committed[1])
            for record in log_.records[:offset]:
                later = record.leader_epoch > carried if carried is not None else record.log_epoch > committed[2]
                if later:
                    self.skipped.add(record.ident)
        return offset

    # -- the group coordinator ------------------------------------------------------------------------
    def join(self, source: SimulatedSource) -> None:
        """A session subscribed (or rejoins after a loss): it becomes a member once the join completes."""
        delay = self.rng.uniform(*self.rebalance_delay)

        def joined() -> None:
            if source.closed or source.frozen:
                return
            if self.down:  # the coordinator cannot be reached: the join completes after the outage
                self.sim.call_at(self.down_until + delay, joined)
                return
            self._members_made += 1
            member = Member(source, self._members_made)
            self.members[member.member_id] = member
            source.member = member
            instance = source.static_instance
            if instance is not None:  # KIP-345/KIP-848: a static member rejoining takes back what was kept for it
                for tp, (kept_for, _until) in list(self.kept_for_static.items()):
                    if kept_for == instance:
                        del self.kept_for_static[tp]
                        self._release_handover(tp)
                for other in [
                    m for m in self.members.values() if m is not member and m.source.static_instance == instance
                ]:
                    self.fence(other)
            self.note(f"{member.member_id} joined")
            self.schedule_rebalance()

        self.sim.call_at(self.now() + delay, joined)

    def schedule_rebalance(self) -> None:
        when = self.now() + self.rng.uniform(*self.rebalance_delay)
        if self._rebalance_due is not None and self._rebalance_due <= when:
            return
        self._rebalance_due = when
        self.sim.call_at(when, self._rebalance_if_due)

    def _rebalance_if_due(self) -> None:
        if self._rebalance_due is None or self._rebalance_due > self.now():
            return
        if self.down:  # no coordinator to rebalance with until the outage ends
            self._rebalance_due = self.down_until + self.rebalance_delay[0]
            self.sim.call_at(self._rebalance_due, self._rebalance_if_due)
            return
        self._rebalance_due = None
        self._rebalance()

    def _protocol(self) -> str:
        protocols = {member.source.protocol for member in self.members.values()}
        return protocols.pop() if len(protocols) == 1 else "cooperative"

    def _targets(self) -> dict[TopicPartitionId, Member | str | None]:
        """The wanted owner of each partition: sticky, balanced over the live members."""
        now = self.now()
        live = [member for member in self.members.values() if not member.source.closing]
        targets: dict[TopicPartitionId, Member | str | None] = {}
        counts = {member.member_id: 0 for member in live}
        free = []
        for tp in self.logs:
            if self.elsewhere_until.get(tp, -1.0) > now:
                targets[tp] = ELSEWHERE
                continue
            kept = self.kept_for_static.get(tp)
            if kept is not None and kept[1] > now:
                targets[tp] = None  # the departed static member's, until its session times out
                continue
            owner = self.owner[tp]
            if isinstance(owner, Member) and owner.member_id in counts:
                targets[tp] = owner
                counts[owner.member_id] += 1
            else:
                free.append(tp)
        if not live:
            targets.update(dict.fromkeys(free))
            return targets
        assignable = len(free) + sum(counts.values())
        ceiling = -(-assignable // len(live))
        for tp, owner in list(targets.items()):  # give away what a member holds beyond its fair share
            if isinstance(owner, Member) and counts[owner.member_id] > ceiling:
                counts[owner.member_id] -= 1
                free.append(tp)
        for tp in free:
            least = min(live, key=lambda member: (counts[member.member_id], self.rng.random()))
            targets[tp] = least
            counts[least.member_id] += 1
        return targets

    def _rebalance(self) -> None:
        """Move the partitions towards their targets, in the group protocol's steps.

        Cooperative (classic protocol with cooperative-sticky, KIP-429) and KIP-848: a member gives up
        only the partitions that move (a revoke), and a partition is assigned to its new owner once the
        old one has revoked it: librdkafka ``rd_kafka_cgrp_handle_assignment`` with
        ``rd_kafka_cgrp_incremental_assign``/``incremental_unassign`` (src/rdkafka_cgrp.c); KIP-848
        ``rd_kafka_cgrp_consumer_assignment_done``. Eager (range, roundrobin): every member revokes
        everything first (``rd_kafka_cgrp_revoke_all_rejoin``), then gets its whole new assignment.
        The callbacks are queued to each member and served inside its next ``consume``, as librdkafka
        serves the rebalance op on the consumer queue (``rd_kafka_poll_cb``, src/rdkafka.c).
        """
        self.release_expired_static()
        targets = self._targets()
        protocol = self._protocol()
        moves = {tp for tp, target in targets.items() if self.owner[tp] is not target}
        for tp, target in targets.items():
            owner = self.owner[tp]
            if owner == ELSEWHERE and target != ELSEWHERE:
                self.owner[tp] = None
                self.note(f"{tp[0]}[{tp[1]}] given back by {ELSEWHERE}")
        if protocol == "eager" and moves:
            revoking = False
            for member in self.members.values():
                keep = member.owned - member.revoking
                if keep:
                    member.revoking |= keep
                    member.source.queue_event(("revoke", sorted(keep), member))
                    revoking = True
                elif member.revoking:
                    revoking = True
            if revoking:
                return  # assigned once every member has revoked (revoked() schedules the next step)
        else:
            for member in self.members.values():
                give_up = {tp for tp in member.owned - member.revoking if targets.get(tp) is not member}
                if give_up:
                    member.revoking |= give_up
                    member.source.queue_event(("revoke", sorted(give_up), member))
        assigned: dict[str, list[TopicPartitionId]] = {}
        for tp, target in targets.items():
            if self.owner[tp] is not None:
                continue
            if target == ELSEWHERE:
                self.owner[tp] = ELSEWHERE
                self.note(f"{tp[0]}[{tp[1]}] assigned to {ELSEWHERE}")
            elif isinstance(target, Member):
                self.owner[tp] = target
                target.owned.add(tp)
                assigned.setdefault(target.member_id, []).append(tp)
        for member_id, tps in assigned.items():
            member = self.members[member_id]
            if protocol == "eager":
                tps = sorted(member.owned)
            self.note(f"{member_id} assigned {', '.join(f'{t}[{p}]' for t, p in sorted(tps))}")
            member.source.queue_event(("assign", sorted(tps), member))

    def revoked(self, member: Member, tps: Sequence[TopicPartitionId]) -> None:
        """The member's revoke callback returned: the partitions are free for their next owner."""
        for tp in tps:
            member.owned.discard(tp)
            member.revoking.discard(tp)
            if self.owner[tp] is member:
                self.owner[tp] = None
        self.note(f"{member.member_id} revoked {', '.join(f'{t}[{p}]' for t, p in tps)}")
        self.schedule_rebalance()

    def _remove(self, member: Member, why: str) -> list[TopicPartitionId]:
        """The member is out of the group (left, or removed): its partitions are free at once."""
        self.members.pop(member.member_id, None)
        owned = sorted(member.owned)
        for tp in owned:
            if self.owner[tp] is member:
                self.owner[tp] = None
        member.owned.clear()
        member.revoking.clear()
        if member.source.member is member:
            member.source.member = None
        self.note(f"{member.member_id} removed: {why}")
        self.schedule_rebalance()
        return owned

    def expire(self, source: SimulatedSource, why: str) -> None:
        """The member's session ended without a leave (heartbeats failed for ``session.timeout.ms``,
        or ``max.poll.interval.ms`` passed without a poll): the partitions go to others at once, and the
        client learns at its next ``consume``: ``on_lost`` (librdkafka ``rd_kafka_cgrp_session_timeout_check``
        and ``rd_kafka_cgrp_max_poll_interval_check_tmr_cb``, src/rdkafka_cgrp.c, both ending in
        ``rd_kafka_cgrp_revoke_all_rejoin_maybe(rkcg, lost=true, ...)``), then it rejoins."""
        member = source.member
        if member is None:
            return
        owned = self._remove(member, why)
        self.expiries.append((self.now(), source.session, owned, why))
        if not source.frozen and not source.closed:
            source.queue_event(("lost", owned, why))

    def fence(self, member: Member) -> None:
        """A new member with the same ``group.instance.id`` joined: the old one is fenced. Its next request
        fails with FENCED_INSTANCE_ID, which librdkafka treats as fatal (src/rdkafka_request.c
        ``rd_kafka_handle_OffsetCommit_error``: ``RD_KAFKA_ERR_ACTION_FATAL``; the heartbeat's handling in
        src/rdkafka_cgrp.c raises it through ``rd_kafka_set_fatal_error``): the adapter raises SourceError."""
        source = member.source
        owned = self._remove(member, "fenced by a new member with the same group.instance.id")
        self.expiries.append((self.now(), source.session, owned, "fenced"))
        if not source.frozen and not source.closed:
            error = KafkaError(
                KafkaError.FENCED_INSTANCE_ID,
                "Broker: Static consumer fenced by other consumer with same group.instance.id",
                fatal=True,
            )
            source.queue_event(("error", error))

    def leave(self, source: SimulatedSource) -> None:
        """The member leaves (LeaveGroup; KIP-848's leave heartbeat with member epoch -1).

        A static member under KIP-848 sends member epoch -2 instead, a *temporary* leave
        (src/rdkafka_cgrp.c ``rd_kafka_cgrp_consumer_leave``: ``if (RD_KAFKA_CGRP_IS_STATIC_MEMBER(rkcg))
        member_epoch = -2``): the broker keeps its partitions for it until the session times out."""
        member = source.member
        if member is None:
            return
        handover = Handover(source.session, self.now())
        self.handovers.append(handover)
        if source.static_instance is not None and source.protocol == "consumer":
            until = self.now() + source.session_timeout
            for tp in member.owned:
                self.kept_for_static[tp] = (source.static_instance, until)
                handover.kept.add(tp)
            self.sim.call_at(until + 1e-6, self.schedule_rebalance)
            self.members.pop(member.member_id, None)
            for tp in member.owned:
                if self.owner[tp] is member:
                    self.owner[tp] = None
            member.owned.clear()
            source.member = None
            self.note(f"{member.member_id} left temporarily (static member, member epoch -2)")
            self.schedule_rebalance()
            return
        handover.released_at = self.now()
        self._remove(member, "left the group")

    def _release_handover(self, tp: TopicPartitionId) -> None:
        for handover in self.handovers:
            if tp in handover.kept and handover.released_at is None:
                handover.released_at = self.now()

    def release_expired_static(self) -> None:
        now = self.now()
        for tp, (_instance, until) in list(self.kept_for_static.items()):
            if until <= now:
                del self.kept_for_static[tp]
                self._release_handover(tp)

    def move_elsewhere(self, tp: TopicPartitionId, seconds: float) -> None:
        """Another member takes the partition for ``seconds`` (a rebalance that moves it), then gives it back."""
        until = self.now() + seconds
        self.elsewhere_until[tp] = until
        self.note(f"{tp[0]}[{tp[1]}] moves to {ELSEWHERE} for {seconds:.2f}s")
        self.schedule_rebalance()
        self.sim.call_at(until + 1e-6, self.schedule_rebalance)

    # -- commits ------------------------------------------------------------------------------------------
    def store_commit(
        self,
        source: SimulatedSource,
        offsets: Mapping[TopicPartitionId, tuple[int, str]],
        sent_at: float,
        asynchronous: bool,
    ) -> tuple[str | None, list[CommitOutcome]]:
        """Apply one OffsetCommit request now: the request's error (``None``: answered) and per-partition outcomes.

        The broker checks the member, not the partitions (Kafka's GroupCoordinator ``handleCommitOffsets``
        and KIP-848's ``OffsetCommit`` validate the member id and generation/epoch only): a member the
        group removed gets UNKNOWN_MEMBER_ID for every partition (librdkafka's action for it is
        PERMANENT, src/rdkafka_request.c ``rd_kafka_handle_OffsetCommit_error``).
        """
        now = self.now()
        if self.down:
            error = KafkaError(KafkaError._TRANSPORT, "Broker: transport failure").str()
            for tp, (offset, metadata) in offsets.items():
                self.commits.append(
                    CommitRecord(
                        source.session, tp, offset, metadata, sent_at, asynchronous, now, error, self.logs[tp].epoch
                    )
                )
            self._failed(source)
            return error, []
        faults = self.commit_faults
        if faults is not None and faults.until <= now:
            faults = self.commit_faults = None
        if faults is not None and faults.whole_request and self.rng.random() < faults.share:
            error = KafkaError(faults.code).str()
            for tp, (offset, metadata) in offsets.items():
                self.commits.append(
                    CommitRecord(
                        source.session, tp, offset, metadata, sent_at, asynchronous, now, error, self.logs[tp].epoch
                    )
                )
            self._failed(source)
            return error, []
        member_error = None
        if source.member is None or source.member.member_id not in self.members:
            member_error = KafkaError(KafkaError.UNKNOWN_MEMBER_ID).str()
        outcomes: list[CommitOutcome] = []
        for tp, (offset, metadata) in offsets.items():
            error = member_error
            if error is None and faults is not None and not faults.whole_request and self.rng.random() < faults.share:
                error = KafkaError(faults.code).str()
            log_ = self.logs[tp]
            self.commits.append(
                CommitRecord(source.session, tp, offset, metadata, sent_at, asynchronous, now, error, log_.epoch)
            )
            if error is None:
                log_.committed = (offset, metadata, log_.epoch)
            else:
                self._failed(source)
            outcomes.append((tp, offset, error))
        return None, outcomes

    def _failed(self, source: SimulatedSource) -> None:
        self.commit_failed_at[source.session] = self.now()

    def committed(self, tp: TopicPartitionId) -> tuple[int | None, str | None]:
        committed = self.logs[tp].committed
        return (committed[0], committed[1]) if committed is not None else (None, None)


class SimulatedSource:
    """FAKE ``keyorder.contracts.Source``: one pod session's consumer on the ``SimulatedBroker``.

    Built from the consumer properties the pod would give librdkafka (``config.consumer_properties``):
    ``group.protocol``, ``partition.assignment.strategy``, ``group.instance.id``,
    ``session.timeout.ms`` and ``max.poll.interval.ms`` shape its behaviour as they shape librdkafka's.
    """

    broker_error: str | None = None

    def __init__(self, broker: SimulatedBroker, properties: Mapping[str, Any], session: int, name: str) -> None:
        self.broker = broker
        self.sim = broker.sim
        self.session = session
        self.name = name
        self.on_commit_result: Callable[[list[CommitOutcome]], None] | None = None
        """Called inside ``consume`` with asynchronous commits' outcomes (as ``KafkaSource.on_commit_result``)."""
        self.broker_reachable = False
        strategy = str(properties.get("partition.assignment.strategy", "range,roundrobin"))
        if broker_assigns(properties):
            self.protocol = "consumer"
        elif "cooperative" in strategy:
            self.protocol = "cooperative"
        else:
            self.protocol = "eager"
        self.static_instance: str | None = str(properties.get("group.instance.id") or "").strip() or None
        self.session_timeout = int(properties.get("session.timeout.ms", LIBRDKAFKA_SESSION_TIMEOUT_MS)) / 1000
        self.max_poll_interval = int(properties.get("max.poll.interval.ms", LIBRDKAFKA_MAX_POLL_INTERVAL_MS)) / 1000
        self.member: Member | None = None
        self.closing = self.closed = self.frozen = False
        self.assigning = False
        """True while the assign callback runs (it reads the committed offsets: blocking, retried on failure)."""
        self._callbacks: tuple[RebalanceCallback, RebalanceCallback, RebalanceCallback] | None = None
        self._events: deque[tuple[Any, ...]] = deque()
        self._wakeup = self.sim.Event()
        self._frozen_forever = self.sim.Event()
        self.assigned: dict[TopicPartitionId, _Fetching] = {}
        """Partitions assigned to this client (its view: from the assign callback to the revoke/lost one)."""
        self.paused: set[TopicPartitionId] = set()
        self._last_poll = self.sim.clock()
        self._in_blocking_poll = False
        self._max_poll_check_due: float | None = None
        self._stats_at = -1.0
        self._fetch_queues: dict[TopicPartitionId, int] = {}
        self.handed_out: list[tuple[float, Record]] = []
        """Every record ``consume`` returned, with the time (for the invariants)."""
        self.revokes: list[RevokeSpan] = []
        self.long_consumes: list[tuple[float, float]] = []
        """(start, end) of the ``consume`` calls that took longer than a second (callbacks blocked in them):
        a SIGTERM arriving meanwhile is noticed by the poll loop only at their end."""
        self.lost: list[tuple[float, list[TopicPartitionId], str]] = []
        self.consumes = 0
        broker.sources.append(self)

    # -- plumbing ------------------------------------------------------------------------------------------
    def wake(self) -> None:
        self._wakeup.set()

    def queue_event(self, event: tuple[Any, ...]) -> None:
        self._events.append(event)
        self.wake()

    def freeze(self) -> None:
        """The pod was killed (SIGKILL): this client does nothing any more; the broker learns it only when
        the session times out."""
        self.frozen = True
        self.broker.sim.call_at(
            self.broker.now() + self.session_timeout,
            lambda: self.broker.expire(self, "session timed out (the pod was killed)"),
        )

    def _check_frozen(self) -> None:
        if self.frozen:
            self._frozen_forever.wait()  # the simulation ends this thread (Simulation.close)

    def validate_position(self, tp: TopicPartitionId) -> None:
        """The partition's leader epoch grew: librdkafka validates the fetch position (KIP-320; src/rdkafka_topic.c
        ``rd_kafka_toppar_leader_update``: "epoch updated from metadata" -> ``rd_kafka_offset_validate``). The
        position validated is the *fetcher's* (``rd_kafka_toppar_fetch_decide_next_fetch_start_pos``: the next
        fetch's offset, past the records prefetched and not yet handed out), with the epoch of the last record
        fetched (or of the committed offset; none: no validation, "no leader epoch set"). It asks the leader for
        the end offset of that epoch; beyond it, the log was truncated: it seeks there (src/rdkafka_offset.c
        ``rd_kafka_toppar_handle_OffsetForLeaderEpoch``, with auto.offset.reset not 'error': "Seek to the updated
        end offset", no error for the application). The seek's version barrier drops the partition's queued
        records, those below the end offset too (src/rdkafka_partition.c ``rd_kafka_toppar_op_seek``; the
        ``("purge", tp)`` event drops the ones of the batch being built), and resets the application position
        (``rd_kafka_toppar_seek``: ``rktp_app_pos`` INVALID until the next record is handed out). A clean
        leader change leaves every position inside the log: nothing moves."""
        fetching = self.assigned.get(tp)
        if fetching is None or fetching.position is None:
            return
        if fetching.fetched > fetching.position:
            position, epoch = fetching.fetched, fetching.fetched_epoch
        else:
            position, epoch = fetching.position, fetching.leader_epoch
        if epoch is None:
            return
        log_ = self.broker.logs[tp]
        end = log_.end_offset_of(epoch)
        if position > end:
            fetching.position = fetching.fetched = end
            fetching.leader_epoch = log_.records[end - 1].leader_epoch if end > 0 else None
            fetching.sought = True
            fetching.queued_from = self.sim.clock()
            self.queue_event(("purge", tp))

    def _prefetch(self) -> None:
        """librdkafka's fetcher reads ahead of the application (up to queued.min.messages): the fetch position of
        each fetching partition is the log's end as of this call; the records between the application's
        position and it are queued, not yet handed out. They are the log's own records, unchanged: a
        truncation below the fetch position purges them (``validate_position``)."""
        logs = self.broker.logs
        for tp, fetching in self.assigned.items():
            if tp in self.paused or fetching.position is None:
                continue
            log_ = logs[tp]
            if log_.end > max(fetching.fetched, fetching.position):
                fetching.fetched = log_.end
                fetching.fetched_epoch = log_.records[-1].leader_epoch

    # -- Source -------------------------------------------------------------------------------------------
    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
        on_lost: RebalanceCallback,
    ) -> None:
        self._check_frozen()
        self._callbacks = (on_assign, on_revoke, on_lost)
        self._last_poll = self.sim.clock()
        self._arm_max_poll_check()
        self.broker.join(self)

    def consume(self, max_messages: int, timeout: float) -> list[Message]:
        """Serve the queued callbacks, then hand out records until ``max_messages`` or ``timeout``.

        As librdkafka's ``rd_kafka_consume_batch_queue`` (src/rdkafka_queue.c,
        ``rd_kafka_q_serve_rkmessages``): it waits the whole timeout unless ``max_messages`` arrive,
        serving rebalance and commit callbacks (``rd_kafka_poll_cb``) in between; a blocking call
        suspends the ``max.poll.interval.ms`` timer (``rd_kafka_app_poll_start`` with
        ``is_blocking``), and its return restarts it (``rd_kafka_app_polled``, src/rdkafka_int.h).
        Consumer errors go through ``KafkaSource._consume_error``, the real adapter's handling.
        """
        self._check_frozen()
        self.consumes += 1
        sim = self.sim
        started = sim.clock()
        deadline = started + max(timeout, 0.0)
        if timeout > 0:
            self._in_blocking_poll = True
        messages: list[Message] = []
        try:
            while True:
                self._serve_events(messages)
                self._check_frozen()
                messages.extend(self._fetch(max_messages - len(messages)))
                if len(messages) >= max_messages or sim.clock() >= deadline:
                    break
                self._wakeup.clear()
                if self._events or self._fetchable():
                    continue
                self._wakeup.wait(deadline - sim.clock())
        finally:
            self._in_blocking_poll = False
            self._last_poll = sim.clock()
            self._arm_max_poll_check()
            if sim.clock() - started > 1.0:
                self.long_consumes.append((started, sim.clock()))
        if self.broker.down:
            self.broker_reachable = False  # KafkaSource._mark_unreachable, on librdkafka's _ALL_BROKERS_DOWN
            self.broker_error = "Local: All broker connections are down"
        else:
            self._mark_reachable()
        return messages

    def _serve_events(self, collected: list[Message]) -> None:
        """Serve the queued callbacks. A rebalance of a partition also drops its records ``collected`` so far
        in this ``consume`` call: librdkafka bumps the partition's op version when it (un)assigns it, and the
        version barrier purges the outdated records from the batch being built (src/rdkafka_queue.c
        ``rd_kafka_q_serve_rkmessages``: ``RD_KAFKA_OP_BARRIER`` -> ``rd_kafka_purge_outdated_messages``)."""
        assert self._callbacks is not None, "consume before subscribe"
        on_assign, on_revoke, on_lost = self._callbacks
        while self._events:
            event = self._events.popleft()
            kind = event[0]
            if kind in ("assign", "revoke", "lost"):
                changed = set(event[1]) if kind != "lost" else set(self.assigned)
                collected[:] = [message for message in collected if (message.topic, message.partition) not in changed]
            if kind == "assign":
                member = event[2]
                tps = [tp for tp in event[1] if member is self.member and tp in member.owned]
                now = self.sim.clock()
                for tp in tps:
                    self.assigned[tp] = _Fetching(None, now, self.broker.logs[tp].committed, queued_from=now)
                self._mark_reachable()  # as KafkaSource.subscribe's assigned(): the coordinator answered
                self.assigning = True
                try:
                    on_assign(tps)
                finally:
                    self.assigning = False
            elif kind == "revoke":
                tps = [tp for tp in event[1] if tp in self.assigned]
                started = self.sim.clock()
                span = RevokeSpan(self.session, tps, started)
                self.revokes.append(span)
                on_revoke(tps)
                span.ended = self.sim.clock()
                for tp in tps:
                    self.assigned.pop(tp, None)
                    self.paused.discard(tp)
                if event[2].member_id in self.broker.members:
                    self.broker.revoked(event[2], event[1])
            elif kind == "lost":
                tps = sorted(self.assigned)  # librdkafka hands on_lost the whole current assignment
                self.lost.append((self.sim.clock(), tps, event[2]))
                for tp in list(self.assigned):
                    self.assigned.pop(tp, None)
                    self.paused.discard(tp)
                on_lost(tps)
                if not self.closing:
                    self.broker.join(self)  # librdkafka rejoins after a loss
            elif kind == "purge":
                collected[:] = [message for message in collected if (message.topic, message.partition) != event[1]]
            elif kind == "commit":
                if self.on_commit_result is not None:
                    self.on_commit_result(event[1])
            elif kind == "error":
                KafkaSource._consume_error(event[1])  # the adapter's own handling: logs, or SourceError if fatal
            if self.frozen:
                return

    def _fetchable(self) -> bool:
        logs = self.broker.logs
        if self.broker.down:
            return False
        return any(
            tp not in self.paused and (fetching.position is None or fetching.position < logs[tp].end)
            for tp, fetching in self.assigned.items()
        )

    def _fetch(self, wanted: int) -> list[Message]:
        """Records of the fetching (assigned, not paused) partitions, from each one's position, in
        fetch-response chunks of a seeded size, oldest queued first (``_queued_at``).

        librdkafka's consumer queue is one FIFO: each partition's fetch queue forwards to the consumer's queue
        (src/rdkafka_partition.c ``rd_kafka_toppar_op_fetch_start``: ``rd_kafka_q_fwd_set0(rktp->rktp_fetchq,
        fwdq, ...)``), a fetch response's records are appended to it as the response is parsed
        (src/rdkafka_msgset_reader.c: ``rd_kafka_q_concat(msetr->msetr_par_rkq, &msetr->msetr_rkq)``, the
        parent queue being ``rktp->rktp_fetchq``), and a batch consume serves it from its head
        (src/rdkafka_queue.c ``rd_kafka_q_serve_rkmessages``, following the forward). So records queued earlier
        are handed out before records queued later, whatever their partitions; partitions whose records were
        queued together interleave in a seeded order. (Before, each call shuffled the partitions anew, so a
        partition paused and resumed could overtake records queued before its own fetch again, which librdkafka
        never does: simulation seed 70213.)"""
        if self.broker.down:
            return []
        self._prefetch()
        if wanted <= 0:
            return []
        broker = self.broker
        rng = broker.rng
        out: list[Message] = []
        order = [tp for tp in self.assigned if tp not in self.paused]
        rng.shuffle(order)
        order.sort(key=self._queued_at)  # stable: ties keep the seeded order
        for tp in order:
            fetching = self.assigned[tp]
            log_ = broker.logs[tp]
            if fetching.position is None:
                fetching.position = broker.start_of(tp, fetching.committed)
                if fetching.committed is not None and fetching.position == fetching.committed[0]:
                    fetching.leader_epoch = offset_metadata.leader_epoch(fetching.committed[1])
                fetching.fetched = fetching.position
            chunk = rng.randint(1, 50)
            while fetching.position < log_.end and len(out) < wanted and chunk > 0:
                record = log_.records[fetching.position]
                fetching.position += 1
                fetching.leader_epoch = record.leader_epoch
                fetching.sought = False
                chunk -= 1
                self.handed_out.append((self.sim.clock(), record))
                out.append(
                    Message(
                        record.topic,
                        record.partition,
                        record.offset,
                        record.key,
                        broker.value_of(record),
                        (),
                        record.produced_at,
                        record.leader_epoch,
                    )
                )
            if len(out) >= wanted:
                break
        return out

    def _queued_at(self, tp: TopicPartitionId) -> float:
        """When the fetcher queued the partition's next record: as it was produced, with a fetcher that keeps
        up, but not before the fetcher began fetching the partition from where it is now (``queued_from``: its
        assignment, a resume, a seek; a pause drops what was queued, and a resume fetches it again, queued
        behind what other partitions queued meanwhile)."""
        fetching = self.assigned[tp]
        log_ = self.broker.logs[tp]
        if fetching.position is None or fetching.position >= log_.end:
            return fetching.queued_from
        return max(log_.records[fetching.position].produced_at, fetching.queued_from)

    def pause(self, partitions: Sequence[TopicPartitionId]) -> None:
        """Pause fetching; the partition's prefetched records are dropped and it will fetch again from the
        last record handed out (src/rdkafka_partition.c ``rd_kafka_toppar_pause_resume``: next fetch at
        ``rktp_app_pos``, then ``rd_kafka_q_purge_toppar_version`` flushes the fetch queue). This fake
        fetches again from the application's position."""
        self._check_frozen()
        for tp in partitions:
            fetching = self.assigned.get(tp)
            if fetching is not None:
                self.paused.add(tp)
                if fetching.position is not None:
                    fetching.fetched = fetching.position

    def resume(self, partitions: Mapping[TopicPartitionId, FetchPosition | None]) -> None:
        """Resume, then seek to the position given (``KafkaSource.resume``); librdkafka's seek moves the
        fetch position, discards what was fetched for the old one, and validates a position that carries a
        leader epoch (src/rdkafka_partition.c ``rd_kafka_toppar_op_seek``: ``rd_kafka_offset_validate(rktp,
        "seek")``), as ``validate_position``."""
        self._check_frozen()
        for tp, position in partitions.items():
            fetching = self.assigned.get(tp)
            if fetching is not None and (tp in self.paused or position is not None):
                fetching.queued_from = self.sim.clock()  # fetched again from here: queued behind the others' records
            self.paused.discard(tp)
            if fetching is not None and position is not None:
                fetching.position, fetching.leader_epoch = position.offset, position.leader_epoch
                fetching.fetched, fetching.sought = position.offset, True  # the prefetched records are dropped
                self.validate_position(tp)
        self.wake()

    def committed(
        self, partitions: Sequence[TopicPartitionId], timeout: float
    ) -> dict[TopicPartitionId, tuple[int | None, str | None]]:
        """The committed offsets with their metadata (an OffsetFetch round trip); ``SourceError`` when no
        broker answers within ``timeout`` (``KafkaSource.committed``)."""
        self._check_frozen()
        if self.broker.down:
            self.sim.sleep(timeout)
            raise SourceError("committed offsets: Local: Timed out")
        self.sim.sleep(self.broker.rng.uniform(*self.broker.commit_latency))
        self._check_frozen()
        return {tp: self.broker.committed(tp) for tp in partitions}

    def commit(self, offsets: Mapping[TopicPartitionId, tuple[int, str]], asynchronous: bool) -> list[CommitOutcome]:
        """Commit as ``KafkaSource.commit`` does through librdkafka.

        Synchronous: a round trip, then the outcomes; a request that fails, or any partition that fails,
        raises ``CommitError`` (librdkafka returns the last partition error as the request's,
        src/rdkafka_request.c ``rd_kafka_handle_OffsetCommit``: "If all partitions failed use error code
        from last partition", and ``err = partition->err`` for each failed one; confluent-kafka raises
        ``KafkaException`` on it). Asynchronous: returns at once; the outcomes (per partition, or the
        request's error on each) arrive inside a later ``consume``, as the offset-commit op served by
        ``rd_kafka_poll_cb`` (src/rdkafka.c) calls ``on_commit``, which ``KafkaSource._committed_callback``
        turns into ``on_commit_result``.
        """
        self._check_frozen()
        if not offsets:
            return []
        offsets = dict(offsets)
        broker = self.broker
        sent_at = self.sim.clock()
        latency = broker.rng.uniform(*broker.commit_latency)
        if asynchronous:

            def answer() -> None:
                if self.closed or self.frozen:
                    return
                error, outcomes = broker.store_commit(self, offsets, sent_at, asynchronous=True)
                if error is not None:
                    outcomes = [(tp, offset, error) for tp, (offset, _metadata) in offsets.items()]
                self.queue_event(("commit", outcomes))

            self.sim.call_at(sent_at + latency, answer)
            return []
        self.sim.sleep(latency)
        self._check_frozen()
        error, outcomes = broker.store_commit(self, offsets, sent_at, asynchronous=False)
        if error is not None:
            raise CommitError(error)
        failed = [outcome for outcome in outcomes if outcome[2] is not None]
        if failed:
            raise CommitError(failed[-1][2] or "")
        return outcomes

    def high_watermark(self, partition: TopicPartitionId) -> int | None:
        log_ = self.broker.logs.get(partition)
        return log_.end if log_ is not None else None

    def fetch_queue(self, partition: TopicPartitionId) -> int | None:
        """From the latest statistics (every 5 s, ``statistics.interval.ms``): records fetchable beyond the
        position (this fake's fetch queue is the log itself)."""
        now = self.sim.clock()
        if now >= self._stats_at + 5.0:
            self._stats_at = now
            self._fetch_queues = {
                tp: max(self.broker.logs[tp].end - fetching.position, 0)
                for tp, fetching in self.assigned.items()
                if fetching.position is not None
            }
        return self._fetch_queues.get(partition)

    def positions(self, partitions: Sequence[TopicPartitionId]) -> dict[TopicPartitionId, int | None]:
        """The application position (last record handed out + 1; src/rdkafka_queue.c updates
        ``rktp_app_pos`` as it returns records); ``None`` before the first fetch, and after a seek until the
        next record is handed out (src/rdkafka_partition.c ``rd_kafka_toppar_seek`` resets it)."""
        result: dict[TopicPartitionId, int | None] = {}
        for tp in partitions:
            fetching = self.assigned.get(tp)
            result[tp] = fetching.position if fetching is not None and not fetching.sought else None
        return result

    def close(self) -> None:
        """``KafkaSource.close``: a static member first leaves explicitly (``_leave_group``: ``unsubscribe``
        revokes through the callbacks, served by polls, then the leave), then the client closes, which
        revokes whatever is still assigned (``rd_kafka_consumer_close`` serves the rebalance callback)
        and leaves the group (a dynamic member; a static one sends no LeaveGroup on close, KIP-345)."""
        self._check_frozen()
        self.closing = True
        if self._callbacks is not None:
            _on_assign, on_revoke, _on_lost = self._callbacks
            self._serve_commit_results_only()
            tps = sorted(self.assigned)
            if tps or self.member is not None:
                started = self.sim.clock()
                span = RevokeSpan(self.session, tps, started, closing=True)
                self.revokes.append(span)
                on_revoke(tps)
                span.ended = self.sim.clock()
            self.assigned.clear()
            if self.member is not None:
                self.broker.leave(self)
        self.closed = True
        self._events.clear()

    def _serve_commit_results_only(self) -> None:
        for event in list(self._events):
            if event[0] == "commit" and self.on_commit_result is not None:
                self.on_commit_result(event[1])
        self._events.clear()

    # -- reachability (KafkaSource._mark_reachable) and max.poll.interval.ms -------------------------------
    def _mark_reachable(self) -> None:
        self.broker_reachable = True
        self.broker_error = None

    def _arm_max_poll_check(self) -> None:
        """librdkafka's ``rd_kafka_cgrp_max_poll_interval_check_tmr_cb`` (src/rdkafka_cgrp.c), a 500 ms
        timer: past ``max.poll.interval.ms`` since the last poll returned, outside a blocking poll, the
        member leaves the group and its partitions count as lost."""
        due = max(self._last_poll + self.max_poll_interval, self.sim.clock()) + MAX_POLL_CHECK_SECONDS
        if self._max_poll_check_due is not None and self._max_poll_check_due <= due:
            return
        self._max_poll_check_due = due
        self.sim.call_at(due, self._max_poll_check)

    def _max_poll_check(self) -> None:
        self._max_poll_check_due = None
        if self.closed or self.frozen:
            return
        now = self.sim.clock()
        if self._in_blocking_poll or now - self._last_poll <= self.max_poll_interval:
            self._arm_max_poll_check()
            return
        log.warning(
            "%s: Application maximum poll interval (%dms) exceeded by %dms: leaving group",
            self.name,
            self.max_poll_interval * 1000,
            (now - self._last_poll - self.max_poll_interval) * 1000,
        )
        if self.member is not None:
            self.broker.expire(self, "max.poll.interval.ms exceeded")
        self._arm_max_poll_check()


@dataclass(slots=True)
class _Fetching:
    position: int | None
    """The next offset to hand out; ``None`` until the first fetch resolves the committed offset."""
    assigned_at: float = 0.0
    committed: tuple[int, str | None, int] | None = None
    """The group's committed offset when the partition was assigned (the client's OffsetFetch then)."""
    leader_epoch: int | None = None
    """The epoch of the fetch position: the last record handed out's, or the committed offset's (the one its
    commit carried: ``KafkaSource.commit`` commits the metadata's); ``None``: unknown, never validated."""
    queued_from: float = 0.0
    """When the fetcher last began fetching the partition from its position (assignment, resume, seek): no
    record of it is queued before then (``SimulatedSource._queued_at``)."""
    fetched: int = 0
    """The fetcher's position (``_prefetch``): records from ``position`` up to it are queued, not handed out."""
    fetched_epoch: int | None = None
    """The leader epoch of the last record fetched (the epoch librdkafka validates the fetch position with)."""
    sought: bool = False
    """A seek since the last record handed out: the application position is unknown (``positions``)."""


@dataclass
class RevokeSpan:
    """One revoke callback as the pod served it (or the close's final revoke)."""

    session: int
    partitions: list[TopicPartitionId]
    started: float
    ended: float | None = None
    closing: bool = False
