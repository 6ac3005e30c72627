"""The catch-up job's parts without Spark: positions, ranges, waves, splits, key statistics, audit, the
task's lane loop (retries, dead letters, look-ahead, order check) and the session check."""

from __future__ import annotations

import io
import threading
from typing import Any

import pandas
import pytest

from keyorder.catchup.apply import KeyBlocked, OrderViolation, TaskFailure, TaskRunner
from keyorder.catchup.job import (
    CatchupJob,
    Plan,
    SparkSettingsError,
    WaveOutcome,
    check_session,
    retryable_wave_error,
    session_problems,
    wave_retry_pause,
)
from keyorder.catchup.plan import (
    CommitMode,
    MembersUnknown,
    OffsetRange,
    PartitionCounts,
    PartitionSnapshot,
    PlanError,
    TaskSummary,
    audit,
    commits_fence,
    cut_waves,
    done_above,
    fence_metadata,
    key_statistics,
    offsets_a_commit_would_skip,
    refuse_live_group,
    resolve_ranges,
    skip_runs,
    split_ranges,
)
from keyorder.catchup.positions import Position, PositionError, PositionKind, parse_position
from keyorder.catchup.settings import ENFORCED_SPARK_SETTINGS, CatchupConfig
from keyorder.contracts import DeadLetterError
from keyorder.core import offset_metadata
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.message import Message
from keyorder.progress import Progress
from tests.fakes import FakeClock

COMMITTED, EARLIEST, END = (Position(PositionKind(kind)) for kind in ("committed", "earliest", "end"))


def test_positions_parse_every_form() -> None:
    assert parse_position("committed", "--start").kind is PositionKind.COMMITTED
    assert parse_position(" end ", "--until").kind is PositionKind.END
    assert parse_position("ms:1700000000000", "--until").timestamp_ms == 1_700_000_000_000
    assert parse_position("2023-11-14T22:13:20Z", "--until").timestamp_ms == 1_700_000_000_000
    explicit = parse_position("orders:0=10,orders:1=20", "--until")
    assert explicit.offsets == {("orders", 0): 10, ("orders", 1): 20}


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("2023-11-14T22:13:20", "time zone"),
        ("ms:soon", "ms:<epoch milliseconds>"),
        ("orders:x=1", "'orders:x=1' must look like topic:partition=offset"),
        ("yesterday", "expected committed, earliest, end"),
    ],
)
def test_bad_positions_are_named(text: str, complaint: str) -> None:
    with pytest.raises(PositionError, match="--until") as error:
        parse_position(text, "--until")
    assert complaint in str(error.value)


SNAPSHOTS = {
    ("t", 0): PartitionSnapshot(earliest=0, end=100, committed=40, from_time=10, until_time=90),
    ("t", 1): PartitionSnapshot(earliest=50, end=80, committed=None, from_time=None, until_time=None),
}


def test_committed_start_falls_back_to_earliest_and_fences_at_end() -> None:
    ranges, notes = resolve_ranges(SNAPSHOTS, COMMITTED, END)
    assert ranges == [OffsetRange("t", 0, 40, 100), OffsetRange("t", 1, 50, 80)]
    assert notes == []


@pytest.mark.parametrize(
    ("offset_reset", "start"),
    [("earliest", 50), ("smallest", 50), ("beginning", 50), ("latest", 80), ("largest", 80), ("END", 80)],
)
def test_committed_start_without_a_commit_follows_the_groups_auto_offset_reset(offset_reset: str, start: int) -> None:
    """A partition the group never committed starts where its pods would start it."""
    ranges, _ = resolve_ranges(SNAPSHOTS, COMMITTED, END, offset_reset)
    assert ranges == [OffsetRange("t", 0, 40, 100), OffsetRange("t", 1, start, 80)]
    assert offsets_a_commit_would_skip(ranges, SNAPSHOTS, offset_reset) == []  # the pods would start there too


