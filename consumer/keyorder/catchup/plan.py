"""The catch-up plan and its audit: pure decisions, no Spark and no Kafka.

* ``resolve_ranges`` turns what Kafka reported (earliest, end, committed, offsets for times) and
  the user's ``--from``/``--until`` into one ``OffsetRange`` per partition;
* ``done_above`` reads the offsets the group's pods finished above the committed one (the commit
  metadata, ``core.offset_metadata``) and ``skip_runs`` cuts them per split: the reader counts
  them and hands them to no handler, as a pod taking the partition over would;
* ``cut_waves`` cuts every range into the same number of consecutive windows, the *waves*: the
  job handles and commits one wave after the other;
* ``split_ranges`` cuts large ranges into sub-ranges, the Spark input splits;
* ``key_statistics`` says how parallel a backlog can be (a key within a partition is always serial);
* ``audit`` checks what the job reports against the plan, so the fence is committed only when
  every message in range was read and handled, in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from keyorder.catchup.exits import KAFKA
from keyorder.catchup.positions import Position, PositionKind
from keyorder.core import offset_metadata

TopicPartition = tuple[str, int]


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``start`` (included) to ``end`` (excluded, the fence) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def offsets(self) -> int:
        """Offsets in range (records can be fewer: compaction and transaction markers leave gaps)."""
        return max(self.end - self.start, 0)

    def name(self) -> str:
        return f"{self.topic}[{self.partition}]"


@dataclass(frozen=True)
class PartitionSnapshot:
    """What Kafka reported for one partition when the job was planned."""

    earliest: int
    end: int
    committed: int | None = None
    """The group's committed offset, ``None`` when it has none."""
    from_time: int | None = None
    """Offset of the first record at/after ``--from``'s timestamp (``None``: no such record)."""
    until_time: int | None = None
    """Offset of the first record at/after ``--until``'s timestamp (``None``: no such record)."""
    done: frozenset[int] = frozenset()
    """Offsets above ``committed`` the group's consumers already finished (its commit metadata)."""


def done_above(metadata: str | None, committed: int | None) -> tuple[frozenset[int], str | None]:
    """The offsets a partition's commit metadata marks finished above ``committed``, and why the
    metadata was ignored when it was keyorder's but unusable (corrupt, out of bounds, written for
    another offset): then nothing is skipped, which is safe (those offsets are handled again).
    Absent or foreign metadata (another client's) is no problem: nothing to skip, nothing to say."""
    if committed is None or not metadata or not metadata.startswith(offset_metadata.PREFIX + ":"):
        return frozenset(), None
    decoded = offset_metadata.decode_checked(metadata, committed)
    if decoded.refused:
        return frozenset(), f"commit metadata ignored ({decoded.refused})"
    if not decoded.done and metadata != offset_metadata.encode(committed, []):
        return frozenset(), "commit metadata ignored (unreadable, or written for another committed offset)"
    return frozenset(decoded.done), None


def skip_runs(split: OffsetRange, done: frozenset[int]) -> list[list[int]]:
    """The offsets of ``done`` inside ``split`` as runs ``[first, end)`` (ascending): compact in the
    split's JSON, since a pod finishes mostly consecutive offsets."""
    runs: list[list[int]] = []
    for offset in sorted(o for o in done if split.start <= o < split.end):
        if runs and runs[-1][1] == offset:
            runs[-1][1] += 1
        else:
            runs.append([offset, offset + 1])
    return runs


def fence_metadata(
    ranges: Iterable[OffsetRange], done: Mapping[TopicPartition, frozenset[int]]
) -> dict[TopicPartition, str]:
    """Commit metadata for committing each range's end: the finished offsets above it that the plan
    knew of, so a rerun after a later wave failed (or the pods) still skips them."""
    metadata = {}
    for r in ranges:
        above = sorted(o for o in done.get((r.topic, r.partition), ()) if o > r.end)
        if above:
            metadata[(r.topic, r.partition)] = offset_metadata.encode(r.end, above)
    return metadata


