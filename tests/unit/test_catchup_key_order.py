"""Catch-up's one ordering guarantee, the pods': per key, in offset order within a partition. A key that
sits in two partitions (partitions were added) is two units of order, in both layouts alike."""

from __future__ import annotations

import threading

from keyorder.catchup.apply import TaskRunner
from keyorder.catchup.datasource import PROGRESS_SCALE, arrow_batch, lane_hash, progress_of, route_of
from keyorder.catchup.plan import PartitionSnapshot
from keyorder.core.retry import RetryPolicy
from keyorder.message import Message
from tests.guarantees import assert_key_order

SOURCES = [("orders", 0), ("orders", 1)]
SPAN = b"spans"
"""The key in both partitions: its older messages in partition 0, newer ones in partition 1 (added)."""


def partition_rows(source: int, keys: list[bytes]) -> list[tuple]:
    """A partition's rows as the reader makes them (lane: the hash of the record's route), a key's n-th
    message in this partition carrying n, then the split's end marker."""
    topic, partition = SOURCES[source]
    rows, sequence = [], dict.fromkeys(keys, 0)
    for offset, key in enumerate(keys):
        lane = lane_hash(route_of("key", topic, partition, key))
        value = str(sequence[key]).encode()
        sequence[key] += 1
        rows.append((lane, source, progress_of(offset, 0, len(keys)), offset, key, value, [], None, None, None))
    rows.append((0, source, PROGRESS_SCALE, len(keys), None, None, [], None, len(keys), 0))
    return rows


PARTITION_KEYS = {
    0: [SPAN, b"a", SPAN, b"b", SPAN, b"a", SPAN, b"b"],
    1: [b"c", SPAN, SPAN, b"c", SPAN, SPAN, b"d", SPAN],
}


class Recorder:
    """The handler: records ``(partition:key, sequence)``; holds the spanning key's first message of
    partition 0 until the spanning key's messages of partition 1 are all handled (a bounded wait)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.partition_one_done = threading.Event()
        self.waited_out = False
        self.left_in_one = PARTITION_KEYS[1].count(SPAN)

    def __call__(self, message: Message) -> None:
        first_of_partition_zero = message.partition == 0 and message.key == SPAN and message.offset == 0
        if first_of_partition_zero and not self.partition_one_done.wait(10):  # hang guard
            self.waited_out = True
        with self.lock:
            self.records.append((f"{message.partition}:{message.key.decode()}", int(message.value)))
            if message.partition == 1 and message.key == SPAN:
                self.left_in_one -= 1
                if not self.left_in_one:
                    self.partition_one_done.set()


def run_tasks(tasks: list[list[tuple]]) -> Recorder:
    """Each task's rows through its own ``TaskRunner`` (8 threads), the tasks at once, as Spark runs them."""
    recorder = Recorder()
    errors: list[BaseException] = []

    def run(rows: list[tuple]) -> None:
        runner = TaskRunner(recorder, RetryPolicy(max_attempts=1), None, SOURCES, "key", 8, 1_000)
        try:
            runner.run(iter([arrow_batch(rows)]))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(rows,)) for rows in tasks if rows]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)  # hang guard
    assert not errors, errors
    return recorder


def shuffled(rows: list[tuple], key_partitions: int) -> list[list[tuple]]:
    """The shuffle layout's tasks: ``repartition(n, lane)`` then ``sortWithinPartitions(progress, source, offset)``."""
    tasks: list[list[tuple]] = [[] for _ in range(key_partitions)]
    for row in rows:
        tasks[row[0] % key_partitions].append(row)
    return [sorted(task, key=lambda row: (row[2], row[1], row[3])) for task in tasks]


def sequences(recorder: Recorder) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for unit, sequence in recorder.records:
        found.setdefault(unit, []).append(sequence)
    return found


def test_a_key_in_two_partitions_is_two_units_of_order_in_the_shuffle_as_in_the_by_partition_layout() -> None:
    """The shuffle routed a key by its bytes alone: its messages of both partitions shared one lane, so the
    newer partition's waited behind the older's, in an order that was neither (partition, offset) nor time,
    while the by-partition layout ran them at once. Now both route a key within its partition: partition 1's
    messages of the key pass its held message of partition 0, each partition's in offset order, and both
    layouts hand every (partition, key) the same sequence."""
    rows = [partition_rows(source, keys) for source, keys in PARTITION_KEYS.items()]
    lanes = {row[1]: row[0] for source_rows in rows for row in source_rows if row[4] == SPAN}
    assert lanes[0] != lanes[1]  # two routes, one per partition

    shuffle = run_tasks(shuffled(rows[0] + rows[1], key_partitions=1))  # the worst case: one task for all
    by_partition = run_tasks(rows)  # one task per partition

    for recorder in (shuffle, by_partition):
        assert not recorder.waited_out, "partition 1's messages of the key waited for partition 0's"
        assert_key_order(recorder.records)  # per (partition, key): 0, 1, 2, ... with no gap or repeat
    assert sequences(shuffle) == sequences(by_partition)
    assert sorted(sequences(shuffle)) == ["0:a", "0:b", "0:spans", "1:c", "1:d", "1:spans"]


def snapshot(committed: int | None, end: int = 10) -> PartitionSnapshot:
    return PartitionSnapshot(earliest=0, end=end, committed=committed)


def test_partitions_added_since_the_groups_commits_are_found_at_planning() -> None:
    from keyorder.catchup.plan import partitions_added_since_commits

    snapshots = {
        ("orders", 0): snapshot(5),
        ("orders", 1): snapshot(7),
        ("orders", 2): snapshot(None),  # above the highest committed one, with records: added
        ("orders", 3): snapshot(None),
        ("orders", 4): snapshot(None, end=0),  # added too, but never had a record: nothing to span
        ("refunds", 0): snapshot(None),  # a topic the group never committed: a new group says nothing
        ("refunds", 1): snapshot(None),
        ("payments", 0): snapshot(3),
        ("payments", 1): snapshot(None),  # a gap below a committed partition: not growth
        ("payments", 2): snapshot(4),
    }
    assert partitions_added_since_commits(snapshots) == {"orders": [2, 3]}
    assert partitions_added_since_commits({("orders", 0): snapshot(5), ("orders", 1): snapshot(6)}) == {}


def test_the_plan_and_the_report_say_the_guarantee_and_the_added_partitions() -> None:
    from keyorder.catchup.job import Outcome, Plan
    from keyorder.catchup.layout import ORDER_GUARANTEE
    from keyorder.catchup.plan import partitions_added_note

    (note,) = partitions_added_note({"orders": [2, 3]})
    assert note.startswith("orders: partitions 2, 3 have records but no commit") and "offset order" in note
    plan = Plan(ranges=[], splits=[], notes=[note], committed={}, commit=False, partitions_added={"orders": [2, 3]})
    report = Outcome(plan, None, 0.0).report()
    assert report["partitions_added"] == {"orders": [2, 3]} and report["notes"] == [note]
    assert report["order"] == ORDER_GUARANTEE
    assert ORDER_GUARANTEE.startswith("per key, in offset order within a partition, as the pods give it")