def test_committed_start_without_a_commit_under_auto_offset_reset_error_is_refused_naming_the_partition() -> None:
    with pytest.raises(PlanError, match=r"t\[1\]: the group has no committed offset and auto.offset.reset is error"):
        resolve_ranges(SNAPSHOTS, COMMITTED, END, "error")
    committed_everywhere = {("t", 0): SNAPSHOTS[("t", 0)]}
    assert resolve_ranges(committed_everywhere, COMMITTED, END, "error")[0] == [OffsetRange("t", 0, 40, 100)]
    assert resolve_ranges(SNAPSHOTS, EARLIEST, END, "error")[0][1] == OffsetRange("t", 1, 50, 80)  # not asked
    with pytest.raises(PlanError, match=r"auto\.offset\.reset='sometimes' is not one of"):
        resolve_ranges(SNAPSHOTS, COMMITTED, END, "sometimes")


def test_timestamps_pick_offsets_and_missing_times_mean_the_end() -> None:
    ranges, _ = resolve_ranges(SNAPSHOTS, Position(PositionKind.TIMESTAMP, 1), Position(PositionKind.TIMESTAMP, 2))
    assert ranges == [OffsetRange("t", 0, 10, 90), OffsetRange("t", 1, 80, 80)]


def test_explicit_offsets_are_clamped_with_notes() -> None:
    start = Position(PositionKind.OFFSETS, offsets={("t", 0): 5, ("t", 1): 10})
    until = Position(PositionKind.OFFSETS, offsets={("t", 0): 500, ("t", 1): 60})
    ranges, notes = resolve_ranges(SNAPSHOTS, start, until)
    assert ranges == [OffsetRange("t", 0, 5, 100), OffsetRange("t", 1, 50, 60)]
    assert any("t[0]: fence 500 is past the end offset" in note for note in notes)
    assert any("t[1]: offsets 10..49 are gone (retention)" in note for note in notes)


def test_plan_errors_name_the_partition() -> None:
    with pytest.raises(PlanError, match="no offset given for t:1"):
        resolve_ranges(SNAPSHOTS, COMMITTED, Position(PositionKind.OFFSETS, offsets={("t", 0): 5}))
    with pytest.raises(PlanError, match="not partitions of --topics: t:7"):
        resolve_ranges(SNAPSHOTS, COMMITTED, Position(PositionKind.OFFSETS, offsets={("t", 7): 5}))
    with pytest.raises(PlanError, match="--until committed"):
        resolve_ranges(SNAPSHOTS, EARLIEST, COMMITTED)


def test_start_past_the_fence_is_an_empty_range() -> None:
    ranges, notes = resolve_ranges(
        {("t", 0): PartitionSnapshot(0, 100, committed=100, until_time=30)},
        COMMITTED,
        Position(PositionKind.TIMESTAMP, 1),
    )
    assert ranges == [OffsetRange("t", 0, 100, 100)]
    assert "nothing to do" in notes[0]


def test_a_commit_must_not_jump_over_unhandled_offsets() -> None:
    snapshots = {
        ("t", 0): PartitionSnapshot(earliest=0, end=100, committed=40),
        ("t", 1): PartitionSnapshot(earliest=50, end=80, committed=10),  # 10..49 lost to retention
        ("t", 2): PartitionSnapshot(earliest=0, end=80, committed=None),
    }
    later = Position(PositionKind.OFFSETS, offsets={("t", 0): 60, ("t", 1): 50, ("t", 2): 5})
    ranges, _ = resolve_ranges(snapshots, later, END)
    assert offsets_a_commit_would_skip(ranges, snapshots) == ["t[0]: offsets 40..59", "t[2]: offsets 0..4"]
    ranges, _ = resolve_ranges(snapshots, EARLIEST, END)  # a replay from before the group's position is fine
    assert offsets_a_commit_would_skip(ranges, snapshots) == []


def test_a_committing_job_refuses_a_group_with_live_members() -> None:
    with pytest.raises(PlanError, match="group 'g' has 2 active members: stop its consumers first"):
        refuse_live_group(2, True, "g")
    refuse_live_group(2, False, "g")  # --commit never: a dry replay may run next to them
    refuse_live_group(0, True, "g")
    refuse_live_group(None, False, "g")  # --commit never: not asked


def test_a_committing_job_refuses_when_the_broker_cannot_tell_its_members_unless_told_to_go_on() -> None:
    """describe-groups failed (a timeout, an ACL, an old broker): the guard fails closed."""
    unknown = MembersUnknown("REQUEST_TIMED_OUT: timed out", passes=True)
    with pytest.raises(PlanError, match="could not tell whether group 'g' has active members"):
        refuse_live_group(unknown, True, "g")
    assert refuse_live_group(unknown, True, "g", allow_unknown=True) is None  # --allow-unknown-members
    preview = refuse_live_group(unknown, True, "g", preview=True)
    assert preview is not None and "--allow-unknown-members" in preview
    preview = refuse_live_group(2, True, "g", preview=True)  # --plan handles nothing: it only tells
    assert preview is not None and preview.startswith("a run would refuse now: group 'g' has 2 active members")