class PlanError(ValueError):
    """The requested range cannot be planned; the message names the partition and the reason, and
    ``setting`` the setting to change when it is not one the message names (``exits.Refusal.setting``)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class PassingPlanError(PlanError):
    """A plan refused for a state of the group or the topics that passes on its own: members still in the
    group (a consumer killed after its grace stays one until its session times out), a broker that could
    not say for now (describe-groups during a coordinator move: ``MembersUnknown.passes``), a partition the
    ``--until`` fence does not name (added since it was recorded). Nothing was handled or committed; the
    same run, planned again later (with offsets taken then), can succeed: ``keyorder catchup`` exits
    ``EXIT_PASSING`` on it, and the operator tries again after a back-off instead of switching catch-up
    off."""


OFFSET_RESETS = {
    "smallest": "earliest",
    "earliest": "earliest",
    "beginning": "earliest",
    "largest": "latest",
    "latest": "latest",
    "end": "latest",
    "error": "error",
}
"""librdkafka's ``auto.offset.reset`` values and what each means for a partition the group never committed."""


def group_position(tp: TopicPartition, snapshot: PartitionSnapshot, offset_reset: str = "earliest") -> int:
    """Where a pod of the group starts ``tp``: its committed offset, else where ``auto.offset.reset``
    says (earliest: the oldest offset still in the log; latest: the end; error: nowhere, a PlanError)."""
    if snapshot.committed is not None:
        return snapshot.committed
    reset = OFFSET_RESETS.get(offset_reset.strip().lower())
    if reset is None:
        raise PlanError(
            f"auto.offset.reset={offset_reset!r} is not one of {', '.join(OFFSET_RESETS)} "
            f"(needed for {tp[0]}[{tp[1]}], which the group never committed)"
        )
    if reset == "error":
        raise PlanError(
            f"{tp[0]}[{tp[1]}]: the group has no committed offset and auto.offset.reset is error, so its "
            "consumers would refuse to start there: commit a start offset for the group, or give --start "
            "earliest (or explicit offsets)"
        )
    return snapshot.earliest if reset == "earliest" else snapshot.end


def _offset_for(
    position: Position,
    tp: TopicPartition,
    snapshot: PartitionSnapshot,
    at_time: int | None,
    flag: str,
    offset_reset: str = "earliest",
) -> int:
    if position.kind is PositionKind.EARLIEST:
        return snapshot.earliest
    if position.kind is PositionKind.END:
        return snapshot.end
    if position.kind is PositionKind.COMMITTED:
        return group_position(tp, snapshot, offset_reset)
    if position.kind is PositionKind.TIMESTAMP:
        return at_time if at_time is not None else snapshot.end
    if tp not in position.offsets:
        message = (
            f"{flag}: no offset given for {tp[0]}:{tp[1]} (give one for every partition of the topics: it may "
            "have been added since the offsets were taken)"
        )
        # the --until fence the operator recorded goes stale when a partition is added: a new one passes
        raise PassingPlanError(message) if flag == "--until" else PlanError(message, setting=flag)
    return position.offsets[tp]


def resolve_ranges(
    snapshots: Mapping[TopicPartition, PartitionSnapshot],
    start: Position,
    until: Position,
    offset_reset: str = "earliest",
) -> tuple[list[OffsetRange], list[str]]:
    """One range per partition, clamped to what Kafka still has, plus notes on every adjustment.
    ``--start committed`` starts a partition the group never committed where its pods would:
    ``offset_reset`` is the group's ``auto.offset.reset``."""
    if until.kind is PositionKind.COMMITTED:
        raise PlanError("--until committed makes an empty range: fence at end, a time or offsets")
    unknown = sorted((set(start.offsets) | set(until.offsets)) - set(snapshots))
    if unknown:
        raise PlanError(
            f"offsets given for partitions that are not partitions of --topics: "
            f"{', '.join(f'{t}:{p}' for t, p in unknown)}"
        )
    ranges, notes = [], []
    for tp in sorted(snapshots):
        snapshot = snapshots[tp]
        first = _offset_for(start, tp, snapshot, snapshot.from_time, "--start", offset_reset)
        fence = _offset_for(until, tp, snapshot, snapshot.until_time, "--until")
        name = f"{tp[0]}[{tp[1]}]"
        if first < snapshot.earliest:
            notes.append(
                f"{name}: offsets {first}..{snapshot.earliest - 1} are gone (retention); starting at "
                f"{snapshot.earliest}"
            )
            first = snapshot.earliest
        if fence > snapshot.end:
            notes.append(f"{name}: fence {fence} is past the end offset; fenced at {snapshot.end}")
            fence = snapshot.end
        if fence < first:
            notes.append(f"{name}: nothing to do (start {first} is at or past the fence {fence})")
            fence = first
        ranges.append(OffsetRange(tp[0], tp[1], first, fence))
    return ranges, notes