def test_the_commit_metadata_names_the_offsets_the_pods_finished_above_the_committed_one() -> None:
    metadata = offset_metadata.encode(40, [41, 42, 45, 90])
    assert done_above(metadata, 40) == (frozenset({41, 42, 45, 90}), None)
    assert done_above(offset_metadata.encode(40, []), 40) == (frozenset(), None)  # nothing finished above
    assert done_above(None, 40) == (frozenset(), None)  # a broker that keeps no metadata (the test broker)
    assert done_above("written by another tool", 40) == (frozenset(), None)  # not ours: nothing to say
    assert done_above(metadata, None) == (frozenset(), None)  # no committed offset: no metadata either


@pytest.mark.parametrize(
    "metadata",
    [
        "ko1:40:r:not base64!",  # corrupt
        offset_metadata.encode(40, [41])[:-4],  # truncated
        offset_metadata.encode(37, [41]),  # written for another committed offset
        "ko1:40:x:eJwDAAAAAAE=",  # an unknown kind
        "ko1:forty:r:eJwDAAAAAAE=",
    ],
)
def test_unusable_commit_metadata_is_ignored_with_a_reason_so_everything_is_handled(metadata: str) -> None:
    done, problem = done_above(metadata, 40)
    assert done == frozenset()  # handle everything: a duplicate is safe, a loss is not
    assert problem is not None and problem.startswith("commit metadata ignored")


def test_finished_offsets_are_cut_into_runs_per_split_and_kept_above_each_committed_wave_end() -> None:
    done = frozenset({3, 4, 5, 9, 12, 13, 30})
    assert skip_runs(OffsetRange("t", 0, 0, 10), done) == [[3, 6], [9, 10]]
    assert skip_runs(OffsetRange("t", 0, 10, 20), done) == [[12, 14]]
    assert skip_runs(OffsetRange("t", 0, 14, 30), done) == []  # the fence (30) is not in the split
    wave = [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 10)]
    metadata = fence_metadata(wave, {("t", 0): done})
    assert list(metadata) == [("t", 0)]  # only where something finished lies above the commit
    assert offset_metadata.decode(metadata[("t", 0)], 10) == {12, 13, 30}


def test_skipped_records_count_toward_the_planned_offsets_and_are_never_lost() -> None:
    ranges, splits = [OffsetRange("t", 0, 0, 100)], split_ranges([OffsetRange("t", 0, 0, 100)], 50)
    clean = audit(
        ranges,
        splits,
        [summary("t", 0, read=45, skipped=5, splits=1, processed=45), summary("t", 0, read=50, splits=1, processed=50)],
    )
    assert clean.ok, clean.problems  # read = handled; the skipped ones are accounted for, not missing
    assert (clean.total("skipped"), clean.total("processed")) == (5, 95)
    too_many = audit(ranges, splits, [summary("t", 0, read=95, skipped=10, splits=2, processed=95)])
    assert "t[0]: read 95 records and skipped 10 from 100 offsets" in too_many.problems


def test_a_task_counts_the_records_its_splits_skipped() -> None:
    rows = record_rows([b"a", b"b"])
    rows[-1] = (*rows[-1][:-1], 3)  # the end marker: 2 records read, 3 skipped
    task = runner(lambda message: None, RetryPolicy(max_attempts=1))
    task.run(iter([frame(rows)]))
    assert (task.counts[0].read, task.counts[0].skipped, task.counts[0].processed) == (2, 3, 2)


def test_splits_cover_each_range_exactly_once() -> None:
    ranges = [OffsetRange("t", 0, 3, 25), OffsetRange("t", 1, 7, 7), OffsetRange("u", 0, 0, 10)]
    splits = split_ranges(ranges, 10)
    assert splits == [
        OffsetRange("t", 0, 3, 13),
        OffsetRange("t", 0, 13, 23),
        OffsetRange("t", 0, 23, 25),
        OffsetRange("u", 0, 0, 10),
    ]
    with pytest.raises(ValueError, match="max_offsets_per_split"):
        split_ranges(ranges, 0)


def test_replays_commit_only_when_asked() -> None:
    assert commits_fence(CommitMode.AUTO, COMMITTED)
    assert not commits_fence(CommitMode.AUTO, EARLIEST)
    assert commits_fence(CommitMode.ALWAYS, EARLIEST)
    assert not commits_fence(CommitMode.NEVER, COMMITTED)


def test_key_statistics_bound_the_parallelism_by_the_hottest_key() -> None:
    stats = key_statistics([("a", 50), ("b", 25), ("c", 25)], top=2)
    assert stats.hottest == [("a", 50), ("b", 25)]
    assert stats.max_parallelism == 2.0
    assert stats.skew == pytest.approx(1.5)
    assert key_statistics([]).max_parallelism == 0.0


RANGES = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 0, 10)]


def summary(topic: str, partition: int, **counts: int) -> TaskSummary:
    return TaskSummary(topic, partition, PartitionCounts(**counts))


SPLITS = split_ranges(RANGES, 50)


def test_a_clean_run_passes_the_audit() -> None:
    result = audit(
        RANGES,
        SPLITS,
        [
            summary("t", 0, read=60, splits=1, processed=60),
            summary("t", 0, read=40, splits=1, processed=39, dead_lettered=1),
            summary("t", 1, read=9, splits=1, processed=9),
        ],
    )  # a gap (compaction)
    assert result.ok, result.problems
    assert (result.total("processed"), result.total("dead_lettered")) == (108, 1)


@pytest.mark.parametrize(
    ("summaries", "problem"),
    [
        (
            [summary("t", 0, read=100, splits=1, processed=100), summary("t", 1, read=10, splits=1, processed=10)],
            "t[0]: 1 of 2 splits reached the fence",
        ),
        (
            [summary("t", 0, read=100, splits=2, processed=99), summary("t", 1, read=10, splits=1, processed=10)],
            "t[0]: read 100 records but handled 99",
        ),
        (
            [
                summary("t", 0, read=100, splits=2, processed=100, violations=3),
                summary("t", 1, read=10, splits=1, processed=10),
            ],
            "t[0]: 3 records out of key order",
        ),
        (
            [summary("t", 0, read=100, splits=2, processed=100), summary("t", 1, read=11, splits=1, processed=11)],
            "t[1]: read 11 records from 10 offsets",
        ),
        ([summary("x", 0, read=1, splits=1, processed=1)], "x[0]: reported but never planned"),
    ],
)
def test_the_audit_names_what_went_wrong(summaries: list[TaskSummary], problem: str) -> None:
    result = audit(RANGES, SPLITS, summaries)
    assert not result.ok
    assert problem in result.problems


class FakeDeadLetters:
    """A fake DLQ sink (records what would be published)."""

    def __init__(self) -> None:
        self.published: list[tuple[int, int, str, dict[str, bytes | None]]] = []

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        self.published.append((message.offset, attempts, str(error), dict(message.headers)))

    def close(self) -> None:
        pass


def frame(rows: list[tuple]) -> pandas.DataFrame:
    columns = ["lane", "source", "progress", "offset", "key", "value", "headers", "timestamp"]
    result = pandas.DataFrame(rows, columns=[*columns, "marker_read", "marker_skipped"])
    for column in ("marker_read", "marker_skipped"):
        result[column] = result[column].astype("Int64")
    return result


def record_rows(keys: list[bytes]) -> list[tuple]:
    """One row per key, at consecutive offsets of source 0, then the end marker."""
    rows = [(0, 0, index, index, key, b"v", [], None, None, None) for index, key in enumerate(keys)]
    return [*rows, (0, 0, 1 << 20, len(keys), None, None, [], None, len(keys), 0)]


def runner(call, policy: RetryPolicy, sink=None, workers: int = 4, lookahead: int = 100, **options: Any) -> TaskRunner:
    options.setdefault("clock", FakeClock(start=0.0, step=0.001))
    return TaskRunner(call, policy, sink, [("t", 0)], "key", workers, lookahead, "run1", 3, **options)