def split_ranges(ranges: Iterable[OffsetRange], max_offsets_per_split: int) -> list[OffsetRange]:
    """Cut each non-empty range into consecutive sub-ranges of at most ``max_offsets_per_split`` offsets."""
    if max_offsets_per_split < 1:
        raise ValueError(f"max_offsets_per_split must be >= 1, got {max_offsets_per_split}")
    splits = []
    for offset_range in ranges:
        for first in range(offset_range.start, offset_range.end, max_offsets_per_split):
            splits.append(
                OffsetRange(
                    offset_range.topic,
                    offset_range.partition,
                    first,
                    min(first + max_offsets_per_split, offset_range.end),
                )
            )
    return splits


def cut_waves(ranges: Iterable[OffsetRange], max_offsets_per_wave: int) -> list[list[OffsetRange]]:
    """Cut every non-empty range into ``n`` consecutive windows of near-equal size, ``n`` being what
    the largest range needs at ``max_offsets_per_wave`` (0: one wave). Wave ``i`` holds window ``i``
    of every range, so each wave spreads over all partitions and ends at a committable offset of
    each; a key lives in one partition, so handling wave after wave keeps its order."""
    if max_offsets_per_wave < 0:
        raise ValueError(f"max_offsets_per_wave must be >= 0, got {max_offsets_per_wave}")
    busy = [r for r in ranges if r.offsets]
    if not busy:
        return []
    largest = max(r.offsets for r in busy)
    count = 1 if max_offsets_per_wave == 0 else -(-largest // max_offsets_per_wave)
    waves: list[list[OffsetRange]] = [[] for _ in range(count)]
    for r in busy:
        pieces = min(count, r.offsets)
        for index in range(pieces):
            first = r.start + r.offsets * index // pieces
            last = r.start + r.offsets * (index + 1) // pieces
            waves[index].append(OffsetRange(r.topic, r.partition, first, last))
    return waves


class CommitMode(StrEnum):
    AUTO = "auto"
    """Commit the fence only when the range started at the group's committed offsets (a drain)."""
    ALWAYS = "always"
    """Commit the fence even after a replay from another start."""
    NEVER = "never"
    """Never commit (a dry replay)."""


def commits_fence(mode: CommitMode, start: Position) -> bool:
    """A replay of an old range must not move the live group unless the user asks for it."""
    if mode is CommitMode.AUTO:
        return start.kind is PositionKind.COMMITTED
    return mode is CommitMode.ALWAYS


def offsets_a_commit_would_skip(
    ranges: Iterable[OffsetRange],
    snapshots: Mapping[TopicPartition, PartitionSnapshot],
    offset_reset: str = "earliest",
) -> list[str]:
    """Partitions whose range starts after the group's position (its committed offset, or where its
    ``auto.offset.reset`` would start, never before the earliest offset still in the log): committing
    the fence would mark the offsets in between as done unhandled."""
    problems = []
    for offset_range in ranges:
        tp = (offset_range.topic, offset_range.partition)
        snapshot = snapshots[tp]
        try:
            reset_at = group_position(tp, snapshot, offset_reset)
        except PlanError:  # auto.offset.reset=error: count from the earliest offset, as before a reset
            reset_at = snapshot.earliest
        position = max(reset_at, snapshot.earliest)
        if offset_range.start > position and offset_range.end > offset_range.start:
            problems.append(f"{offset_range.name()}: offsets {position}..{offset_range.start - 1}")
    return problems


@dataclass(frozen=True)
class MembersUnknown:
    """The broker could not say who is in the group (``offsets.KafkaOffsets.members``)."""

    reason: str
    """What describe-groups answered."""
    passes: bool
    """A state that passes on its own (a coordinator moving or loading, a timeout); else a setting must
    change (the principal lacks DESCRIBE on the group, a broker without the API): asking again later
    answers the same."""


def refuse_live_group(
    members: int | MembersUnknown | None, commit: bool, group: str, preview: bool = False, allow_unknown: bool = False
) -> str | None:
    """A job that will commit must own the group: live members would handle the same keys concurrently.
    ``members`` is ``MembersUnknown`` when the broker could not say: that refuses too (it fails closed)
    unless ``allow_unknown`` (``--allow-unknown-members``); for good (a ``PlanError`` naming the Kafka
    settings) when asking again would not help, else for now (``PassingPlanError``). ``None``: not asked
    (a job that does not commit).

    A preview (``--plan``) handles and commits nothing, so it only returns the refusal as a note."""
    refusal, passes = None, True
    if commit and isinstance(members, int) and members:
        refusal = (
            f"group {group!r} has {members} active members: stop its consumers first (scale the "
            "OrderedConsumer to 0), or run with --commit never"
        )
    elif commit and isinstance(members, MembersUnknown) and not allow_unknown:
        refusal = (
            f"could not tell whether group {group!r} has active members (describe-groups: {members.reason}): "
            "stop its consumers and run again with --allow-unknown-members, or run with --commit never"
        )
        passes = members.passes
        if not passes:
            refusal += (
                "; this does not pass on its own: grant the job's Kafka principal DESCRIBE on the group, or "
                "use a broker with describe-groups"
            )
    if refusal is None:
        return None
    if preview:
        return f"a run would refuse now: {refusal}"
    if passes:
        raise PassingPlanError(refusal)
    raise PlanError(refusal, setting=KAFKA)


def partitions_added_since_commits(snapshots: Mapping[TopicPartition, PartitionSnapshot]) -> dict[str, list[int]]:
    """Per topic, the partitions that were probably added since the group's commits (pure): those above the
    highest partition the group committed that hold records (or held them: ``end`` above 0) and that the
    group never committed. Kafka adds partitions only at the end, and a group running over a partition
    that had records commits it; so a topic whose group committed 0..k but not k+1.. that hold records
    grew after those commits, and a key's newer messages may sit in a new partition while its older ones
    wait in an old one. A topic the group never committed says nothing (a new group), nor does a gap below
    the highest committed partition (a partition that never had a record under the group); a topic that
    grew and whose new partitions the group has committed since cannot be told apart from one that did
    not: the run's notes say what it found, not more."""
    committed: dict[str, list[int]] = {}
    for (topic, partition), snapshot in snapshots.items():
        if snapshot.committed is not None:
            committed.setdefault(topic, []).append(partition)
    added: dict[str, list[int]] = {}
    for (topic, partition), snapshot in sorted(snapshots.items()):
        if topic in committed and partition > max(committed[topic]) and snapshot.committed is None and snapshot.end:
            added.setdefault(topic, []).append(partition)
    return added


def partitions_added_note(added: Mapping[str, list[int]]) -> list[str]:
    """What ``partitions_added_since_commits`` found, one note per topic (none when nothing)."""
    return [
        f"{topic}: partitions {', '.join(map(str, partitions))} have records but no commit from the group, which "
        f"committed lower partitions: the topic probably grew since the group's commits, so a key may sit in "
        "two partitions; its messages are handled in offset order within each partition, the partitions "
        "independently, as the pods do (docs/catchup.md, Guarantees, precisely)"
        for topic, partitions in sorted(added.items())
    ]


@dataclass(frozen=True)
class KeyStatistics:
    messages: int
    distinct_keys: int
    hottest: list[tuple[str, int]]
    """The most frequent keys with their message counts, hottest first."""

    @property
    def skew(self) -> float:
        """Hottest key's messages over the mean per key (1.0 = perfectly even)."""
        if not self.distinct_keys or not self.hottest:
            return 0.0
        return self.hottest[0][1] / (self.messages / self.distinct_keys)

    @property
    def max_parallelism(self) -> float:
        """The best speed-up over one serial consumer: a key's messages always run one after another."""
        if not self.hottest:
            return 0.0
        return self.messages / self.hottest[0][1]


def key_statistics(counts: Iterable[tuple[str, int]], top: int = 10) -> KeyStatistics:
    items = list(counts)
    items.sort(key=lambda item: (-item[1], item[0]))
    return KeyStatistics(messages=sum(count for _, count in items), distinct_keys=len(items), hottest=items[:top])


@dataclass
class PartitionCounts:
    """Counts for one source partition: reported per Spark task, summed per partition by the audit."""

    read: int = 0
    """Records the data source read (reported by the splits' end markers)."""
    skipped: int = 0
    """Records the data source passed over because the group's commit metadata marked them finished."""
    splits: int = 0
    """Splits of this partition whose reader reached the fence."""
    processed: int = 0
    """Records the handler finished."""
    dead_lettered: int = 0
    """Records published to the dead-letter topic after their last attempt."""
    violations: int = 0
    """Records seen out of (key, offset) order by the built-in check."""

    @property
    def handled(self) -> int:
        """Records that left the handler for good: finished, or dead-lettered after their last attempt."""
        return self.processed + self.dead_lettered

    def add(self, other: PartitionCounts) -> None:
        for name in COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


COUNTS = tuple(PartitionCounts.__dataclass_fields__)


@dataclass(frozen=True)
class TaskSummary:
    """What one Spark task reports for one source partition."""

    topic: str
    partition: int
    counts: PartitionCounts


@dataclass
class PartitionAudit:
    planned: OffsetRange
    expected_splits: int
    counts: PartitionCounts = field(default_factory=PartitionCounts)


@dataclass
class Audit:
    partitions: list[PartitionAudit] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def total(self, count: str) -> int:
        return sum(getattr(partition.counts, count) for partition in self.partitions)

    @property
    def handled(self) -> int:
        """``PartitionCounts.handled`` over every partition."""
        return sum(partition.counts.handled for partition in self.partitions)


def audit(ranges: Iterable[OffsetRange], splits: Iterable[OffsetRange], summaries: Iterable[TaskSummary]) -> Audit:
    """Compare the tasks' reports with the plan; any problem means the fence must not be committed."""
    expected_splits: dict[TopicPartition, int] = {}
    for split in splits:
        expected_splits[(split.topic, split.partition)] = expected_splits.get((split.topic, split.partition), 0) + 1
    by_partition = {
        (r.topic, r.partition): PartitionAudit(r, expected_splits.get((r.topic, r.partition), 0)) for r in ranges
    }
    result = Audit(partitions=[by_partition[tp] for tp in sorted(by_partition)])
    for summary in summaries:
        entry = by_partition.get((summary.topic, summary.partition))
        if entry is None:
            result.problems.append(f"{summary.topic}[{summary.partition}]: reported but never planned")
            continue
        entry.counts.add(summary.counts)
    for entry in result.partitions:
        name, counts = entry.planned.name(), entry.counts
        if counts.splits != entry.expected_splits:
            result.problems.append(f"{name}: {counts.splits} of {entry.expected_splits} splits reached the fence")
        if counts.read + counts.skipped > entry.planned.offsets:
            result.problems.append(
                f"{name}: read {counts.read} records"
                + (f" and skipped {counts.skipped}" if counts.skipped else "")
                + f" from {entry.planned.offsets} offsets"
            )
        if counts.handled != counts.read:
            result.problems.append(f"{name}: read {counts.read} records but handled {counts.handled}")
        if counts.violations:
            result.problems.append(f"{name}: {counts.violations} records out of key order")
    return result