class FlakyDeadLetters(FakeDeadLetters):
    """A dead-letter sink whose first ``failures`` writes fail (the broker is down for a while)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.writes = 0

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        self.writes += 1
        if self.writes <= self.failures:
            raise DeadLetterError("no acknowledgement from 't.dlq' within 30s")
        super().publish(message, error, attempts)


def test_a_failed_dead_letter_write_is_retried_like_a_pods_without_running_the_handler_again() -> None:
    calls: list[bytes] = []

    def call(message: Message) -> None:
        calls.append(message.key)
        if message.key == b"poison":
            raise RuntimeError("boom")

    sink = FlakyDeadLetters(failures=3)
    task = runner(call, RetryPolicy(max_attempts=2, initial_backoff=0.01, max_backoff=0.05), sink, workers=1)
    task.run(iter([frame(record_rows([b"poison", b"a", b"b"]))]))
    assert sink.writes == 4 and [offset for offset, *_ in sink.published] == [0]  # written once it could be
    assert calls.count(b"poison") == 2  # the handler's two attempts; the write alone was retried
    assert (task.counts[0].processed, task.counts[0].dead_lettered) == (2, 1)


def test_a_dead_letter_write_that_keeps_failing_fails_the_task_after_its_time_bound() -> None:
    clock = FakeClock(start=0.0, step=0.5)
    policy = RetryPolicy(max_attempts=1, initial_backoff=0.1, max_backoff=1.0)
    task = runner(lambda message: 1 / 0, policy, FlakyDeadLetters(failures=10**6), clock=clock, dead_letter_timeout=60)
    with pytest.raises(DeadLetterError, match=r"could not dead-letter t\[0\]@0: \d+ writes failed in 6\ds"):
        task.run(iter([frame(record_rows([b"poison"]))]))
    assert 60 <= clock.now < 120


def test_a_failed_attempt_parks_its_key_while_the_others_go_on_then_succeeds() -> None:
    done: list[bytes] = []
    failures = {b"a": 2}
    lock = threading.Lock()

    def call(message: Message) -> None:
        with lock:
            if failures.get(message.key, 0):
                failures[message.key] -= 1
                raise RuntimeError("boom")
            done.append(message.key)

    task = runner(call, RetryPolicy(max_attempts=3, initial_backoff=0.05, max_backoff=0.05), workers=1)
    task.run(iter([frame(record_rows([b"a", b"b", b"c", b"a"]))]))
    assert done.index(b"b") < done.index(b"a")  # one worker: b and c passed the parked key
    assert [key for key in done if key == b"a"] == [b"a", b"a"]
    assert (task.counts[0].processed, task.counts[0].read, task.counts[0].splits) == (4, 4, 1)


def test_exhausted_messages_are_dead_lettered_with_the_run_and_wave_as_provenance() -> None:
    def call(message: Message) -> None:
        if message.key == b"poison":
            raise RuntimeError("boom")

    sink = FakeDeadLetters()
    task = runner(call, RetryPolicy(max_attempts=3, initial_backoff=0, max_backoff=0), sink)
    task.run(iter([frame(record_rows([b"a", b"poison", b"b"]))]))
    ((offset, attempts, error, headers),) = sink.published
    assert (offset, attempts, error) == (1, 3, "boom")
    assert headers == {"keyorder.catchup.run": b"run1", "keyorder.catchup.wave": b"3"}
    assert (task.counts[0].processed, task.counts[0].dead_lettered) == (2, 1)
    assert task.dead_letter_offsets == {0: [1]}


def test_block_fails_the_task_instead_of_parking_the_key_forever() -> None:
    def call(message: Message) -> None:
        raise RuntimeError("boom")

    policy = RetryPolicy(max_attempts=2, initial_backoff=0, max_backoff=1, exhausted=ExhaustedPolicy.BLOCK)
    with pytest.raises(KeyBlocked, match=r"t\[0\]@0 failed 2 times and on-exhausted is block"):
        runner(call, policy).run(iter([frame(record_rows([b"a"]))]))


def test_the_task_reads_ahead_at_most_its_lookahead() -> None:
    seen: list[int] = []
    task: TaskRunner

    def call(message: Message) -> None:
        seen.append(len(task._scheduler))

    task = runner(call, RetryPolicy(max_attempts=1), workers=3, lookahead=7)
    task.run(iter([frame(record_rows([f"k{i}".encode() for i in range(100)]))]))
    assert task.counts[0].processed == 100
    assert max(seen) <= 7


def test_a_row_at_or_below_its_partitions_previous_offset_stops_the_task() -> None:
    calls: list[int] = []
    rows = [(0, 0, 0, 5, b"a", b"v", [], None, None, None), (0, 0, 1, 5, b"b", b"v", [], None, None, None)]
    with pytest.raises(OrderViolation, match=r"t\[0\]@5 arrived after t\[0\]@5"):
        runner(lambda message: calls.append(message.offset), RetryPolicy(max_attempts=1)).run(iter([frame(rows)]))
    assert calls == []  # a batch is checked whole before any of it is handled


def test_waves_cut_every_range_into_the_same_number_of_windows() -> None:
    ranges = [OffsetRange("t", 0, 100, 350), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 5, 5)]
    waves = cut_waves(ranges, 100)
    assert len(waves) == 3  # the largest range (250 offsets) needs 3 windows of at most 100
    for partition, offsets in ((0, range(100, 350)), (1, range(0, 10))):
        windows = [r for wave in waves for r in wave if r.partition == partition]
        assert [o for r in windows for o in range(r.start, r.end)] == list(offsets)  # each offset once, in order
        assert all(r.offsets <= 100 for r in windows)
    assert [len(wave) for wave in waves] == [2, 2, 2]  # every wave spreads over the busy partitions
    assert cut_waves(ranges, 0) == [[OffsetRange("t", 0, 100, 350), OffsetRange("t", 1, 0, 10)]]
    assert cut_waves([OffsetRange("t", 0, 3, 3)], 10) == []
    assert [len(w) for w in cut_waves([OffsetRange("t", 0, 0, 2), OffsetRange("t", 1, 0, 9)], 3)] == [2, 2, 1]


LOCAL_NF = "spark.task.maxFailures says; needs local[n] or local[n,1])"


@pytest.mark.parametrize(
    ("conf", "master", "problems"),
    [
        (ENFORCED_SPARK_SETTINGS, "spark://h:7077", []),
        ({}, "local[2]", ["spark.stage.maxConsecutiveAttempts=4 (needs 1)"]),
        ({"spark.stage.maxConsecutiveAttempts": "1"}, "local[*]", []),  # local mode runs a task once
        (
            {"spark.stage.maxConsecutiveAttempts": "1"},
            "spark://h:7077",
            ["spark.task.maxFailures=4 (needs 1)"],
        ),
        ({**ENFORCED_SPARK_SETTINGS, "spark.speculation": "True"}, "yarn", ["spark.speculation=true (needs false)"]),
        # local[n,f] gives a task f attempts whatever spark.task.maxFailures says (SparkContext.createTaskScheduler)
        (
            ENFORCED_SPARK_SETTINGS,
            "local[2,4]",
            [f"master local[2,4] (4 attempts per task whatever {LOCAL_NF}"],
        ),
        (
            ENFORCED_SPARK_SETTINGS,
            "local[*, 3]",
            [f"master local[*, 3] (3 attempts per task whatever {LOCAL_NF}"],
        ),
        ({"spark.stage.maxConsecutiveAttempts": "1"}, "local[2,1]", []),
        # local-cluster runs executors of its own: spark.task.maxFailures decides, as on a cluster
        (
            {"spark.stage.maxConsecutiveAttempts": "1"},
            "local-cluster[2,1,1024]",
            ["spark.task.maxFailures=4 (needs 1)"],
        ),
        (ENFORCED_SPARK_SETTINGS, "local-cluster[2,1,1024]", []),
    ],
)
def test_a_session_that_could_run_a_task_twice_is_named(conf: dict, master: str, problems: list[str]) -> None:
    assert session_problems(conf, master) == problems


def test_an_existing_session_without_the_settings_is_refused() -> None:
    class Conf:
        def getAll(self):
            return [("spark.task.maxFailures", "4")]

    class Context:
        master = "spark://h:7077"

        def getConf(self):
            return Conf()

    class Session:
        sparkContext = Context()

    with pytest.raises(SparkSettingsError, match=r"spark.task.maxFailures=4 \(needs 1\).*cannot be changed"):
        check_session(Session())


def test_crossover_is_where_startup_plus_spark_time_equals_pod_time() -> None:
    from keyorder.devtools.catchup_bench import CatchupBenchReport, Measurement, crossover_messages

    n = crossover_messages(startup_seconds=10, pod_rate=1_000, spark_rate=3_000)
    assert n == pytest.approx(15_000)
    assert 10 + n / 3_000 == pytest.approx(n / 1_000)
    assert crossover_messages(10, 1_000, 900) == float("inf")
    report = CatchupBenchReport(
        parameters={},
        spark_startup_seconds=10,
        measurements=[
            Measurement("cpu", "pod W=4", 10_000, 10.0, cpu_seconds=1.0),
            Measurement("cpu", "spark local[1]", 10_000, 5.0, cores=1, cpu_seconds=4.0),
            Measurement("cpu", "spark local[2]", 10_000, 10 / 3, cores=2, cpu_seconds=2.0),
            Measurement("io", "pod W=64", 10_000, 1.0),
            Measurement("io", "spark local[8]", 10_000, 4.0),
        ],
    )
    assert report.crossover("cpu") == {
        "pod_rate": 1000.0,
        "spark_runner": "spark local[2]",
        "spark_rate": 3000.0,
        "speedup": 3.0,
        "crossover_messages": 15_000,
    }
    assert report.crossover("io")["crossover_messages"] is None
    per_core = report.per_core("cpu")  # pod: 1,000 msg/s on one core, 100 us of CPU per message
    assert per_core["pod_per_core"] == 1000.0
    assert per_core["spark local[1]"] == {
        "per_core": 2000.0,
        "per_core_ratio": 2.0,
        "cpu_us_per_message": 400.0,
        "cpu_ratio": 0.25,
    }
    assert per_core["spark local[2]"]["per_core"] == 1500.0 and per_core["spark local[2]"]["per_core_ratio"] == 1.5
    hot = CatchupBenchReport(
        parameters={},
        hot_keys=[
            Measurement("io", "local[2] uniform keys | W=16 auto", 120_000, 8.0),
            Measurement("io", "local[2] 4 hot keys x 10,000 | W=16 auto", 120_000, 16.0),
            Measurement("io", "local[2] uniform keys | W=16 shuffle", 120_000, 10.0),
            Measurement("io", "local[2] 4 hot keys x 10,000 | W=16 shuffle", 120_000, 12.5),
        ],
        hot_chain_seconds=10.0,
    )
    assert hot.hot_key_ratios() == {"W=16 auto": 0.5, "W=16 shuffle": 0.8}
    # the hot run cannot beat the 10 s chain: 8 / 10 and 10 / 10 at best
    assert hot.hot_key_ceilings() == {"W=16 auto": 0.8, "W=16 shuffle": 1.0}
    # issue 38's criterion: the hot run within 1.3x of its chain's floor (16 s and 12.5 s against 10 s)
    assert hot.hot_run_over_chain() == {"W=16 auto": 1.6, "W=16 shuffle": 1.25}


@pytest.mark.parametrize(
    ("error", "failure", "retryable"),
    [
        ("RuntimeError: Python worker exited unexpectedly (crashed)", None, True),
        ("SplitReadError: t[0]: no record for 120.0s at offset 5, 40 read errors in a row", None, True),
        ("DeadLetterError: could not dead-letter t[0]@3: 9 writes failed in 300s", TaskFailure.OTHER, True),
        ("KeyBlocked: t[0]@7 failed 5 times and on-exhausted is block", TaskFailure.KEY_BLOCKED, False),
        ("OrderViolation: t[0]@3 arrived after t[0]@5", TaskFailure.ORDER_VIOLATION, False),
        ("KeyBlocked: t[0]@7 failed 5 times", None, True),  # the text alone decides nothing
        (None, None, False),  # the wave ran to its end and its audit found problems: the same records again
    ],
)
def test_a_failed_wave_is_retried_unless_retrying_cannot_help(
    error: str | None, failure: TaskFailure | None, retryable: bool
) -> None:
    assert retryable_wave_error(error, failure) is retryable


def test_the_pause_before_a_waves_retry_grows_and_is_bounded() -> None:
    assert [wave_retry_pause(retry, 10.0) for retry in (1, 2, 3)] == [10.0, 20.0, 40.0]
    assert wave_retry_pause(30, 10.0) == 600.0
    assert wave_retry_pause(1, 0.0) == 0.0


def scripted_job(
    errors: list[str | tuple[str, TaskFailure] | None], **settings: Any
) -> tuple[CatchupJob, list[float], list[int]]:
    """A job whose waves fail with ``errors`` one attempt after the other (``None``: the attempt succeeds)."""
    config = CatchupConfig(
        bootstrap_servers="127.0.0.1:9", topics=["t"], group_id="g", handler="tests.spark.handlers:record", **settings
    )
    job = CatchupJob(config, spark=object(), progress=Progress(stream=io.StringIO()))
    pauses: list[float] = []
    ran: list[int] = []
    job.sleep = pauses.append  # type: ignore[method-assign]

    def run_wave(plan, index, ranges, run_id, started, handled_before):
        ran.append(job._attempt[0])
        error, failure = errors.pop(0), None
        if isinstance(error, tuple):
            error, failure = error
        ok = audit(ranges, ranges, [summary("t", 0, read=10, splits=1, processed=10)])
        return WaveOutcome(index, ranges, 1.0, audit=None if error else ok, error=error, failure=failure), []

    job._run_wave = run_wave  # type: ignore[method-assign]
    return job, pauses, ran


def run_one_wave(job: CatchupJob) -> WaveOutcome:
    wave = [OffsetRange("t", 0, 0, 10)]
    plan = Plan(ranges=wave, splits=wave, notes=[], committed={}, commit=False, waves=[wave])
    try:
        outcome, _ = job._run_wave_with_retries(plan, 0, wave, "run", 0.0, 0)
    finally:
        job.offsets.close()
    return outcome


def test_a_wave_that_fails_once_is_run_again_and_every_attempt_is_reported() -> None:
    job, pauses, ran = scripted_job(["RuntimeError: Python worker exited unexpectedly (crashed)", None])
    wave = run_one_wave(job)
    assert wave.ok and wave.attempts == 2 and ran == [1, 2]
    assert sum(pauses) == pytest.approx(10.0)  # the default first pause
    report = wave.report("run")
    assert report["attempts"] == 2
    assert report["failed_attempts"] == [
        {"attempt": 1, "error": "RuntimeError: Python worker exited unexpectedly (crashed)", "seconds": 1.0}
    ]


def test_retries_are_bounded_and_never_follow_a_blocked_key() -> None:
    crash = "RuntimeError: Python worker exited unexpectedly (crashed)"
    job, pauses, ran = scripted_job([crash, crash, crash, None], wave_retry_pause=1.0)
    wave = run_one_wave(job)
    assert not wave.ok and wave.attempts == 3 and len(wave.failed_attempts) == 2  # 1 + --wave-retries 2
    assert sum(pauses) == pytest.approx(1.0 + 2.0)

    blocked = ("KeyBlocked: t[0]@7 failed 5 times and on-exhausted is block", TaskFailure.KEY_BLOCKED)
    job, pauses, ran = scripted_job([blocked, None])
    wave = run_one_wave(job)
    assert not wave.ok and wave.attempts == 1 and ran == [1] and pauses == []

    job, pauses, ran = scripted_job([crash, None], wave_retries=0)
    assert not run_one_wave(job).ok and ran == [1]


class SnapshotOffsets:
    """The job's Kafka offsets as fixed snapshots (no broker): what ``CatchupJob.plan`` reads."""

    def __init__(self, snapshots: dict) -> None:
        self.snapshots = snapshots

    def snapshot(self, topics, start, until) -> dict:
        return self.snapshots

    def members(self) -> int:
        return 0


def test_the_plan_skips_what_the_pods_finished_only_when_it_starts_at_the_committed_offsets() -> None:
    job, _, _ = scripted_job([], until="t:0=100")
    job.offsets.close()
    job.offsets = SnapshotOffsets(  # type: ignore[assignment]
        {("t", 0): PartitionSnapshot(earliest=0, end=200, committed=10, done=frozenset({11, 12, 150}))}
    )
    plan = job.plan()
    assert plan.ranges == [OffsetRange("t", 0, 10, 100)]
    assert plan.done == {("t", 0): frozenset({11, 12, 150})}  # 150, past the fence, is kept for the commit's metadata
    assert "t[0]: 2 offsets in range were finished by the group's consumers" in " ".join(plan.notes)
    assert offset_metadata.decode(fence_metadata(plan.ranges, plan.done)[("t", 0)], 100) == {150}

    job.config = job.config.model_copy(update={"start": "earliest", "commit": CommitMode.NEVER})
    assert job.plan().done == {}  # a replay handles everything again
